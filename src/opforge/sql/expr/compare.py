"""Comparisons (= <> < <= > >=) and IN lists, exact across DECIMAL scales, strings by dictionary code."""
from __future__ import annotations

import torch

from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.column import Column, code_bound, storage_value, unify_strings
from opforge.sql.errors import SqlError
from opforge.sql.expr import decimal_wide
from opforge.sql.expr.casts import cast_values
from opforge.sql.expr.evaluation import FUNCS, LITERAL_PATHS, and_valid, evaluate
from opforge.sql.expr.result_types import scale_of
from opforge.sql.expr.tree import Func, Lit


def comparable(a: Column, b: Column) -> tuple[torch.Tensor, torch.Tensor]:
    """Both columns as tensors of one type whose order is SQL order."""
    if T.is_coded(a.type) or T.is_coded(b.type):
        if a.type.kind != b.type.kind or (a.type.kind in T.NESTED and a.type != b.type):
            raise SqlError(f"cannot compare {a.type} with {b.type}")
        a, b = unify_strings([a, b])
        return a.values, b.values
    if a.type.kind == "DATE" or b.type.kind == "DATE":
        if a.type.kind != b.type.kind:
            raise SqlError(f"cannot compare {a.type} with {b.type}")
        return a.values, b.values
    if a.type.kind == "TIMESTAMP" or b.type.kind == "TIMESTAMP":
        if a.type.kind != b.type.kind:
            raise SqlError(f"cannot compare {a.type} with {b.type}")
        digits = max(a.type.scale, b.type.scale)  # both in the finer unit
        return a.values * 10 ** (digits - a.type.scale), b.values * 10 ** (digits - b.type.scale)
    t = T.common_numeric(a.type, b.type)
    if t.kind == "DECIMAL":  # at the finer scale of the two: a comparison never rounds a side
        s = max(scale_of(a.type), scale_of(b.type))
        # wide: [n, 2] rows, which callers compare with decimal_wide / decimal128, not elementwise
        t = T.wide_decimal(38, s) if t.wide else T.decimal(18, s)
    return cast_values(a, t), cast_values(b, t)


def compare_values(op: str, av: torch.Tensor, bv: torch.Tensor) -> torch.Tensor:
    """``av <op> bv`` in SQL order. Floats: NaN equals NaN and is greater than every other value,
    +inf included (DuckDB's order, and this engine's in joins, GROUP BY, ORDER BY, min / max)."""
    if not (av.dtype.is_floating_point or bv.dtype.is_floating_point):
        return _CMP[op](av, bv)
    an, bn = torch.isnan(av), torch.isnan(bv)
    if op in ("=", "<>"):
        eq = (av == bv) | (an & bn)
        return eq if op == "=" else ~eq
    if op in (">", ">="):
        av, bv, an, bn, op = bv, av, bn, an, "<" if op == ">" else "<="
    lt = (av < bv) | (~an & bn)
    return lt if op == "<" else lt | (av == bv) | (an & bn)


def _is_constant_string(c: Column) -> bool:
    """A one-word dictionary without NULLs: every row holds that word (literals evaluate to this)."""
    return c.dictionary is not None and len(c.dictionary) == 1 and c.valid is None


_CMP = {"=": torch.eq, "<>": torch.ne, "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge}


def compare(e, args, batch):
    a, b = args
    flip = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
    op = e.extra
    if a.type.kind == "STRING" and b.type.kind == "STRING" and _is_constant_string(a) and not _is_constant_string(b):
        a, b, op = b, a, flip[op]
    if a.type.kind == "STRING" and b.type.kind == "STRING" and _is_constant_string(b):
        # column vs one string: compare codes against that string's position, no re-coding of the column
        w = b.dictionary[0]
        lo, hi = code_bound(a.dictionary, w, "left"), code_bound(a.dictionary, w, "right")
        c = a.values
        out = {"=": (c >= lo) & (c < hi), "<>": (c < lo) | (c >= hi), "<": c < lo, "<=": c < hi,
               ">": c >= hi, ">=": c >= lo}[op]
        return Column(out, a.valid, T.BOOL)
    if a.type.wide or b.type.wide:
        return Column(decimal_wide.compare_wide(op, a, b), and_valid(a, b), T.BOOL)
    if _decimal_scales_differ(a.type, b.type):
        return Column(_compare_scaled(op, a, b), and_valid(a, b), T.BOOL)
    av, bv = comparable(a, b)
    return Column(compare_values(op, av, bv), and_valid(a, b), T.BOOL)


_FLIP_CMP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _literal_at_scale(col_type: T.SqlType, lit: Lit) -> tuple[int, bool] | None:
    """A non-NULL integer / DECIMAL / DATE literal as ``(floor(L / f), exact)`` at the column's scale:
    the column stores ``x`` at scale s, the literal ``L`` at scale t; ``f = 10^(t - s)`` when t > s
    (``exact``: f divides L), else the literal is scaled up exactly. None: not such a pair."""
    tb = lit.type
    if col_type.wide or tb.wide:  # 128-bit values: the general path (decimal_wide)
        return None
    if col_type.kind == "DATE" and tb.kind == "DATE":
        sa = sb = 0
    elif "BOOL" in (col_type.kind, tb.kind) or "DATE" in (col_type.kind, tb.kind):
        return None
    else:
        sa, sb = scale_of(col_type), scale_of(tb)
        if sa is None or sb is None:
            return None
    value = storage_value(lit.value, tb)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if sb <= sa:
        return value * 10 ** (sa - sb), True
    f = 10 ** (sb - sa)
    return value // f, value % f == 0


def _filled(value: bool, col: Column, batch) -> Column:
    fill = torch.ones if value else torch.zeros
    return Column(fill(batch.n, dtype=torch.bool, device=batch.device), col.valid, T.BOOL)


def _compare_literal(e, batch) -> Column | None:
    """``x <op> literal`` over integers, DECIMALs and DATEs, exactly, with the literal kept a Python
    int: no column of copies, and a DECIMAL literal of a finer scale is moved to the column's scale
    instead of splitting the column (``_literal_at_scale``: x < L / f iff x < ceil(L / f); x = L / f
    only when f divides L). None: not this case (the general path)."""
    a, b = e.args
    op = e.extra
    if isinstance(a, Lit) and not isinstance(b, Lit):
        a, b, op = b, a, _FLIP_CMP[op]
    if not isinstance(b, Lit) or isinstance(a, Lit) or b.value is None or op not in _FLIP_CMP:
        return None
    # a 128-bit column (a SUM's DECIMAL(38, s)) against a literal: as int64 when its values fit
    col_type = T.decimal(a.type.precision, a.type.scale, False) if a.type.wide else a.type
    scaled = _literal_at_scale(col_type, b)
    if scaled is None:
        return None
    bound, exact = scaled
    col = evaluate(a, batch)
    if a.type.wide:
        if len(col) and not bool(decimal128.fits_int64(col.values).all()):
            return Column(decimal_wide.compare_wide(op, col, Column.constant(b.value, b.type, len(col), col.device)),
                          col.valid, T.BOOL)
        col = Column(decimal128.lo(col.values), col.valid, col_type)
    if not exact:  # bound = floor(L / f) < L / f < bound + 1
        if op in ("=", "<>"):
            return _filled(op == "<>", col, batch)
        op = {"<": "<=", ">=": ">"}.get(op, op)
    info = torch.iinfo(col.values.dtype)
    if not info.min <= bound <= info.max:  # every value of the column lies on one side of it
        below = bound < info.min
        return _filled({"=": False, "<>": True, "<": not below, "<=": not below, ">": below, ">=": below}[op],
                       col, batch)
    return Column(_CMP[op](col.values, bound), col.valid, T.BOOL)


def _in_literals(e, batch) -> Column | None:
    """``x [NOT] IN (literal, ...)`` in one pass: a string column's matching dictionary codes as a
    lookup table, a number's or date's listed values (at its scale; inexact ones never match) by
    ``isin``. SQL's NULLs: a NULL x, or no match with a NULL in the list, is NULL. None: another case."""
    x, items = e.args[0], e.args[1:]
    if not items or not all(isinstance(i, Lit) for i in items) or isinstance(x, Lit):
        return None
    listed = [i for i in items if i.value is not None]
    has_null = len(listed) < len(items)
    if x.type.kind == "STRING":
        if not all(i.type.kind == "STRING" for i in listed):
            return None
        col = evaluate(x, batch)
        table = torch.zeros(len(col.dictionary) + 1, dtype=torch.bool)
        for i in listed:
            table[code_bound(col.dictionary, i.value, "left"):code_bound(col.dictionary, i.value, "right")] = True
        hit = table.to(col.device)[col.values.long()]
    else:
        scaled = [_literal_at_scale(x.type, i) for i in listed]
        if any(v is None for v in scaled):
            return None
        col = evaluate(x, batch)
        info = torch.iinfo(col.values.dtype)
        values = [v for v, exact in scaled if exact and info.min <= v <= info.max]
        hit = torch.isin(col.values, torch.tensor(values, dtype=col.values.dtype, device=col.device))
    valid = col.valid
    if has_null:
        valid = hit if valid is None else valid & hit  # no match against a NULL: NULL
    return Column(~hit if e.extra else hit, valid, T.BOOL)


def _decimal_scales_differ(ta: T.SqlType, tb: T.SqlType) -> bool:
    sa, sb = scale_of(ta), scale_of(tb)
    return "DECIMAL" in (ta.kind, tb.kind) and sa is not None and sb is not None and sa != sb


def _compare_scaled(op: str, a: Column, b: Column) -> torch.Tensor:
    """Exact comparison of scaled integers without rescaling up (which can overflow int64): the side
    with more decimals is split into (quotient, remainder) at the other side's scale."""
    sa, sb = scale_of(a.type), scale_of(b.type)
    s = min(sa, sb)

    def split(col, sc):
        v = col.values.long()
        if sc == s:
            return v, torch.zeros_like(v)
        f = 10 ** (sc - s)
        return torch.div(v, f, rounding_mode="floor"), torch.remainder(v, f)
    qa, ra = split(a, sa)
    qb, rb = split(b, sb)
    lt = (qa < qb) | ((qa == qb) & (ra < rb))
    eq = (qa == qb) & (ra == rb)
    return {"=": eq, "<>": ~eq, "<": lt, "<=": lt | eq, ">": ~(lt | eq), ">=": ~lt}[op]


def _in_list(e, args, batch):
    a, items = args[0], args[1:]
    hit = torch.zeros(batch.n, dtype=torch.bool, device=batch.device)
    any_null = torch.zeros(batch.n, dtype=torch.bool, device=batch.device)
    for it in items:
        eq = compare(Func("=", [], T.BOOL, "="), [a, it], batch)
        hit |= eq.values & eq.valid_mask()
        any_null |= ~eq.valid_mask()
    valid = hit | ~any_null
    if e.extra:  # NOT IN
        return Column(~hit, None if bool(valid.all()) else valid, T.BOOL)
    return Column(hit, None if bool(valid.all()) else valid, T.BOOL)


FUNCS.update({"cmp": compare, "in": _in_list})
LITERAL_PATHS.update({"cmp": _compare_literal, "in": _in_literals})
