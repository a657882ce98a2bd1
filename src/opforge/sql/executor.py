"""Runs a logical/physical plan bottom-up over whole-column batches (pull model, one batch per operator).

Each operator's inputs are computed first, then the operator itself runs: under EXPLAIN ANALYZE the
``Profiler`` measures exactly that second step, so every figure is the operator's own."""
from __future__ import annotations

import pyarrow as pa

from opforge.sql import plan as P
from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr import Batch
from opforge.sql.physical.aggregate import run_aggregate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.distinct import run_distinct
from opforge.sql.physical.filter import keep_rows
from opforge.sql.physical.join import run_join
from opforge.sql.physical.limit import run_limit
from opforge.sql.physical.project import run_project
from opforge.sql.physical.scan import run_scan
from opforge.sql.physical.sort import run_sort
from opforge.sql.physical.topk import run_topk
from opforge.sql.physical.union import run_union
from opforge.sql.profile import Profiler, batch_bytes


class Executor:
    def __init__(self, tables: dict, device, ctx: ExecContext | None = None, profiler: Profiler | None = None):
        self.tables, self.device = tables, device
        self.ctx = ctx or ExecContext()
        self.profiler = profiler

    def run(self, node: P.Node) -> Batch:
        if isinstance(node, P.Scan) and node.table not in self.tables:
            raise SqlError(f"table {node.table!r} is no longer registered")
        inputs = [self.run(c) for c in node.inputs()]
        if self.profiler is None:
            return self._operator(node, inputs)
        if isinstance(node, P.Scan):
            table = self.tables[node.table]
            bytes_in = batch_bytes(Batch({o.cid: table.column(o.name) for o in node.outputs}, table.num_rows, self.device))
        else:
            bytes_in = sum(batch_bytes(b) for b in inputs)
        return self.profiler.measure(node, lambda: self._operator(node, inputs), bytes_in, self.ctx)

    def _operator(self, node: P.Node, inputs: list[Batch]) -> Batch:
        ctx = self.ctx
        if isinstance(node, P.Scan):
            return run_scan(node, self.tables[node.table], self.device)
        if isinstance(node, P.OneRow):
            return Batch({}, 1, self.device)
        if isinstance(node, P.Filter):
            return keep_rows(node.predicate, inputs[0])
        if isinstance(node, P.Project):
            return run_project(node, inputs[0])
        if isinstance(node, P.Aggregate):
            return run_aggregate(node, inputs[0], ctx)
        if isinstance(node, P.Join):
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
        if isinstance(node, P.Union):
            return run_union(node, inputs, [[o.cid for o in c.outputs] for c in node.children])
        raise SqlError(f"internal: no operator for {type(node).__name__}")

    def to_arrow(self, node: P.Node) -> pa.Table:
        batch = self.run(node)
        arrays, names = [], []
        for o in node.outputs:
            col: Column = batch.cols[o.cid]
            arrays.append(col.to_arrow())
            names.append(o.name)
        return pa.Table.from_arrays(arrays, names=names)
