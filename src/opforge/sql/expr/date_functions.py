"""Date functions: EXTRACT, month arithmetic, and date / timestamp + INTERVAL (frontend/intervals.py)."""
from __future__ import annotations

import torch

from opforge.sql import dates
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import OutOfRangeError
from opforge.sql.expr.evaluation import FUNCS, and_valid, check_range


def _extract(e, args, batch):
    (a,) = args
    return Column(dates.extract(e.extra, a.values), a.valid, T.INT64)


def _add_months(e, args, batch):
    (a,) = args
    return Column(dates.add_months(a.values, e.extra), a.valid, T.DATE)


_DATE_MIN, _DATE_MAX = -2 ** 31 + 2, 2 ** 31 - 2  # DuckDB's DATE range in days (its infinities excluded)


def _date_add_interval(e, args, batch):
    """DATE + months (per row, day clamped) + days: DuckDB's order; a date outside DATE's range raises."""
    base, months, days = args
    out = dates.add_months(base.values, months.values.long()).long() + days.values.long()
    valid = and_valid(base, months, days)
    check_range((out < _DATE_MIN) | (out > _DATE_MAX), valid,
                lambda: OutOfRangeError("Date out of range in date + interval"))
    return Column(out.clamp(_DATE_MIN, _DATE_MAX).to(torch.int32), valid, T.DATE)


def _timestamp_add_interval(e, args, batch):
    """TIMESTAMP + months + days + microseconds, in the column's unit: the months move the date
    part (day clamped), the time of day is kept; the result must stay in int64."""
    base, months, days, micros = args
    per_second = 10 ** base.type.scale
    per_day = 86400 * per_second
    v = base.values
    day = torch.div(v, per_day, rounding_mode="floor")
    tod = v - day * per_day
    moved = dates.add_months(day, months.values.long()).long() + days.values.long()
    m = micros.values.long()
    step = m * (per_second // 10 ** 6) if per_second >= 10 ** 6 else torch.div(m, 10 ** 6 // per_second, rounding_mode="floor")
    valid = and_valid(base, months, days, micros)
    limit = (2 ** 63 - 1) // per_day - 2  # a day count whose timestamp surely fits int64
    check_range(moved.abs() > limit, valid, lambda: OutOfRangeError("Timestamp out of range in timestamp + interval"))
    out = moved.clamp(-limit, limit) * per_day + tod
    total = out + step
    check_range(((out ^ total) & (step ^ total)) < 0, valid,
                lambda: OutOfRangeError("Timestamp out of range in timestamp + interval"))
    return Column(total, valid, base.type)


def _date_to_timestamp(e, args, batch):
    (a,) = args
    return Column(a.values.long() * (86400 * 10 ** e.type.scale), a.valid, e.type)


FUNCS.update({"extract": _extract, "add_months": _add_months, "date_add_interval": _date_add_interval,
              "timestamp_add_interval": _timestamp_add_interval, "date_to_timestamp": _date_to_timestamp})
