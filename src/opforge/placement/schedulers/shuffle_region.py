"""shuffle-region: move random peers to random stores (PD's
shuffle_region.go). For tests and chaos drills, not for production balance.

Each operator picks a random store that may give peers, a random healthy,
fully replicated region on it, and moves that peer to a random store that
passes the target filters (up and willing, not holding the region, not low on
space, keeping the region's spread over ``location_labels``).
"""

from __future__ import annotations

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer
from opforge.placement.operator.operator import Operator, OpKind


class ShuffleRegionScheduler:
    name = "shuffle-region"

    def __init__(self, batch: int = 4, retry: int = 10):
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.retry = int(retry)

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        local = sc.local_context(ctx)
        cluster = ctx.cluster
        sources = [s for s in cluster.stores.values() if flt.region_source_reason(local, s) is None]
        targets = [s for s in cluster.stores.values() if flt.store_target_reason(local, s) is None]
        ops: list[Operator] = []
        if not sources or not targets:
            return ops
        for _ in range(self.batch * self.retry):
            if len(ops) >= self.batch:
                break
            src = local.rng.choice(sources)
            # A peer of any role, uniformly: pick the role's index by its size
            # (a union of the three sets would cost O(regions on the store)).
            sets = [cluster.leader_region_ids(src.id), cluster.follower_region_ids(src.id),
                    cluster.learner_region_ids(src.id)]
            sizes = [len(x) for x in sets]
            if not sum(sizes):
                continue
            ids = local.rng.choices(sets, weights=sizes)[0]
            region = flt.pick_region(local, ids, replicated=True)
            if region is None:
                continue
            tgt = next((t for t in local.rng.sample(targets, len(targets))
                        if flt.region_target_reason(local, region, t, src, store_checked=True) is None), None)
            if tgt is None:
                continue
            op = move_peer(self.name, region, src.id, tgt.id, local.ids, local.now, kind=OpKind.REGION)
            sc.note_operator(local, op, region)
            ops.append(op)
        return ops
