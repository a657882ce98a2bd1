"""``range(...)`` / ``generate_series(...)`` in FROM: the series is made on the host as a hidden table
of the connection and the statement reads that table. Why: DuckDB's tests build their data with
them (``CREATE TABLE t AS SELECT ... FROM range(1000)``); a binder operator would be the faster path
for huge series, but constant bounds are all those statements use."""
from __future__ import annotations

import itertools

import pyarrow as pa
from sqlglot import exp

from opforge.sql.ddl import literal_value
from opforge.sql.errors import NotSupportedError, SqlError

_NAMES = itertools.count()


def _series(node: exp.GenerateSeries) -> range:
    try:
        start, end = literal_value(node.args["start"]), literal_value(node.args["end"])
        step = literal_value(node.args["step"]) if node.args.get("step") is not None else 1
    except LookupError:
        raise NotSupportedError(f"{node.sql(dialect='duckdb')}: only constant integer bounds") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)):
        raise NotSupportedError(f"{node.sql(dialect='duckdb')}: only integer bounds")
    if step == 0:
        raise SqlError("range: the step must not be 0")
    exclusive = bool(node.args.get("is_end_exclusive"))
    stop = end if exclusive else end + (1 if step > 0 else -1)
    return range(start, stop, step)


def materialize(con, tree: exp.Expression) -> exp.Expression:
    """``tree`` with each series in FROM replaced by a hidden table holding its values."""
    for table in list(tree.find_all(exp.Table)):
        fn = table.this
        if not isinstance(fn, exp.GenerateSeries):
            continue
        alias = table.args.get("alias")
        column = "range" if fn.args.get("is_end_exclusive") else "generate_series"
        if alias is not None and alias.columns:
            column = alias.columns[0].name
            alias.set("columns", None)
        name = f"__series_{next(_NAMES)}"
        con._put_table(name, pa.table({column: pa.array(_series(fn), pa.int64())}))
        table.set("this", exp.to_identifier(name))
        if alias is None:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(column)))
    return tree
