"""One worker's part of a distributed SQL query: the single-process executor's operators, with the
exchanges between workers inserted where a plan node needs rows from other workers.

Every batch is either *partitioned* (each row on exactly one worker: what a scan of the regions a
worker leads gives) or *replicated* (every worker holds all rows). Each node keeps or changes that:

* scan: partitioned (the worker's leader regions); filter / project: as their input;
* co-location: a scan of a table hash-partitioned on a key knows its rows' *layout* (the region
  count and the worker leading each region); a join of two inputs laid out alike on their join
  keys (orders and lineitem on the order key, their regions led by the same workers), or an
  aggregate grouped on the layout's key, runs where the rows are: nothing moves. Rows shuffled
  by one key are laid out by it too;
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
from opforge.sql.expr import Batch, Ref
from opforge.sql.expr.evaluation import evaluate
from opforge.sql.executor import Executor
from opforge.sql.physical.cross_product import aggregate_cross_product, aggregates_without_pairs
from opforge.sql.planner.distribution import choose_distribution

PARTITIONED, REPLICATED = "partitioned", "replicated"
GATHER_RIGHT = ("semi", "anti", "left", "cross")


class DistributedExecutor(Executor):
    """Runs a plan on this worker; ``group``: the cluster's process group (None: the default one)."""

    def __init__(self, tables: dict, device, ctx, world: int, group=None, layouts: dict | None = None):
        ctx.runtime_filters = False
        super().__init__(tables, device, ctx)
        self.world, self.group = world, group
        self.layouts = layouts or {}  # table -> (key column, layout signature)
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
        out = self._exchange(node, "shuffle", batch, lambda b: X.shuffle_rows(b, dest, self.group))
        if len(keys) == 1 and isinstance(keys[0], Ref):
            _lay(out, frozenset([keys[0].cid]), f"shuffle/{self.world}")
        return out

    def _global_bytes(self, batch: Batch) -> int:
        from opforge.distributed import all_gather, device
        mine = torch.tensor([X.batch_bytes(batch)], dtype=torch.int64, device=device(self.group))
        return int(all_gather(mine, group=self.group).sum())

    # -- the plan -----------------------------------------------------------------------------------
    def run_distributed(self, node: P.Node) -> tuple[Batch, str]:
        if isinstance(node, P.Scan):
            out = self._operator(node, [], [])
            key, sig = self.layouts.get(node.table, (None, None))
            _lay(out, frozenset(o.cid for o in node.outputs if o.name == key), sig)
            return out, PARTITIONED
        if isinstance(node, P.OneRow):
            return self._operator(node, [], []), REPLICATED
        if aggregates_without_pairs(node):
            join = node.child
            left = self._replicated(join, self.run_distributed(join.left))
            right = self._replicated(join, self.run_distributed(join.right))
            return aggregate_cross_product(node, left, right, self.ctx), REPLICATED
        items = [self.run_distributed(c) for c in node.inputs()]
        if isinstance(node, (P.Filter, P.Project)):
            src = items[0][0]
            out = self._operator(node, [src])
            if isinstance(node, P.Filter):
                _lay(out, src.hash_keys, _layout(src))
            else:
                _lay(out, frozenset(o.cid for o, e in node.exprs if isinstance(e, Ref) and e.cid in src.hash_keys),
                     _layout(src))
            return out, items[0][1]
        if isinstance(node, P.Join):
            return self._join(node, items[0], items[1])
        if isinstance(node, P.Aggregate) and node.keys and items[0][1] == PARTITIONED:
            src = items[0][0]
            on = [o.cid for o, e in node.keys if isinstance(e, Ref) and e.cid in src.hash_keys]
            if on and _layout(src) is not None:  # groups never span workers: aggregate in place
                self.stats.append({"node": node.describe()[:80], "exchange": "none (co-located)", "rows_in": src.n,
                                   "rows_out": src.n, "bytes_sent": 0, "ms": 0.0})
                out = self._operator(node, [src])
                _lay(out, frozenset(on), _layout(src))
                return out, PARTITIONED
            part = self._by_keys(node, items[0], [e for _, e in node.keys])
            return self._operator(node, [part]), PARTITIONED
        inputs = [self._replicated(node, it) for it in items]
        return self._operator(node, inputs), REPLICATED

    def _join(self, node: P.Join, left, right) -> tuple[Batch, str]:
        (lb, ls), (rb, rs) = left, right
        if ls == REPLICATED and rs == REPLICATED:
            return self._operator(node, [lb, rb]), REPLICATED
        kind = node.kind if node.left_keys else "cross"
        if ls == rs == PARTITIONED and _colocated(node, lb, rb):
            self.stats.append({"node": node.describe()[:80], "exchange": "none (co-located)", "rows_in": lb.n + rb.n,
                               "rows_out": lb.n + rb.n, "bytes_sent": 0, "ms": 0.0})
            out = self._operator(node, [lb, rb])
            if kind == "inner":
                _lay(out, frozenset([node.left_keys[0].cid, node.right_keys[0].cid]), _layout(lb))
            elif kind in ("left", "semi", "anti"):
                _lay(out, lb.hash_keys, _layout(lb))
            return out, PARTITIONED
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
        out = self._operator(node, [lp, rp])
        if kind == "inner" and len(node.left_keys) == 1 and lp.hash_keys and rp.hash_keys:
            _lay(out, lp.hash_keys | rp.hash_keys, _layout(lp))
        return out, PARTITIONED


def _lay(batch: Batch, keys: frozenset, layout: str | None) -> None:
    """Record that ``batch``'s rows sit on workers by the hash of column(s) ``keys`` under ``layout``."""
    if keys and layout is not None:
        batch.hash_keys, batch.layout = keys, layout


def _layout(batch: Batch) -> str | None:
    return getattr(batch, "layout", None) if batch.hash_keys else None


def _colocated(node: P.Join, left: Batch, right: Batch) -> bool:
    """One key pair, each side laid out by its key under the same layout."""
    if len(node.left_keys) != 1:
        return False
    lk, rk = node.left_keys[0], node.right_keys[0]
    return (isinstance(lk, Ref) and isinstance(rk, Ref) and lk.cid in left.hash_keys and rk.cid in right.hash_keys
            and _layout(left) is not None and _layout(left) == _layout(right))
