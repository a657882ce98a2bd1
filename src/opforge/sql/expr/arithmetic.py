"""SQL arithmetic (+ - * / // %, unary minus, abs, round) over integers, DECIMALs, floats and dates."""
from __future__ import annotations

import operator

import torch

from opforge.sql import types as T
from opforge.sql.column import Column, storage_value
from opforge.sql.errors import NotSupportedError, OutOfRangeError, SqlError
from opforge.sql.expr import decimal_wide
from opforge.sql.expr.casts import cast_values, round_div, scale_up, storage_error
from opforge.sql.expr.evaluation import FUNCS, LITERAL_PATHS, and_valid, check_range, evaluate
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
    if t.wide:
        return Column(decimal_wide.arith_wide(op, a, b, t, valid), valid, t)
    if t.kind == "DECIMAL" and op == "*":
        da, db = as_decimal_type(a.type), as_decimal_type(b.type)
        av = cast_values(a, T.decimal(18, da.scale))
        bv = cast_values(b, T.decimal(18, db.scale))
        return Column(checked("*", av, bv, t, valid, da.precision + db.precision), valid, t)
    work = t if t.kind != "DECIMAL" else T.decimal(18, t.scale)
    av, bv = cast_values(a, work), cast_values(b, work)
    if op in "+-*":
        out = checked(op, av, bv, t, valid, t.precision if t.kind == "DECIMAL" and op in "+-" else None)
    elif op in ("//", "%"):
        if t.is_float:
            out = torch.div(av, bv, rounding_mode="floor") if op == "//" else torch.fmod(av, bv)
        else:
            out = int_divmod(op, av, bv, valid)
    else:
        raise NotSupportedError(f"operator {op}")
    return Column(out.to(t.torch_dtype), valid, t)


def int_divmod(op: str, av: torch.Tensor, bv: torch.Tensor, valid) -> torch.Tensor:
    """``av // bv`` or ``av % bv`` of integer tensors, truncating (C, DuckDB): the remainder takes
    the dividend's sign; a zero divisor raises."""
    check_range(bv == 0, valid, lambda: SqlError(f"division by zero in {op}"))  # DuckDB raises too
    # x // -1 is -x (the type's minimum overflows, as DuckDB), x % -1 is 0; dividing the
    # minimum by -1 in the hardware traps (SIGFPE on x86), so -1 never reaches it
    minus_one = bv == -1
    safe = torch.where((bv == 0) | minus_one, torch.ones_like(bv), bv)
    if op == "//":
        check_range(minus_one & (av == torch.iinfo(av.dtype).min), valid,
                    lambda x: OutOfRangeError(f"Overflow in division of {x} / -1"), av)
        return torch.where(minus_one, -av, torch.div(av, safe, rounding_mode="trunc"))
    return torch.fmod(av, safe)



def _arith_literal(e: Func, batch) -> Column | None:
    """``x + - * literal`` (either side) with a BIGINT or DECIMAL result and the literal kept a Python
    int: no column of copies and no overflow check of copies (TPC-H's ``1 - l_discount``). The same
    values, scales and overflow checks as ``_arith``. None: not this case (the general path)."""
    a, b = e.args
    op, t = e.extra, e.type
    if op not in ("+", "-", "*") or t.kind not in ("DECIMAL", "INT64") or t.wide:
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
        v = scale_up(v, ts - sx, col.valid, as_decimal_type(x.type).precision)
        value *= 10 ** (ts - sl)
    if abs(value) >= 2 ** 63:
        return None
    av, bv = (value, v) if lit_left else (v, value)
    px, dv = as_decimal_type(x.type).precision, len(str(abs(value)))  # value: at the result's scale for + -
    digits = px + dv if op == "*" else max(px - sx + ts, dv) + 1
    return Column(checked(op, av, bv, t, col.valid, digits).to(t.torch_dtype), col.valid, t)


_OP_NAMES = {"+": "addition", "-": "subtraction", "*": "multiplication"}
_FN = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _overflow_error(op: str, t: T.SqlType):
    """DuckDB's out-of-range message for ``t``; a DECIMAL wider than 18 digits, which DuckDB holds
    in 128 bits, is refused as the limit of this engine's int64 storage."""
    if t.kind == "DECIMAL" and t.precision > 18:
        return storage_error(f"{_OP_NAMES[op]} of {t}")
    if t.kind == "DECIMAL":
        return lambda x, y: OutOfRangeError(f"Overflow in {_OP_NAMES[op]} of DECIMAL(18) ({x} {op} {y}). "
                                            "You might want to add an explicit cast to a bigger decimal.")
    return lambda x, y: OutOfRangeError(f"Overflow in {_OP_NAMES[op]} of {t} ({x} {op} {y})!")


def _as_double(x):
    return x.double() if isinstance(x, torch.Tensor) else float(x)


def mul_overflow(av, bv, product: torch.Tensor, bound: int) -> torch.Tensor:
    """Exactly where ``|av * bv| >= bound`` (``bound`` <= 2^63), elementwise, without 128-bit
    integers or division: ``product`` is the wrapped int64 product. The float64 product is within a
    relative 2^-50 of the true one, so only a thin band around ``bound`` needs the integers: there
    the true product is below 2^64, so it wrapped iff its sign is wrong (bound 2^63), or else it is
    exact and compared directly."""
    est = (_as_double(av) * _as_double(bv)).abs()
    lo, hi = bound * (1 - 2.0 ** -50), bound * (1 + 2.0 ** -50)
    if bound >= 2 ** 63:
        band_bad = (product < 0) != ((av < 0) ^ (bv < 0))
    else:
        band_bad = (product >= bound) | (product <= -bound)
    return (est > hi) | ((est >= lo) & band_bad)


def checked(op: str, av, bv, t: T.SqlType, valid, digits: int | None = None) -> torch.Tensor:
    """+ - * with an overflow check instead of a wrapped-around value (DuckDB raises an out-of-range
    error too). Operands: int64 / int32 / float tensors, or one a Python int. INT32 results are
    computed in int64 and range-checked; int64 results by the sign rule of two's complement for + and
    -, and :func:`mul_overflow` for * (DECIMALs of <= 18 digits within 10^18, as DuckDB). The flags are
    recorded with ``check_range`` (read back once per expression evaluation). ``digits``: a bound
    from the operand types on the digits of the int64 result (a DECIMAL product of p1 + p2 digits,
    a sum of the type's precision); up to 18 the result cannot overflow and goes unchecked."""
    fn = _FN[op]
    if t.kind != "INT32" and digits is not None and digits <= 18:
        return fn(av, bv)
    if t.kind == "INT32":
        wide = fn(_long(av), _long(bv))
        check_range((wide < -2 ** 31) | (wide >= 2 ** 31), valid, _overflow_error(op, t), av, bv)
        return wide.to(torch.int32)
    out = fn(av, bv)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.int64:
        return out
    if op == "+":
        bad = ((av ^ out) & (bv ^ out)) < 0
    elif op == "-":
        bad = ((av ^ bv) & (av ^ out)) < 0
    else:
        bound = 10 ** 18 if t.kind == "DECIMAL" and t.precision <= 18 else 2 ** 63
        bad = mul_overflow(av, bv, out, bound)
    check_range(bad, valid, _overflow_error(op, t), av, bv)
    return out


def _long(x):
    return x.long() if isinstance(x, torch.Tensor) else int(x)


def _neg(e, args, batch):
    (a,) = args
    v = a.values
    if a.type.wide:
        return Column(decimal_wide.neg_wide(v), a.valid, a.type)
    if v.dtype in (torch.int32, torch.int64):
        check_range(v == torch.iinfo(v.dtype).min, a.valid,
                    lambda x: OutOfRangeError("Overflow in negation of numeric value!"), v)
    return Column(-v, a.valid, a.type)


def _abs(e, args, batch):
    (a,) = args
    v = a.values
    if a.type.wide:
        return Column(decimal_wide.abs_wide(v), a.valid, a.type)
    if v.dtype in (torch.int32, torch.int64):
        check_range(v == torch.iinfo(v.dtype).min, a.valid, lambda x: OutOfRangeError(f"Overflow on abs({x})"), v)
    return Column(v.abs(), a.valid, a.type)


def _round(e, args, batch):
    (a,) = args
    digits = e.extra
    if a.type.kind == "DECIMAL":
        drop = max(a.type.scale - digits, 0)
        if a.type.wide:
            return Column(decimal_wide.round_wide(a.values, drop), a.valid, e.type)
        return Column(round_div(a.values, 10 ** drop), a.valid, e.type)
    if a.type.is_float:
        f = 10.0 ** digits
        v = a.values
        return Column(torch.sign(v) * torch.floor(v.abs() * f + 0.5) / f, a.valid, e.type)
    return a


FUNCS.update({"arith": _arith, "neg": _neg, "abs": _abs, "round": _round})
LITERAL_PATHS["arith"] = _arith_literal
