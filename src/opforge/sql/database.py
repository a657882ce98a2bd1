"""A database folder: the tables CREATE TABLE makes, kept as Parquet files that a JSON catalog names.

Layout: ``<folder>/catalog.json`` and ``<folder>/data/<random>.parquet``. The catalog holds a format
version, a commit number (``version``) and per table its data files (in order), row count and
constraints; the files hold the rows and the exact Arrow schema.

A commit (``Database.commit``): new data files are written aside and fsynced (``durable_files``),
then the new catalog is written to a temporary file, fsynced and renamed over ``catalog.json``:
that rename is the commit point. A process killed before it leaves the previous catalog, which
names only the previous files; after it, the new state is complete. Files the catalog no longer
names are deleted after the commit and, when a crash got in the way, on the next open (orphans).
An INSERT adds one file (no rewrite); UPDATE / DELETE / CREATE rewrite the table's files.

Several connections may open one folder: commits and the orphan sweep hold an exclusive ``flock``
on ``<folder>/lock``, a connection re-reads the catalog when its file changed (``refresh``), and
a commit made on a stale catalog is refused rather than losing the other connection's commit."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.runtime import durable_files
from opforge.sql import parquet_write
from opforge.sql.errors import SqlError

FORMAT = "opforge-db"
FORMAT_VERSION = 1
CATALOG = "catalog.json"
DATA = "data"
MAX_FILES = 64  # an appended table with more files than this is rewritten as one set


class StaleCatalogError(SqlError):
    """A commit on a catalog another connection has changed since this one read it."""


@dataclass
class TableEntry:
    """One table in the catalog: its files in row order, rows and constraints (``ddl.MemoryTable``'s)."""
    files: list[str]
    rows: int
    not_null: list[str] = field(default_factory=list)
    unique: list[list[str]] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)  # column -> SQL text (DuckDB dialect)

    def to_json(self) -> dict:
        return {"files": self.files, "rows": self.rows, "not_null": self.not_null, "unique": self.unique,
                "defaults": self.defaults}

    @staticmethod
    def from_json(d: dict) -> "TableEntry":
        return TableEntry(list(d["files"]), int(d["rows"]), list(d.get("not_null", [])),
                          [list(u) for u in d.get("unique", [])], dict(d.get("defaults", {})))


class Database:
    def __init__(self, folder: str):
        self.folder = os.path.abspath(os.fspath(folder))
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise SqlError(f"connect: {folder!r} exists and is not a database folder")
        os.makedirs(os.path.join(self.folder, DATA), exist_ok=True)
        self.version = 0
        self.tables: dict[str, TableEntry] = {}
        self._stamp = None
        with self._locked():
            self._read()
            self._sweep()

    # ------------------------------------------------------------------------------ reading
    @property
    def catalog_path(self) -> str:
        return os.path.join(self.folder, CATALOG)

    def _file(self, name: str) -> str:
        return os.path.join(self.folder, DATA, name)

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.folder, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _catalog_stamp(self):
        try:
            st = os.stat(self.catalog_path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read(self) -> None:
        stamp = self._catalog_stamp()
        if stamp is None:
            self.version, self.tables, self._stamp = 0, {}, None
            return
        with open(self.catalog_path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
            raise SqlError(f"connect: {self.catalog_path} is not an {FORMAT} catalog of format "
                           f"version {FORMAT_VERSION}")
        self.version = int(doc["version"])
        self.tables = {name: TableEntry.from_json(t) for name, t in doc["tables"].items()}
        self._stamp = stamp

    def changed(self) -> bool:
        """Whether another connection committed since this one last read the catalog."""
        return self._catalog_stamp() != self._stamp

    def refresh(self) -> bool:
        """Re-reads the catalog if it changed; True when it did."""
        if not self.changed():
            return False
        with self._locked():
            self._read()
        return True

    def _sweep(self) -> None:
        """Deletes what no commit names: data files of writes that never committed, files a commit
        replaced, temporary files. Called holding the lock."""
        named = {f for t in self.tables.values() for f in t.files}
        data = os.path.join(self.folder, DATA)
        removed = False
        for name in os.listdir(data):
            if name not in named:
                os.remove(os.path.join(data, name))
                removed = True
        for name in os.listdir(self.folder):
            if durable_files.is_temp(name):
                os.remove(os.path.join(self.folder, name))
                removed = True
        if removed:
            durable_files.fsync_dir(data)

    def load(self, name: str) -> pa.Table:
        """The rows of table ``name`` (its files, in order), checked against the catalog's count."""
        entry = self.tables[name]
        parts = [pq.ParquetFile(self._file(f)).read() for f in entry.files]
        data = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if data.num_rows != entry.rows:
            raise SqlError(f"database {self.folder}: table {name!r} has {data.num_rows} rows in its files, "
                           f"the catalog says {entry.rows}")
        return data

    def parquet_files(self, name: str) -> list[tuple[str, pq.FileMetaData]]:
        """Table ``name``'s files with their Parquet metadata (nothing else is read), checked against
        the catalog's row count: what a query reads from, chunk by chunk under a memory limit."""
        entry = self.tables[name]
        files = [(self._file(f), pq.ParquetFile(self._file(f)).metadata) for f in entry.files]
        rows = sum(meta.num_rows for _, meta in files)
        if rows != entry.rows:
            raise SqlError(f"database {self.folder}: table {name!r} has {rows} rows in its files, "
                           f"the catalog says {entry.rows}")
        return files

    # ------------------------------------------------------------------------------ writing
    def _write_files(self, data: pa.Table) -> list[str]:
        """Writes ``data`` as a new data file (fsynced, not yet named by the catalog); its name in a
        list. Its row groups are encoded side by side (``parquet_write.write``); dictionary-encoded
        columns are stored as plain columns of their values."""
        name = f"{uuid.uuid4().hex}.parquet"  # write_aside leaves nothing under it when it fails
        durable_files.write_aside(self._file(name), lambda tmp: parquet_write.write(data, tmp), sync_dir=False)
        return [name]

    def commit(self, changes: dict[str, Change | None]) -> None:
        """Makes ``changes`` (table -> its new content, or None: dropped) the database's state in
        one atomic step. Holds the lock from the first data file to the catalog's rename, so the
        orphan sweep of another connection never sees this statement's files half-way."""
        with self._locked():
            if self.changed():
                raise StaleCatalogError(f"database {self.folder}: another connection committed since this "
                                        "one read the catalog; the statement was not applied")
            tables = dict(self.tables)
            written: list[str] = []
            try:
                for name, change in changes.items():
                    if change is None:
                        tables.pop(name, None)
                        continue
                    old = tables.get(name)
                    if change.appended is not None and old is not None and len(old.files) < MAX_FILES:
                        files = self._write_files(change.appended) if change.appended.num_rows else []
                        written += files
                        files = old.files + files
                    else:
                        files = self._write_files(change.data)
                        written += files
                    tables[name] = TableEntry(files, change.data.num_rows, sorted(change.not_null),
                                              [list(u) for u in change.unique], dict(change.defaults))
                durable_files.fsync_dir(os.path.join(self.folder, DATA))
                doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "version": self.version + 1,
                       "tables": {n: t.to_json() for n, t in sorted(tables.items())}}
                text = json.dumps(doc, indent=1)
                durable_files.write_aside(self.catalog_path, lambda tmp: _write_text(tmp, text))  # commit point
            except BaseException:
                self._discard(written)
                raise
            self.version, self.tables, self._stamp = self.version + 1, tables, self._catalog_stamp()
            self._sweep()

    def _discard(self, files: list[str]) -> None:
        """Removes data files of a statement that failed before its commit."""
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._file(f))


@dataclass
class Change:
    """A table's new content for ``Database.commit``: all its rows (``data``), and when the change
    only appended rows, those rows (``appended``: written as one more file instead of a rewrite)."""
    data: pa.Table
    appended: pa.Table | None = None
    not_null: set[str] = field(default_factory=set)
    unique: list[list[str]] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
