"""SQL arithmetic (+ - * / // %, unary minus, abs, round) over integers, DECIMALs, floats and dates."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column, storage_value
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.casts import cast_values, round_div, scale_up
from opforge.sql.expr.evaluation import FUNCS, LITERAL_PATHS, and_valid, evaluate
from opforge.sql.expr.result_types import as_decimal_type, scale_of
from opforge.sql.expr.tree import Func, Lit


def _arith(e: Func, args, batch):
    a, b = args
    op = e.extra
    valid = and_valid(a, b)
    t = e.type
    if t.kind == "DATE" or (a.type.kind == "DATE" and b.type.kind == "DATE"):
        av, bv = a.values.long(), b.values.long()
        out = av + bv if op == "+" else av - bv
        return Column(out.to(t.torch_dtype), valid, t)
    if op == "/":  # DOUBLE division, IEEE results for a zero divisor (as DuckDB)
        return Column(cast_values(a, T.FLOAT64) / cast_values(b, T.FLOAT64), valid, t)
    if t.kind == "DECIMAL" and op == "*":
        da, db = as_decimal_type(a.type), as_decimal_type(b.type)
        av = cast_values(a, T.decimal(18, da.scale))
        bv = cast_values(b, T.decimal(18, db.scale))
        return Column(_checked("*", av, bv, t, valid), valid, t)
    work = t if t.kind != "DECIMAL" else T.decimal(18, t.scale)
    av, bv = cast_values(a, work), cast_values(b, work)
    if op in "+-*":
        out = _checked(op, av, bv, t, valid)
    elif op in ("//", "%"):
        if t.is_float:
            out = torch.div(av, bv, rounding_mode="floor") if op == "//" else torch.fmod(av, bv)
        else:
            zero = bv == 0
            if valid is not None:
                zero = zero & valid
            if bool(zero.any()):  # DuckDB raises too
                raise SqlError(f"division by zero in {op}")
            safe = torch.where(bv == 0, torch.ones_like(bv), bv)
            # truncating division; the remainder takes the dividend's sign (C, DuckDB)
            out = torch.div(av, safe, rounding_mode="trunc") if op == "//" else torch.fmod(av, safe)
    else:
        raise NotSupportedError(f"operator {op}")
    return Column(out.to(t.torch_dtype), valid, t)


_INT64_SAFE = 2.0 ** 62


def _arith_literal(e: Func, batch) -> Column | None:
    """``x + - * literal`` (either side) with a BIGINT or DECIMAL result and the literal kept a Python
    int: no column of copies and no overflow check of copies (TPC-H's ``1 - l_discount``). The same
    values, scales and overflow checks as ``_arith``. None: not this case (the general path)."""
    a, b = e.args
    op, t = e.extra, e.type
    if op not in ("+", "-", "*") or t.kind not in ("DECIMAL", "INT64"):
        return None
    lit_left = isinstance(a, Lit) and not isinstance(b, Lit)
    x, lit = (b, a) if lit_left else (a, b)
    if not isinstance(lit, Lit) or isinstance(x, Lit) or lit.value is None:
        return None
    if "BOOL" in (x.type.kind, lit.type.kind):
        return None
    sx, sl = scale_of(x.type), scale_of(lit.type)
    value = storage_value(lit.value, lit.type) if sl is not None else None
    if sx is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    ts = t.scale if t.kind == "DECIMAL" else 0
    col = evaluate(x, batch)
    v = col.values.long()
    if op == "*":
        if ts != sx + sl:
            return None
    else:
        if ts < max(sx, sl):
            return None
        v = scale_up(v, ts - sx)
        value *= 10 ** (ts - sl)
    if abs(value) >= 2 ** 63:
        return None
    if op == "+":
        out = v + value
    elif op == "*":
        out = v * value
    else:
        out = value - v if lit_left else v - value
    if t.kind == "INT64" or t.precision > 18:  # _checked's estimate, with the literal as a float
        est = {"+": v.double() + float(value), "*": v.double() * float(value),
               "-": (float(value) - v.double()) if lit_left else (v.double() - float(value))}[op].abs()
        if col.valid is not None:
            est = torch.where(col.valid, est, torch.zeros_like(est))
        if len(est) and bool((est > _INT64_SAFE).any()):
            raise SqlError(f"overflow in {t} {op}: the result exceeds the int64 storage range")
    return Column(out.to(t.torch_dtype), col.valid, t)


def _checked(op: str, av: torch.Tensor, bv: torch.Tensor, t: T.SqlType, valid) -> torch.Tensor:
    """+ - * that raise instead of wrapping around (DuckDB raises an out-of-range error too).
    INT32 results are computed in int64 and range-checked exactly; int64 storage (BIGINT, wide
    DECIMAL) is checked against a float64 estimate."""
    fn = {"+": torch.add, "-": torch.sub, "*": torch.mul}[op]
    if t.kind == "INT32":
        wide = fn(av.long(), bv.long())
        bad = (wide < -2**31) | (wide >= 2**31)
        if valid is not None:
            bad &= valid
        if bool(bad.any()):
            raise SqlError(f"overflow in INT32 {op}")
        return wide.to(torch.int32)
    out = fn(av, bv)
    if out.dtype == torch.int64 and (t.kind == "INT64" or (t.kind == "DECIMAL" and t.precision > 18)):
        est = fn(av.double(), bv.double()).abs()
        if valid is not None:
            est = torch.where(valid, est, torch.zeros_like(est))
        if len(est) and bool((est > _INT64_SAFE).any()):
            raise SqlError(f"overflow in {t} {op}: the result exceeds the int64 storage range")
    return out


def _neg(e, args, batch):
    (a,) = args
    return Column(-a.values, a.valid, a.type)


def _abs(e, args, batch):
    (a,) = args
    return Column(a.values.abs(), a.valid, a.type)


def _round(e, args, batch):
    (a,) = args
    digits = e.extra
    if a.type.kind == "DECIMAL":
        drop = max(a.type.scale - digits, 0)
        return Column(round_div(a.values, 10 ** drop), a.valid, e.type)
    if a.type.is_float:
        f = 10.0 ** digits
        v = a.values
        return Column(torch.sign(v) * torch.floor(v.abs() * f + 0.5) / f, a.valid, e.type)
    return a


FUNCS.update({"arith": _arith, "neg": _neg, "abs": _abs, "round": _round})
LITERAL_PATHS["arith"] = _arith_literal
