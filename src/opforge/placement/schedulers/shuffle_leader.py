"""shuffle-leader: move random leaders to random stores (PD's
shuffle_leader.go). For tests and chaos drills, not for production balance.

Each operator picks a random store that may take leaders, a random healthy
region it follows, and transfers the leadership to it.
"""

from __future__ import annotations

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import transfer_leader
from opforge.placement.operator.operator import Operator, OpKind


class ShuffleLeaderScheduler:
    name = "shuffle-leader"

    def __init__(self, batch: int = 4, retry: int = 10):
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.retry = int(retry)

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        local = sc.local_context(ctx)
        cluster = ctx.cluster
        targets = [s for s in cluster.stores.values() if flt.leader_store_target_reason(local, s) is None]
        ops: list[Operator] = []
        for _ in range(self.batch * self.retry):
            if len(ops) >= self.batch or not targets:
                break
            tgt = local.rng.choice(targets)

            def accept(r) -> bool:
                return (flt.schedulable(local, r)
                        and flt.leader_source_reason(local, cluster.get_store(r.leader.store_id)) is None
                        and flt.leader_target_reason(local, r, tgt) is None)

            region = next(flt.sample_regions(cluster, cluster.follower_region_ids(tgt.id), local.rng, 1, accept),
                          None)
            if region is None:
                continue
            op = transfer_leader(self.name, region, tgt.id, local.now, kind=OpKind.LEADER)
            sc.note_operator(local, op, region)
            ops.append(op)
        return ops
