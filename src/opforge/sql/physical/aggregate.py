"""Hash aggregation by dense group ids (sort-based today) and scatter reductions.
NULL inputs are ignored by every aggregate; NULL keys form one group; no GROUP BY gives one row."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError
from opforge.sql.expr import Batch, cast_values, evaluate
from opforge.sql.physical.keys import dense_ids, key_tensor
from opforge.sql.plan import Aggregate


def result_type(func: str, arg_type: T.SqlType | None) -> T.SqlType:
    """DuckDB's result types: count BIGINT, avg DOUBLE, sum(int) HUGEINT (here DECIMAL(38,0)),
    sum(decimal(p,s)) DECIMAL(38,s), sum(float) DOUBLE, min/max keep the type."""
    if func in ("count", "count_star", "count_distinct"):
        return T.INT64
    if func == "avg":
        return T.FLOAT64
    if func == "sum":
        if arg_type.kind == "DECIMAL":
            return T.decimal(38, arg_type.scale)
        if arg_type.is_integer or arg_type.kind == "BOOL":
            return T.decimal(38, 0)
        return T.FLOAT64
    return arg_type


def run_aggregate(node: Aggregate, batch: Batch) -> Batch:
    n, dev = batch.n, batch.device
    key_cols = [evaluate(e, batch) for _, e in node.keys]
    gid, groups = dense_ids(key_cols, n, dev)
    if not node.keys:
        groups = 1
    out: dict[int, Column] = {}
    if node.keys:
        first = torch.full((groups,), n, dtype=torch.int64, device=dev)
        first = first.scatter_reduce(0, gid, torch.arange(n, device=dev), "amin", include_self=True)
        for (o, _), col in zip(node.keys, key_cols):
            out[o.cid] = col.take(first)
    for o, call in node.aggs:
        out[o.cid] = _reduce(call.func, None if call.arg is None else evaluate(call.arg, batch), gid, groups, n, dev, o.type)
    return Batch(out, groups, dev)


def _reduce(func: str, col: Column | None, gid: torch.Tensor, groups: int, n: int, dev, out_type: T.SqlType) -> Column:
    if func == "count_star":
        cnt = torch.zeros(groups, dtype=torch.int64, device=dev).index_add_(0, gid, torch.ones(n, dtype=torch.int64, device=dev))
        return Column(cnt, None, T.INT64)
    ok = col.valid_mask()
    g_ok = gid[ok]
    cnt = torch.zeros(groups, dtype=torch.int64, device=dev).index_add_(0, g_ok, torch.ones_like(g_ok))
    has = cnt > 0
    valid = None if bool(has.all()) else has
    if func == "count":
        return Column(cnt, None, T.INT64)
    if func == "count_distinct":
        v = key_tensor(col)[ok]
        pairs, _ = dense_ids([Column(g_ok, None, T.INT64), Column(v, None, T.INT64)], len(v), dev)
        uniq_pair, first_idx = torch.unique(pairs, return_inverse=True)
        first = torch.full((len(uniq_pair),), len(v), dtype=torch.int64, device=dev).scatter_reduce(
            0, first_idx, torch.arange(len(v), device=dev), "amin", include_self=True)
        d = torch.zeros(groups, dtype=torch.int64, device=dev).index_add_(0, g_ok[first], torch.ones_like(first))
        return Column(d, None, T.INT64)
    if func in ("sum", "avg"):
        if func == "avg" or out_type.is_float:
            v = cast_values(col, T.FLOAT64)[ok]
            s = torch.zeros(groups, dtype=torch.float64, device=dev).index_add_(0, g_ok, v)
            if func == "avg":
                return Column(s / cnt.clamp(min=1), valid, T.FLOAT64)
            return Column(s, valid, T.FLOAT64)
        v = col.values.long()[ok]
        s = torch.zeros(groups, dtype=torch.int64, device=dev).index_add_(0, g_ok, v)
        est = torch.zeros(groups, dtype=torch.float64, device=dev).index_add_(0, g_ok, v.double())
        if groups and bool((est.abs() > 2.0 ** 62).any()):
            raise NotSupportedError(f"sum exceeds the int64 range of {out_type} storage")
        return Column(s, valid, out_type)
    if func in ("min", "max"):
        v = col.values[ok]
        if v.dtype == torch.bool:
            v = v.to(torch.int32)
        big = _extreme(v.dtype, func == "min")
        init = torch.full((groups,), big, dtype=v.dtype, device=dev)
        r = init.scatter_reduce(0, g_ok, v, "amin" if func == "min" else "amax", include_self=True)
        if col.type.kind == "BOOL":
            r = r.bool()
        return Column(r, valid, col.type, col.dictionary)
    raise ValueError(f"aggregate: unknown function {func!r}")


def _extreme(dtype: torch.dtype, for_min: bool):
    if dtype.is_floating_point:
        return float("inf") if for_min else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if for_min else info.min
