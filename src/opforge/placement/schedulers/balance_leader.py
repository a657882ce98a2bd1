"""balance-leader: even out leaders (by count, or by size) across stores
(PD's balance_leader.go).

Stores are ranked by leader score (with pending influence). From the
highest-scoring source it tries to hand a random leader to the
lowest-scoring follower of that region ("transfer out"); for the
lowest-scoring target it tries to take the leadership of a random region it
follows ("transfer in"). A transfer is proposed only when
``score(source) - tol > score(target) + tol`` (see ``score``), so transfers
never reverse each other.
"""

from __future__ import annotations

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Region, Store
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import transfer_leader
from opforge.placement.operator.operator import Operator, OpKind


class BalanceLeaderScheduler:
    name = "balance-leader"

    def __init__(self, batch: int = 4, policy: str = "count", retry: int = 10):
        if policy not in ("count", "size"):
            raise ValueError(f"balance-leader policy must be 'count' or 'size', got {policy!r}")
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.policy = policy
        self.retry = int(retry)

    @property
    def kind(self) -> str:
        return sc.LEADER_SIZE if self.policy == "size" else sc.LEADER_COUNT

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        local = sc.local_context(ctx)
        stores = list(ctx.cluster.stores.values())
        sources = [s for s in stores if flt.leader_source_reason(local, s) is None]
        targets = [s for s in stores if flt.leader_store_target_reason(local, s) is None]
        if not sources or not targets:
            return []
        ratio = sc.tolerant_size_ratio(ctx, self.kind)
        avg = sc.average_region_size(ctx.cluster) if self.kind == sc.LEADER_SIZE else 1.0
        # No move can use less tolerance than this: pairs failing it are skipped unsampled.
        min_tol = max(ratio, 1.0) if self.kind == sc.LEADER_COUNT else max(ratio * avg, 1.0)
        ops: list[Operator] = []
        while len(ops) < self.batch:
            op = self._one(local, sources, targets, ratio, avg, min_tol)
            if op is None:
                break
            ops.append(op)
        return ops

    def _one(self, local: ScheduleContext, sources: list[Store], targets: list[Store], ratio: float,
             avg: float, min_tol: float) -> Operator | None:
        score = {s.id: sc.store_leader_score(local, s.id, self.kind) for s in (*sources, *targets)}
        src_order = sorted(sources, key=lambda s: -score[s.id])
        tgt_order = sorted(targets, key=lambda s: score[s.id])
        target_ids = {s.id for s in targets}
        source_ids = {s.id for s in sources}
        for i in range(max(len(src_order), len(tgt_order))):
            progressed = False
            if i < len(src_order):
                src = src_order[i]
                low = next((t for t in tgt_order if t.id != src.id), None)
                if low is not None and score[src.id] - min_tol > score[low.id] + min_tol:
                    progressed = True
                    op = self._transfer_out(local, src, target_ids, ratio, avg)
                    if op is not None:
                        return op
            if i < len(tgt_order):
                tgt = tgt_order[i]
                high = next((s for s in src_order if s.id != tgt.id), None)
                if high is not None and score[high.id] - min_tol > score[tgt.id] + min_tol:
                    progressed = True
                    op = self._transfer_in(local, tgt, source_ids, ratio, avg)
                    if op is not None:
                        return op
            if not progressed:
                break  # the orders only get closer from here
        return None

    def _transfer_out(self, local: ScheduleContext, src: Store, target_ids: set[int], ratio: float,
                      avg: float) -> Operator | None:
        ids = local.cluster.leader_region_ids(src.id)
        for region in flt.sample_regions(local.cluster, ids, local.rng, self.retry,
                                            lambda r: flt.schedulable(local, r)):
            cands = [p.store_id for p in region.followers() if p.store_id in target_ids and
                     flt.leader_target_reason(local, region, local.cluster.get_store(p.store_id)) is None]
            if not cands:
                continue
            tgt = min(cands, key=lambda sid: (sc.store_leader_score(local, sid, self.kind), sid))
            op = self._try(local, region, src.id, tgt, ratio, avg)
            if op is not None:
                return op
        return None

    def _transfer_in(self, local: ScheduleContext, tgt: Store, source_ids: set[int], ratio: float,
                     avg: float) -> Operator | None:
        ids = local.cluster.follower_region_ids(tgt.id)
        for region in flt.sample_regions(local.cluster, ids, local.rng, self.retry,
                                            lambda r: flt.schedulable(local, r)):
            src = region.leader.store_id
            if src not in source_ids or flt.leader_target_reason(local, region, tgt) is not None:
                continue
            op = self._try(local, region, src, tgt.id, ratio, avg)
            if op is not None:
                return op
        return None

    def _try(self, local: ScheduleContext, region: Region, src: int, tgt: int, ratio: float,
             avg: float) -> Operator | None:
        tol = sc.tolerant_resource(local, self.kind, region, ratio, avg)
        if not sc.should_balance(local, self.kind, src, tgt, tol):
            return None
        op = transfer_leader(self.name, region, tgt, local.now, kind=OpKind.LEADER)
        sc.note_operator(local, op, region)
        return op
