"""``COPY table | (query) TO 'file' (FORMAT parquet | csv, ...)`` and ``COPY table [(cols)] FROM 'file'``.

TO writes the rows whole or not at all (``data_files.write``); FROM appends the file's rows to a
table made by CREATE TABLE, through the same path as ``INSERT INTO t SELECT * FROM read_...('file')``
(values cast to the table's types, constraints checked, one commit on a database). Both answer
the row count, as DuckDB does."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import data_files
from opforge.sql.errors import NotSupportedError, SqlError


def _options(tree: exp.Copy) -> tuple[str | None, dict[str, object]]:
    fmt, options = None, {}
    for p in tree.args.get("params") or []:
        key = p.this.name.lower()
        value = data_files.option_value(p.expression)
        if key == "format":
            fmt = str(value)
        else:
            options[key] = value
    return fmt, options


def run(con, tree: exp.Copy) -> int:
    files = tree.args.get("files") or []
    if len(files) != 1 or not isinstance(files[0], exp.Literal) or not files[0].is_string:
        raise NotSupportedError("COPY: expected one quoted file name")
    path = files[0].this
    given, options = _options(tree)
    fmt = data_files.format_of(path, given)
    if tree.args.get("kind"):  # FROM
        return _copy_from(con, tree.this, path, fmt, options)
    source = tree.this
    if isinstance(source, exp.Subquery):
        query = source.this
    elif isinstance(source, exp.Table):
        query = exp.select("*").from_(source.copy())
    elif isinstance(source, exp.Schema):
        query = exp.select(*[exp.column(c.name, quoted=True) for c in source.expressions]).from_(source.this.copy())
    else:
        raise NotSupportedError(f"COPY {source.sql(dialect='duckdb')} TO")
    data = con.sql(query.sql(dialect="duckdb")).to_arrow(dictionary=True)
    data_files.write(data, path, fmt, options)
    return data.num_rows


def _copy_from(con, target: exp.Expression, path: str, fmt: str, options: dict[str, object]) -> int:
    if fmt == "parquet":
        if options:
            raise NotSupportedError(f"COPY ... FROM parquet option(s) {sorted(options)}")
        reader = exp.ReadParquet(expressions=[exp.Literal.string(path)])
    else:
        items = [exp.EQ(this=exp.column(k), expression=_option_literal(v)) for k, v in options.items()]
        reader = exp.ReadCSV(this=exp.Literal.string(path), expressions=items)
    if not isinstance(target, (exp.Table, exp.Schema)):
        raise SqlError(f"COPY ... FROM: expected a table, got {target.sql(dialect='duckdb')}")
    insert = exp.Insert(this=target.copy(), expression=exp.select("*").from_(exp.Table(this=reader)))
    return con.sql(insert.sql(dialect="duckdb")).fetchall()[0][0]


def _option_literal(value) -> exp.Expression:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))

