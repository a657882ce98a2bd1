"""Runs a logical/physical plan bottom-up over whole-column batches (pull model, one batch per operator).

Each operator's inputs are computed first, then the operator itself runs: under EXPLAIN ANALYZE the
``Profiler`` measures exactly that second step, so every figure is the operator's own.

Runtime filters (``connect(runtime_filters=True)``, ``physical/runtime_filter.py``): a join that can
make one runs the filter's source input first (the right one of an inner / semi / right join, the
left one of a left / anti join), builds the filter from its keys, and runs the other input with the
filter travelling down to the scans that may apply it.

Out of core (``connect(memory_limit=...)``): ``sql/outofcore/streaming.py`` runs the subtrees whose
data exceed the limit chunk by chunk and the joins / aggregations over them partitioned, spilling.

Shared subtrees (``planner/shared_subtrees.py``): a subtree the plan holds several times under other
column ids (a CTE read twice, the block under a ROLLUP) runs once, without the runtime filters
pushed into it (its result must serve every use), and its result is read again under each copy's
ids, then dropped after its last use. Not out of core: there a subtree's result may not fit."""
from __future__ import annotations

import pyarrow as pa

from opforge.sql import host_scan
from opforge.sql import plan as P
from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr import Batch, Ref
from opforge.sql.physical.aggregate import run_aggregate, run_window
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.cross_product import (
    aggregate_cross_product, aggregates_without_pairs, is_keyless, run_keyless_join,
)
from opforge.sql.physical.distinct import run_distinct
from opforge.sql.physical.filter import keep_rows
from opforge.sql.physical.join import run_join
from opforge.sql.physical.limit import run_limit
from opforge.sql.physical import runtime_filter as RF
from opforge.sql.physical.project import run_project
from opforge.sql.physical.scan import run_scan
from opforge.sql.physical.sort import run_sort
from opforge.sql.physical.topk import run_topk
from opforge.sql.physical.union import run_union
from opforge.sql.physical.window_functions import run_window_functions
from opforge.sql.planner.shared_subtrees import Reuse, plan_reuse
from opforge.sql.profile import Profiler, batch_bytes


class Executor:
    def __init__(self, tables: dict, device, ctx: ExecContext | None = None, profiler: Profiler | None = None):
        self.tables, self.device = tables, device
        self.ctx = ctx or ExecContext()
        self.profiler = profiler
        self.ooc = None
        self.reuse: Reuse | None = None  # planned at the first run(), over its node: the plan's root
        self._results: dict[int, tuple[P.Node, Batch]] = {}  # shape -> (node it ran as, its result)
        if self.ctx.memory_limit is not None:
            from opforge.sql.outofcore.streaming import OutOfCore

            self.ooc = OutOfCore(self)

    def run(self, node: P.Node, pushed: list | None = None) -> Batch:
        """``pushed``: runtime filters (``runtime_filter.Pushed``) this subtree's scans may apply."""
        if isinstance(node, P.Scan) and node.table not in self.tables:
            raise SqlError(f"table {node.table!r} is no longer registered")
        pushed = pushed or []
        if self.reuse is None:
            self.reuse = plan_reuse(node) if self.ooc is None else Reuse()
        shape = self.reuse.key(node)
        if shape is not None:
            return self._shared(node, shape)
        return self._run(node, pushed)

    def _shared(self, node: P.Node, shape: int) -> Batch:
        """A shared subtree's result: computed at its first use, renamed to ``node``'s columns after."""
        if shape not in self._results:
            self._results[shape] = (node, self._run(node, []))
            return self._results[shape][1]
        first, batch = self._results[shape]
        self.reuse.uses[shape] -= 1
        if self.reuse.uses[shape] == 0:
            del self._results[shape]
        rename = {a.cid: b.cid for a, b in zip(first.outputs, node.outputs)}
        out = Batch({rename[a.cid]: batch.cols[a.cid] for a in first.outputs}, batch.n, batch.device)
        out.hash_keys = frozenset(rename[c] for c in batch.hash_keys if c in rename)
        if self.profiler is not None:
            def reused() -> Batch:
                self.ctx.note("result of an identical subtree, computed once, reused")
                return out
            self.profiler.measure(node, reused, 0, self.ctx)
        return out

    def _run(self, node: P.Node, pushed: list) -> Batch:
        if self.ooc is not None:
            out = self.ooc.run(node, pushed)
            if out is not None:
                return out
        routes = RF.route(node, pushed)
        if aggregates_without_pairs(node):  # over a cross product: its two sides, never the pairs
            join = node.child
            sides = RF.route(join, routes[0])
            left, right = self.run(join.left, sides[0]), self.run(join.right, sides[1])
            run = lambda: aggregate_cross_product(node, left, right, self.ctx)  # noqa: E731
            if self.profiler is None:
                return run()
            return self.profiler.measure(node, run, batch_bytes(left) + batch_bytes(right), self.ctx)
        plan = RF.filter_plan(node) if isinstance(node, P.Join) and self.ctx.runtime_filters else None
        if plan is not None and plan.source == "right":
            right = self.run(node.right, routes[1])
            left = self.run(node.left, routes[0] + [RF.make(node, plan, right)])
            inputs = [left, right]
        elif plan is not None:
            left = self.run(node.left, routes[0])
            right = self.run(node.right, routes[1] + [RF.make(node, plan, left)])
            inputs = [left, right]
        else:
            inputs = [self.run(c, r) for c, r in zip(node.inputs(), routes)]
        if self.profiler is None:
            out = self._operator(node, inputs, pushed)
        else:
            if isinstance(node, P.Scan):
                table = self.tables[node.table]
                bytes_in = batch_bytes(Batch({o.cid: table.column(o.name) for o in node.outputs}, table.num_rows,
                                             self.device))
            else:
                bytes_in = sum(batch_bytes(b) for b in inputs)
            out = self.profiler.measure(node, lambda: self._operator(node, inputs, pushed), bytes_in, self.ctx)
        if self.ctx.workers > 1 and not isinstance(node, P.Join):
            out.hash_keys = self._placement(node, inputs)
        return out

    def _placement(self, node: P.Node, inputs: list[Batch]) -> frozenset:
        """The columns whose hash places ``node``'s rows on workers (``physical/simulated_workers.py``)."""
        if isinstance(node, P.Scan):
            key = self.tables[node.table].partition_key
            return frozenset(o.cid for o in node.outputs if o.name == key)
        if isinstance(node, P.Filter):
            return inputs[0].hash_keys
        if isinstance(node, P.Project):
            return frozenset(o.cid for o, e in node.exprs if isinstance(e, Ref) and e.cid in inputs[0].hash_keys)
        return frozenset()

    def _operator(self, node: P.Node, inputs: list[Batch], pushed=()) -> Batch:
        ctx = self.ctx
        if self.ooc is not None and isinstance(node, (P.Join, P.Aggregate, P.Sort, P.Distinct, P.Window,
                                                      P.WindowFunctions)):
            out = self.ooc.operator(node, inputs)
            if out is not None:
                return out
        if isinstance(node, P.Scan):
            return run_scan(node, self.tables[node.table], self.device, pushed, ctx)
        if isinstance(node, P.OneRow):
            return Batch({}, 1, self.device)
        if isinstance(node, P.Filter):
            return keep_rows(node.predicate, inputs[0])
        if isinstance(node, P.Project):
            return run_project(node, inputs[0])
        if isinstance(node, P.Aggregate):
            return run_aggregate(node, inputs[0], ctx)
        if isinstance(node, P.Window):
            return run_window(node, inputs[0], ctx)
        if isinstance(node, P.WindowFunctions):
            return run_window_functions(node, inputs[0], ctx)
        if isinstance(node, P.Join):
            if is_keyless(node) and ctx.workers == 1:
                return run_keyless_join(node, inputs[0], inputs[1], ctx)
            return run_join(node, inputs[0], inputs[1], ctx)
        if isinstance(node, P.TopK):
            return run_topk(node, inputs[0], ctx)
        if isinstance(node, P.Sort):
            return run_sort(node, inputs[0])
        if isinstance(node, P.Limit):
            return run_limit(node, inputs[0])
        if isinstance(node, P.Distinct):
            child = inputs[0]
            keep = Batch({o.cid: child.cols[o.cid] for o in node.outputs}, child.n, child.device)
            return run_distinct(keep)
        if isinstance(node, P.Unnest):
            from opforge.sql.physical.unnest import run_unnest
            return run_unnest(node, inputs[0])
        if isinstance(node, P.Union):
            return run_union(node, inputs, [[o.cid for o in c.outputs] for c in node.children])
        raise SqlError(f"internal: no operator for {type(node).__name__}")

    def to_arrow(self, node: P.Node, *, dictionary: bool = False) -> pa.Table:
        """The result as Arrow; ``dictionary``: strings as dictionary arrays (``Column.to_arrow``).
        A plan that only reads columns of a table is answered from its host data (``host_scan``)."""
        if self.profiler is None:
            passed = host_scan.read(node, self.tables)
            if passed is not None:
                return passed
        batch = self.run(node)
        arrays, names = [], []
        for o in node.outputs:
            col: Column = batch.cols[o.cid]
            arrays.append(col.to_arrow(dictionary))
            names.append(o.name)
        return pa.Table.from_arrays(arrays, names=names)
