"""Simulator cases (PD's tools/pd-simulator/simulator/cases).

Each case is one module of this package holding a declarative ``CASE``:
the initial stores (with zone/host labels), the initial regions (how many,
how many replicas, where), config overrides for the driver, events by tick
(stores added, going down, deleted; loads), a tick budget, and the pass
criterion (``check``) with its description in words.

This module holds the building blocks (``Case``, ``StoreSpec``,
``RegionSpec``, events) and the criteria the cases share (PD's
``isUniform``: every store within +-5 % of the mean; "fully replicated and
rule-compliant"), and the registry (``list_cases``, ``get_case``).
"""

from __future__ import annotations

import importlib
import pkgutil
import random
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from opforge.placement.cluster import PeerRole, Region, RegionEpoch
from opforge.placement.simulator.node import Node
from opforge.placement.simulator.simulated_cluster import Flow, ImportSpot, SimRegion

if TYPE_CHECKING:  # pragma: no cover
    from opforge.placement.simulator.runner import CaseRun

GIB = 1 << 30
BALANCE_RATIO = 0.05  # PD's simulator: every store within 5 % of the mean


# --------------------------------------------------------------------------
# declarations
# --------------------------------------------------------------------------
@dataclass
class StoreSpec:
    id: int
    labels: dict[str, str] = field(default_factory=dict)
    capacity_gib: float = 1024.0
    snap_bandwidth: float = 64.0  # MiB per tick, per snapshot
    snap_limit: int = 4
    slow: float = 1.0

    def node(self) -> Node:
        return Node(self.id, dict(self.labels), int(self.capacity_gib * GIB), self.snap_bandwidth,
                    self.snap_limit, self.slow)


Placement = Callable[[int, random.Random, Sequence[int], int], Sequence[int]]


def round_robin(i: int, rng: random.Random, stores: Sequence[int], replicas: int) -> list[int]:
    """Region i on stores i, i+1, ... (mod n); the first leads."""
    n = len(stores)
    return [stores[(i + k) % n] for k in range(replicas)]


def random_placement(i: int, rng: random.Random, stores: Sequence[int], replicas: int) -> list[int]:
    return rng.sample(list(stores), replicas)


def weighted(weights: dict[int, float]) -> Placement:
    """Replicas drawn without replacement with these store weights (skewed clusters)."""

    def place(i: int, rng: random.Random, stores: Sequence[int], replicas: int) -> list[int]:
        pool = [s for s in stores]
        out = []
        for _ in range(replicas):
            w = [weights.get(s, 1.0) for s in pool]
            s = rng.choices(pool, w)[0]
            out.append(s)
            pool.remove(s)
        return out

    return place


def blocks(size: int, inner: Placement = random_placement) -> Placement:
    """Runs of ``size`` consecutive regions share one placement (drawn by ``inner``)."""
    memos: "weakref.WeakKeyDictionary[random.Random, dict[int, list[int]]]" = weakref.WeakKeyDictionary()

    def place(i: int, rng: random.Random, stores: Sequence[int], replicas: int) -> list[int]:
        memo = memos.setdefault(rng, {})  # one memo per run (the run's rng)
        b = i // size
        if b not in memo:
            memo[b] = list(inner(b, rng, stores, replicas))
        return list(memo[b])

    return place


@dataclass
class RegionSpec:
    count: int
    replicas: int = 3
    size_mib: float | Callable[[int, random.Random], float] = 32.0
    keys_per_mib: int = 10_000
    placement: Placement = round_robin
    stores: Sequence[int] | None = None  # the initial stores to place on (default: all)
    leader_store: int | None = None  # every region led from this store (when it holds a replica)


# -- events ------------------------------------------------------------------
@dataclass
class Event:
    at: int

    def apply(self, run: "CaseRun") -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass
class AddStore(Event):
    spec: StoreSpec = None

    def apply(self, run):
        run.sim.add_node(self.spec.node())

    def describe(self):
        return f"add store {self.spec.id}"


@dataclass
class StoreDown(Event):
    store_id: int = 0

    def apply(self, run):
        run.sim.store_down(self.store_id)

    def describe(self):
        return f"store {self.store_id} down"


@dataclass
class StoreUp(Event):
    store_id: int = 0

    def apply(self, run):
        run.sim.store_up(self.store_id)

    def describe(self):
        return f"store {self.store_id} up"


@dataclass
class DeleteStore(Event):
    store_id: int = 0

    def apply(self, run):
        run.sim.delete_store(self.store_id)

    def describe(self):
        return f"delete store {self.store_id}"


@dataclass
class SlowStore(Event):
    store_id: int = 0
    factor: float = 4.0

    def apply(self, run):
        run.sim.set_slow(self.store_id, self.factor)

    def describe(self):
        return f"store {self.store_id} slow x{self.factor:g}"


@dataclass
class SetFlow(Event):
    """Give the regions ``select`` picks a constant flow (remembered in run.state[name])."""

    name: str = "hot"
    select: Callable[["CaseRun"], list[int]] = None
    flow: Flow = field(default_factory=Flow)

    def apply(self, run):
        ids = list(self.select(run))
        run.state[self.name] = ids
        run.sim.set_flow(ids, self.flow)

    def describe(self):
        return f"{self.name} flow on regions"


@dataclass
class Import(Event):
    """Write ``mib_per_tick`` at the key at fraction ``where`` of the key space until ``until``."""

    where: float = 0.5
    mib_per_tick: float = 16.0
    until: int = 100
    keys_per_mib: int = 10_000

    def apply(self, run):
        from opforge.placement.simulator.simulated_cluster import KEY_SPACE, encode_key

        key = encode_key(int(self.where * KEY_SPACE))
        run.state.setdefault("import_keys", []).append(key)
        run.sim.add_import(ImportSpot(key, self.mib_per_tick, self.until, self.keys_per_mib))

    def describe(self):
        return f"import {self.mib_per_tick:g} MiB/tick until {self.until}"


@dataclass
class Call(Event):
    fn: Callable[["CaseRun"], None] = None
    text: str = "call"

    def apply(self, run):
        self.fn(run)

    def describe(self):
        return self.text


# -- the case ----------------------------------------------------------------
@dataclass
class Check:
    ok: bool
    message: str = ""


@dataclass
class Case:
    name: str
    description: str
    criterion: str  # the pass criterion, in words
    stores: list[StoreSpec]
    regions: RegionSpec | list[RegionSpec]
    check: Callable[["CaseRun"], Check]
    max_ticks: int = 600
    config: dict[str, Any] = field(default_factory=dict)  # ScheduleConfig overrides
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides
    schedulers: tuple[str, ...] | None = None  # None: the driver's defaults
    scheduler_args: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> create() kwargs
    setup: Callable[["CaseRun"], None] | None = None  # e.g. placement rules
    events: list[Event] = field(default_factory=list)
    check_from: int | None = None  # first tick the criterion may pass (default: after the last event)
    hold_ticks: int = 5  # the criterion must hold this many ticks in a row to pass
    settle_ticks: int = 30  # ticks run after passing, to see whether it holds (and reversals)
    ideal: Callable[["CaseRun"], float | None] | None = None  # MiB that must move at least
    ideal_doc: str = ""
    kind: str = "balance"  # balance | repair | split | merge | hot | import | placement

    @property
    def first_check_tick(self) -> int:
        if self.check_from is not None:
            return self.check_from
        return max((e.at for e in self.events), default=0) + 1


# --------------------------------------------------------------------------
# criteria
# --------------------------------------------------------------------------
def uniform(values: dict[int, float], ratio: float = BALANCE_RATIO) -> tuple[bool, float]:
    """PD's isUniform: every value within ``ratio`` of the mean. Returns (ok, worst deviation)."""
    if not values:
        return False, float("inf")
    mean = sum(values.values()) / len(values)
    if mean <= 0:
        return all(v == 0 for v in values.values()), 0.0
    worst = max(abs(v - mean) / mean for v in values.values())
    return worst <= ratio + 1e-12, worst


def balanced(run: "CaseRun", leaders: bool = True, regions: bool = True, sizes: bool = False,
             stores: Sequence[int] | None = None, ratio: float = BALANCE_RATIO) -> Check:
    """Every (up) store within ``ratio`` of the mean on leader count, region count, region size."""
    sim = run.sim
    ids = list(stores) if stores is not None else sim.up_store_ids()
    parts, ok = [], True
    for flag, name, get in ((leaders, "leaders", sim.leader_count), (regions, "regions", sim.peer_count),
                            (sizes, "size", sim.used_mib)):
        if not flag:
            continue
        vals = {s: get(s) for s in ids}
        good, worst = uniform(vals, ratio)
        ok = ok and good
        parts.append(f"{name} {[round(v) for v in vals.values()]} (worst {worst:.1%})")
    return Check(ok, "; ".join(parts))


def rule_violations(run: "CaseRun", limit: int = 20) -> list[str]:
    """Regions not fully replicated on up stores (max_replicas voters, no
    learner, no joint state, distinct ``isolation_level``), or whose true peers
    do not satisfy the driver's placement rules."""
    sim, driver = run.sim, run.driver
    out = sim.fit_violations(limit=limit)
    if len(out) >= limit:
        return out
    stores = {sid: s for sid, s in driver.cluster.stores.items()}
    down = [sid for sid in sim.nodes if not sim.is_alive(sid)]
    for r in sim.regions.values():
        view = Region(id=r.id, start_key=r.start, end_key=r.end, epoch=RegionEpoch(r.conf_ver, r.version),
                      peers=r.peers, leader=r.leader, approximate_size=max(1, int(r.size)),
                      pending_peers=tuple(r.pending))
        try:
            fit = driver.rules.fit_region(view, stores, down_stores=down)
        except Exception as e:  # noqa: BLE001 - report, don't crash the run
            out.append(f"region {r.id}: rule fit failed: {e}")
        else:
            if not fit.is_satisfied():
                out.append(f"region {r.id}: does not satisfy its placement rules")
        if len(out) >= limit:
            break
    return out


def repaired(run: "CaseRun") -> Check:
    bad = rule_violations(run, limit=5)
    return Check(not bad, "all regions fully replicated" if not bad else f"{len(bad)}+ violations, e.g. {bad[0]}")


def all_of(*checks: Check) -> Check:
    return Check(all(c.ok for c in checks), "; ".join(c.message for c in checks if c.message))


# -- the ideal data movement ---------------------------------------------------
def ideal_rebalance_mib(run: "CaseRun") -> float:
    """The least data any schedule could have copied to turn the initial
    distribution into the final one: the sum over stores of what they gained,
    max(0, final MiB - initial MiB). Every MiB a store ends up with beyond what
    it started with arrived by a snapshot. (For balance, this is the data
    needed to bring every store to the mean, measured on the end state the
    run actually reached; for a lost or removed store it is the re-created
    replicas.) Valid while region sizes do not change (no splits or imports)."""
    sim = run.sim
    init = run.initial_store_mib
    return sum(max(0.0, sim.used_mib(s) - init.get(s, 0.0)) for s in sim.nodes if not sim.nodes[s].removed)


def ideal_isolation_mib(run: "CaseRun") -> float:
    """For isolation: the larger of the rebalance bound and, per region, (replicas
    minus distinct zones among them) x size at the start (each such replica has
    to move to another zone once)."""
    return max(ideal_rebalance_mib(run), run.state.get("initial_isolation_mib", 0.0))


def zero(run: "CaseRun") -> float:
    return 0.0


# --------------------------------------------------------------------------
# building the initial cluster
# --------------------------------------------------------------------------
def build_regions(run: "CaseRun", specs: RegionSpec | list[RegionSpec], rng: random.Random) -> None:
    from opforge.placement.cluster import Peer
    from opforge.placement.simulator.simulated_cluster import KEY_SPACE, encode_key

    specs = [specs] if isinstance(specs, RegionSpec) else list(specs)
    total = sum(s.count for s in specs)
    sim = run.sim
    all_stores = sorted(sim.nodes)
    i = 0
    for spec in specs:
        stores = list(spec.stores) if spec.stores is not None else all_stores
        for j in range(spec.count):
            start = encode_key(i * KEY_SPACE // total)
            end = b"" if i == total - 1 else encode_key((i + 1) * KEY_SPACE // total)
            placed = list(spec.placement(j, rng, stores, spec.replicas))
            if spec.leader_store is not None and spec.leader_store in placed:
                placed.remove(spec.leader_store)
                placed.insert(0, spec.leader_store)
            peers = tuple(Peer(sim.new_id(), s, PeerRole.VOTER) for s in placed)
            size = spec.size_mib(j, rng) if callable(spec.size_mib) else spec.size_mib
            rid = sim.new_id()
            sim.add_region(SimRegion(rid, start, end, peers, peers[0].id, size, int(size * spec.keys_per_mib)))
            i += 1


def list_cases() -> list[str]:
    names = []
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            names.append(m.name.replace("_", "-"))
    return sorted(names)


def get_case(name: str) -> Case:
    mod_name = name.replace("-", "_")
    if name not in list_cases():
        raise ValueError(f"unknown case {name!r}; cases: {', '.join(list_cases())}")
    mod = importlib.import_module(f"{__name__}.{mod_name}")
    case = mod.CASE
    return case() if callable(case) and not isinstance(case, Case) else case
