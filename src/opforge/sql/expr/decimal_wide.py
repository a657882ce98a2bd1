"""DECIMAL in 128-bit storage (``SqlType.wide``) in expressions: CAST to and from it, + - * and
comparison, negation, abs and round, exactly (``sql/decimal128.py``), with DuckDB's result types
and range errors. The int64 paths in ``casts`` / ``arithmetic`` / ``compare`` hand a wide operand
or result here; nothing else changes for DECIMAL(p <= 18)."""
from __future__ import annotations

import torch

from opforge.sql import decimal128 as D
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import ConversionError, NotSupportedError, OutOfRangeError, SqlError
from opforge.sql.expr.evaluation import check_range

I64_MIN, I64_MAX = -2 ** 63, 2 ** 63 - 1
I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def involves_wide(*types: T.SqlType) -> bool:
    return any(t.wide for t in types)


def _text(v: int, scale: int) -> str:
    from opforge.sql.expr.casts import decimal_text
    return decimal_text(v, scale)


def _scale(t: T.SqlType) -> int:
    return t.scale if t.kind == "DECIMAL" else 0


def _digits(t: T.SqlType) -> int:
    """A bound on the digits of a value of ``t`` (at its own scale)."""
    return t.precision if t.kind == "DECIMAL" else {"INT32": 10, "INT64": 19, "BOOL": 1}.get(t.kind, 39)


def as_wide(col: Column) -> torch.Tensor:
    """The column's exact numeric values as [n, 2] 128-bit integers at its own scale (integers: 0)."""
    if col.type.wide:
        return col.values
    if col.type.kind in ("DECIMAL", "INT32", "INT64", "BOOL"):
        return D.from_int64(col.values.long())
    raise NotSupportedError(f"CAST from {col.type} to a 128-bit DECIMAL")


def cast_wide(col: Column, to: T.SqlType) -> torch.Tensor:
    """CAST where the source or the target is a 128-bit DECIMAL: the target's storage, with
    DuckDB's conversion errors for values the target cannot hold."""
    fr, v, valid = col.type, col.values, col.valid
    if fr == to:
        return v
    if to.wide:
        if fr.is_float:
            x = v.double() * (10 ** to.scale)
            r = torch.sign(x) * torch.floor(x.abs() + 0.5)  # half away from zero
            bad = ~(r.abs() < float(10 ** to.precision))  # NaN and inf too
            check_range(bad, valid, lambda x: ConversionError(f"Could not cast value {x:f} to {to}"), v.double())
            return D.from_float64(torch.where(bad, torch.zeros_like(r), r))
        w = as_wide(col)
        return _rescale(w, fr, to, valid)
    if to.kind == "DECIMAL":
        out = _rescale(v, fr, T.wide_decimal(38, to.scale), valid)
        if to.precision <= 18:
            bad = D.exceeds(out, 10 ** to.precision)
            error = lambda x: ConversionError(  # noqa: E731
                f'Casting value "{_text(x, fr.scale)}" to type {to} failed: value is out of range!')
        else:  # a wider DECIMAL in int64 storage (SUM's type)
            bad = ~D.fits_int64(out)
            error = lambda x: NotSupportedError(  # noqa: E731
                f"CAST of {_text(x, fr.scale)} to {to}: the value does not fit the int64 storage of DECIMAL values")
        check_range(bad, valid, error, v)
        return D.lo(out)
    if to.is_integer:
        q = D.div_pow10(v, fr.scale)
        lo_, hi_ = (I32_MIN, I32_MAX) if to.kind == "INT32" else (I64_MIN, I64_MAX)
        bad = ~D.fits_int64(q) | (D.lo(q) < lo_) | (D.lo(q) > hi_)
        check_range(bad, valid, lambda x: ConversionError(
            f"Failed to cast decimal value {_text(x, fr.scale)} to type {to}"), v)
        return D.lo(q).to(to.torch_dtype)
    if to.is_float:
        narrow = _narrow(col)
        if narrow is not None and narrow[0][1] < 2 ** 63 and 0 < fr.scale <= 18:
            # D.to_float64_scaled's parts (|x| // 10^s, |x| % 10^s) in int64: the same doubles
            m = narrow[0][0].abs()
            f = (m // 10 ** fr.scale).double() + (m % 10 ** fr.scale).double() / 10.0 ** fr.scale
            return torch.where(narrow[0][0] < 0, -f, f).to(to.torch_dtype)
        return D.to_float64_scaled(v, fr.scale).to(to.torch_dtype)
    if to.kind == "BOOL":
        return D.compare("<>", v, torch.zeros_like(v))
    raise NotSupportedError(f"CAST from {fr} to {to}")


def _rescale(w: torch.Tensor, fr: T.SqlType, to: T.SqlType, valid) -> torch.Tensor:
    """128-bit values of ``fr``'s scale moved to ``to``'s (rounding half away from zero), refused
    where they need more than ``to.precision`` digits."""
    fs = _scale(fr)
    k = to.scale - fs
    if fr.kind == "DECIMAL":
        error = lambda x: ConversionError(  # noqa: E731
            f'Casting value "{_text(x, fs)}" to type {to} failed: value is out of range!')
    else:
        error = lambda x: ConversionError(f"Could not cast value {x} to {to}")  # noqa: E731
    # the digits the result can have, from the types: within the target's, there is nothing to check
    # (rounding a value down to fewer decimals adds at most the one digit it removed)
    fits = _digits(fr) + k <= to.precision if k >= 0 else _digits(fr) <= to.precision
    if k >= 0:
        if fits:
            return D.scale_up(w, k)
        bad = D.exceeds(w, 10 ** (to.precision - k))
        out = D.scale_up(torch.where(bad[:, None], torch.zeros_like(w), w), k)
    else:
        out = D.div_pow10(w, -k)
        if fits:
            return out
        bad = D.exceeds(out, 10 ** to.precision)
    check_range(bad, valid, error, w)
    return out


# -- arithmetic -------------------------------------------------------------------------------------
_NAMES = {"+": "addition", "-": "subtraction", "*": "multiplication"}


def arith_wide(op: str, a: Column, b: Column, t: T.SqlType, valid) -> torch.Tensor:
    """``a op b`` for a 128-bit DECIMAL result ``t``. + and -: both operands CAST to ``t`` first
    (DuckDB: "Could not cast value 10000 to DECIMAL(38,35)"); *: the exact product of the operands
    at their own scales. A result beyond ``t``'s digits is DuckDB's overflow error."""
    if op in "+-":
        av, bv = cast_wide(a, t), cast_wide(b, t)
        out, over = (D.add if op == "+" else D.sub)(av, bv)
        digits = max(_digits(a.type) - _scale(a.type), _digits(b.type) - _scale(b.type)) + t.scale + 1
    elif op == "*":
        narrow = _narrow(a, b)
        if narrow is not None and narrow[0][1] * narrow[1][1] < 2 ** 63:  # |product| < 2^63 < 10^19: no check
            return D.from_int64(narrow[0][0] * narrow[1][0])
        av, bv = as_wide(a), as_wide(b)
        out, over = D.mul(av, bv)
        digits = _digits(a.type) + _digits(b.type)
    elif op == "%":
        return _remainder(a, b, t, valid)
    else:
        raise NotSupportedError(f"operator {op} on {t} (128-bit DECIMAL)")
    if digits <= t.precision:  # the operand types bound the result within t: no check
        return out
    bad = over | D.exceeds(torch.where(over[:, None], torch.zeros_like(out), out), 10 ** t.precision)
    sa, sb = (t.scale, t.scale) if op in "+-" else (_scale(a.type), _scale(b.type))
    check_range(bad, valid, lambda x, y: OutOfRangeError(
        f"Overflow in {_NAMES[op]} of DECIMAL({t.precision}) ({_text(x, sa)} {op} {_text(y, sb)})"), av, bv)
    return out


def _narrow(*cols: Column) -> list[tuple[torch.Tensor, int]] | None:
    """Each column's values as int64 with the largest magnitude among them, when every value of each
    fits int64 (SUM results nearly always), read in one host sync; else None. A few int64 ops then
    replace dozens of 128-bit ones: a one-row Project (TPC-H q14's ``100.00 * SUM(...)``) pays per
    launch, a long column per pass."""
    if not len(cols[0]):
        return None
    lows, stats = [], []
    for col in cols:
        v = col.values
        if col.type.wide:
            low = D.lo(v)
            stats.append(D.fits_int64(v).all().long())
        elif col.type.kind in ("DECIMAL", "INT32", "INT64", "BOOL"):
            low = v.long()
            stats.append(torch.ones((), dtype=torch.int64, device=v.device))
        else:
            return None
        lows.append(low)
        stats += [low.min(), low.max()]
    host = torch.stack(stats).tolist()
    out = []
    for i, low in enumerate(lows):
        fits, lo_, hi_ = host[3 * i: 3 * i + 3]
        if not fits:
            return None
        out.append((low, max(-lo_, hi_)))  # Python ints: -(-2^63) is exact
    return out


def _remainder(a: Column, b: Column, t: T.SqlType, valid) -> torch.Tensor:
    """``a % b`` at ``t``'s scale (the remainder of truncating division, the dividend's sign, as
    DuckDB): by long division when every divisor is below 2^31, else in int64 when both sides'
    values fit it (128-by-128-bit division is not implemented: beyond that a clear refusal)."""
    from opforge.sql.expr.arithmetic import int_divmod
    av, bv = cast_wide(a, t), cast_wide(b, t)
    d = D.lo(bv).abs()
    small = D.fits_int64(bv) & (d < 2 ** 31)
    if bool((small if valid is None else small | ~valid).all()):
        check_range(d == 0, valid, lambda: SqlError("division by zero in %"))
        _, r = D.divmod_small(D.abs_(av), torch.where(small & (d > 0), d, torch.ones_like(d)))
        return D.from_int64(torch.where(D.is_negative(av), -r, r))
    fits = D.fits_int64(av) & D.fits_int64(bv)
    if valid is not None:
        fits = fits | ~valid
    if not bool(fits.all()):
        raise NotSupportedError(f"% of {t} values beyond 64 bits")
    return D.from_int64(int_divmod("%", D.lo(av), D.lo(bv), valid))


def neg_wide(v: torch.Tensor) -> torch.Tensor:
    return D.neg(v)  # |v| < 10^38: no overflow


def abs_wide(v: torch.Tensor) -> torch.Tensor:
    return D.abs_(v)


def round_wide(v: torch.Tensor, drop: int) -> torch.Tensor:
    """ROUND to ``drop`` fewer decimals: the value divided by 10^drop, half away from zero."""
    return D.div_pow10(v, drop)


def compare_wide(op: str, a: Column, b: Column) -> torch.Tensor:
    """``a op b`` where either side is a 128-bit DECIMAL (or a float against one: as doubles)."""
    if a.type.is_float or b.type.is_float:
        from opforge.sql.expr.compare import compare_values
        return compare_values(op, cast_wide(a, T.FLOAT64) if a.type.wide else a.values.double(),
                              cast_wide(b, T.FLOAT64) if b.type.wide else b.values.double())
    s = max(_scale(a.type), _scale(b.type))
    narrow = _narrow(a, b)
    if narrow is not None:
        (la, ma), (lb, mb) = narrow
        ka, kb = s - _scale(a.type), s - _scale(b.type)
        if ma * 10 ** ka < 2 ** 63 and mb * 10 ** kb < 2 ** 63:  # both at the common scale in int64
            return _INT_CMP[op](la * 10 ** ka if ka else la, lb * 10 ** kb if kb else lb)
    t = T.wide_decimal(38, s)
    return D.compare(op, _exact(a, t), _exact(b, t))


_INT_CMP = {"=": torch.eq, "<>": torch.ne, "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge}


def _exact(col: Column, t: T.SqlType) -> torch.Tensor:
    """The values at ``t``'s scale; a value whose digits leave 128 bits there compares as a clamp
    (beyond every DECIMAL(38)) instead of raising: a comparison cannot overflow."""
    w = as_wide(col)
    k = t.scale - _scale(col.type)
    if k == 0:
        return w
    big = D.exceeds(w, 10 ** (38 - k))
    up = D.scale_up(torch.where(big[:, None], torch.zeros_like(w), w), k)
    clamp = torch.where(D.is_negative(w)[:, None], D.full(-10 ** 38, len(w), w.device), D.full(10 ** 38, len(w), w.device))
    return torch.where(big[:, None], clamp, up)
