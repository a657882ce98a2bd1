"""evict-leader: move every leader off the configured stores (PD's
evict_leader.go), e.g. before restarting a worker.

Each call hands up to ``batch`` random leaders of the evicted stores to the
follower with the lowest leader score (pending influence included) that can
take it. While it runs it pauses leader transfers *onto* those stores, so
balance-leader and the others do not bring leaders back; the pause is renewed
on every call and lapses ``pause_ttl`` seconds after the scheduler stops.
"""

from __future__ import annotations

from typing import Iterable

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import transfer_leader
from opforge.placement.operator.operator import Operator, OpKind, Priority


class EvictLeaderScheduler:
    name = "evict-leader"

    def __init__(self, store_ids: Iterable[int] | int = (), batch: int = 4, pause_ttl: float = 60.0):
        if isinstance(store_ids, int):
            store_ids = (store_ids,)
        self.store_ids: set[int] = {int(s) for s in store_ids}
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.pause_ttl = float(pause_ttl)
        self._released: set[int] = set()

    def add_store(self, store_id: int) -> None:
        self.store_ids.add(int(store_id))
        self._released.discard(int(store_id))

    def remove_store(self, store_id: int) -> None:
        self.store_ids.discard(int(store_id))
        self._released.add(int(store_id))

    def config(self) -> dict:
        return {"store_ids": sorted(self.store_ids), "batch": self.batch}

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        cluster = ctx.cluster
        if self._released:
            flt.resume_leader_transfer(cluster, self._released)
            self._released.clear()
        if not self.store_ids:
            return []
        flt.pause_leader_transfer(cluster, self.store_ids, ctx.now + self.pause_ttl)
        local = sc.local_context(ctx)
        ops: list[Operator] = []
        # Round-robin over the evicted stores so each makes progress.
        pending = sorted(s for s in self.store_ids if cluster.leader_count(s))
        while pending and len(ops) < self.batch:
            nxt = []
            for sid in pending:
                if len(ops) >= self.batch:
                    break
                op = self._evict_one(local, sid)
                if op is not None:
                    ops.append(op)
                    nxt.append(sid)
            pending = nxt
        return ops

    def _evict_one(self, local: ScheduleContext, store_id: int) -> Operator | None:
        cluster = local.cluster

        def accept(r) -> bool:
            return flt.schedulable(local, r, healthy_only=False)

        for region in flt.sample_regions(cluster, cluster.leader_region_ids(store_id), local.rng, 8, accept):
            cands = [p.store_id for p in region.followers() if p.store_id not in self.store_ids
                     and flt.leader_target_reason(local, region, cluster.get_store(p.store_id)) is None]
            if not cands:
                continue
            tgt = min(cands, key=lambda sid: (sc.store_leader_score(local, sid), sid))
            op = transfer_leader(self.name, region, tgt, local.now, kind=OpKind.LEADER, priority=Priority.URGENT)
            sc.note_operator(local, op, region)
            return op
        return None
