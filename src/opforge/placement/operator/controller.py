"""The operator controller: which operators run, and what each region's leader
is told to do next (PD's operator controller).

At most one operator runs per region. ``add`` admits an operator when

1. its region is known and its epoch still matches the operator's (else it is
   refused as stale);
2. the region has no operator, or only one of lower priority (which then ends
   REPLACED); an operator of equal or higher priority wins and the new one is
   refused;
3. the per-kind concurrency limits have room (each running operator counts
   once under every limited flag of its kind: LEADER -> leader_schedule_limit,
   REGION -> region_schedule_limit, REPLICA -> replica_schedule_limit,
   MERGE -> merge_schedule_limit, HOT -> hot_region_schedule_limit; ADMIN
   operators count but are never held back by these limits);
4. the store limits hold tokens for every store it adds a peer to or removes a
   peer from (``store_limit.StoreLimiter``); the tokens are taken at admission.

An operator refused only by 3 or 4 waits in a queue ordered by priority, then
age; ``promote_waiting`` admits from it as capacity frees up and drops what
expired (an operator not started ``EXPIRE_AFTER`` seconds after it was created
has expired, waiting or not). ``add`` returns True only when the operator was
admitted; ``last_refusal`` says why not ("waiting: ..." when it was queued).

``dispatch`` is called with every region heartbeat and answers the step the
leader should run now. The controller never promotes on its own inside
``dispatch`` (which stays O(1)): a periodic tick calls ``check_timeouts`` and
``promote_waiting``.

Merge operators come in pairs (``builder.merge_regions``): ``add_pair`` admits
both or neither, and when one of a pair ends other than SUCCESS its partner is
canceled. The source region disappears when a merge completes:
``region_removed`` ends a started merge-source operator SUCCESS.

Times are seconds on the cluster's clock, passed in as ``now`` (None: read
``clock``, which defaults to the cluster's).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

from opforge.placement.cluster import Cluster, Region
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import StoreInfluence
from opforge.placement.operator.operator import EXPIRE_AFTER, Operator, OpKind, OpStatus
from opforge.placement.operator.step import (
    AddLearner, AddPeer, MergeRegion, RemovePeer, SplitRegion, Step, TransferLeader,
)
from opforge.placement.operator.store_limit import StoreLimiter, StoreLimitType, step_cost

# The limited kinds and the config item that bounds how many run at once.
KIND_LIMITS: tuple[tuple[OpKind, str], ...] = (
    (OpKind.LEADER, "leader_schedule_limit"),
    (OpKind.REGION, "region_schedule_limit"),
    (OpKind.REPLICA, "replica_schedule_limit"),
    (OpKind.MERGE, "merge_schedule_limit"),
    (OpKind.HOT, "hot_region_schedule_limit"),
)


@dataclass(order=True)
class _Waiting:
    """One queued operator, or a queued merge pair (admitted together)."""

    key: tuple  # (-priority, created_at, seq): the queue order
    ops: tuple[Operator, ...] = field(compare=False)
    alive: bool = field(default=True, compare=False)


class OperatorController:
    def __init__(self, cluster: Cluster, config: ScheduleConfig, clock=None, *,
                 store_limit: StoreLimiter | None = None, history_size: int = 1000, max_waiting: int = 10_000):
        self.cluster = cluster
        self.config = config
        self.clock = clock if clock is not None else cluster.clock
        # Default rates follow the config (re-read at each admission); per-store
        # overrides and the burst live in the limiter.
        self.store_limit = store_limit if store_limit is not None else StoreLimiter(
            config.store_limit_add_peer, config.store_limit_remove_peer)
        self.max_waiting = max_waiting
        self.last_refusal = ""  # why the last add/add_pair did not admit ("" when it did)
        self._running: dict[int, Operator] = {}  # region id -> operator
        self._kind_counts: Counter[OpKind] = Counter()  # flag -> running operators carrying it
        self._queue: list[_Waiting] = []  # heap, lazily cleaned (entries with alive=False)
        self._waiting: dict[int, _Waiting] = {}  # region id -> its live queue entry
        self._partner: dict[int, Operator] = {}  # operator id -> the other half of its merge pair
        self._history: deque[Operator] = deque(maxlen=history_size)
        self._ended: Counter[str] = Counter()  # status -> operators ended so far
        self._seq = itertools.count()

    # -- admission -------------------------------------------------------
    def add(self, op: Operator, now: float | None = None) -> bool:
        """Admit ``op`` (True), queue it, or refuse it (False; see ``last_refusal``)."""
        return self._add_group((op,), self._t(now))

    def add_pair(self, a: Operator, b: Operator, now: float | None = None) -> bool:
        """Admit a merge pair (``builder.merge_regions``' active, passive): both or neither."""
        if a.region_id == b.region_id:
            self.last_refusal = f"a merge pair needs two regions, both operators are on region {a.region_id}"
            return False
        return self._add_group((a, b), self._t(now))

    def _add_group(self, ops: tuple[Operator, ...], now: float) -> bool:
        self.last_refusal = ""
        reason = self._precheck(ops, now)
        if reason:
            self.last_refusal = reason
            return False
        replaced = [self._running[op.region_id] for op in ops if op.region_id in self._running]
        blocked = self._limits_block(ops, replaced, now)
        if blocked and len(self._waiting) + len(ops) > self.max_waiting:
            self.last_refusal = f"{blocked}; waiting queue is full ({self.max_waiting})"
            return False
        # lower-priority queued operators of these regions give way either way
        for op in ops:
            entry = self._waiting.get(op.region_id)
            if entry is not None:
                self._drop_waiting(entry, now, OpStatus.REPLACED, f"replaced by operator #{op.id}",
                                   trigger=op.region_id)
        if blocked:
            self._enqueue(ops)
            self.last_refusal = f"waiting: {blocked}"
            return False
        self._admit(ops, replaced, now)
        return True

    def _precheck(self, ops: tuple[Operator, ...], now: float, queued: _Waiting | None = None) -> str:
        """Why ``ops`` can never run as they are ("" when they can, limits aside)."""
        for op in ops:
            rid = op.region_id
            if op.status != OpStatus.CREATED:
                return f"operator #{op.id} on region {rid} is {op.status.value}, not created"
            if queued is None and (self._running.get(rid) is op or rid in self._waiting
                                   and any(o is op for o in self._waiting[rid].ops)):
                return f"operator #{op.id} on region {rid} was already added"
            if now - op.created_at > EXPIRE_AFTER:
                return f"operator #{op.id} on region {rid} expired ({now - op.created_at:.1f}s since it was created)"
            region = self.cluster.regions.get(rid)
            if region is None:
                return f"region {rid} not found"
            if region.epoch != op.epoch:
                return (f"stale epoch: region {rid} is at conf_ver {region.epoch.conf_ver} version "
                        f"{region.epoch.version}, operator #{op.id} was made at conf_ver {op.epoch.conf_ver} "
                        f"version {op.epoch.version}")
            old = self._running.get(rid)
            if old is not None and old.priority >= op.priority:
                return (f"region {rid} already has operator #{old.id} ({old.desc}) of priority "
                        f"{old.priority.name.lower()} >= {op.priority.name.lower()}")
            entry = self._waiting.get(rid)
            if entry is not None and entry is not queued:
                other = next(o for o in entry.ops if o.region_id == rid)
                if other.priority >= op.priority:
                    return (f"region {rid} already has waiting operator #{other.id} ({other.desc}) of priority "
                            f"{other.priority.name.lower()} >= {op.priority.name.lower()}")
        return ""

    def _limits_block(self, ops: tuple[Operator, ...], replaced: list[Operator], now: float) -> str:
        """Which concurrency or store limit keeps ``ops`` out now ("" when none does)."""
        need: Counter[OpKind] = Counter()
        for op in ops:
            if OpKind.ADMIN not in op.kind:
                need.update(flag for flag, _ in KIND_LIMITS if flag in op.kind)
        freed: Counter[OpKind] = Counter()
        for old in replaced:
            freed.update(flag for flag, _ in KIND_LIMITS if flag in old.kind)
        for flag, item in KIND_LIMITS:
            if need[flag]:
                limit = getattr(self.config, item)
                running = self._kind_counts[flag] - freed[flag]
                if running + need[flag] > limit:
                    return f"{item} {limit} reached ({running} {flag.name.lower()} operators running)"
        self._sync_store_rates()
        for (store_id, kind), cost in self._store_costs(ops).items():
            if not self.store_limit.can_take(store_id, kind, cost, now):
                avail = self.store_limit.available(store_id, kind, now)
                return f"store {store_id} {kind.value} limit: needs {cost:.2f} tokens, has {avail:.2f}"
        return ""

    def _store_costs(self, ops: tuple[Operator, ...] | list[Operator]) -> dict[tuple[int, StoreLimitType], float]:
        costs: dict[tuple[int, StoreLimitType], float] = {}
        for op in ops:
            region = self.cluster.regions.get(op.region_id)
            size = region.approximate_size if region is not None else 0
            for step in op.steps[op.current:]:
                if isinstance(step, (AddLearner, AddPeer)):
                    key = (step.to_store, StoreLimitType.ADD_PEER)
                elif isinstance(step, RemovePeer):
                    key = (step.from_store, StoreLimitType.REMOVE_PEER)
                else:
                    continue
                costs[key] = costs.get(key, 0.0) + step_cost(size)
        return costs

    def _sync_store_rates(self) -> None:
        self.store_limit.set_default_rate(StoreLimitType.ADD_PEER, self.config.store_limit_add_peer)
        self.store_limit.set_default_rate(StoreLimitType.REMOVE_PEER, self.config.store_limit_remove_peer)

    def _admit(self, ops: tuple[Operator, ...], replaced: list[Operator], now: float) -> None:
        for old in replaced:
            newer = next(op for op in ops if op.region_id == old.region_id)
            self._finish(old, OpStatus.REPLACED, now, f"replaced by operator #{newer.id} ({newer.desc})")
        missing = self.store_limit.take_all(self._store_costs(ops), now)
        assert missing is None, f"store limit checked but not takeable: {missing}"
        for op in ops:
            self._running[op.region_id] = op
            self._kind_counts.update(flag for flag, _ in KIND_LIMITS if flag in op.kind)
        if len(ops) == 2:
            a, b = ops
            self._partner[a.id], self._partner[b.id] = b, a

    def _enqueue(self, ops: tuple[Operator, ...]) -> None:
        head = ops[0]
        entry = _Waiting((-max(int(op.priority) for op in ops), head.created_at, next(self._seq)), ops)
        if len(self._queue) > 2 * len(self._waiting) + 64:  # drop dead entries now and then
            self._queue = [e for e in self._queue if e.alive]
            heapq.heapify(self._queue)
        heapq.heappush(self._queue, entry)
        for op in ops:
            self._waiting[op.region_id] = entry

    def promote_waiting(self, now: float | None = None) -> list[Operator]:
        """Admit queued operators, highest priority (then oldest) first, as far as
        the limits allow; drop the expired and the stale. Returns those admitted."""
        now = self._t(now)
        admitted: list[Operator] = []
        if not self._waiting:
            self._queue.clear()
            return admitted
        entries = sorted(e for e in self._queue if e.alive)
        self._queue = []
        kept: list[_Waiting] = []
        for entry in entries:
            if not entry.alive:  # dropped earlier in this pass (a partner's region)
                continue
            if any(now - op.created_at > EXPIRE_AFTER for op in entry.ops):
                self._drop_waiting(entry, now, OpStatus.EXPIRED, "expired while waiting")
                continue
            reason = self._precheck(entry.ops, now, queued=entry)
            if reason:
                self._drop_waiting(entry, now, OpStatus.CANCELED, reason)
                continue
            replaced = [self._running[op.region_id] for op in entry.ops if op.region_id in self._running]
            if self._limits_block(entry.ops, replaced, now):
                kept.append(entry)
                continue
            entry.alive = False
            for op in entry.ops:
                self._waiting.pop(op.region_id, None)
            self._admit(entry.ops, replaced, now)
            admitted.extend(entry.ops)
        self._queue = kept
        heapq.heapify(self._queue)
        return admitted

    def _drop_waiting(self, entry: _Waiting, now: float, status: OpStatus, reason: str,
                      trigger: int | None = None) -> None:
        """End every operator of a queue entry: the one on ``trigger``'s region
        (all when None) with ``status``, a merge partner with CANCELED."""
        entry.alive = False
        for op in entry.ops:
            if self._waiting.get(op.region_id) is entry:
                del self._waiting[op.region_id]
        for op in entry.ops:
            if trigger is None or op.region_id == trigger:
                op.end(status, now, reason)
            else:
                op.end(OpStatus.CANCELED, now, f"merge partner on region {trigger}: {status.value}")
            self._bury(op)

    # -- running ---------------------------------------------------------
    def dispatch(self, region: Region, now: float | None = None) -> Step | None:
        """Called with each region heartbeat: advance the region's operator by
        what the region shows and return the step its leader should run now."""
        op = self._running.get(region.id)
        if op is None:
            return None
        now = self._t(now)
        if op.is_stale(region):
            self._finish(op, OpStatus.CANCELED, now, "stale epoch")
            return None
        if op.status == OpStatus.CREATED:
            if op.is_timed_out(region, now):
                self._finish(op, OpStatus.EXPIRED, now, f"not started within {EXPIRE_AFTER:g}s of creation")
                return None
            op.start(now)
        step = op.check(region, now)
        if op.status == OpStatus.SUCCESS:
            self._finish(op, OpStatus.SUCCESS, now)
            return None
        if isinstance(step, RemovePeer) and region.leader is not None and region.leader.store_id == step.from_store:
            # An election put the leader on the peer we were about to remove: a
            # leader cannot remove itself, so give up and let a checker replan (PD does too).
            self._finish(op, OpStatus.CANCELED, now, "the leader moved onto the peer to remove")
            return None
        if op.is_timed_out(region, now):
            self._finish(op, OpStatus.TIMEOUT, now, f"step {op.current} ({type(step).__name__}) timed out")
            return None
        return step

    def region_removed(self, region_id: int, now: float | None = None) -> Operator | None:
        """The region is gone (merged away, or dropped). A started merge-source
        operator succeeded; any other operator on it is canceled. Returns it."""
        now = self._t(now)
        entry = self._waiting.get(region_id)
        if entry is not None:
            self._drop_waiting(entry, now, OpStatus.CANCELED, "region removed", trigger=region_id)
        op = self._running.get(region_id)
        if op is None:
            return None
        self._region_gone(op, now)
        return op

    def _region_gone(self, op: Operator, now: float) -> None:
        # A started merge source disappears when it merges; a started split's
        # region is replaced (for a moment) by the halves it split into.
        done = op.is_merge_source or bool(op.kind & OpKind.SPLIT)
        if done and op.status == OpStatus.STARTED:
            op.current = len(op.steps)
            self._finish(op, OpStatus.SUCCESS, now)
        else:
            self._finish(op, OpStatus.CANCELED, now, "region removed")

    def check_timeouts(self, now: float | None = None) -> list[Operator]:
        """Sweep every running operator against the cluster's current view of its
        region (for regions whose heartbeats stopped), and the queue for
        expired operators. Returns the operators that ended."""
        now = self._t(now)
        ended: list[Operator] = []
        for op in list(self._running.values()):
            if self._running.get(op.region_id) is not op:  # ended as a partner in this sweep
                continue
            region = self.cluster.regions.get(op.region_id)
            if region is None:
                self._region_gone(op, now)
            elif op.is_stale(region):
                self._finish(op, OpStatus.CANCELED, now, "stale epoch")
            elif op.status == OpStatus.CREATED:
                if op.is_timed_out(region, now):
                    self._finish(op, OpStatus.EXPIRED, now, f"not started within {EXPIRE_AFTER:g}s of creation")
            else:
                op.check(region, now)
                if op.status == OpStatus.SUCCESS:
                    self._finish(op, OpStatus.SUCCESS, now)
                elif op.is_timed_out(region, now):
                    self._finish(op, OpStatus.TIMEOUT, now, f"step {op.current} timed out (no progress reported)")
            if op.status.is_end:
                ended.append(op)
        for entry in {id(e): e for e in self._waiting.values()}.values():
            if entry.alive and any(now - op.created_at > EXPIRE_AFTER for op in entry.ops):
                self._drop_waiting(entry, now, OpStatus.EXPIRED, "expired while waiting")
                ended.extend(entry.ops)
        return ended

    def remove(self, region_id: int, reason: str = "canceled by admin", now: float | None = None) -> bool:
        """Cancel the region's running or waiting operator. False when it has none."""
        now = self._t(now)
        done = False
        entry = self._waiting.get(region_id)
        if entry is not None:
            self._drop_waiting(entry, now, OpStatus.CANCELED, reason, trigger=region_id)
            done = True
        op = self._running.get(region_id)
        if op is not None:
            self._finish(op, OpStatus.CANCELED, now, reason)
            done = True
        return done

    def _finish(self, op: Operator, status: OpStatus, now: float, reason: str = "") -> None:
        """End a running operator, take it out of the running set, and cancel
        its merge partner if it did not succeed."""
        if self._running.get(op.region_id) is not op:
            return
        op.end(status, now, reason)
        del self._running[op.region_id]
        self._kind_counts.subtract(flag for flag, _ in KIND_LIMITS if flag in op.kind)
        self._bury(op)

    def _bury(self, op: Operator) -> None:
        self._history.append(op)
        self._ended[op.status.value] += 1
        partner = self._partner.pop(op.id, None)
        if partner is None:
            return
        self._partner.pop(partner.id, None)
        if op.status != OpStatus.SUCCESS and not partner.status.is_end:
            why = f"merge partner #{op.id} on region {op.region_id} ended {op.status.value}"
            self._finish(partner, OpStatus.CANCELED, op.ended_at, why)

    # -- reading ---------------------------------------------------------
    def get(self, region_id: int) -> Operator | None:
        """The region's running operator (not a waiting one: see ``get_waiting``)."""
        return self._running.get(region_id)

    def get_waiting(self, region_id: int) -> Operator | None:
        entry = self._waiting.get(region_id)
        return None if entry is None else next(op for op in entry.ops if op.region_id == region_id)

    def running(self) -> list[Operator]:
        return list(self._running.values())

    def waiting(self) -> list[Operator]:
        """Queued operators in the order ``promote_waiting`` would try them."""
        return [op for e in sorted(e for e in self._queue if e.alive) for op in e.ops]

    def busy_region_ids(self) -> set[int]:
        """Regions with a running or waiting operator (for ``ScheduleContext.busy_regions``)."""
        return set(self._running) | set(self._waiting)

    def operator_count(self, kind: OpKind) -> int:
        """Running operators whose kind carries ``kind`` (one of the limited flags)."""
        if kind in self._kind_counts:
            return self._kind_counts[kind]
        return sum(1 for op in self._running.values() if kind in op.kind)

    def history(self, limit: int | None = None) -> list[Operator]:
        """Ended operators, most recent first (each with its status and cancel_reason)."""
        items = list(reversed(self._history))
        return items if limit is None else items[:limit]

    def counts_by_status(self) -> dict[str, int]:
        """Running operators by status (created, started), queued ones under
        "waiting", and every operator ended so far by its final status."""
        out: Counter[str] = Counter(op.status.value for op in self._running.values())
        out["waiting"] = sum(len(e.ops) for e in {id(e): e for e in self._waiting.values()}.values())
        out.update(self._ended)
        return {k: v for k, v in out.items() if v}

    def influence(self) -> dict[int, StoreInfluence]:
        """Per store, what the running operators' remaining steps will change
        once they finish (PD's pending influence)."""
        out: dict[int, StoreInfluence] = {}

        def at(store_id: int) -> StoreInfluence:
            inf = out.get(store_id)
            if inf is None:
                inf = out[store_id] = StoreInfluence()
            return inf

        for op in self._running.values():
            region = self.cluster.regions.get(op.region_id)
            if region is None:
                continue
            size = region.approximate_size
            for step in op.steps[op.current:]:
                if isinstance(step, (AddLearner, AddPeer)):
                    inf = at(step.to_store)
                    inf.region_size += size
                    inf.region_count += 1
                elif isinstance(step, RemovePeer):
                    inf = at(step.from_store)
                    inf.region_size -= size
                    inf.region_count -= 1
                elif isinstance(step, TransferLeader):
                    src, dst = at(step.from_store), at(step.to_store)
                    src.leader_size -= size
                    src.leader_count -= 1
                    dst.leader_size += size
                    dst.leader_count += 1
                elif isinstance(step, MergeRegion) and step.is_passive:
                    # two regions become one on the target's stores (sizes add up: no change)
                    for p in region.peers:
                        at(p.store_id).region_count -= 1
                    if region.leader is not None:
                        at(region.leader.store_id).leader_count -= 1
                elif isinstance(step, SplitRegion):
                    for p in region.peers:
                        at(p.store_id).region_count += 1
                    if region.leader is not None:
                        at(region.leader.store_id).leader_count += 1
        return out

    def to_json(self) -> dict:
        return {"running": [op.to_json() for op in self._running.values()],
                "waiting": [op.to_json() for op in self.waiting()],
                "counts": self.counts_by_status()}

    # -- helpers ---------------------------------------------------------
    def _t(self, now: float | None) -> float:
        return self.clock() if now is None else now
