"""scatter-range: spread the regions of one key range ``[start_key, end_key)``
evenly over the stores (PD's scatter_range.go, which balances a "range
cluster"). The range holds the regions that start inside it; ``end_key`` b""
means to the end of the key space.

Each call counts, per store, the peers and the leaders of the range's regions
(with the moves still running), then moves peers from the store with the
most to the store with the fewest while they differ by two or more (so a move
never reverses the order), and does the same for leaders with leader
transfers. It ends with every eligible store within one peer (and, where the
peers allow, one leader) of every other. Targets pass the usual filters,
isolation over ``location_labels`` included.

Cost per call, never O(regions) for a large range:

* the whole key space (no keys given): the cluster's per-store counts and the
  running operators' influence, O(stores);
* a range of at most ``scan_limit`` regions: one exact pass over it;
* a larger range: counts kept from a rolling scan of ``scan_limit`` regions
  per call (it schedules once a first sweep is complete), and regions picked
  by random position in the range.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Region
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer, transfer_leader
from opforge.placement.operator.operator import Operator, OpKind


def _key(k: bytes | str | None, name: str) -> bytes:
    """A key given as bytes or text (its UTF-8 bytes); anything else is refused
    (``bytes(5)`` would be five zero bytes)."""
    if k is None:
        return b""
    if isinstance(k, str):
        return k.encode()
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k)
    raise ValueError(f"scatter-range: {name} must be a string or bytes, got {type(k).__name__} {k!r}")


class ScatterRangeScheduler:
    name = "scatter-range"

    def __init__(self, start_key: bytes | str = b"", end_key: bytes | str = b"", range_name: str = "",
                 batch: int = 4, scan_limit: int = 1024, probe_budget: int = 2048):
        self.start_key = _key(start_key, "start_key")
        self.end_key = _key(end_key, "end_key")
        if self.end_key and self.start_key >= self.end_key:
            raise ValueError(f"scatter-range: start_key {self.start_key!r} must sort before end_key {self.end_key!r}")
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if int(scan_limit) < 1:
            raise ValueError(f"scan_limit must be >= 1, got {scan_limit}")
        self.range_name = range_name
        self.batch = int(batch)
        self.scan_limit = int(scan_limit)
        self.probe_budget = int(probe_budget)  # random picks per call (large ranges), for a bounded cost
        self._probes_left = self.probe_budget
        # region id -> (from store, to store, moves a peer, moves the leader) of operators we proposed
        self._pending: dict[int, tuple[int, int, bool, bool]] = {}
        # rolling counts (large ranges): region id -> (its stores, its leader's store)
        self._contrib: dict[int, tuple[tuple[int, ...], int | None]] = {}
        self._peers_roll: Counter[int] = Counter()
        self._leaders_roll: Counter[int] = Counter()
        self._cursor: bytes | None = None
        self._seen: set[int] = set()
        self._swept = False

    @property
    def whole(self) -> bool:
        return self.start_key == b"" and self.end_key == b""

    def in_range(self, region: Region) -> bool:
        """The range holds the regions that start in ``[start_key, end_key)``."""
        return region.start_key >= self.start_key and (self.end_key == b"" or region.start_key < self.end_key)

    # -- counting -------------------------------------------------------------
    def _account(self, rid: int, region: Region | None) -> None:
        old = self._contrib.pop(rid, None)
        if old is not None:
            for s in old[0]:
                self._peers_roll[s] -= 1
            if old[1] is not None:
                self._leaders_roll[old[1]] -= 1
        if region is not None and self.in_range(region):
            stores = tuple(p.store_id for p in region.peers)
            lead = region.leader.store_id if region.leader is not None else None
            self._contrib[rid] = (stores, lead)
            for s in stores:
                self._peers_roll[s] += 1
            if lead is not None:
                self._leaders_roll[lead] += 1

    def _reset_roll(self) -> None:
        self._contrib.clear()
        self._peers_roll.clear()
        self._leaders_roll.clear()
        self._cursor, self._seen, self._swept = None, set(), False

    def _roll(self, view: flt.RangeView) -> None:
        n = len(view)
        i = view.index_of(self._cursor) if self._cursor is not None else 0
        for _ in range(min(self.scan_limit, n)):
            if i >= n:
                self._end_sweep()
                i = 0
            r = view.at(i)
            i += 1
            if r is not None:
                self._account(r.id, r)
                self._seen.add(r.id)
        if i >= n:
            self._end_sweep()
            i = 0
        nxt = view.at(i) if i < n else None
        self._cursor = nxt.start_key if nxt is not None else None

    def _end_sweep(self) -> None:
        for rid in [rid for rid in self._contrib if rid not in self._seen]:
            self._account(rid, None)  # gone from the range since the last sweep
        self._seen = set()
        self._swept = True

    def counts(self, ctx: ScheduleContext) -> tuple[Counter, Counter, dict | None, dict | None]:
        """Peers and leaders of the range per store (with running moves), and,
        for a small range, its regions by the store of each peer / leader."""
        cluster = ctx.cluster
        if self.whole:
            self._reset_roll()
            peers = Counter({s: cluster.region_count(s) + ctx.store_influence(s).region_count
                             for s in cluster.stores})
            leaders = Counter({s: cluster.leader_count(s) + ctx.store_influence(s).leader_count
                               for s in cluster.stores})
            return peers, leaders, None, None
        view = flt.RangeView(cluster, self.start_key, self.end_key)
        by_peer: dict[int, list[Region]] | None = None
        by_leader: dict[int, list[Region]] | None = None
        if len(view) <= self.scan_limit:
            self._reset_roll()
            peers, leaders, by_peer, by_leader = Counter(), Counter(), {}, {}
            for i in range(len(view)):
                r = view.at(i)
                if r is None:
                    continue
                for p in r.peers:
                    peers[p.store_id] += 1
                    by_peer.setdefault(p.store_id, []).append(r)
                if r.leader is not None:
                    leaders[r.leader.store_id] += 1
                    by_leader.setdefault(r.leader.store_id, []).append(r)
        else:
            self._roll(view)
            peers, leaders = Counter(self._peers_roll), Counter(self._leaders_roll)
        for src, dst, moves_peer, moves_leader in self._pending.values():
            if moves_peer:
                peers[src] -= 1
                peers[dst] += 1
            if moves_leader:
                leaders[src] -= 1
                leaders[dst] += 1
        return peers, leaders, by_peer, by_leader

    # -- scheduling -------------------------------------------------------------
    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        cluster = ctx.cluster
        for rid in [rid for rid in self._pending if rid not in ctx.busy_regions]:
            del self._pending[rid]
            if self._contrib or self._swept:
                self._account(rid, cluster.regions.get(rid))  # its operator ended: count what it left
        peers, leaders, by_peer, by_leader = self.counts(ctx)
        if by_peer is None and not self.whole and not self._swept:
            return []  # a large range: wait for the first full sweep
        local = sc.local_context(ctx)
        view = None if by_peer is not None or self.whole else flt.RangeView(cluster, self.start_key, self.end_key)
        self._probes_left = self.probe_budget
        stores = list(cluster.stores.values())
        ops: list[Operator] = []
        sources = [s.id for s in stores if flt.region_source_reason(local, s) is None]
        targets = [s.id for s in stores if flt.store_target_reason(local, s) is None]
        while len(ops) < self.batch:
            op = self._move_peer(local, peers, leaders, by_peer, view, sources, targets)
            if op is None:
                break
            ops.append(op)
        lsources = [s.id for s in stores if flt.leader_source_reason(local, s) is None]
        ltargets = [s.id for s in stores if flt.leader_store_target_reason(local, s) is None]
        while len(ops) < self.batch:
            op = self._move_leader(local, leaders, by_leader, view, lsources, ltargets)
            if op is None:
                break
            ops.append(op)
        return ops

    def _candidates(self, local: ScheduleContext, store: int, lists: dict[int, list[Region]] | None,
                    view: flt.RangeView | None, ok: Callable[[Region], bool]):
        """Regions of the range on ``store`` (as ``lists`` says, or found by
        random position in ``view``) that pass ``ok``: all of them in random
        order for a small range, a bounded number of probes otherwise."""
        if lists is not None:
            cands = lists.get(store, [])
            for i in local.rng.sample(range(len(cands)), len(cands)):
                if ok(cands[i]):
                    yield cands[i]
            return
        per_pair = min(self.probe_budget, 16 * max(len(local.cluster.stores), 8))
        if view is None:  # the whole key space: the cluster's own per-store sets
            cluster = local.cluster
            for ids in (cluster.follower_region_ids(store), cluster.leader_region_ids(store)):
                probes = min(self._probes_left, per_pair // 2)
                if probes <= 0:
                    return
                self._probes_left -= probes
                yield from flt.sample_regions(cluster, ids, local.rng, 4, ok, draws=probes, max_probes=probes)
            return
        for _ in range(per_pair):
            if self._probes_left <= 0:
                return
            self._probes_left -= 1
            r = view.random(local.rng)
            if r is not None and ok(r):
                yield r

    def _pairs(self, counts: Counter, sources: list[int], targets: list[int]):
        """(source, target) pairs that differ by two or more, most uneven first
        (sources by count, then targets); probing stops them when its budget is spent."""
        srcs = sorted(sources, key=lambda s: (-counts[s], s))
        tgts = sorted(targets, key=lambda s: (counts[s], s))
        for src in srcs:
            for dst in tgts:
                if counts[src] - counts[dst] < 2:
                    break
                if self._probes_left <= 0:
                    return
                yield src, dst

    def _move_peer(self, local: ScheduleContext, peers: Counter, leaders: Counter,
                   by_peer: dict[int, list[Region]] | None, view: flt.RangeView | None, sources: list[int],
                   targets: list[int]) -> Operator | None:
        cluster = local.cluster
        for src, dst in self._pairs(peers, sources, targets):
            src_store, dst_store = cluster.get_store(src), cluster.get_store(dst)

            def ok(r: Region) -> bool:
                return (r.peer_on(src) is not None and self.in_range(r)
                        and flt.schedulable(local, r, replicated=True)
                        and flt.region_target_reason(local, r, dst_store, src_store, store_checked=True) is None)

            r = next(self._candidates(local, src, by_peer, view, ok), None)
            if r is None:
                continue
            op = move_peer(self.name, r, src, dst, local.ids, local.now, kind=OpKind.REGION)
            moves_leader = r.leader is not None and r.leader.store_id == src
            self._note(local, op, r, src, dst, True, moves_leader)
            peers[src] -= 1
            peers[dst] += 1
            if moves_leader:
                leaders[src] -= 1
                leaders[dst] += 1
            return op
        return None

    def _move_leader(self, local: ScheduleContext, leaders: Counter, by_leader: dict[int, list[Region]] | None,
                     view: flt.RangeView | None, sources: list[int], targets: list[int]) -> Operator | None:
        cluster = local.cluster
        for src, dst in self._pairs(leaders, sources, targets):
            dst_store = cluster.get_store(dst)

            def ok(r: Region) -> bool:
                return (r.leader is not None and r.leader.store_id == src and self.in_range(r)
                        and flt.schedulable(local, r) and flt.leader_target_reason(local, r, dst_store) is None)

            if by_leader is None and view is None:  # whole key space: regions src leads that dst follows
                probes = min(self._probes_left, 16 * max(len(cluster.stores), 8))
                self._probes_left -= probes
                r = next(flt.sample_regions(cluster, cluster.leader_region_ids(src), local.rng, 1, ok,
                                            draws=probes, max_probes=probes), None)
            else:
                r = next(self._candidates(local, src, by_leader, view, ok), None)
            if r is None:
                continue
            op = transfer_leader(self.name, r, dst, local.now, kind=OpKind.LEADER)
            self._note(local, op, r, src, dst, False, True)
            leaders[src] -= 1
            leaders[dst] += 1
            return op
        return None

    def _note(self, local: ScheduleContext, op: Operator, r: Region, src: int, dst: int, moves_peer: bool,
              moves_leader: bool) -> None:
        sc.note_operator(local, op, r)
        if not self.whole:  # the whole key space counts running operators through their influence
            self._pending[r.id] = (src, dst, moves_peer, moves_leader)
