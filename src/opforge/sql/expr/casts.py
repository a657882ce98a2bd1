"""CAST between SQL types on the device: the storage of one type converted to another's.

Two levels: :func:`cast_values` converts storage for the engine's own use (a common type for a
comparison, CASE or UNION, the working scale of arithmetic), where the target always holds the
value and only the int64 storage of a DECIMAL can run out (a ``NotSupportedError``);
:func:`sql_cast` is SQL's CAST, which also refuses values the target type cannot hold (DuckDB's
``Conversion Error`` and its messages). Both record their checks with ``check_range`` (one host
read per expression evaluation)."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import ConversionError, NotSupportedError
from opforge.sql.expr import decimal_wide
from opforge.sql.expr.evaluation import FUNCS, check_range

I64_MAX = 2 ** 63 - 1
I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1
FLOAT32_MAX = 3.4028234663852886e38

# the type names of DuckDB's conversion messages
DUCKDB_NAME = {"INT32": "INT32", "INT64": "INT64", "FLOAT32": "FLOAT", "FLOAT64": "DOUBLE", "BOOL": "BOOLEAN"}


def decimal_text(v: int, scale: int) -> str:
    """The decimal ``v * 10^-scale`` as DuckDB prints it in messages (123.45): exact digits for 38 of
    them (no Decimal context rounding) and no exponent form (0.0000001, not 1E-7)."""
    v = int(v)
    sign, digits = ("-" if v < 0 else ""), str(abs(v))
    if not scale:
        return sign + digits
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def storage_error(what: str):
    def error(*values):
        return NotSupportedError(f"{what}: the value does not fit the int64 storage of DECIMAL values "
                                 f"({', '.join(str(v) for v in values)})")
    return error


def scale_up(v: torch.Tensor, k: int, valid: torch.Tensor | None = None, digits: int | None = None) -> torch.Tensor:
    """``v * 10^k`` in int64 storage; a value that does not fit raises (``NotSupportedError``).
    ``digits``: a bound on the digits of ``v`` from its type (then ``digits + k <= 18`` is unchecked)."""
    if k <= 0:
        return v
    f = 10 ** k
    if digits is not None and digits + k <= 18:
        return v * f
    check_range((v > I64_MAX // f) | (v < -(I64_MAX // f)), valid, storage_error(f"rescaling a DECIMAL by 10^{k}"), v)
    return v * f


def round_div(v: torch.Tensor, factor: int) -> torch.Tensor:
    """Integer division rounding half away from zero (DuckDB's decimal rescale), exact over all of
    int64 (no ``abs``, which is negative at the minimum)."""
    if factor == 1:
        return v
    q = torch.div(v, factor, rounding_mode="trunc")
    r = v - q * factor  # |r| < factor, the sign of v
    up = 2 * r.abs() >= factor
    return q + torch.where(up, torch.sign(v), torch.zeros_like(v))


def _float_to_int(v: torch.Tensor, fr: T.SqlType, to: T.SqlType, valid) -> torch.Tensor:
    """DOUBLE / FLOAT -> INTEGER / BIGINT: round half to even (DuckDB's nearbyint); NaN, inf and
    values outside the target's range raise."""
    r = torch.round(v.double())
    lo, hi = (float(I32_MIN), float(I32_MAX) + 1) if to.kind == "INT32" else (-2.0 ** 63, 2.0 ** 63)
    bad = ~((r >= lo) & (r < hi))  # NaN compares false
    check_range(bad, valid, lambda x: ConversionError(
        f"Type {DUCKDB_NAME[fr.kind]} with value {x!r} can't be cast because the value is out of range for "
        f"the destination type {DUCKDB_NAME[to.kind]}"), v.double())
    return torch.where(bad, torch.zeros_like(r), r).to(to.torch_dtype)


def cast_values(col: Column, to: T.SqlType) -> torch.Tensor:
    """The values of `col` converted to `to`'s storage (NULL slots carry arbitrary values)."""
    fr = col.type
    v = col.values
    if fr == to:
        return v
    if fr.wide or to.wide:
        return decimal_wide.cast_wide(col, to)
    if to.kind == "DECIMAL":
        if fr.kind == "DECIMAL":
            if to.scale >= fr.scale:
                return scale_up(v, to.scale - fr.scale, col.valid, fr.precision)
            return round_div(v, 10 ** (fr.scale - to.scale))
        if fr.is_float:
            x = v.double() * (10 ** to.scale)
            r = torch.sign(x) * torch.floor(x.abs() + 0.5)  # half away from zero
            bad = ~(r.abs() < 2.0 ** 63)
            check_range(bad, col.valid, storage_error(f"CAST to {to}"), v.double())
            return torch.where(bad, torch.zeros_like(r), r).long()
        return scale_up(v.long(), to.scale, col.valid, {"INT32": 10, "BOOL": 1}.get(fr.kind))
    if to.is_float:
        if fr.kind == "DECIMAL":
            return (v.double() / (10 ** fr.scale)).to(to.torch_dtype)
        return v.to(to.torch_dtype)
    if to.is_integer or to.kind == "BOOL":
        if fr.kind == "DECIMAL":
            v = round_div(v, 10 ** fr.scale)
        elif fr.is_float and to.kind != "BOOL":
            return _float_to_int(v, fr, to, col.valid)
        return (v != 0) if to.kind == "BOOL" else v.to(to.torch_dtype)
    if to.kind == "DATE" and fr.kind == "DATE":
        return v
    if {fr.kind, to.kind} == {"DATE", "TIMESTAMP"}:
        return _date_timestamp(col, to)
    raise NotSupportedError(f"CAST from {fr} to {to}")


_UTC = (None, "UTC", "Etc/UTC", "+00:00")


def _date_timestamp(col: Column, to: T.SqlType) -> torch.Tensor:
    """DATE <-> TIMESTAMP: midnight of the day, or the day of the instant (UTC, DuckDB's default
    zone; a TIMESTAMPTZ in another zone is refused)."""
    ts = to if to.kind == "TIMESTAMP" else col.type
    if ts.tz not in _UTC:
        raise NotSupportedError(f"CAST between DATE and a TIMESTAMPTZ in zone {ts.tz} (only UTC)")
    per_day = 86400 * 10 ** ts.scale
    if to.kind == "DATE":
        return torch.div(col.values, per_day, rounding_mode="floor").to(torch.int32)
    days = col.values.long()
    limit = I64_MAX // per_day
    check_range((days > limit) | (days < -limit), col.valid,
                lambda x: ConversionError(f"Could not cast DATE (day {x}) to {to}: out of range"), days)
    return days * per_day


def sql_cast(col: Column, to: T.SqlType) -> torch.Tensor:
    """SQL's CAST: :func:`cast_values`, refusing (``ConversionError``, DuckDB's messages) values the
    target type cannot hold: a DECIMAL's precision, the integer types' ranges, FLOAT's range."""
    fr, v, valid = col.type, col.values, col.valid
    if fr == to:
        return v
    if fr.wide or to.wide:
        return decimal_wide.cast_wide(col, to)
    if to.kind == "DECIMAL" and to.precision <= 18:
        limit = 10 ** to.precision
        if fr.kind == "DECIMAL":
            k = to.scale - fr.scale
            if k >= 0:
                hi = (limit - 1) // 10 ** k
                bad = (v > hi) | (v < -hi)
                v = torch.where(bad, torch.zeros_like(v), v)
                out = cast_values(Column(v, valid, fr), to)
            else:
                out = cast_values(col, to)
                bad = (out >= limit) | (out <= -limit)
            check_range(bad, valid, lambda x: ConversionError(
                f'Casting value "{decimal_text(x, fr.scale)}" to type {to} failed: value is out of range!'), col.values)
            return out
        if fr.is_integer or fr.kind == "BOOL":
            hi = (limit - 1) // 10 ** to.scale
            w = v.long()
            bad = (w > hi) | (w < -hi)
            check_range(bad, valid, lambda x: ConversionError(f"Could not cast value {x} to {to}"), w)
            return cast_values(Column(torch.where(bad, torch.zeros_like(w), w), valid, T.INT64), to)
        if fr.is_float:
            x = v.double() * (10 ** to.scale)
            r = torch.sign(x) * torch.floor(x.abs() + 0.5)
            bad = ~(r.abs() < float(limit))  # NaN and inf too
            check_range(bad, valid, lambda x: ConversionError(f"Could not cast value {x:f} to {to}"), v.double())
            return torch.where(bad, torch.zeros_like(r), r).long()
    if to.kind == "INT32" and fr.kind in ("INT64", "DECIMAL"):
        w = round_div(v, 10 ** fr.scale) if fr.kind == "DECIMAL" else v
        bad = (w < I32_MIN) | (w > I32_MAX)
        if fr.kind == "DECIMAL":
            error = lambda x: ConversionError(f"Failed to cast decimal value {x} to type INT32")  # noqa: E731
        else:
            error = lambda x: ConversionError(  # noqa: E731
                f"Type INT64 with value {x} can't be cast because the value is out of range for the destination "
                f"type INT32")
        check_range(bad, valid, error, w)
        return torch.where(bad, torch.zeros_like(w), w).to(torch.int32)
    if to.kind == "FLOAT32" and fr.kind == "FLOAT64":
        bad = torch.isfinite(v) & (v.abs() > FLOAT32_MAX)
        check_range(bad, valid, lambda x: ConversionError(
            f"Type DOUBLE with value {x!r} can't be cast because the value is out of range for the destination "
            f"type FLOAT"), v)
    return cast_values(col, to)


def coerce(col: Column, t: T.SqlType) -> Column:
    """A column cast to `t` (strings keep their own dictionaries; callers unify)."""
    if col.type == t or t.kind == "STRING":
        return col
    if t.kind in T.NESTED:  # a LIST / STRUCT widened value by value (sql/nested.py)
        from opforge.sql.nested import cast_column
        return cast_column(col, t)
    return Column(cast_values(col, t), col.valid, t)


def _cast(e, args, batch):
    (a,) = args
    values = a.values if e.type.kind == "STRING" else sql_cast(a, e.type)
    return Column(values, a.valid, e.type, a.dictionary if e.type.kind == "STRING" else None)


FUNCS["cast"] = _cast
