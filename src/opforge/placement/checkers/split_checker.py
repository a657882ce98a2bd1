"""The split checker: proposes splitting a region that is too big, too hot,
or spans a placement-rule boundary (PD's split checker, plus the size and
load checks TiKV makes itself).

A region gets a ``split_region`` operator when, in this order:

1. **boundaries**: a placement-rule boundary (``RuleManager.split_keys``) or
   a known key boundary (``add_boundaries``: table or partition starts, ...)
   lies strictly inside it -> split exactly there (``split-by-boundary``);
2. **size**: ``approximate_size > region_max_size`` or
   ``approximate_keys > region_max_keys`` -> ``split-oversized``;
3. **load**: its load is far above the average region's. The load rule:
   with ``B(r) = written_bytes + read_bytes`` and ``Q(r) = query_num`` (the
   flow of the last heartbeat interval), and the means ``mean_B`` / ``mean_Q``
   taken over the *other* regions of the cluster, the region is split when
   the cluster has at least ``min_regions`` regions and either
   ``B > load_factor * mean_B and B >= min_load_bytes`` or
   ``Q > load_factor * mean_Q and Q >= min_load_queries``
   (defaults: 4x the average, 30 MiB and 3000 queries per second: TiKV's
   load-base-split thresholds; below them a hot region is the hot-region
   scheduler's to move, not to split) -> ``split-hot``.
   The sums behind the means are the cluster's running totals, so the
   rule costs O(1) per region.

For 2 and 3, :meth:`SplitChecker.suggest_split_keys` gives the keys when it
knows some (boundaries inside the region); an empty tuple lets the leader
split at the middle of its data. Regions without a leader, in joint
consensus, with a single key, or with an operator running are skipped.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from opforge.placement.cluster import Region
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import split_region
from opforge.placement.operator.operator import Operator, Priority
from opforge.placement.rules import RuleManager


class SplitChecker:
    name = "split-checker"

    def __init__(self, rules: RuleManager | None = None, boundaries: Iterable[bytes] = (), *,
                 load_factor: float = 4.0, min_load_bytes: int = 30 << 20, min_load_queries: int = 3000,
                 min_regions: int = 4):
        self.rules = rules  # None: ctx.rules when set (no rules: no rule boundaries)
        self._boundaries: list[bytes] = []
        self.add_boundaries(boundaries)
        self.load_factor = load_factor
        self.min_load_bytes = min_load_bytes
        self.min_load_queries = min_load_queries
        self.min_regions = min_regions

    def add_boundaries(self, keys: Iterable[bytes]) -> None:
        """Keys a region should never span (e.g. where tables or partitions start)."""
        for k in keys:
            if not isinstance(k, bytes):
                raise ValueError(f"split boundary must be bytes, got {type(k).__name__}")
            if k and k not in self._boundaries:
                bisect.insort(self._boundaries, k)

    def suggest_split_keys(self, region: Region, rules: RuleManager | None = None) -> tuple[bytes, ...]:
        """Known keys strictly inside ``region`` to split at: placement-rule
        boundaries and the boundaries given to ``add_boundaries``. Empty when
        none is known (the leader then picks the middle)."""
        keys = set()
        rm = rules if rules is not None else self.rules
        if rm is not None:
            keys.update(rm.split_keys(region.start_key, region.end_key))
        i = bisect.bisect_right(self._boundaries, region.start_key)
        while i < len(self._boundaries):
            k = self._boundaries[i]
            if region.end_key != b"" and k >= region.end_key:
                break
            keys.add(k)
            i += 1
        return tuple(sorted(k for k in keys if region.contains(k) and k != region.start_key))

    def check(self, region: Region, ctx: ScheduleContext) -> list[Operator]:
        if region.leader is None or region.in_joint_state or region.id in ctx.busy_regions:
            return []
        rm = self.rules if self.rules is not None else ctx.rules
        keys = self.suggest_split_keys(region, rm)
        if keys:
            return [split_region("split-by-boundary", region, ctx.now, keys, Priority.MEDIUM)]
        if region.approximate_keys == 1:
            return []  # one key cannot be split
        cfg = ctx.config
        if region.approximate_size > cfg.region_max_size or region.approximate_keys > cfg.region_max_keys:
            return [split_region("split-oversized", region, ctx.now, (), Priority.MEDIUM)]
        if self.is_hot(region, ctx):
            return [split_region("split-hot", region, ctx.now, (), Priority.MEDIUM)]
        return []

    # -- load --------------------------------------------------------------
    def is_hot(self, region: Region, ctx: ScheduleContext) -> bool:
        """The load rule of the module docstring."""
        cluster = ctx.cluster
        b_sum, q_sum, n = cluster.total_flow_bytes, cluster.total_queries, len(cluster.regions)
        known = cluster.regions.get(region.id)
        if known is not None:  # the average is over the other regions
            n -= 1
            b_sum -= known.written_bytes + known.read_bytes
            q_sum -= known.query_num
        if n + 1 < self.min_regions or n <= 0:
            return False
        b = region.written_bytes + region.read_bytes
        q = region.query_num
        hot_bytes = b >= self.min_load_bytes and b > self.load_factor * (b_sum / n)
        hot_queries = q >= self.min_load_queries and q > self.load_factor * (q_sum / n)
        return hot_bytes or hot_queries
