"""balance-region: even out region size (space-aware) across stores
(PD's balance_region.go).

Stores are ranked by region score (size, rising steeply as a store runs low
on space; pending influence included). From the highest-scoring sources, it
picks random healthy, fully replicated regions (followers first, then
leaders, then learners, as PD) and moves the peer to the lowest-scoring
target that passes the filters: up and willing, not holding the region, not
low on space, and keeping the region spread over ``location_labels`` at least
as well. The move is proposed only when
``score(source, -tol) > score(target, +tol)``, so moves never reverse.
"""

from __future__ import annotations

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Region, Store
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer
from opforge.placement.operator.operator import Operator, OpKind


class BalanceRegionScheduler:
    name = "balance-region"

    def __init__(self, batch: int = 4, retry: int = 10):
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.retry = int(retry)
        self._quota: dict[int, int] = {}  # store id -> samples per call, while it keeps failing

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        local = sc.local_context(ctx)
        stores = list(ctx.cluster.stores.values())
        sources = [s for s in stores if flt.region_source_reason(local, s) is None]
        targets = [s for s in stores if flt.store_target_reason(local, s) is None]
        if not sources or not targets:
            return []
        ratio = sc.tolerant_size_ratio(ctx, sc.REGION)
        avg = sc.average_region_size(ctx.cluster)
        min_tol = max(ratio * avg, 1.0)
        ops: list[Operator] = []
        while len(ops) < self.batch:
            op = self._one(local, sources, targets, ratio, avg, min_tol)
            if op is None:
                break
            ops.append(op)
        return ops

    def _one(self, local: ScheduleContext, sources: list[Store], targets: list[Store], ratio: float,
             avg: float, min_tol: float) -> Operator | None:
        src_score = {s.id: sc.store_region_score(local, s.id, -min_tol) for s in sources}
        tgt_score = {t.id: sc.store_region_score(local, t.id, min_tol) for t in targets}
        tgt_order = sorted(targets, key=lambda t: tgt_score[t.id])
        for src in sorted(sources, key=lambda s: -src_score[s.id]):
            low = next((t for t in tgt_order if t.id != src.id), None)
            if low is None or not src_score[src.id] > tgt_score[low.id]:
                break  # sources are in descending order: no later one can do better
            op = self._from_source(local, src, tgt_order, ratio, avg)
            if op is not None:
                return op
        return None

    def _from_source(self, local: ScheduleContext, src: Store, tgt_order: list[Store], ratio: float,
                     avg: float) -> Operator | None:
        cluster = local.cluster

        def accept(r: Region) -> bool:
            return flt.schedulable(local, r, replicated=True)

        tries = self._quota.get(src.id, self.retry)
        for ids in (cluster.follower_region_ids(src.id), cluster.leader_region_ids(src.id),
                    cluster.learner_region_ids(src.id)):
            for region in flt.sample_regions(cluster, ids, local.rng, tries, accept):
                op = self._move(local, region, src, tgt_order, ratio, avg)
                if op is not None:
                    self._quota.pop(src.id, None)
                    return op
        # PD's retry quota: a source that keeps failing is sampled less, down to one try
        self._quota[src.id] = max(tries // 2, 1)
        return None

    def _move(self, local: ScheduleContext, region: Region, src: Store, tgt_order: list[Store], ratio: float,
              avg: float) -> Operator | None:
        tol = sc.tolerant_resource(local, sc.REGION, region, ratio, avg)
        labels = local.config.location_labels
        guard = None
        if labels:
            region_stores = [s for p in region.peers if (s := local.cluster.get_store(p.store_id)) is not None]
            guard = flt.LocationSafeguard(labels, region_stores, src)
        # The first target in score order that passes the filters is the best one.
        best = next((t for t in tgt_order if t.id != src.id and flt.region_target_reason(
            local, region, t, src, guard, store_checked=True) is None), None)
        if best is None or not sc.should_balance(local, sc.REGION, src.id, best.id, tol):
            return None
        op = move_peer(self.name, region, src.id, best.id, local.ids, local.now, kind=OpKind.REGION)
        sc.note_operator(local, op, region)
        return op
