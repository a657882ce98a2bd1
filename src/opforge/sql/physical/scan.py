"""Scan: the selected columns of a registered table, with pushed-down filters applied.

On a partitioned table (``table.Table.bounds``) the scan first skips the partitions whose
per-column min / max exclude a filter's range (``col <op> literal`` conjuncts on integer / DATE
columns) or a runtime filter (``RuntimeFilter.keep_partitions``: its [min, max] or IN-list), and
reads the rest only. Then the filters and the runtime filters' row masks (min / max, IN-list,
Bloom) are applied together in one compaction. The rows read, the partitions skipped and the rows
the runtime filters dropped go to EXPLAIN ANALYZE (``ctx.note`` / ``ctx.metrics``)."""
from __future__ import annotations

import torch

from opforge.sql.expr import Batch, Func, Lit, Ref, and_, evaluate
from opforge.sql.plan import Scan
from opforge.sql.table import Table

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


def static_ranges(filters, names: dict[int, str]) -> list[tuple[str, str, int]]:
    """(column, op, value) of each ``column <op> literal`` conjunct over an integer / DATE column."""
    out = []
    for f in filters:
        if not (isinstance(f, Func) and f.name == "cmp" and f.extra in _FLIP):
            continue
        a, b = f.args
        op = f.extra
        if isinstance(a, Lit) and isinstance(b, Ref):
            a, b, op = b, a, _FLIP[op]
        if not (isinstance(a, Ref) and isinstance(b, Lit) and a.cid in names) or b.value is None:
            continue
        if not ((a.type.is_integer and a.type.kind != "BOOL" and b.type.is_integer)
                or (a.type.kind == "DATE" and b.type.kind == "DATE")):
            continue
        if isinstance(b.value, bool) or not isinstance(b.value, int):
            continue
        out.append((names[a.cid], op, b.value))
    return out


def _range_keep(lo: torch.Tensor, hi: torch.Tensor, op: str, v: int) -> torch.Tensor:
    if op == "=":
        return (lo <= v) & (hi >= v)
    if op == "<":
        return lo < v
    if op == "<=":
        return lo <= v
    if op == ">":
        return hi > v
    return hi >= v


def run_scan(node: Scan, table: Table, device, pushed=(), ctx=None) -> Batch:
    names = {o.cid: o.name for o in node.outputs}
    mine = [p for p in pushed if p.cid in names]
    cols = {o.cid: table.column(o.name) for o in node.outputs}
    batch = Batch(cols, table.num_rows, device)
    if table.bounds is not None:
        keep = torch.ones(table.num_partitions, dtype=torch.bool, device=device)
        for name, op, v in static_ranges(node.filters, names):
            r = table.partition_range(name)
            if r is not None:
                keep &= _range_keep(r[0], r[1], op, v)
        by_filters = table.num_partitions - int(keep.sum())
        for p in mine:
            r = table.partition_range(names[p.cid])
            if r is not None:
                keep &= p.filter.keep_partitions(r[0], r[1])
        kept = int(keep.sum())
        if kept < table.num_partitions:
            rows = table.partition_rows(keep)
            batch = batch.take(rows)
            for k, c in cols.items():
                batch.cols[k].sorted = c.sorted  # whole partitions in order: still sorted
        if ctx is not None:
            skipped = table.num_partitions - kept
            ctx.note(f"partitions: read {kept} of {table.num_partitions} ({by_filters} skipped by filters' "
                     f"min/max, {skipped - by_filters} by runtime filters); rows read {batch.n} of {table.num_rows} "
                     f"({table.num_rows - batch.n} skipped)")
            ctx.count("partitions", table.num_partitions)
            ctx.count("partitions_skipped", skipped)
            ctx.count("rows_skipped", table.num_rows - batch.n)
    if ctx is not None:
        ctx.count("rows_read", batch.n)
    if not node.filters and not mine:
        return batch
    mask = None
    if node.filters:
        m = evaluate(and_(node.filters), batch)
        mask = m.values & m.valid_mask() if m.valid is not None else m.values
    before = int(mask.sum()) if (mine and ctx is not None and mask is not None) else batch.n
    for p in mine:
        c = batch.cols[p.cid]
        rf = p.filter.mask(c.values, c.valid)
        mask = rf if mask is None else mask & rf
    idx = torch.nonzero(mask).squeeze(1)
    out = batch.take(idx)
    for k, c in batch.cols.items():
        if c.sorted:
            out.cols[k].sorted = True
    if mine and ctx is not None:
        ctx.count("runtime_filtered_rows", before - out.n)
        for p in mine:
            ctx.note(p.source)
        ctx.note(f"runtime filters dropped {before - out.n} of {before} rows")
    return out
