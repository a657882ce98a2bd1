"""Scan: the selected columns of a registered table, with pushed-down filters applied."""
from __future__ import annotations

from opforge.sql.expr import Batch, and_
from opforge.sql.physical.filter import keep_rows
from opforge.sql.plan import Scan
from opforge.sql.table import Table


def run_scan(node: Scan, table: Table, device) -> Batch:
    cols = {o.cid: table.column(o.name) for o in node.outputs}
    batch = Batch(cols, table.num_rows, device)
    if node.filters:
        batch = keep_rows(and_(node.filters), batch)
    return batch
