"""What ``Connection.register`` keeps until the first statement: a table's source (a file path or a
pandas frame), checked as far as that is cheap, not read.

Why: ``connect()`` + ``register()`` of a few tables should take milliseconds (issue 23), and loading
a table needs pyarrow's Parquet / CSV readers, pandas' conversion and the engine's type mapping.
The checks done here (the file exists, its name, Parquet's magic bytes) raise register's own
errors; what needs the file's footer or the frame's conversion (a damaged footer, an unsupported
column type) raises them, with the same messages, at the first statement (``Connection._tables``).
This module imports nothing but the errors: it runs before the engine is loaded."""
from __future__ import annotations

import os
import sys

from opforge.sql.errors import SqlError

PARQUET_MAGIC = b"PAR1"  # the first and the last four bytes of a Parquet file


class TableSource:
    """A source whose reading waits for the first statement; ``load`` reads it as register did."""

    def __init__(self, obj):
        self.obj = obj

    def load(self, device):
        from opforge.sql.table import Table

        return Table.load(self.obj, device)

    def __repr__(self) -> str:
        what = self.obj if isinstance(self.obj, str) else type(self.obj).__name__
        return f"TableSource({what!r})"


def deferred(obj) -> TableSource | None:
    """``obj`` as a source to read at the first statement, after register's cheap checks; None when
    it is loaded at register: Arrow data (already in memory; its types are checked there) and
    anything ``Table.load`` rejects. pandas is looked up, not imported: a frame means it is loaded."""
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        if not os.path.exists(path):
            raise SqlError(f"register: file {path!r} does not exist")
        if path.endswith(".parquet") and not os.path.isdir(path):
            _check_parquet_magic(path)
        elif not (path.endswith(".parquet") or os.path.isdir(path) or path.endswith(".csv")):
            raise SqlError(f"register: {path!r} is neither .parquet nor .csv")
        return TableSource(path)
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(obj, pandas.DataFrame):
        return TableSource(obj)
    return None


def _check_parquet_magic(path: str) -> None:
    """A file cut short or not Parquet at all fails here, as register failed on reading its footer."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except OSError as e:
        raise SqlError(f"register: {path!r} is not a readable Parquet file: {e}") from None
    if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        raise SqlError(f"register: {path!r} is not a readable Parquet file: Parquet magic bytes not found "
                       f"at its start and end (the file is cut short or not Parquet)")
