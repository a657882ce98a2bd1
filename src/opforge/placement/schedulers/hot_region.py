"""hot-region: even out the load of hot regions across stores (PD's
hot_region.go, simplified).

A region is *hot* for reads (writes) when one of its read (write) flows per
second reaches the configured threshold: bytes (``hot_region_bytes_threshold``),
keys (``hot_region_keys_threshold``) or, for reads, queries
(``hot_region_query_threshold``). Region flow fields are read as totals over
``report_interval`` seconds (1.0: they are already rates).

Three kinds of load are balanced, each over its dimensions in priority order:

* ``read-leader``: reads are served by leaders; the load of a store is the
  read flow of the hot regions it leads. Moved by transferring the leader to
  a follower, else by moving the leader's peer to another store.
* ``write-leader``: the write flow of the hot regions a store leads (the
  leader does the extra work of a write). Moved by leader transfers.
* ``write-peer``: every replica applies every write; the load of a store is
  the write flow of the hot regions it holds a peer of. Moved by peer moves.

From the store with the highest load, a hot region whose flow ``x`` is moved
to the coolest eligible store ``t`` only if the hottest of the two stays
clearly below where the source was (``max(src - x, t + x) * tolerance_ratio <=
src``) and no dimension of higher priority gets more uneven (``x <= src - t``
on each). The sum of squared loads therefore falls with every move: no move
undoes another and the loads settle. Operators it proposed count as pending
influence until their region has no operator any more.

The hot regions come from a cache: ``observe(region)`` (call it on region
heartbeats) adds a region, and each call rescans ``scan_per_call`` regions in
key order (all of them in a small cluster) and rechecks the cached ones, so a
call costs O(hot regions + scan_per_call), not O(regions).
"""

from __future__ import annotations

from collections import defaultdict

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Region, Store
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer, transfer_leader
from opforge.placement.operator.operator import Operator, OpKind

READ = "read"
WRITE = "write"
READ_LEADER = "read-leader"
WRITE_LEADER = "write-leader"
WRITE_PEER = "write-peer"
KINDS = (READ_LEADER, WRITE_PEER, WRITE_LEADER)
DIMS = ("bytes", "keys", "query")

_FIELDS = {
    (READ, "bytes"): "read_bytes", (READ, "keys"): "read_keys", (READ, "query"): "query_num",
    (WRITE, "bytes"): "written_bytes", (WRITE, "keys"): "written_keys",
}
DEFAULT_PRIORITIES = {READ_LEADER: ("query", "bytes"), WRITE_LEADER: ("keys", "bytes"),
                      WRITE_PEER: ("bytes", "keys")}


def rw_of(kind: str) -> str:
    return READ if kind == READ_LEADER else WRITE


def thresholds(config: ScheduleConfig) -> dict[str, float]:
    return {"bytes": config.hot_region_bytes_threshold, "keys": config.hot_region_keys_threshold,
            "query": config.hot_region_query_threshold}


def region_flow(region: Region, rw: str, dims: tuple[str, ...], interval: float = 1.0) -> tuple[float, ...]:
    """The region's ``rw`` flow per second along ``dims`` (0 where not measured)."""
    return tuple(getattr(region, _FIELDS[(rw, d)]) / interval if (rw, d) in _FIELDS else 0.0 for d in dims)


def is_hot(region: Region, rw: str, config: ScheduleConfig, interval: float = 1.0) -> bool:
    th = thresholds(config)
    for d in DIMS:
        f = _FIELDS.get((rw, d))
        if f is not None and th[d] > 0 and getattr(region, f) / interval >= th[d]:
            return True
    return False


class HotRegionScheduler:
    name = "hot-region"

    def __init__(self, batch: int = 4, report_interval: float = 1.0, kinds: tuple[str, ...] = KINDS,
                 priorities: dict[str, tuple[str, ...]] | None = None, tolerance_ratio: float = 1.05,
                 scan_per_call: int = 1024, top_regions: int = 16):
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if report_interval <= 0:
            raise ValueError(f"report_interval must be > 0, got {report_interval}")
        for k in kinds:
            if k not in KINDS:
                raise ValueError(f"unknown hot-region kind {k!r}; known: {list(KINDS)}")
        self.batch = int(batch)
        self.report_interval = float(report_interval)
        self.kinds = tuple(kinds)
        self.priorities = dict(DEFAULT_PRIORITIES)
        for k, dims in (priorities or {}).items():
            bad = [d for d in dims if d not in DIMS]
            if k not in KINDS or bad or not dims:
                raise ValueError(f"bad hot-region priorities {k!r}: {dims!r} (dims: {list(DIMS)})")
            self.priorities[k] = tuple(dims)
        self.tolerance_ratio = float(tolerance_ratio)
        self.scan_per_call = int(scan_per_call)
        self.top_regions = int(top_regions)
        self._hot: set[int] = set()
        self._cursor = b""
        self._config: ScheduleConfig | None = None
        self._turn = 0
        # region id -> (from store, to store, moves a peer, moves the leader) of operators we proposed
        self._pending: dict[int, tuple[int, int, bool, bool]] = {}

    # -- the hot cache -------------------------------------------------------
    def _hot_any(self, region: Region, config: ScheduleConfig) -> bool:
        return is_hot(region, READ, config, self.report_interval) or is_hot(region, WRITE, config,
                                                                            self.report_interval)

    def observe(self, region: Region, config: ScheduleConfig | None = None) -> None:
        """Note a region from a heartbeat (O(1)); it is used if hot."""
        if self._hot_any(region, config or self._config or ScheduleConfig()):
            self._hot.add(region.id)

    def hot_region_ids(self) -> set[int]:
        return set(self._hot)

    def _refresh(self, ctx: ScheduleContext) -> None:
        cluster, cfg = ctx.cluster, ctx.config
        self._config = cfg
        if len(cluster.regions) <= self.scan_per_call:
            self._hot = {rid for rid, r in cluster.regions.items() if self._hot_any(r, cfg)}
            return
        n, last = 0, None
        for r in flt.regions_from(cluster, self._cursor):
            if self._hot_any(r, cfg):
                self._hot.add(r.id)
            else:
                self._hot.discard(r.id)
            n, last = n + 1, r
            if n >= self.scan_per_call:
                break
        self._cursor = last.end_key if last is not None and n >= self.scan_per_call else b""
        for rid in list(self._hot):
            r = cluster.regions.get(rid)
            if r is None or not self._hot_any(r, cfg):
                self._hot.discard(rid)

    # -- scheduling -----------------------------------------------------------
    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        self._refresh(ctx)
        self._pending = {rid: v for rid, v in self._pending.items() if rid in ctx.busy_regions}
        if not self._hot:
            return []
        local = sc.local_context(ctx)
        kinds = self.kinds[self._turn % len(self.kinds):] + self.kinds[:self._turn % len(self.kinds)]
        self._turn += 1
        ops: list[Operator] = []
        progress = True
        while progress and len(ops) < self.batch:
            progress = False
            for kind in kinds:
                if len(ops) >= self.batch:
                    break
                op = self._one(local, kind)
                if op is not None:
                    ops.append(op)
                    progress = True
        return ops

    def store_loads(self, ctx: ScheduleContext, kind: str) -> dict[int, tuple[float, ...]]:
        """Per-store hot load of ``kind`` along its priority dimensions (pending moves included)."""
        loads, _ = self._loads(ctx, kind)
        return {s: tuple(v) for s, v in loads.items()}

    def _loads(self, ctx: ScheduleContext, kind: str):
        cluster, cfg = ctx.cluster, ctx.config
        rw, dims = rw_of(kind), self.priorities[kind]
        n = len(dims)
        loads: dict[int, list[float]] = defaultdict(lambda: [0.0] * n)
        items: dict[int, list[tuple[Region, tuple[float, ...]]]] = defaultdict(list)
        leader_kind = kind != WRITE_PEER
        flows: dict[int, tuple[float, ...]] = {}
        for rid in self._hot:
            r = cluster.regions.get(rid)
            if r is None or r.leader is None or not is_hot(r, rw, cfg, self.report_interval):
                continue
            f = region_flow(r, rw, dims, self.report_interval)
            flows[rid] = f
            holders = (r.leader.store_id,) if leader_kind else tuple(p.store_id for p in r.peers)
            for s in holders:
                ld = loads[s]
                for i in range(n):
                    ld[i] += f[i]
                items[s].append((r, f))
        for rid, (src, dst, moves_peer, moves_leader) in self._pending.items():
            f = flows.get(rid)
            r = cluster.regions.get(rid)
            if f is None or r is None:
                continue
            if leader_kind:
                if not moves_leader or r.leader.store_id != src:
                    continue
                take, give = True, True
            else:
                if not moves_peer:
                    continue
                take, give = r.peer_on(src) is not None, r.peer_on(dst) is None
            for i in range(n):
                if take:
                    loads[src][i] -= f[i]
                if give:
                    loads[dst][i] += f[i]
        return loads, items

    def _worth(self, ls: list[float], ld: list[float], x: tuple[float, ...], di: int) -> bool:
        for j in range(di):
            if x[j] > ls[j] - ld[j]:
                return False  # a dimension of higher priority would get more uneven
        return x[di] > 0 and max(ls[di] - x[di], ld[di] + x[di]) * self.tolerance_ratio <= ls[di]

    def _one(self, local: ScheduleContext, kind: str) -> Operator | None:
        cluster = local.cluster
        loads, items = self._loads(local, kind)
        if not items:
            return None
        stores = list(cluster.stores.values())
        leader_kind = kind != WRITE_PEER
        source_ok = flt.leader_source_reason if leader_kind else flt.region_source_reason
        sources = [sid for sid in items if source_ok(local, cluster.get_store(sid)) is None]
        region_targets = [s for s in stores if flt.store_target_reason(local, s) is None]
        dims = self.priorities[kind]
        for di in range(len(dims)):
            for src in sorted(sources, key=lambda s: -loads[s][di])[:3]:
                if loads[src][di] <= 0:
                    break
                cands = [(r, f) for r, f in items[src] if f[di] > 0]
                cands.sort(key=lambda rf: -rf[1][di])
                tried = 0
                for r, f in cands:
                    if tried >= self.top_regions:
                        break
                    if not flt.schedulable(local, r):
                        continue
                    tried += 1
                    op = self._try(local, kind, r, f, src, di, loads, region_targets)
                    if op is not None:
                        return op
        return None

    def _try(self, local: ScheduleContext, kind: str, r: Region, f: tuple[float, ...], src: int, di: int,
             loads, region_targets: list[Store]) -> Operator | None:
        cluster = local.cluster
        ls = loads[src]
        if kind != WRITE_PEER:
            best = None
            for p in r.followers():
                t = cluster.get_store(p.store_id)
                if flt.leader_target_reason(local, r, t) is not None or not self._worth(ls, loads[t.id], f, di):
                    continue
                if best is None or (loads[t.id][di], t.id) < (loads[best][di], best):
                    best = t.id
            if best is not None:
                op = transfer_leader(self.name, r, best, local.now, kind=OpKind.HOT | OpKind.LEADER)
                self._note(local, op, r, src, best, False, True)
                return op
            if kind == WRITE_LEADER:
                return None
        if not flt.schedulable(local, r, replicated=True):
            return None
        src_store = cluster.get_store(src)
        guard = None
        if local.config.location_labels:
            region_stores = [s for p in r.peers if (s := cluster.get_store(p.store_id)) is not None]
            guard = flt.LocationSafeguard(local.config.location_labels, region_stores, src_store)
        best = None
        for t in region_targets:
            if not self._worth(ls, loads[t.id], f, di):
                continue
            if flt.region_target_reason(local, r, t, src_store, guard, store_checked=True) is not None:
                continue
            if best is None or (loads[t.id][di], t.id) < (loads[best][di], best):
                best = t.id
        if best is None:
            return None
        op = move_peer(self.name, r, src, best, local.ids, local.now, kind=OpKind.HOT | OpKind.REGION)
        self._note(local, op, r, src, best, True, r.leader.store_id == src)
        return op

    def _note(self, local: ScheduleContext, op: Operator, r: Region, src: int, dst: int, moves_peer: bool,
              moves_leader: bool) -> None:
        sc.note_operator(local, op, r)
        self._pending[r.id] = (src, dst, moves_peer, moves_leader)
