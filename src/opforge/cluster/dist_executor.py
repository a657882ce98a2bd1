"""One worker's part of a distributed SQL query: the single-process executor's operators, with the
exchanges between workers inserted where a plan node needs rows from other workers.

Every batch is either *partitioned* (each row on exactly one worker: what a scan of the regions a
worker leads gives) or *replicated* (every worker holds all rows). Each node keeps or changes that:

* scan: partitioned (the worker's leader regions); filter / project: as their input;
* join: semi / anti / left / cross joins see the whole right side (gathered: a NOT IN must see
  every NULL), right joins the whole left; an inner join gathers a small right side (broadcast,
  ``planner/distribution.py``'s rule over the global bytes), else both sides are shuffled by a hash
  of the keys (partitioned); full joins are always shuffled;
* aggregate: grouped ones shuffle their input by the group keys and aggregate locally (each group
  on one worker); global ones gather their input;
* sort, top-k, limit, distinct, window, union: gather, then run the same operator everywhere.

Runtime filters are off here (a filter built from one worker's share of the build side would
drop rows that match elsewhere). Per-operator rows and bytes moved are kept in ``stats`` for the
driver's EXPLAIN ANALYZE-style report.
"""
from __future__ import annotations

import time

import torch

from opforge.cluster import exchange as X
from opforge.sql import plan as P
from opforge.sql.expr import Batch
from opforge.sql.expr.evaluation import evaluate
from opforge.sql.executor import Executor
from opforge.sql.physical.cross_product import aggregate_cross_product, aggregates_without_pairs
from opforge.sql.planner.distribution import choose_distribution

PARTITIONED, REPLICATED = "partitioned", "replicated"
GATHER_RIGHT = ("semi", "anti", "left", "cross")


class DistributedExecutor(Executor):
    """Runs a plan on this worker; ``group``: the cluster's process group (None: the default one)."""

    def __init__(self, tables: dict, device, ctx, world: int, group=None):
        ctx.runtime_filters = False
        super().__init__(tables, device, ctx)
        self.world, self.group = world, group
        self.stats: list[dict] = []  # one per exchange: node, kind, rows in / out, bytes, ms

    # -- exchanges ----------------------------------------------------------------------------------
    def _exchange(self, node, kind: str, batch: Batch, move) -> Batch:
        t0 = time.perf_counter()
        out = move(batch)
        self.stats.append({"node": node.describe()[:80], "exchange": kind, "rows_in": batch.n, "rows_out": out.n,
                           "bytes_sent": X.batch_bytes(batch), "ms": (time.perf_counter() - t0) * 1e3})
        return out

    def _replicated(self, node, item: tuple[Batch, str]) -> Batch:
        batch, spread = item
        if spread == REPLICATED:
            return batch
        return self._exchange(node, "gather", batch, lambda b: X.gather_rows(b, self.group))

    def _by_keys(self, node, item: tuple[Batch, str], keys) -> Batch:
        batch, spread = item
        if spread == REPLICATED:
            batch = X.slice_rows(batch, self.group)
        dest = X.key_dest([evaluate(k, batch) for k in keys], self.world)
        return self._exchange(node, "shuffle", batch, lambda b: X.shuffle_rows(b, dest, self.group))

    def _global_bytes(self, batch: Batch) -> int:
        from opforge.distributed import all_gather, device
        mine = torch.tensor([X.batch_bytes(batch)], dtype=torch.int64, device=device(self.group))
        return int(all_gather(mine, group=self.group).sum())

    # -- the plan -----------------------------------------------------------------------------------
    def run_distributed(self, node: P.Node) -> tuple[Batch, str]:
        if isinstance(node, P.Scan):
            return self._operator(node, [], []), PARTITIONED
        if isinstance(node, P.OneRow):
            return self._operator(node, [], []), REPLICATED
        if aggregates_without_pairs(node):
            join = node.child
            left = self._replicated(join, self.run_distributed(join.left))
            right = self._replicated(join, self.run_distributed(join.right))
            return aggregate_cross_product(node, left, right, self.ctx), REPLICATED
        items = [self.run_distributed(c) for c in node.inputs()]
        if isinstance(node, (P.Filter, P.Project)):
            return self._operator(node, [items[0][0]]), items[0][1]
        if isinstance(node, P.Join):
            return self._join(node, items[0], items[1])
        if isinstance(node, P.Aggregate) and node.keys and items[0][1] == PARTITIONED:
            part = self._by_keys(node, items[0], [e for _, e in node.keys])
            return self._operator(node, [part]), PARTITIONED
        inputs = [self._replicated(node, it) for it in items]
        return self._operator(node, inputs), REPLICATED

    def _join(self, node: P.Join, left, right) -> tuple[Batch, str]:
        (lb, ls), (rb, rs) = left, right
        if ls == REPLICATED and rs == REPLICATED:
            return self._operator(node, [lb, rb]), REPLICATED
        kind = node.kind if node.left_keys else "cross"
        if kind in GATHER_RIGHT or (kind == "inner" and ls == PARTITIONED and rs == REPLICATED):
            if ls == REPLICATED:  # the left side is split so each row is joined once
                lb = X.slice_rows(lb, self.group)
            return self._operator(node, [lb, self._replicated(node, right)]), PARTITIONED
        if kind in ("right", "inner") and ls == REPLICATED:
            return self._operator(node, [lb, rb]), PARTITIONED  # right rows stay where they are
        if kind == "right":
            return self._operator(node, [self._replicated(node, left), rb]), PARTITIONED
        if kind == "inner":
            build, probe = self._global_bytes(rb), self._global_bytes(lb)
            choice = choose_distribution(build, probe, self.world, self.ctx.join_distribution, False)
            if choice.method == "broadcast":
                return self._operator(node, [lb, self._replicated(node, right)]), PARTITIONED
        lp = self._by_keys(node, left, node.left_keys)
        rp = self._by_keys(node, right, node.right_keys)
        return self._operator(node, [lp, rp]), PARTITIONED
