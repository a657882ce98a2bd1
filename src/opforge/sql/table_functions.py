"""Table functions in FROM, each made a hidden table of the connection that the statement reads.

``range(...)`` / ``generate_series(...)``: the series is made on the host. Why: DuckDB's tests build
their data with them (``CREATE TABLE t AS SELECT ... FROM range(1000)``); a binder operator would be
the faster path for huge series, but constant bounds are all those statements use.

``read_parquet('f')`` / ``read_csv('f', header=..., delim=...)`` / ``FROM 'f.parquet'``: the file (or
the files a glob or a list names) registered as a table (``data_files``); Parquet stays lazy,
each column read on first use (several files must share their columns and types). The hidden table is kept for the file as long as its
size and modification time stay the same, so repeated queries reuse the columns already loaded."""
from __future__ import annotations

import itertools
import os

import pyarrow as pa
from sqlglot import exp

from opforge.sql import data_files
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
        if isinstance(fn, (exp.ReadParquet, exp.ReadCSV)) or _is_file_name(con, table):
            _read_file(con, table)
            continue
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


def _is_file_name(con, table: exp.Table) -> bool:
    ident = table.this
    return (isinstance(ident, exp.Identifier) and ident.quoted and table.args.get("db") is None
            and ident.name not in con._tables and ident.name.lower() not in con.views
            and data_files.looks_like_file(ident.name))


def _options(items: list[exp.Expression], fn: str) -> dict[str, object]:
    out = {}
    for item in items:
        if not isinstance(item, exp.EQ) or not isinstance(item.this, exp.Column):
            raise NotSupportedError(f"{fn}: argument {item.sql(dialect='duckdb')} (options are name = value)")
        out[item.this.name.lower()] = data_files.option_value(item.expression)
    return out


def _paths(arg: exp.Expression, fn: str) -> list[str]:
    items = arg.expressions if isinstance(arg, exp.Array) else [arg]
    if not items or not all(isinstance(i, exp.Literal) and i.is_string for i in items):
        raise NotSupportedError(f"{fn}: the files must be a string or a list of strings")
    return [p for i in items for p in data_files.expand(i.this)]


def _read_file(con, table: exp.Table) -> None:
    fn = table.this
    if isinstance(fn, exp.ReadParquet):
        first, rest = (fn.expressions or [None])[0], fn.expressions[1:]
        fmt, label = "parquet", "read_parquet"
    elif isinstance(fn, exp.ReadCSV):
        first, rest, fmt, label = fn.this, list(fn.expressions or []), "csv", "read_csv"
    else:
        first, rest, label = exp.Literal.string(fn.name), [], os.path.basename(fn.name).split(".")[0]
        fmt = data_files.format_of(fn.name)
    if first is None:
        raise SqlError(f"{label}: expected a file name")
    paths = _paths(first, label)
    options = _options(rest, label)
    if fmt == "parquet" and options:
        raise NotSupportedError(f"read_parquet option(s) {sorted(options)}")
    key = (fmt, tuple(options.items()), tuple((os.path.abspath(p), os.stat(p).st_mtime_ns, os.stat(p).st_size)
                                             for p in paths))
    name = con._file_tables.get(key)
    if name is None:
        name = f"__file_{next(_NAMES)}"
        if fmt == "parquet":  # several files: one lazy table over them (``Table.from_parquet_files``)
            source = paths[0] if len(paths) == 1 else paths
        else:
            csv = data_files.CsvOptions(options)
            parts = [data_files.read_csv(p, csv) for p in paths]
            source = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
        con.register(name, source)
        con._file_tables[key] = name
    table.set("this", exp.to_identifier(name))
    if table.args.get("alias") is None:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(label)))
