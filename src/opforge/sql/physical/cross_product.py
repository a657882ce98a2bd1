"""Joins without equi keys (cross products, theta joins) under a memory limit.

A cross product of L x R rows materializes L * R pairs (two int64 indexes each, then the gathered
columns): ``SELECT count(*) FROM customer a, customer b`` at SF0.1 is 2.25e8 pairs, gigabytes. So:

* an aggregate without GROUP BY directly over a cross product, each aggregate reading one side only
  (``count(*)``, ``sum(a.x)``, ``max(b.y)``, ...), is computed from the two sides apart, never
  forming a pair: ``count(*) = L * R``, ``sum_L(x) * R``, ``min_L(x)`` when R > 0, ... (EXPLAIN
  ANALYZE notes "cross product not materialized");
* a materialized join without equi keys first compares its size with the limit, the connection's
  ``memory_budget`` or else half of the memory free on the device (host memory on the CPU), and
  raises :class:`~opforge.sql.errors.MemoryLimitError` before allocating when the output cannot fit;
  one with a residual condition (``a.x < b.x``) runs in slices of left rows whose pairs fit the
  limit, so only the matching pairs are kept."""
from __future__ import annotations

import os

import torch

from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import MemoryLimitError, NotSupportedError, OutOfRangeError
from opforge.sql.expr import Batch
from opforge.sql.physical.aggregate import run_aggregate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.join import run_join
from opforge.sql.plan import Aggregate, Join, output_cids

PAIR_BYTES = 16  # a pair's two int64 row indexes
SLICED_KINDS = ("inner", "cross", "left", "semi", "anti")  # a left row's output depends on that row only
_ONE_SIDE_AGGREGATES = ("count_star", "count", "count_distinct", "sum", "avg", "min", "max")


def is_keyless(node: Join) -> bool:
    return not node.left_keys


def aggregates_without_pairs(node) -> bool:
    """``node`` is an aggregate without GROUP BY directly over a cross product (no keys, no
    residual), each aggregate reading the columns of one side only."""
    j = getattr(node, "child", None)
    if not (isinstance(node, Aggregate) and isinstance(j, Join) and j.kind in ("inner", "cross")):
        return False
    if node.keys or j.left_keys or j.residual is not None:
        return False
    lc, rc = output_cids(j.left), output_cids(j.right)
    return all(c.func in _ONE_SIDE_AGGREGATES and (c.arg is None or c.arg.cids() <= lc or c.arg.cids() <= rc)
               for _, c in node.aggs)


def aggregate_cross_product(node: Aggregate, left: Batch, right: Batch, ctx: ExecContext) -> Batch:
    """The aggregates of :func:`aggregates_without_pairs` over ``left x right``, from each side alone."""
    j = node.child
    lc = output_cids(j.left)
    nl, nr, dev = left.n, right.n, left.device
    ctx.note(f"cross product not materialized: aggregates of {nl} x {nr} = {nl * nr} pairs from each side")
    out: dict[int, Column] = {}
    for o, call in node.aggs:
        if call.func == "count_star":
            out[o.cid] = Column(torch.tensor([nl * nr], dtype=torch.int64, device=dev), None, T.INT64)
            continue
        on_left = call.arg.cids() <= lc
        side, times = (left, nr) if on_left else (right, nl)
        one = run_aggregate(Aggregate(j.left if on_left else j.right, [], [(o, call)]), side, ctx).cols[o.cid]
        out[o.cid] = _repeated(call.func, one, times, o.type, dev)
    return Batch(out, 1, dev)


def _repeated(func: str, one: Column, times: int, out_type: T.SqlType, dev) -> Column:
    """An aggregate over one side's rows, each repeated ``times`` times (once per row of the other side)."""
    if times == 0:  # no pairs: counts are 0, the others NULL
        if func in ("count", "count_distinct"):
            return Column(torch.zeros(1, dtype=torch.int64, device=dev), None, T.INT64)
        return Column.constant(None, out_type, 1, dev)
    if func == "count":
        return Column(one.values * times, None, T.INT64)
    if func != "sum":  # avg, min, max, count(DISTINCT): the same over repeated rows
        return one
    if out_type.is_float:
        return Column(one.values * times, one.valid, out_type)
    if out_type.wide:  # a 128-bit sum: exact in Python, refused past DECIMAL(38) (DuckDB's overflow)
        total = decimal128.to_ints(one.values)[0] * times
        if abs(total) >= 10 ** 38:
            raise OutOfRangeError(f"Overflow in SUM: {total} does not fit {out_type}")
        return Column(decimal128.from_ints([total], dev), one.valid, out_type)
    total = int(one.values[0]) * times
    if not -2 ** 63 <= total < 2 ** 63:
        raise NotSupportedError(f"sum: the result does not fit the int64 storage of {out_type} in this engine "
                                "(DuckDB sums in 128 bits)")
    return Column(torch.tensor([total], dtype=torch.int64, device=dev), one.valid, out_type)


def memory_limit(ctx: ExecContext, dev: torch.device) -> int:
    """The bytes a materialized cross product may take: the memory budget, else half the free memory."""
    if ctx.memory_budget is not None:
        return ctx.memory_budget
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0] // 2
    return _host_available() // 2


def _host_available() -> int:
    """Host memory available to a new allocation: MemAvailable (free plus reclaimable caches)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 35


def _row_bytes(batch: Batch, cids=None) -> int:
    total = 0
    for cid, c in batch.cols.items():
        if cids is None or cid in cids:
            total += c.values.element_size() + (0 if c.valid is None else 1)
    return total


def run_keyless_join(node: Join, left: Batch, right: Batch, ctx: ExecContext) -> Batch:
    """A join without equi keys within :func:`memory_limit` (module docstring)."""
    nl, nr = left.n, right.n
    limit = memory_limit(ctx, left.device)
    what = "the memory budget" if ctx.memory_budget is not None else "half of the free memory"
    out_row = _row_bytes(left) + (0 if node.kind in ("semi", "anti") else _row_bytes(right))
    if node.residual is None or node.kind not in SLICED_KINDS:
        need = nl * nr * (PAIR_BYTES + out_row)
        if need > limit:
            raise MemoryLimitError(
                f"join without equi keys ({node.kind}) of {nl} x {nr} rows would materialize {nl * nr} pairs "
                f"(~{need} bytes) > {what} ({limit} bytes): add a join condition, or aggregate it without "
                "GROUP BY (count(*), sum, min, max of one side are computed without materializing the pairs)")
        return run_join(node, left, right, ctx)
    need_cids = node.residual.cids()
    per_pair = PAIR_BYTES + 1 + _row_bytes(left, need_cids) + _row_bytes(right, need_cids)
    rows = max(1, limit // max(1, nr * per_pair))
    if rows >= nl:
        return run_join(node, left, right, ctx)
    ctx.note(f"join without equi keys in slices of {rows} left rows x {nr} (pairs within {what})")
    parts, size = [], 0
    for start in range(0, nl, rows):
        idx = torch.arange(start, min(start + rows, nl), device=left.device)
        part = run_join(node, left.take(idx), right, ctx)
        size += part.n * out_row
        if size > limit:
            raise MemoryLimitError(f"join without equi keys of {nl} x {nr} rows: its output passed {what} "
                                   f"({limit} bytes)")
        parts.append(part)
    return _concat(parts, left.device)


def _concat(parts: list[Batch], dev) -> Batch:
    cols = {}
    for cid, first in parts[0].cols.items():
        cs = [p.cols[cid] for p in parts]
        valid = torch.cat([c.valid_mask() for c in cs]) if any(c.valid is not None for c in cs) else None
        cols[cid] = Column(torch.cat([c.values for c in cs]), valid, first.type, first.dictionary)
    return Batch(cols, sum(p.n for p in parts), dev)
