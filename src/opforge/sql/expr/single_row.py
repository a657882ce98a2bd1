"""``single_value(count, value)``: the value of a decorrelated scalar subquery, whose rows were
grouped by the outer row's correlated values; more than one row for an outer row is DuckDB's
error ("More than one row returned by a subquery used as an expression"), raised at run time."""
from __future__ import annotations

from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr.evaluation import FUNCS, check_range


def _error(count) -> SqlError:
    return SqlError(f"More than one row returned by a subquery used as an expression ({count} rows); "
                    "scalar subqueries can only return a single row")


def _single_value(e, args, batch):
    count, value = args
    check_range(count.values > 1, count.valid, _error, count.values)
    return Column(value.values, value.valid, value.type, value.dictionary)


FUNCS["single_value"] = _single_value
