"""INTERVAL in date / timestamp arithmetic: ``x + INTERVAL 3 DAY``, ``INTERVAL '1 year 2 months'``,
``INTERVAL (i) DAY`` (an amount computed per row), ``INTERVAL 1 DAY + x``, ``x - INTERVAL ...``.

There is no INTERVAL column type: an interval is taken apart at binding into DuckDB's three parts,
months, days and microseconds (each a constant or an integer expression), and the date or
timestamp arithmetic is bound directly: DuckDB adds the months first (the day clamped to the target
month's length), then the days, then the microseconds. A DATE plus months / days stays a DATE (as
this engine did before); a DATE plus hours or less becomes a TIMESTAMP (as DuckDB)."""
from __future__ import annotations

import re

from sqlglot import exp

from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr import Expr, Func, Lit

MICROS = 10 ** 6
# unit -> (part, factor): DuckDB's names, singular, plural and short
_UNITS = {}
for _names, _part, _factor in (
        (("year", "years", "y", "yr", "yrs"), "months", 12),
        (("quarter", "quarters"), "months", 3),
        (("month", "months", "mon", "mons"), "months", 1),
        (("week", "weeks", "w"), "days", 7),
        (("day", "days", "d"), "days", 1),
        (("hour", "hours", "h", "hr", "hrs"), "micros", 3600 * MICROS),
        (("minute", "minutes", "m", "min", "mins"), "micros", 60 * MICROS),
        (("second", "seconds", "s", "sec", "secs"), "micros", MICROS),
        (("millisecond", "milliseconds", "ms", "msec", "msecs"), "micros", 1000),
        (("microsecond", "microseconds", "us", "usec", "usecs"), "micros", 1)):
    for _n in _names:
        _UNITS[_n] = (_part, _factor)

_PAIR = re.compile(r"\s*([+-]?\d+)\s*([a-zA-Z]+)\s*")


def _unit(name: str) -> tuple[str, int]:
    hit = _UNITS.get(name.lower())
    if hit is None:
        raise NotSupportedError(f"interval unit {name}")
    return hit


def interval_parts(node: exp.Interval, bind) -> dict[str, list]:
    """``{"months": [...], "days": [...], "micros": [...]}``: each part's terms, Python ints or
    bound integer expressions already multiplied by the unit's factor."""
    parts = {"months": [], "days": [], "micros": []}
    amount = node.this
    unit = node.args.get("unit")
    if unit is None:  # INTERVAL '1 year 2 months'
        if not (isinstance(amount, exp.Literal) and amount.is_string):
            raise NotSupportedError(f"interval {node.sql(dialect='duckdb')}")
        text = amount.this
        pos = 0
        for m in _PAIR.finditer(text):
            if m.start() != pos:
                break
            part, factor = _unit(m.group(2))
            parts[part].append(int(m.group(1)) * factor)
            pos = m.end()
        if pos != len(text) or pos == 0:
            raise NotSupportedError(f"interval text {text!r} (only 'N unit [N unit ...]')")
        return parts
    part, factor = _unit(unit.name)
    if isinstance(amount, exp.Literal):
        try:
            parts[part].append(int(amount.this) * factor)
        except ValueError:
            raise NotSupportedError(f"interval amount {amount.this!r} (an integer is needed)") from None
        return parts
    e = bind(amount)
    if isinstance(e, Lit) and e.value is None:
        parts[part].append(None)
        return parts
    if not e.type.is_integer:
        raise NotSupportedError(f"interval amount of type {e.type} (an integer is needed)")
    e = Func("cast", [e], T.INT64) if e.type.kind != "INT64" else e
    parts[part].append(e if factor == 1 else Func("arith", [e, Lit(factor, T.INT64)], T.INT64, "*"))
    return parts


def _total(terms: list, sign: int) -> Expr:
    """The sum of a part's terms (times ``sign``) as one INT64 expression (a literal when constant)."""
    if any(t is None for t in terms):
        return Lit(None, T.INT64)
    const = sign * sum(t for t in terms if isinstance(t, int))
    out: Expr = Lit(const, T.INT64)
    for t in terms:
        if not isinstance(t, int):
            out = Func("arith", [out, t], T.INT64, "+" if sign > 0 else "-")
    return out


def _constant(e: Expr) -> int | None:
    return e.value if isinstance(e, Lit) and isinstance(e.value, int) and not isinstance(e.value, bool) else None


def add_interval(base: Expr, node: exp.Interval, sign: int, bind) -> Expr:
    """``base + sign * interval`` for a DATE or TIMESTAMP ``base``."""
    parts = interval_parts(node, bind)
    months, days, micros = (_total(parts[p], sign) for p in ("months", "days", "micros"))
    if any(isinstance(x, Lit) and x.value is None for x in (months, days, micros)) or (
            isinstance(base, Lit) and base.value is None):
        return Lit(None, base.type if base.type.kind == "TIMESTAMP" or _constant(micros) == 0 else T.timestamp(6))
    if base.type.kind == "DATE":
        if _constant(micros) == 0:
            m, d = _constant(months), _constant(days)
            if m is not None and d is not None:  # constants: the plain day / month arithmetic
                out = base if m == 0 else Func("add_months", [base], T.DATE, m)
                return out if d == 0 else Func("arith", [out, Lit(d, T.INT32)], T.DATE, "+")
            return Func("date_add_interval", [base, months, days], T.DATE)
        base = Func("date_to_timestamp", [base], T.timestamp(6))
    if base.type.kind != "TIMESTAMP":
        raise SqlError(f"interval arithmetic needs a DATE or TIMESTAMP, got {base.type}")
    if base.type.tz not in (None, "UTC", "Etc/UTC", "+00:00") and (_constant(months), _constant(days)) != (0, 0):
        raise NotSupportedError(f"month / day intervals on a TIMESTAMPTZ in zone {base.type.tz} (only UTC)")
    if base.type.scale < 6:
        c = _constant(micros)
        if c is None or c % 10 ** (6 - base.type.scale):
            raise NotSupportedError(f"an interval finer than the {base.type} column's unit")
    return Func("timestamp_add_interval", [base, months, days, micros], base.type)
