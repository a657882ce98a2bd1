"""Parsing with sqlglot's DuckDB dialect; syntax errors become SqlError naming line and column."""
from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError

from opforge.sql.errors import SqlError


# DuckDB aggregates sqlglot has no node for: parsed as AnonymousAggFunc (an aggregate to the binder)
# instead of Anonymous (a scalar call). decimal_average(x): the exact average of a DECIMAL, in its type.
ANONYMOUS_AGGREGATES = ("decimal_average",)
for _name in ANONYMOUS_AGGREGATES:
    DuckDB.Parser.FUNCTIONS.setdefault(
        _name.upper(), lambda args, dialect=None, _name=_name: exp.AnonymousAggFunc(this=_name, expressions=args))


def parse(text: str) -> exp.Expression:
    trees = parse_all(text)
    if len(trees) != 1:
        raise SqlError(f"expected exactly one SQL statement, got {len(trees)}")
    return trees[0]


def parse_all(text: str) -> list[exp.Expression]:
    """Every statement of ``text`` (separated by semicolons)."""
    try:
        trees = [t for t in sqlglot.parse(text, read="duckdb") if t is not None]
    except ParseError as e:
        info = e.errors[0] if e.errors else {}
        where = f" at line {info.get('line')}, column {info.get('col')}" if info else ""
        raise SqlError(f"syntax error{where}: {info.get('description', str(e))}") from None
    except TokenError as e:
        raise SqlError(f"syntax error: {e}") from None
    from opforge.sql.frontend.covariance import covariances
    from opforge.sql.frontend.exact_sums import exact_sums
    return [covariances(exact_sums(t)) for t in trees]
