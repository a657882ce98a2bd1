"""Date functions: EXTRACT and month arithmetic."""
from __future__ import annotations

from opforge.sql import dates
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.expr.evaluation import FUNCS


def _extract(e, args, batch):
    (a,) = args
    return Column(dates.extract(e.extra, a.values), a.valid, T.INT64)


def _add_months(e, args, batch):
    (a,) = args
    return Column(dates.add_months(a.values, e.extra), a.valid, T.DATE)


FUNCS.update({"extract": _extract, "add_months": _add_months})
