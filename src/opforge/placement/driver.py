"""The placement driver: heartbeats in, steps out, schedulers and checkers on each tick.

``Driver`` ties the pieces together the way PD's coordinator does: heartbeats
update the cluster view; each region heartbeat is answered with the step its
leader should run now; ``tick`` runs the checkers over a window of regions
(patrol) and the schedulers, and hands their operators to the controller,
which enforces the limits.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from opforge.placement.checkers.merge_checker import MergeChecker
from opforge.placement.checkers.rule_checker import RuleChecker
from opforge.placement.checkers.split_checker import SplitChecker
from opforge.placement.cluster import Cluster, Region, Store, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import ScheduleContext
from opforge.placement.heartbeat import (
    HeartbeatError, RegionHeartbeat, StoreHeartbeat, parse_region_heartbeat, parse_store_heartbeat,
)
from opforge.placement.operator import builder
from opforge.placement.operator.controller import OperatorController
from opforge.placement.operator.operator import Operator, OpKind, Priority
from opforge.placement.operator.step import Step
from opforge.placement.rules import RuleManager
from opforge.placement import schedulers as scheduler_registry

DEFAULT_SCHEDULERS = ("balance-leader", "balance-region", "hot-region")


@dataclass
class RegionHeartbeatResponse:
    region_id: int
    step: Step | None = None
    operator_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"region_id": self.region_id, "operator_id": self.operator_id,
                "step": self.step.to_json() if self.step is not None else None}


class Driver:
    def __init__(self, config: ScheduleConfig | None = None, clock=time.monotonic, seed: int = 0,
                 schedulers: tuple[str, ...] = DEFAULT_SCHEDULERS):
        self.config = config or ScheduleConfig()
        self.clock = clock
        self.cluster = Cluster(self.config.max_store_down_time, clock)
        self.controller = OperatorController(self.cluster, self.config)
        self.rules = RuleManager(self.config)
        self.ids = builder.PeerIds()
        self.rng = random.Random(seed)
        self.schedulers: dict[str, Any] = {}
        for name in schedulers:
            self.add_scheduler(name)
        self.merge_checker = MergeChecker()
        self.checkers = [RuleChecker(), self.merge_checker, SplitChecker()]
        self._patrol_key = b""  # where the next patrol window starts
        self.errors = 0  # refused heartbeats, for operators of the driver

    # -- stores ----------------------------------------------------------
    def put_store(self, store: Store) -> None:
        """Register a store (a worker joining), or update its address and labels."""
        old = self.cluster.get_store(store.id)
        if old is not None and old.state == StoreState.TOMBSTONE:
            raise HeartbeatError(f"store {store.id} is a tombstone; it cannot rejoin under the same id")
        store.last_heartbeat = self.clock()
        if old is not None:
            store.state = old.state
        self.cluster.put_store(store)

    def handle_store_heartbeat(self, hb: StoreHeartbeat | dict) -> dict[str, Any]:
        try:
            hb = hb if isinstance(hb, StoreHeartbeat) else parse_store_heartbeat(hb)
            known = self.cluster.get_store(hb.store.id)
            if known is None:
                raise HeartbeatError(f"store {hb.store.id} is not registered; put the store first")
            if known.state == StoreState.TOMBSTONE:
                raise HeartbeatError(f"store {hb.store.id} is a tombstone")
        except HeartbeatError:
            self.errors += 1
            raise
        s = hb.store
        s.state = known.state  # the administrative state is the driver's, not the worker's
        s.labels = s.labels or known.labels
        s.address = s.address or known.address
        s.last_heartbeat = self.clock()
        self.cluster.put_store(s)
        return {"store_id": s.id, "state": s.state.value}

    def set_store_state(self, store_id: int, state: StoreState | str) -> None:
        store = self.cluster.get_store(store_id)
        if store is None:
            raise ValueError(f"store {store_id} is not registered")
        state = StoreState(state)
        if state == StoreState.TOMBSTONE and self.cluster.region_count(store_id):
            raise ValueError(f"store {store_id} still holds {self.cluster.region_count(store_id)} regions; "
                             "set it offline and wait until they have moved")
        if store.state == StoreState.TOMBSTONE and state != StoreState.TOMBSTONE:
            raise ValueError(f"store {store_id} is a tombstone; it cannot come back")
        store.state = state

    # -- regions ---------------------------------------------------------
    def handle_region_heartbeat(self, hb: RegionHeartbeat | dict) -> RegionHeartbeatResponse:
        try:
            hb = hb if isinstance(hb, RegionHeartbeat) else parse_region_heartbeat(hb)
            region = hb.region
            for p in region.peers:
                if self.cluster.get_store(p.store_id) is None:
                    raise HeartbeatError(f"region {region.id}: peer {p.id} is on unknown store {p.store_id}")
            known = self.cluster.regions.get(region.id)
            if known is not None and region.epoch.is_stale_against(known.epoch):
                raise HeartbeatError(
                    f"region {region.id}: stale epoch {region.epoch} (known {known.epoch})")
            overlaps = self.cluster.overlapping(region)
            for other in overlaps:
                if other.epoch.version > region.epoch.version:
                    raise HeartbeatError(
                        f"region {region.id}: overlaps region {other.id}, which has a newer version")
        except HeartbeatError:
            self.errors += 1
            raise
        now = self.clock()
        for other in overlaps:  # replaced by this region after a split or merge
            self.cluster.remove_region(other.id)
            self.controller.region_removed(other.id, now)
        if self._is_split_result(region, known, overlaps):
            self.merge_checker.note_split(region.id, now)
        self.cluster.put_region(region)
        self.ids.advance_past(max(p.id for p in region.peers))
        hot = self.schedulers.get("hot-region")
        if hot is not None:
            hot.observe(region, self.config)  # hot regions are found from heartbeats, not by scanning
        step = self.controller.dispatch(region, now)
        op = self.controller.get(region.id)
        return RegionHeartbeatResponse(region.id, step, op.id if op is not None and step is not None else None)

    @staticmethod
    def _is_split_result(region: Region, known: Region | None, overlaps: list[Region]) -> bool:
        """A region born from a split (new, over an older range) or whose range shrank:
        the merge checker leaves such regions alone for split_merge_interval."""
        if known is None:
            return bool(overlaps)
        shrank = region.start_key > known.start_key or (
            region.end_key != b"" and (known.end_key == b"" or region.end_key < known.end_key))
        return region.epoch.version > known.epoch.version and shrank

    # -- scheduling --------------------------------------------------------
    def context(self, now: float | None = None) -> ScheduleContext:
        now = self.clock() if now is None else now
        busy = set(self.controller.busy_region_ids())
        return ScheduleContext(self.cluster, self.config, now, self.rng, self.ids,
                               self.controller.influence(), self.rules, busy)

    def tick(self, now: float | None = None) -> list[Operator]:
        """One scheduling round: timeouts, waiting queue, checkers (patrol), schedulers."""
        now = self.clock() if now is None else now
        self.controller.check_timeouts(now)
        self.controller.promote_waiting(now)
        added: list[Operator] = []
        ctx = self.context(now)
        for region in self._patrol_window():
            if region.id in ctx.busy_regions:
                continue
            for checker in self.checkers:
                ops = checker.check(region, ctx)
                if ops and self._admit(ops, now):
                    added += ops
                    ctx.busy_regions.update(op.region_id for op in ops)
                    break
        for scheduler in list(self.schedulers.values()):
            ctx = self.context(now)
            for op in scheduler.schedule(ctx):
                if self._admit([op], now):
                    added.append(op)
        return added

    def _admit(self, ops: list[Operator], now: float) -> bool:
        if len(ops) == 2:
            return self.controller.add_pair(ops[0], ops[1], now)
        return all(self.controller.add(op, now) for op in ops)

    def _patrol_window(self) -> list[Region]:
        """The next ``patrol_regions_per_tick`` regions in key order, wrapping
        around: every region is checked once per full patrol, at O(window) a tick."""
        n = min(self.config.patrol_regions_per_tick, len(self.cluster.regions))
        window: list[Region] = []
        for r in self.cluster.scan(self._patrol_key):
            if len(window) >= n:
                break
            if r.start_key >= self._patrol_key or not window:
                window.append(r)
        if len(window) < n:  # wrap to the start of the key space
            seen = {r.id for r in window}
            for r in self.cluster.scan(b""):
                if len(window) >= n or r.id in seen:
                    break
                window.append(r)
        self._patrol_key = window[-1].end_key if window and window[-1].end_key else b""
        return window

    # -- admin -------------------------------------------------------------
    def add_scheduler(self, name: str, **args) -> None:
        if name in self.schedulers:
            raise ValueError(f"scheduler {name!r} is already running")
        self.schedulers[name] = scheduler_registry.create(name, **args)

    def remove_scheduler(self, name: str) -> None:
        if name not in self.schedulers:
            raise ValueError(f"scheduler {name!r} is not running; running: {sorted(self.schedulers)}")
        scheduler = self.schedulers.pop(name)
        for store_id in list(getattr(scheduler, "store_ids", ())):  # evict-leader: lift its pause now
            scheduler.remove_store(store_id)

    def set_config(self, name: str, value) -> None:
        self.config.set(name, value)
        self.cluster.max_store_down_time = self.config.max_store_down_time
        if name in ("max_replicas", "location_labels", "isolation_level"):
            self.rules.apply_replication_config(self.config)

    def add_operator(self, kind: str, region_id: int, **args) -> Operator:
        """An admin operator (pd-ctl's `operator add`): transfer-leader, add-peer,
        remove-peer, move-peer, split-region. Admin operators bypass kind limits."""
        region = self.cluster.regions.get(region_id)
        if region is None:
            raise ValueError(f"region {region_id} is not known")
        now = self.clock()
        k, p = OpKind.ADMIN, Priority.HIGH
        stores = {s.id for s in self.cluster.up_stores()}

        def store_arg(name):
            sid = args.get(name)
            if sid not in stores:
                raise ValueError(f"operator {kind}: {name}={sid!r} is not an up store")
            return sid

        if kind == "transfer-leader":
            to = store_arg("to_store")
            if region.peer_on(to) is None or not region.peer_on(to).is_voter:
                raise ValueError(f"operator transfer-leader: store {to} holds no voter of region {region_id}")
            op = builder.transfer_leader("admin", region, to, now, k | OpKind.LEADER, p)
        elif kind == "add-peer":
            to = store_arg("to_store")
            if region.peer_on(to) is not None:
                raise ValueError(f"operator add-peer: store {to} already holds a peer of region {region_id}")
            op = builder.add_peer("admin", region, to, self.ids, now, k | OpKind.REGION, p)
        elif kind == "remove-peer":
            frm = args.get("from_store")
            if region.peer_on(frm) is None:
                raise ValueError(f"operator remove-peer: store {frm!r} holds no peer of region {region_id}")
            op = builder.remove_peer("admin", region, frm, now, None, k | OpKind.REGION, p)
        elif kind == "move-peer":
            frm, to = args.get("from_store"), store_arg("to_store")
            if region.peer_on(frm) is None or region.peer_on(to) is not None:
                raise ValueError(f"operator move-peer: needs a peer on {frm!r} and none on {to}")
            op = builder.move_peer("admin", region, frm, to, self.ids, now, k | OpKind.REGION, p)
        elif kind == "split-region":
            op = builder.split_region("admin", region, now, priority=p)
            op.kind |= k
        else:
            raise ValueError(f"unknown operator kind {kind!r}; one of transfer-leader, add-peer, remove-peer, "
                             "move-peer, split-region")
        if not self.controller.add(op, now) and not self.controller.last_refusal.startswith("waiting"):
            raise ValueError(f"operator refused: {self.controller.last_refusal}")
        return op
