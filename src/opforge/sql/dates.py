"""Calendar arithmetic on DATE columns (int32 days since 1970-01-01), vectorized on the device.
Howard Hinnant's civil-from-days algorithms: exact for the proleptic Gregorian calendar."""
from __future__ import annotations

import torch


def _fdiv(a: torch.Tensor, b: int) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


def civil_from_days(days: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z = days.long() + 719468
    era = _fdiv(z, 146097)
    doe = z - era * 146097
    yoe = _fdiv(doe - _fdiv(doe, 1460) + _fdiv(doe, 36524) - _fdiv(doe, 146096), 365)
    doy = doe - (365 * yoe + _fdiv(yoe, 4) - _fdiv(yoe, 100))
    mp = _fdiv(5 * doy + 2, 153)
    d = doy - _fdiv(153 * mp + 2, 5) + 1
    m = torch.where(mp < 10, mp + 3, mp - 9)
    y = yoe + era * 400 + (m <= 2).long()
    return y, m, d


def days_from_civil(y: torch.Tensor, m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    y = y - (m <= 2).long()
    era = _fdiv(y, 400)
    yoe = y - era * 400
    mp = torch.remainder(m + 9, 12)
    doy = _fdiv(153 * mp + 2, 5) + d - 1
    doe = yoe * 365 + _fdiv(yoe, 4) - _fdiv(yoe, 100) + doy
    return era * 146097 + doe - 719468


def add_months(days: torch.Tensor, months: int) -> torch.Tensor:
    """date + interval 'n' month: the day of month is clamped to the target month's length (as DuckDB)."""
    y, m, d = civil_from_days(days)
    total = y * 12 + (m - 1) + months
    y2, m2 = _fdiv(total, 12), torch.remainder(total, 12) + 1
    first = days_from_civil(y2, m2, torch.ones_like(d))
    nxt_total = total + 1
    nxt = days_from_civil(_fdiv(nxt_total, 12), torch.remainder(nxt_total, 12) + 1, torch.ones_like(d))
    d2 = torch.minimum(d, nxt - first)
    return (first + d2 - 1).to(torch.int32)


def extract(part: str, days: torch.Tensor) -> torch.Tensor:
    y, m, d = civil_from_days(days)
    if part == "year":
        return y
    if part == "month":
        return m
    if part == "day":
        return d
    if part == "quarter":
        return _fdiv(m - 1, 3) + 1
    raise ValueError(f"extract: unknown part {part!r}")
