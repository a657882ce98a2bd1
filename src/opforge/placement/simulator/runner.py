"""Running simulator cases: ``run_case``, ``list_cases``, ``table``, ``plot_case``.

``run_case(name)`` builds the case's cluster (a ``Driver`` on the simulated
clock and a ``SimulatedCluster`` of ``Node`` workers), then ticks: events
fire at their tick, the simulated workers run (``SimulatedCluster.step``),
the driver schedules, and the case's criterion is checked every tick from
``Case.first_check_tick`` on. The criterion is *met* when it holds for
``hold_ticks`` ticks in a row (``ticks`` is the first of them); the run goes on
for ``settle_ticks`` more to see whether it keeps holding (``held``) and to
catch moves that undo earlier ones. A case *passes* when the criterion was
met and still holds at the end.

Metrics in ``CaseResult``:

* ``ticks``: the tick (simulated second) at which the criterion first held;
* operators by their ``desc`` (the scheduler or checker that made them) and
  final status, by kind flag, and the shares that ended canceled, timed out
  or expired (from the controller's own totals, which include operators that
  expired while waiting);
* ``moved_mib``: data copied by finished snapshots (every AddLearner/AddPeer
  that completed copies the region's size), against ``ideal_mib``, the least
  that must move (each case documents its bound; the usual one,
  ``cases.ideal_rebalance_mib``, is the sum over stores of what they gained
  between the start and the end, max(0, final MiB - initial MiB): every such
  MiB had to arrive by a snapshot, so no schedule reaching the same end state
  could move less);
* ``reversed_region_moves`` / ``reversed_leader_moves``: a region whose peer
  moved A->B (an operator that added a peer on B and removed the one on A)
  and later B->A, or whose leadership went A->B and later B->A by operators
  (elections do not count);
* ``quorum_violations``: membership changes that left a region without a
  majority of voters on live stores when it had one before;
* ``series``: per-tick, per-store leader count, region count, and MiB.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from opforge.placement.config import ScheduleConfig
from opforge.placement.driver import DEFAULT_SCHEDULERS, Driver
from opforge.placement.operator.operator import OpKind, OpStatus
from opforge.placement.simulator.cases import Case, Check, build_regions, get_case, list_cases, rule_violations
from opforge.placement.simulator.simulated_cluster import SimConfig, SimulatedCluster

__all__ = ["CaseResult", "CaseRun", "list_cases", "plot_case", "run_case", "table"]

# Driver settings every case starts from (a case's own ``config`` wins): a
# patrol window sized for these small clusters, so the checkers cost little per tick.
BASE_CONFIG: dict[str, Any] = {"patrol_regions_per_tick": 128}


@dataclass
class CaseResult:
    name: str
    description: str
    criterion: str
    seed: int
    passed: bool  # reached, and still held at the end of the run
    ticks: int | None  # the tick at which the criterion was first met (for hold_ticks in a row)
    held: bool  # the criterion still held at the end of the run
    ticks_run: int
    max_ticks: int
    message: str  # the criterion's last report
    operators: dict[str, dict[str, int]]  # desc -> status -> count
    operators_by_kind: dict[str, int]
    operator_status: dict[str, int]  # controller totals by status
    total_operators: int
    canceled_share: float
    timeout_share: float
    expired_share: float
    moved_mib: float
    ideal_mib: float | None
    ideal_doc: str
    snapshots: int
    reversed_region_moves: int
    reversed_leader_moves: int
    reversed_examples: list[str]
    quorum_violations: int
    coverage_errors: int
    final_violations: list[str]
    steps: dict[str, Any]
    events: list[tuple[int, str]]
    series: dict[str, Any]
    wall_s: float
    kind: str = "balance"

    @property
    def moved_ratio(self) -> float | None:
        if self.ideal_mib is None or self.ideal_mib <= 0:
            return None
        return self.moved_mib / self.ideal_mib

    @property
    def reversed_moves(self) -> int:
        return self.reversed_region_moves + self.reversed_leader_moves

    def to_json(self, series: bool = True) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if series or k != "series"}
        d["moved_ratio"] = self.moved_ratio
        d["moved_bytes"] = int(self.moved_mib * (1 << 20))
        d["ideal_bytes"] = None if self.ideal_mib is None else int(self.ideal_mib * (1 << 20))
        d["events"] = [list(e) for e in self.events]
        return d


class CaseRun:
    """One case being simulated: the driver, the true cluster, and what is recorded."""

    def __init__(self, case: Case, seed: int = 0, config: dict[str, Any] | None = None,
                 sim_config: dict[str, Any] | None = None):
        self.case = case
        self.seed = seed
        self.rng = random.Random(seed)
        cfg = ScheduleConfig()
        for k, v in {**BASE_CONFIG, **case.config, **(config or {})}.items():
            cfg.set(k, v)
        scfg = SimConfig(**{**case.sim, **(sim_config or {})})
        self.sim: SimulatedCluster | None = None
        self.driver = Driver(cfg, clock=self._clock, seed=seed,
                             schedulers=tuple(case.schedulers) if case.schedulers is not None else DEFAULT_SCHEDULERS)
        for name, args in case.scheduler_args.items():
            if name in self.driver.schedulers:
                self.driver.remove_scheduler(name)
            self.driver.add_scheduler(name, **args)
        self.sim = SimulatedCluster(self.driver, scfg, seed)
        self.state: dict[str, Any] = {}
        for spec in case.stores:
            self.sim.add_node(spec.node())
        build_regions(self, case.regions, self.rng)
        self.initial_store_mib = {sid: self.sim.used_mib(sid) for sid in self.sim.nodes}
        self.state["initial_isolation_mib"] = self._isolation_mib()
        if case.setup is not None:
            case.setup(self)
        self._events = sorted(case.events, key=lambda e: e.at)
        self._next_event = 0
        self.fired: list[tuple[int, str]] = []
        self.ops: dict[int, Any] = {}
        self.series: dict[str, Any] = {"tick": [], "leaders": {}, "regions": {}, "mib": {}}

    def _clock(self) -> float:
        return self.sim.now if self.sim is not None else 0.0

    def _isolation_mib(self) -> float:
        label = self.driver.config.isolation_level
        if not label:
            return 0.0
        out = 0.0
        for r in self.sim.regions.values():
            zones = {self.sim.nodes[p.store_id].labels.get(label) for p in r.peers}
            out += (len(r.peers) - len(zones)) * r.size
        return out

    @property
    def tick(self) -> int:
        return int(self.sim.now)

    def step(self) -> None:
        """Simulate one tick: due events, the workers and the driver, then record."""
        now = self.tick
        while self._next_event < len(self._events) and self._events[self._next_event].at <= now:
            ev = self._events[self._next_event]
            ev.apply(self)
            self.fired.append((now, ev.describe()))
            self._next_event += 1
        self.sim.step()
        for op in self.driver.controller.running():
            self.ops[op.id] = op
        self._record(now)

    def _record(self, now: int) -> None:
        s = self.series
        n = len(s["tick"])
        s["tick"].append(now)
        for sid, node in self.sim.nodes.items():
            for key, get in (("leaders", self.sim.leader_count), ("regions", self.sim.peer_count),
                             ("mib", self.sim.used_mib)):
                col = s[key].setdefault(sid, [None] * n)
                col.append(None if node.removed else round(get(sid), 1))

    def collect_operators(self) -> None:
        for op in self.driver.controller.history():
            self.ops.setdefault(op.id, op)


def run_case(name: str | Case, seed: int = 0, plot: str | None = None, *, max_ticks: int | None = None,
             config: dict[str, Any] | None = None, sim_config: dict[str, Any] | None = None) -> CaseResult:
    """Simulate one case (by name, or a ``Case``) and measure it; write a PNG to ``plot`` if given."""
    case = get_case(name) if isinstance(name, str) else name
    t0 = time.perf_counter()
    run = CaseRun(case, seed, config, sim_config)
    limit = max_ticks if max_ticks is not None else case.max_ticks
    first = case.first_check_tick
    passed_at: int | None = None
    streak_from: int | None = None  # first tick of the current run of passing checks
    hold = max(1, case.hold_ticks)
    for _ in range(limit):
        run.step()
        tick = run.tick - 1
        if tick >= first and passed_at is None:
            if case.check(run).ok:
                streak_from = tick if streak_from is None else streak_from
                if tick - streak_from + 1 >= hold:
                    passed_at = streak_from
            else:
                streak_from = None
        if passed_at is not None and tick >= passed_at + hold - 1 + case.settle_ticks:
            break
    final = case.check(run)
    run.collect_operators()
    result = _result(run, passed_at, final, time.perf_counter() - t0, limit)
    if plot:
        plot_case(result, plot)
    return result


def _result(run: CaseRun, passed_at: int | None, final: Check, wall: float, limit: int) -> CaseResult:
    case, sim, driver = run.case, run.sim, run.driver
    by_desc: dict[str, Counter] = {}
    by_kind: Counter = Counter()
    for op in run.ops.values():
        by_desc.setdefault(op.desc, Counter())[op.status.value] += 1
        for flag in OpKind:
            if flag in op.kind:
                by_kind[flag.name.lower()] += 1
    status = driver.controller.counts_by_status()
    total = sum(status.values())

    def share(s: OpStatus) -> float:
        return status.get(s.value, 0) / total if total else 0.0

    ideal = case.ideal(run) if case.ideal is not None else None
    rev_region = [(a, b) for a, b in sim.reversed_moves if b.kind == "peer"]
    rev_leader = [(a, b) for a, b in sim.reversed_moves if b.kind == "leader"]
    examples = [f"region {b.region_id} {b.kind} {a.from_store}->{a.to_store} at {a.tick:g} "
                f"(op #{a.operator_id}, {_desc(run, a.operator_id)}), back at {b.tick:g} "
                f"(op #{b.operator_id}, {_desc(run, b.operator_id)})" for a, b in sim.reversed_moves[:5]]
    return CaseResult(
        name=case.name, description=case.description, criterion=case.criterion, seed=run.seed,
        passed=passed_at is not None and final.ok, ticks=passed_at, held=final.ok, ticks_run=run.tick, max_ticks=limit,
        message=final.message,
        operators={d: dict(c) for d, c in sorted(by_desc.items())}, operators_by_kind=dict(by_kind),
        operator_status=status, total_operators=total, canceled_share=share(OpStatus.CANCELED),
        timeout_share=share(OpStatus.TIMEOUT), expired_share=share(OpStatus.EXPIRED),
        moved_mib=round(sim.snapshot_mib, 1), ideal_mib=None if ideal is None else round(ideal, 1),
        ideal_doc=case.ideal_doc, snapshots=sim.snapshots_done,
        reversed_region_moves=len(rev_region), reversed_leader_moves=len(rev_leader), reversed_examples=examples,
        quorum_violations=len(sim.quorum_violations), coverage_errors=len(sim.coverage_errors),
        final_violations=rule_violations(run, limit=10),
        steps={"received": sim.steps_received, "dropped": sim.steps_dropped, "applied": dict(sim.steps_applied),
               "rejected": dict(sim.steps_rejected), "heartbeats": sim.heartbeats_sent,
               "heartbeats_refused": sim.heartbeats_refused, "splits": sim.splits, "merges": sim.merges,
               "elections": sim.elections, "regions_end": len(sim.regions)},
        events=list(run.fired), series=run.series, wall_s=round(wall, 3), kind=case.kind,
    )


def _desc(run: CaseRun, op_id: int | None) -> str:
    op = run.ops.get(op_id) if op_id is not None else None
    return op.desc if op is not None else "?"


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------
def table(results: list[CaseResult]):
    """A rich Table of the results, one row per case."""
    from rich.table import Table

    t = Table(title="placement simulator", show_lines=False)
    for col, just in (("case", "left"), ("pass", "center"), ("ticks", "right"), ("held", "center"),
                      ("ops", "right"), ("top operators", "left"), ("cancel", "right"), ("timeout", "right"),
                      ("moved MiB", "right"), ("ideal MiB", "right"), ("x ideal", "right"),
                      ("reversed", "right"), ("wall s", "right")):
        t.add_column(col, justify=just)
    for r in results:
        counts = sorted(((sum(st.values()), d) for d, st in r.operators.items()), reverse=True)
        top = ", ".join(f"{d} {n}" for n, d in counts[:3])
        ratio = r.moved_ratio
        t.add_row(
            r.name, "[green]yes[/]" if r.passed else "[red]no[/]",
            str(r.ticks) if r.ticks is not None else f">{r.ticks_run}",
            "yes" if r.held else "no", str(r.total_operators), top,
            f"{r.canceled_share:.0%}", f"{r.timeout_share:.0%}", f"{r.moved_mib:,.0f}",
            "-" if r.ideal_mib is None else f"{r.ideal_mib:,.0f}", "-" if ratio is None else f"{ratio:.2f}",
            f"{r.reversed_region_moves}/{r.reversed_leader_moves}", f"{r.wall_s:.1f}",
        )
    return t


def plot_case(result: CaseResult, path: str) -> str:
    """A PNG of per-store leader and region counts over time (pass tick and events marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.series
    ticks = s["tick"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharex=True)
    for ax, key, title in ((axes[0], "leaders", "leaders per store"), (axes[1], "regions", "regions per store")):
        for sid in sorted(s[key]):
            ax.plot(ticks, s[key][sid], label=f"store {sid}", linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("tick (simulated seconds)")
        ax.grid(alpha=0.3)
        for t, text in result.events:
            ax.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        if result.ticks is not None:
            ax.axvline(result.ticks, color="green", linestyle="--", linewidth=1.0)
    axes[1].legend(fontsize=7, loc="best", ncol=2)
    if result.passed:
        status = f"passed at tick {result.ticks}"
    elif result.ticks is not None:
        status = f"met at tick {result.ticks} but did not hold"
    else:
        status = "did not pass"
    fig.suptitle(f"{result.name}: {status}; {result.total_operators} operators, "
                 f"{result.moved_mib:,.0f} MiB moved", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
