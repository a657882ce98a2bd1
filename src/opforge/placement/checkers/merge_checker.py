"""The merge checker: folds a small, cold region into a neighbour (PD's merge
checker).

A region is merged when all of these hold:

* it has a leader, is healthy (no down or pending peer, not in joint
  consensus), has no operator running, and is fully replicated (its peers fit
  its placement rules exactly);
* it is small: ``approximate_size <= max_merge_region_size`` and
  ``approximate_keys <= max_merge_region_keys``;
* it is cold: its flow is under the hot-region thresholds
  (``written_bytes + read_bytes``, ``written_keys + read_keys`` and
  ``query_num``, compared with ``hot_region_*_threshold``);
* neither it nor the neighbour split within ``split_merge_interval``
  (the driver reports splits through :meth:`MergeChecker.note_split`).

The neighbour (the one after it, or the one before it when that one is
smaller) must also be healthy, cold, fully replicated and idle, lie in the
same placement-rule range (no rule boundary between them), keep the merged
region within ``region_max_size`` / ``region_max_keys`` (else it would be
split again), and have its peers on exactly the same stores, in the same
roles. PD first moves the source's peers onto the target's stores; this
checker leaves that to the balance schedulers and proposes nothing until
the peers line up.

It returns both merge operators (the source's and the target's).
"""

from __future__ import annotations

from opforge.placement.cluster import Region
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import merge_regions
from opforge.placement.operator.operator import Operator
from opforge.placement.rules import RuleManager, rules_for_context


class MergeChecker:
    name = "merge-checker"

    def __init__(self, rules: RuleManager | None = None):
        self.rules = rules  # None: ctx.rules, or the default rule from ctx.config
        self._split_at: dict[int, float] = {}  # region id -> when it last split

    # -- split memory ------------------------------------------------------
    def note_split(self, region_id: int, now: float) -> None:
        """``region_id`` was made or cut by a split at ``now``: leave it alone
        for ``split_merge_interval``."""
        self._split_at[region_id] = max(now, self._split_at.get(region_id, now))

    def recently_split(self, region_id: int, now: float, interval: float) -> bool:
        t = self._split_at.get(region_id)
        if t is None:
            return False
        if now - t >= interval:
            del self._split_at[region_id]
            return False
        return True

    # -- check -------------------------------------------------------------
    def check(self, region: Region, ctx: ScheduleContext) -> list[Operator]:
        cfg = ctx.config
        if region.approximate_size > cfg.max_merge_region_size or region.approximate_keys > cfg.max_merge_region_keys:
            return []
        if self.recently_split(region.id, ctx.now, cfg.split_merge_interval) or not self._mergeable(region, ctx):
            return []
        prev, nxt = ctx.cluster.adjacent(region)
        target = nxt if self._target_ok(region, nxt, ctx) else None
        if self._target_ok(region, prev, ctx) and (target is None or prev.approximate_size < nxt.approximate_size):
            target = prev
        if target is None:
            return []
        return list(merge_regions("merge-region", region, target, ctx.now))

    def _rm(self, ctx: ScheduleContext) -> RuleManager:
        return self.rules if self.rules is not None else rules_for_context(ctx)

    def _is_cold(self, r: Region, ctx: ScheduleContext) -> bool:
        cfg = ctx.config
        return (r.written_bytes + r.read_bytes < cfg.hot_region_bytes_threshold
                and r.written_keys + r.read_keys < cfg.hot_region_keys_threshold
                and r.query_num < cfg.hot_region_query_threshold)

    def _mergeable(self, r: Region, ctx: ScheduleContext) -> bool:
        """Healthy, idle, led, cold, and exactly as its rules want it."""
        if r.leader is None or not r.is_healthy() or r.id in ctx.busy_regions or not self._is_cold(r, ctx):
            return False
        return self._rm(ctx).fit_region(r, ctx.cluster).is_satisfied()

    def _target_ok(self, region: Region, target: Region | None, ctx: ScheduleContext) -> bool:
        if target is None or target.id == region.id:
            return False
        cfg = ctx.config
        if self.recently_split(target.id, ctx.now, cfg.split_merge_interval):
            return False
        if region.end_key != b"" and region.end_key == target.start_key:
            start, end = region.start_key, target.end_key
        elif target.end_key != b"" and target.end_key == region.start_key:
            start, end = target.start_key, region.end_key
        else:
            return False  # not adjacent
        if self._rm(ctx).split_keys(start, end) or not self._rm(ctx).rules_for_range(start, end):
            return False  # a rule boundary lies between them
        if (region.approximate_size + target.approximate_size > cfg.region_max_size
                or region.approximate_keys + target.approximate_keys > cfg.region_max_keys):
            return False
        if _placement(region) != _placement(target):
            return False
        return self._mergeable(target, ctx)


def _placement(r: Region) -> dict[int, bool]:
    """store id -> is the peer there a voter."""
    return {p.store_id: p.is_voter for p in r.peers}
