"""Runs a logical/physical plan bottom-up over whole-column batches (pull model, one batch per operator)."""
from __future__ import annotations

import pyarrow as pa

from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr import Batch
from opforge.sql.physical.aggregate import run_aggregate
from opforge.sql.physical.distinct import run_distinct
from opforge.sql.physical.filter import keep_rows
from opforge.sql.physical.join import run_join
from opforge.sql.physical.limit import run_limit
from opforge.sql.physical.project import run_project
from opforge.sql.physical.scan import run_scan
from opforge.sql.physical.sort import run_sort
from opforge.sql.physical.union import run_union
from opforge.sql import plan as P


class Executor:
    def __init__(self, tables: dict, device):
        self.tables, self.device = tables, device

    def run(self, node: P.Node) -> Batch:
        if isinstance(node, P.Scan):
            if node.table not in self.tables:
                raise SqlError(f"table {node.table!r} is no longer registered")
            return run_scan(node, self.tables[node.table], self.device)
        if isinstance(node, P.OneRow):
            return Batch({}, 1, self.device)
        if isinstance(node, P.Filter):
            return keep_rows(node.predicate, self.run(node.child))
        if isinstance(node, P.Project):
            return run_project(node, self.run(node.child))
        if isinstance(node, P.Aggregate):
            return run_aggregate(node, self.run(node.child))
        if isinstance(node, P.Join):
            return run_join(node, self.run(node.left), self.run(node.right))
        if isinstance(node, P.Sort):
            return run_sort(node, self.run(node.child))
        if isinstance(node, P.Limit):
            return run_limit(node, self.run(node.child))
        if isinstance(node, P.Distinct):
            child = self.run(node.child)
            keep = Batch({o.cid: child.cols[o.cid] for o in node.outputs}, child.n, child.device)
            return run_distinct(keep)
        if isinstance(node, P.Union):
            batches = [self.run(c) for c in node.children]
            return run_union(node, batches, [[o.cid for o in c.outputs] for c in node.children])
        raise SqlError(f"internal: no operator for {type(node).__name__}")

    def to_arrow(self, node: P.Node) -> pa.Table:
        batch = self.run(node)
        arrays, names = [], []
        for o in node.outputs:
            col: Column = batch.cols[o.cid]
            arrays.append(col.to_arrow())
            names.append(o.name)
        return pa.Table.from_arrays(arrays, names=names)
