"""Hash aggregation: dense group ids from ``opforge.group_by`` (``keys.dense_ids``), then one
``opforge.segment_reduce`` per aggregate (sum / min / max / count by group id), both through dispatch:
the Triton hash table and atomic reductions on CUDA, the sort-based reference on the CPU.
NULL inputs are ignored by every aggregate; NULL keys form one group; no GROUP BY gives one row.

Memory budget: the group table needs at most ``GROUP_BYTES_PER_ROW`` bytes per input row (every
row its own group). When that exceeds the budget, the rows are radix-partitioned on a hash of all
key columns (``keys.partition_of``): equal keys share a partition, so each partition's groups are
complete and disjoint from the others'; the partitions are aggregated in turn and concatenated."""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError, OutOfRangeError
from opforge.sql.expr import Batch, cast_values, evaluate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.keys import dense_ids, key_tensor, partition_bits, partition_of, partitions
from opforge.sql.plan import Aggregate, Window

GROUP_BYTES_PER_ROW = 48
_MIX = 0x9E3779B97F4A7C15 - (1 << 64)


SPREAD_FUNCS = ("var_samp", "var_pop", "stddev_samp", "stddev_pop")


def result_type(func: str, arg_type: T.SqlType | None) -> T.SqlType:
    """DuckDB's result types: count BIGINT, avg DOUBLE, sum(int) HUGEINT (here DECIMAL(38,0)),
    sum(decimal(p,s)) DECIMAL(38,s), sum(float) DOUBLE, min/max keep the type."""
    if func in ("count", "count_star", "count_distinct"):
        return T.INT64
    if func == "list":
        return T.list_of(arg_type)
    if func in ("avg", "fsum", "favg") or func in SPREAD_FUNCS:
        return T.FLOAT64
    if func == "sum":  # 128-bit storage: a sum past int64 is exact (DuckDB's HUGEINT / DECIMAL(38, s))
        if arg_type.kind == "DECIMAL":
            return T.wide_decimal(38, arg_type.scale)
        if arg_type.is_integer or arg_type.kind == "BOOL":
            return T.wide_decimal(38, 0)
        return T.FLOAT64
    return arg_type


def _row_hash(key_cols: list[Column]) -> torch.Tensor:
    """One int64 per row, equal for rows with equal keys (NULL is a value of its own)."""
    h = None
    for col in key_cols:
        k = key_tensor(col) * 2 + col.null_mask().long()
        h = k if h is None else (h * _MIX) ^ k
    return h


def run_aggregate(node: Aggregate, batch: Batch, ctx: ExecContext | None = None) -> Batch:
    ctx = ctx or ExecContext()
    n, dev = batch.n, batch.device
    key_cols = [evaluate(e, batch) for _, e in node.keys]
    bits = partition_bits(n * GROUP_BYTES_PER_ROW, ctx.memory_budget) if node.keys else 0
    if bits:
        ctx.note(f"radix-partitioned into {1 << bits} parts (group table <= {n * GROUP_BYTES_PER_ROW} B "
                 f"> budget {ctx.memory_budget} B)")
        on = key_cols if node.grouped is None else [key_cols[i] for i in node.grouped]
        parts = [p for p in partitions(partition_of(_row_hash(on), bits), bits) if len(p)]
        outs = [_aggregate(node, batch.take(idx), [c.take(idx) for c in key_cols]) for idx in parts]
        if not outs:
            return _aggregate(node, batch, key_cols, ctx)
        cols = {}
        for cid, first in outs[0].cols.items():
            parts_c = [o.cols[cid] for o in outs]
            valid = None
            if any(c.valid is not None for c in parts_c):
                valid = torch.cat([c.valid_mask() for c in parts_c])
            cols[cid] = Column(torch.cat([c.values for c in parts_c]), valid, first.type, first.dictionary)
        return Batch(cols, sum(o.n for o in outs), dev)
    ctx.note(f"hash aggregate: {n} rows, {len(node.keys)} key(s), {len(node.aggs)} aggregate(s)")
    return _aggregate(node, batch, key_cols, ctx)


def run_window(node: Window, batch: Batch, ctx: ExecContext | None = None) -> Batch:
    """The aggregates per partition (the group ids and reductions of :func:`run_aggregate`),
    each gathered back onto the partition's rows."""
    n, dev = batch.n, batch.device
    gid, groups = dense_ids([evaluate(e, batch) for e in node.partition], n, dev, ctx)
    if ctx is not None:
        ctx.note(f"window: {n} rows in {groups} partitions, {len(node.aggs)} aggregate(s)")
    out = dict(batch.cols)
    for (o, _), per_group in zip(node.aggs, _reduce_all(node.aggs, batch, gid, groups)):
        out[o.cid] = per_group.take(gid)
    return Batch(out, n, dev)


def _aggregate(node: Aggregate, batch: Batch, key_cols: list[Column], ctx: ExecContext | None = None) -> Batch:
    n, dev = batch.n, batch.device
    grouped = key_cols if node.grouped is None else [key_cols[i] for i in node.grouped]
    gid, groups = dense_ids(grouped, n, dev, ctx if node.keys else None)
    if not node.keys:
        groups = 1
    out: dict[int, Column] = {}
    if node.keys:
        first = hashing.segment_reduce_dense(torch.arange(n, device=dev), gid, groups, "min")
        for (o, _), col in zip(node.keys, key_cols):
            out[o.cid] = col.take(first)
    for (o, _), col in zip(node.aggs, _reduce_all(node.aggs, batch, gid, groups)):
        out[o.cid] = col
    return Batch(out, groups, dev)


def _reduce_all(aggs, batch: Batch, gid: torch.Tensor, groups: int) -> list[Column]:
    """Every aggregate of one operator over the same group ids, with one host read for all of them
    where each used to read its own (TPC-DS q66's 96 SUMs: 240 reads a run, each a sync on the GPU):
    - an integer or DECIMAL SUM is summed in int64 at once, its overflow bounds kept on the device;
      only a SUM whose bound fails is summed again exactly, after the read;
    - a result's NULL mask is kept, and dropped after the read when every group has a value.
    One argument column is alive at a time, as before."""
    n, dev = batch.n, batch.device
    rows_per_group = []  # count(*) per group, computed once and shared by aggregates over non-NULL columns
    out, pending = [], []
    for i, (o, call) in enumerate(aggs):
        col = None if call.arg is None else evaluate(call.arg, batch)
        bounds = _int64_bounds(call.func, col, o.type, n, groups)
        if bounds is not None:
            pending.append((i, bounds))
        out.append(_reduce(call.func, col, gid, groups, n, dev, o.type, rows_per_group,
                           None if bounds is None else True, read_valid=False))
    stats = [b for _, bounds in pending for b in bounds]
    if pending:
        counts = (rows_per_group[0][0] if rows_per_group
                  else hashing.segment_reduce_dense(gid.new_ones(n), gid, groups, "count"))
        stats.append(counts.max().long())
    masked = [i for i, c in enumerate(out) if c.valid is not None]
    stats += [out[i].valid.all().long() for i in masked]
    if not stats:
        return out
    host = torch.stack(stats).tolist()
    for i, full in zip(masked, host[len(host) - len(masked):]):
        if full:
            out[i] = Column(out[i].values, None, out[i].type, out[i].dictionary)
    for k, (i, _) in enumerate(pending):
        fits, lo, hi = host[3 * k: 3 * k + 3]
        if not (fits and max(-lo, hi) * host[3 * len(pending)] < 2 ** 63):  # exact Python ints
            o, call = aggs[i]
            out[i] = _reduce(call.func, evaluate(call.arg, batch), gid, groups, n, dev, o.type, rows_per_group,
                             False)
    return out


def _int64_bounds(func: str, col: Column | None, out_type: T.SqlType, n: int, groups: int):
    """``[every value fits int64, min, max]`` as device scalars for a SUM that ``_reduce`` would
    take in int64 (integer / DECIMAL, and 128-bit AVG), else None."""
    if col is None or not n or not groups:
        return None
    if col.type.wide and func in ("sum", "avg"):
        low, fits = decimal128.lo(col.values), decimal128.fits_int64(col.values)
        return [(fits if col.valid is None else fits | ~col.valid).all().long(), low.min(), low.max()]
    if func == "sum" and not out_type.is_float:
        v = col.values.long()
        return [torch.ones((), dtype=torch.int64, device=v.device), v.min(), v.max()]
    return None


def _reduce(func: str, col: Column | None, gid: torch.Tensor, groups: int, n: int, dev, out_type: T.SqlType,
            rows_per_group: list, int64_safe: bool | None = None, read_valid: bool = True) -> Column:
    """One aggregate per group. ``int64_safe``: whether an integer / DECIMAL SUM may run in int64
    (None: read its bounds here). ``read_valid``: whether to drop an all-true NULL mask here (one
    host read each) or leave that to the caller (``_reduce_all``: one read for all)."""
    if func == "list":
        from opforge.sql.nested import group_lists
        return group_lists(col, gid, groups, out_type)
    if func in ("fsum", "favg"):
        return _exact_float_sum(func, col, gid, groups)
    if func == "first":  # DuckDB's first(x): the group's first row's value, NULL included
        first = hashing.segment_reduce_dense(torch.arange(n, device=dev), gid, groups, "min")
        return col.take(first.clamp(0, max(n - 1, 0))) if n else Column.constant(None, col.type, groups, dev)
    if func == "count_star" or col.valid is None:
        if not rows_per_group:
            c = hashing.segment_reduce_dense(gid.new_ones(n), gid, groups, "count")
            if read_valid:
                rows_per_group.append((c, None if n and bool((c > 0).all()) or not groups else c > 0))
            else:
                rows_per_group.append((c, c > 0))
        cnt, valid = rows_per_group[0]
        if func == "count_star":
            return Column(cnt, None, T.INT64)
    else:
        cnt = hashing.segment_reduce_dense(gid.new_ones(n), gid, groups, "count", valid=col.valid)
        has = cnt > 0
        valid = None if read_valid and bool(has.all()) else has
    if func == "count":
        return Column(cnt, None, T.INT64)
    if func == "count_distinct":
        ok = col.valid_mask()
        g_ok = gid[ok]
        v = key_tensor(col)[ok]
        pairs, npairs = dense_ids([Column(g_ok, None, T.INT64), Column(v, None, T.INT64)], len(v), dev)
        # groups of pairs are numbered by first occurrence: the first row of each pair carries its group
        first = hashing.segment_reduce_dense(torch.arange(len(v), device=dev), pairs, npairs, "min")
        d = hashing.segment_reduce_dense(gid.new_ones(npairs), g_ok[first], groups, "count")
        return Column(d, None, T.INT64)
    if func == "decimal_avg":
        return _decimal_average(col, gid, groups, cnt, valid)
    if col.type.wide and func in ("sum", "avg", "min", "max"):
        return _reduce_wide(func, col, gid, groups, cnt, valid, out_type, int64_safe, read_valid)
    if func in ("sum", "avg"):
        if func == "avg" or out_type.is_float:
            v = cast_values(col, T.FLOAT64)
            s = hashing.segment_reduce_dense(v, gid, groups, "sum", valid=col.valid)
            if func == "avg":
                return Column(s / cnt.clamp(min=1), valid, T.FLOAT64)
            return Column(s, valid, T.FLOAT64)
        v = col.values.long()
        if n and groups:
            # int64 cannot overflow unless max|v| * (largest group) reaches 2^63 (exact Python ints:
            # abs() of the int64 minimum is negative); only then sum exactly in two halves
            if int64_safe is None:
                lo, hi, most = torch.stack([v.min(), v.max(), cnt.max().long()]).tolist()  # one host read
                int64_safe = max(-lo, hi) * most < 2 ** 63
            if not int64_safe:
                if out_type.wide:  # exact in 128 bits, by 32-bit limbs
                    return _reduce_wide("sum", Column(decimal128.from_int64(v), col.valid, out_type), gid, groups,
                                        cnt, valid, out_type)
                return Column(_exact_sum(v, gid, groups, col.valid, out_type), valid, out_type)
        s = hashing.segment_reduce_dense(v, gid, groups, "sum", valid=col.valid)
        return Column(decimal128.from_int64(s) if out_type.wide else s, valid, out_type)
    if func in SPREAD_FUNCS:
        return _spread(func, col, gid, groups, cnt)
    if func in ("min", "max"):
        v = col.values
        if v.dtype in (torch.bool, torch.int8, torch.int16, torch.uint8):
            v = v.to(torch.int32)
        elif v.dtype == torch.float16 or v.dtype == torch.bfloat16:
            v = v.float()
        if v.dtype.is_floating_point and bool(torch.isnan(v).any()):
            r = _scatter_extreme(v, col.valid_mask(), gid, groups, func)  # NaN orders as SQL: largest
        else:
            r = hashing.segment_reduce_dense(v, gid, groups, func, valid=col.valid)
        r = r.to(col.values.dtype)
        return Column(r, valid, col.type, col.dictionary)
    raise ValueError(f"aggregate: unknown function {func!r}")


def _exact_float_sum(func: str, col: Column, gid: torch.Tensor, groups: int) -> Column:
    """fsum / favg: each group's sum of its non-NULL values rounded once (``math.fsum``, on the
    host: the device sum rounds at every addition); NULL for a group without values."""
    import math

    values = cast_values(col, T.FLOAT64).tolist()
    ok = col.valid_mask().tolist()
    per: list[list[float]] = [[] for _ in range(groups)]
    for g, v, k in zip(gid.tolist(), values, ok):
        if k:
            per[g].append(v)
    out = [math.fsum(p) / (len(p) if func == "favg" else 1) if p else 0.0 for p in per]
    valid = torch.tensor([bool(p) for p in per], dtype=torch.bool, device=col.device)
    return Column(torch.tensor(out, dtype=torch.float64, device=col.device), None if bool(valid.all()) else valid,
                  T.FLOAT64)


def _reduce_wide(func: str, col: Column, gid: torch.Tensor, groups: int, cnt: torch.Tensor, valid,
                 out_type: T.SqlType, int64_safe: bool | None = None, read_valid: bool = True) -> Column:
    """sum / avg / min / max of a 128-bit DECIMAL: SUM exact by 32-bit limb columns (int64 segment
    sums, carries folded after), AVG that exact sum as a DOUBLE, MIN / MAX through the values' dense
    ranks."""
    v = col.values
    if func in ("sum", "avg") and len(v) and groups:
        low = decimal128.lo(v)
        if int64_safe is None:
            fits = decimal128.fits_int64(v) if col.valid is None else decimal128.fits_int64(v) | ~col.valid
            bounds = torch.stack([fits.all().long(), low.min(), low.max(), cnt.max()]).tolist()
            int64_safe = bool(bounds[0]) and max(-bounds[1], bounds[2]) * bounds[3] < 2 ** 63
        if int64_safe:  # int64 values, no int64 overflow
            narrow = T.decimal(col.type.precision, col.type.scale, False)
            out = _reduce(func, Column(low, col.valid, narrow), gid, groups, len(v), v.device,
                          T.FLOAT64 if func == "avg" else narrow, [(cnt, valid)], True, read_valid)
            return out if func == "avg" else Column(decimal128.from_int64(out.values), out.valid, out_type)
    if func in ("sum", "avg"):
        s, over = decimal128.segment_sum(
            v, lambda limb: hashing.segment_reduce_dense(limb, gid, groups, "sum", valid=col.valid))
        bad = over | decimal128.exceeds(torch.where(over[:, None], torch.zeros_like(s), s), 10 ** 38)
        if valid is not None:
            bad = bad & valid
        if bool(bad.any()):
            raise OutOfRangeError(f"Overflow in SUM of {col.type}: the sum leaves DECIMAL(38)")
        if func == "avg":
            return Column(decimal128.to_float64_scaled(s, col.type.scale) / cnt.clamp(min=1), valid, T.FLOAT64)
        return Column(s, valid, out_type)
    if len(v) == 0 or bool(decimal128.fits_int64(v).all()):  # int64 values: the plain reduction
        r = hashing.segment_reduce_dense(decimal128.lo(v), gid, groups, func, valid=col.valid)
        return Column(decimal128.from_int64(r), valid, col.type)
    rank, uniques = decimal128.dense_rank(v)
    r = hashing.segment_reduce_dense(rank, gid, groups, func, valid=col.valid)
    r = torch.where(cnt > 0, r, torch.zeros_like(r)).clamp(0, max(len(uniques) - 1, 0))
    out = uniques[r] if len(uniques) else torch.zeros(groups, 2, dtype=torch.int64, device=v.device)
    return Column(out, valid, col.type)


def _decimal_average(col: Column, gid: torch.Tensor, groups: int, cnt: torch.Tensor, valid) -> Column:
    """DuckDB's decimal_average: the exact sum (128 bits) divided by the count, rounded half to
    even, in the argument's DECIMAL type; a sum beyond 128 bits is DuckDB's error."""
    v = col.values if col.type.wide else decimal128.from_int64(col.values)
    s, over = decimal128.segment_sum(
        v, lambda limb: hashing.segment_reduce_dense(limb, gid, groups, "sum", valid=col.valid))
    if bool((over if valid is None else over & valid).any()):
        raise OutOfRangeError("decimal_average: the intermediate sum overflowed HUGEINT range")
    q = decimal128.div_count_half_even(s, cnt.clamp(min=1))
    return Column(q if col.type.wide else decimal128.lo(q), valid, col.type)


def _spread(func: str, col: Column, gid: torch.Tensor, groups: int, cnt: torch.Tensor) -> Column:
    """Variance / standard deviation, sample or population, in two passes (the group means, then
    the squared deviations from them: no cancellation of sum(x^2) - sum(x)^2 / n). A sample
    statistic of fewer than two values, or a population one of none, is NULL (DuckDB)."""
    v = cast_values(col, T.FLOAT64)
    mean = hashing.segment_reduce_dense(v, gid, groups, "sum", valid=col.valid) / cnt.clamp(min=1)
    dev = (v - mean[gid]) ** 2
    ss = hashing.segment_reduce_dense(dev, gid, groups, "sum", valid=col.valid)
    sample = func.endswith("samp")
    var = ss / (cnt - 1 if sample else cnt).clamp(min=1)
    out = torch.sqrt(var) if func.startswith("stddev") else var
    return Column(out, cnt > (1 if sample else 0), T.FLOAT64)


def _exact_sum(v: torch.Tensor, gid: torch.Tensor, groups: int, valid, out_type: T.SqlType) -> torch.Tensor:
    """Per-group int64 sums, exact: each value split into its signed high and unsigned low 32 bits,
    both halves summed in int64 (no overflow below 2^31 rows a group), then recombined; a sum outside
    int64 raises instead of wrapping around (DuckDB sums in 128 bits: this engine's storage limit)."""
    high = hashing.segment_reduce_dense(v >> 32, gid, groups, "sum", valid=valid)
    low = hashing.segment_reduce_dense(v & 0xFFFFFFFF, gid, groups, "sum", valid=valid)
    top = high + (low >> 32)  # sum = top * 2^32 + (low mod 2^32), 0 <= low mod 2^32 < 2^32
    bad = (top < -2 ** 31) | (top >= 2 ** 31)
    if bool(bad.any()):
        raise NotSupportedError(f"sum: the result does not fit the int64 storage of {out_type} in this engine "
                              "(DuckDB sums in 128 bits)")
    return top * (1 << 32) + (low & 0xFFFFFFFF)


def _scatter_extreme(v, ok, gid, groups, func):
    """min/max over floats holding NaN, where NaN is the largest value (DuckDB's order)."""
    isnan = torch.isnan(v)
    finite = v.masked_fill(isnan, float("-inf") if func == "max" else float("inf"))
    r = torch.full((groups,), _extreme(v.dtype, func == "min"), dtype=v.dtype, device=v.device)
    r = r.scatter_reduce(0, gid[ok], finite[ok], "amin" if func == "min" else "amax", include_self=True)
    nans = torch.bincount(gid[ok & isnan], minlength=groups) > 0
    others = torch.bincount(gid[ok & ~isnan], minlength=groups) > 0
    if func == "max":
        return torch.where(nans, float("nan"), r)
    return torch.where(nans & ~others, float("nan"), r)


def _extreme(dtype: torch.dtype, for_min: bool):
    if dtype.is_floating_point:
        return float("inf") if for_min else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if for_min else info.min
