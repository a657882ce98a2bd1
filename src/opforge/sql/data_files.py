"""Parquet and CSV files as SQL sees them: ``read_parquet`` / ``read_csv`` / ``FROM 'x.parquet'``
read them, ``COPY ... TO`` writes them (whole or not at all: ``durable_files.write_aside``).

Formats follow DuckDB's defaults: the format comes from a FORMAT option or the file's extension;
CSV files have a header row and ``,`` as delimiter unless told otherwise, empty fields are NULL,
and strings are quoted only when they need it."""
from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.csv as pacsv
from sqlglot import exp

from opforge.runtime import durable_files
from opforge.sql import parquet_write
from opforge.sql.errors import NotSupportedError, SqlError

FORMATS = ("parquet", "csv")


def format_of(path: str, given: str | None = None) -> str:
    """``given`` (a FORMAT option) or the format the file name says."""
    if given is not None:
        fmt = given.lower()
        if fmt not in FORMATS:
            raise NotSupportedError(f"file format {given!r} (only parquet and csv)")
        return fmt
    name = path.lower()
    for fmt in FORMATS:
        if name.endswith("." + fmt) or name.endswith(f".{fmt}.gz"):
            return fmt
    raise SqlError(f"cannot tell the format of {path!r}: name it .parquet / .csv or give (FORMAT ...)")


def looks_like_file(name: str) -> bool:
    """A quoted name in FROM that DuckDB reads as a file (``FROM 'x.parquet'``)."""
    try:
        format_of(name)
    except SqlError:
        return False
    return True


def expand(pattern: str) -> list[str]:
    """The files a path or glob pattern names, sorted; an error when there are none."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths or not all(os.path.isfile(p) for p in paths):
        raise SqlError(f"no file found that matches {pattern!r}")
    return paths


class CsvOptions:
    """HEADER / DELIMITER of read_csv and COPY (DuckDB's names and aliases)."""

    def __init__(self, options: dict[str, object]):
        self.header, self.delimiter = True, ","
        for key, value in options.items():
            if key == "header":
                self.header = _boolean(value, key)
            elif key in ("delimiter", "delim", "sep"):
                if not isinstance(value, str) or len(value) != 1:
                    raise SqlError(f"CSV option {key}: expected one character, got {value!r}")
                self.delimiter = value
            else:
                raise NotSupportedError(f"CSV option {key!r} (only header and delimiter)")


def _boolean(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).lower() in ("1", "0", "true", "false"):
        return str(value).lower() in ("1", "true")
    raise SqlError(f"option {key}: expected a boolean, got {value!r}")


def read_csv(path: str, options: CsvOptions) -> pa.Table:
    read = pacsv.ReadOptions(autogenerate_column_names=not options.header)
    parse = pacsv.ParseOptions(delimiter=options.delimiter)
    convert = pacsv.ConvertOptions(strings_can_be_null=True)  # empty fields are NULL, as DuckDB reads them
    try:
        t = pacsv.read_csv(path, read_options=read, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, OSError) as e:
        raise SqlError(f"reading {path!r}: {e}") from None
    if not options.header:  # DuckDB's names for headerless columns
        t = t.rename_columns([f"column{i}" for i in range(t.num_columns)])
    return t


def write(data: pa.Table, path: str, fmt: str, options: dict[str, object]) -> None:
    """Writes ``data`` to ``path`` atomically: a reader sees the old file or the whole new one.
    Dictionary-encoded columns are written as plain columns of their values."""
    if fmt == "parquet":
        unknown = set(options) - {"compression"}
        if unknown:
            raise NotSupportedError(f"COPY ... TO parquet option(s) {sorted(unknown)} (only compression)")
        compression = str(options.get("compression", "snappy")).lower()
        durable_files.write_aside(path, lambda tmp: parquet_write.write(data, tmp, compression))
        return
    csv = CsvOptions(options)
    data = parquet_write.decoded(data)
    opts = pacsv.WriteOptions(include_header=csv.header, delimiter=csv.delimiter, quoting_style="needed")
    durable_files.write_aside(path, lambda tmp: pacsv.write_csv(data, tmp, write_options=opts))


def option_value(e: exp.Expression | None):
    """The Python value of an option's expression (``HEADER`` alone is true)."""
    if e is None:
        return True
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Literal):
        return e.this if e.is_string else int(e.this)
    if isinstance(e, (exp.Var, exp.Column, exp.Identifier)):
        return e.name
    raise NotSupportedError(f"option value {e.sql(dialect='duckdb')}")
