"""scatter-range: spread the regions of one key range ``[start_key, end_key)``
evenly over the stores (PD's scatter_range.go, which balances a "range
cluster").

Each call counts, per store, the peers and the leaders of the range's regions
(plus the moves it proposed that are still running), then moves peers from
the store with the most to the store with the fewest while they differ by two
or more (so a move never reverses the order), and does the same for leaders
with leader transfers. It ends with every eligible store within one peer (and,
where the peers allow, one leader) of every other. Targets pass the usual
filters, isolation over ``location_labels`` included.

Cost: one pass over the range's regions per call (as PD, which scans the range).
"""

from __future__ import annotations

from collections import Counter

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Region
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer, transfer_leader
from opforge.placement.operator.operator import Operator, OpKind


def _key(k: bytes | str | None) -> bytes:
    if k is None:
        return b""
    return k.encode() if isinstance(k, str) else bytes(k)


class ScatterRangeScheduler:
    name = "scatter-range"

    def __init__(self, start_key: bytes | str = b"", end_key: bytes | str = b"", range_name: str = "",
                 batch: int = 4):
        self.start_key = _key(start_key)
        self.end_key = _key(end_key)
        if self.end_key and self.start_key >= self.end_key:
            raise ValueError(f"scatter-range: start_key {self.start_key!r} must sort before end_key {self.end_key!r}")
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.range_name = range_name
        self.batch = int(batch)
        # region id -> (from store, to store, moves a peer, moves the leader) of operators we proposed
        self._pending: dict[int, tuple[int, int, bool, bool]] = {}

    def in_range(self, region: Region) -> bool:
        """The range holds the regions that start in ``[start_key, end_key)``."""
        return region.start_key >= self.start_key and (self.end_key == b"" or region.start_key < self.end_key)

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        cluster = ctx.cluster
        local = sc.local_context(ctx)
        self._pending = {rid: v for rid, v in self._pending.items() if rid in ctx.busy_regions}
        regions = [r for r in flt.regions_from(cluster, self.start_key, self.end_key) if self.in_range(r)]
        peers: Counter[int] = Counter()
        leaders: Counter[int] = Counter()
        by_peer: dict[int, list[Region]] = {}
        by_leader: dict[int, list[Region]] = {}
        for r in regions:
            for p in r.peers:
                peers[p.store_id] += 1
                by_peer.setdefault(p.store_id, []).append(r)
            if r.leader is not None:
                leaders[r.leader.store_id] += 1
                by_leader.setdefault(r.leader.store_id, []).append(r)
        for src, dst, moves_peer, moves_leader in self._pending.values():
            if moves_peer:
                peers[src] -= 1
                peers[dst] += 1
            if moves_leader:
                leaders[src] -= 1
                leaders[dst] += 1
        stores = list(cluster.stores.values())
        ops: list[Operator] = []
        sources = [s.id for s in stores if flt.region_source_reason(local, s) is None]
        targets = [s.id for s in stores if flt.store_target_reason(local, s) is None]
        while len(ops) < self.batch:
            op = self._move_peer(local, peers, leaders, by_peer, sources, targets)
            if op is None:
                break
            ops.append(op)
        lsources = [s.id for s in stores if flt.leader_source_reason(local, s) is None]
        ltargets = [s.id for s in stores if flt.leader_store_target_reason(local, s) is None]
        while len(ops) < self.batch:
            op = self._move_leader(local, leaders, by_leader, lsources, ltargets)
            if op is None:
                break
            ops.append(op)
        return ops

    def _move_peer(self, local: ScheduleContext, peers: Counter, leaders: Counter,
                   by_peer: dict[int, list[Region]], sources: list[int], targets: list[int]) -> Operator | None:
        cluster = local.cluster
        for src in sorted(sources, key=lambda s: (-peers[s], s)):
            src_store = cluster.get_store(src)
            for dst in sorted(targets, key=lambda s: (peers[s], s)):
                if peers[src] - peers[dst] < 2:
                    break
                dst_store = cluster.get_store(dst)
                cands = by_peer.get(src, [])
                for i in local.rng.sample(range(len(cands)), len(cands)):
                    r = cands[i]
                    if r.peer_on(src) is None or not flt.schedulable(local, r, replicated=True):
                        continue
                    if flt.region_target_reason(local, r, dst_store, src_store) is not None:
                        continue
                    op = move_peer(self.name, r, src, dst, local.ids, local.now, kind=OpKind.REGION)
                    moves_leader = r.leader is not None and r.leader.store_id == src
                    sc.note_operator(local, op, r)
                    self._pending[r.id] = (src, dst, True, moves_leader)
                    peers[src] -= 1
                    peers[dst] += 1
                    if moves_leader:
                        leaders[src] -= 1
                        leaders[dst] += 1
                    return op
        return None

    def _move_leader(self, local: ScheduleContext, leaders: Counter, by_leader: dict[int, list[Region]],
                     sources: list[int], targets: list[int]) -> Operator | None:
        cluster = local.cluster
        for src in sorted(sources, key=lambda s: (-leaders[s], s)):
            for dst in sorted(targets, key=lambda s: (leaders[s], s)):
                if leaders[src] - leaders[dst] < 2:
                    break
                dst_store = cluster.get_store(dst)
                cands = by_leader.get(src, [])
                for i in local.rng.sample(range(len(cands)), len(cands)):
                    r = cands[i]
                    if r.leader is None or r.leader.store_id != src or not flt.schedulable(local, r):
                        continue
                    if flt.leader_target_reason(local, r, dst_store) is not None:
                        continue
                    op = transfer_leader(self.name, r, dst, local.now, kind=OpKind.LEADER)
                    sc.note_operator(local, op, r)
                    self._pending[r.id] = (src, dst, False, True)
                    leaders[src] -= 1
                    leaders[dst] += 1
                    return op
        return None
