"""The persistent autotune cache: SQLite in WAL mode, JSON lines in and out.

One row per tuning key. The key holds every fact that can change which
config wins (op, variant, kernel version, triton, torch, GPU name, SM count,
dtype, shape bucket), so an entry is never reused where any of them differ.
Many processes may tune into one file at once: each write is one short
``BEGIN IMMEDIATE`` transaction, readers never block in WAL mode, and rows are
whole JSON values, so there are no torn entries. A corrupted file or one of
another schema version is ignored with one warning, never a crash: the process
then keeps its results in memory. A single bad row (config not a JSON object,
a field of the wrong type) is dropped with one warning wherever it is read;
JSON lines are checked line by line, and an import refuses a bad line by its
number. Whether a config fits its variant is :mod:`opforge.runtime.autotune`'s
business (it knows the variants).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from opforge.runtime import nearest

SCHEMA_VERSION = 1
FILE_NAME = "autotune.sqlite"


@dataclass(frozen=True)
class TuneKey:
    op: str  # "opforge::add"
    variant: str
    kernel_version: str
    triton: str
    torch: str
    gpu: str
    sm_count: int
    dtype: str
    shape_bucket: str

    def text(self) -> str:
        """The primary key: every field, in order, as one JSON array (unambiguous)."""
        return json.dumps(list(asdict(self).values()))


@dataclass
class TuneEntry:
    key: TuneKey
    config: dict[str, Any]
    median_ms: float
    created: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(
            {"key": asdict(self.key), "config": self.config, "median_ms": self.median_ms, "created": self.created},
            sort_keys=True,
        )

    @staticmethod
    def from_json(line: str) -> "TuneEntry":
        """The entry on one JSON line; a ``ValueError`` says what is wrong with it."""
        try:
            d = json.loads(line)
        except ValueError as e:
            raise ValueError(f"not JSON ({e})") from None
        if not isinstance(d, dict) or not isinstance(d.get("key"), dict):
            raise ValueError("not an object with a 'key' object")
        fields = {f: d["key"].get(f) for f in TuneKey.__dataclass_fields__}
        extra = sorted(set(d["key"]) - set(fields))
        if extra:
            raise ValueError(f"unknown key field(s) {extra}")
        return checked_entry(fields, d.get("config"), d.get("median_ms"), d.get("created", 0.0))


class BadRow(ValueError):
    """A row or JSON line that is not a well-formed entry."""


def checked_entry(key_fields: dict[str, Any], config: Any, median_ms: Any, created: Any = 0.0) -> TuneEntry:
    """A ``TuneEntry`` from loosely typed parts, or ``BadRow`` naming the wrong part."""
    for name, f in TuneKey.__dataclass_fields__.items():
        value = key_fields.get(name)
        want = int if f.type in (int, "int") else str
        if not isinstance(value, want) or isinstance(value, bool):
            raise BadRow(f"key field {name!r} is {value!r}, not {'an int' if want is int else 'a string'}")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            raise BadRow(f"config {config[:60]!r} is not JSON") from None
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise BadRow(f"config {config!r:.60} is not a JSON object")
    for name, value in (("median_ms", median_ms), ("created", created)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise BadRow(f"{name} {value!r} is not a finite number >= 0")
    return TuneEntry(TuneKey(**key_fields), dict(config), float(median_ms), float(created))


def default_cache_dir() -> Path:
    env = os.environ.get("OPFORGE_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("opforge"))
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opforge"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    op TEXT NOT NULL, variant TEXT NOT NULL, kernel_version TEXT NOT NULL,
    triton TEXT NOT NULL, torch TEXT NOT NULL, gpu TEXT NOT NULL, sm_count INTEGER NOT NULL,
    dtype TEXT NOT NULL, shape_bucket TEXT NOT NULL,
    config TEXT NOT NULL, median_ms REAL NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ceilings (device TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL);
"""


class CacheUnusable(Exception):
    pass


class AutotuneCache:
    """Tuned entries for this machine; ``path=None`` keeps them in memory only.

    Every database access goes through ``_db``: a database error at any point
    turns the cache into an in-memory one with a single warning.
    """

    def __init__(self, path: Path | str | None):
        self.path = Path(path) if path is not None else None
        self._memory: dict[str, TuneEntry] = {}
        self._warned: set[str] = set()
        self._memory_ceilings: dict[str, dict] = {}
        self._local = threading.local()
        self._groups: dict[tuple, list[nearest.Indexed]] | None = None
        self._version = 0  # bumped by every write: an index built across a write is not kept
        self.usable = self.path is not None
        if self.path is not None:
            try:
                self._open()
            except (CacheUnusable, sqlite3.DatabaseError, OSError) as e:
                self._give_up(e, stacklevel=3)

    # -- connection ------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None or getattr(self._local, "pid", None) != os.getpid():
            con = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
            con.execute("PRAGMA busy_timeout = 60000")
            self._local.con, self._local.pid = con, os.getpid()
        return con

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = self._connect()
        mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise CacheUnusable(f"could not switch to WAL mode (got {mode})")
        with _transaction(con):
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    con.execute(stmt)
            row = con.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            if row is None:
                con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise CacheUnusable(f"schema version {row[0]}, this opforge reads version {SCHEMA_VERSION}")
        con.execute("SELECT count(*) FROM entries").fetchone()

    def _db(self, work, default=None):
        """Run ``work(connection)``; on a database error, fall back to memory."""
        if not self.usable:
            return default
        try:
            return work(self._connect())
        except sqlite3.DatabaseError as e:
            self._give_up(e)
            return default

    def _give_up(self, e: Exception, stacklevel: int = 3) -> None:
        self.usable = False
        warnings.warn(
            f"opforge: ignoring the autotune cache {self.path} ({e}); tuned results stay in memory "
            f"for this process. Run `opforge tune --clear` (or delete the file) to start a fresh one.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )

    def reset_file(self) -> None:
        """Delete the database file (and its WAL) and start an empty one."""
        if self.path is None:
            return
        self._local = threading.local()
        self._changed()
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)
        self._memory.clear()
        self._memory_ceilings.clear()
        self.usable = True
        try:
            self._open()
        except (CacheUnusable, sqlite3.DatabaseError, OSError) as e:
            self._give_up(e)

    # -- entries ---------------------------------------------------------
    def get(self, key: TuneKey) -> TuneEntry | None:
        k = key.text()
        if k in self._memory:
            return self._memory[k]
        row = self._db(lambda con: con.execute(
            "SELECT config, median_ms, created FROM entries WHERE key = ?", (k,)).fetchone())
        if row is None:
            return None
        try:
            entry = checked_entry(asdict(key), *row)
        except BadRow as e:
            self.drop(key, f"{e}; calls use the shipped entry if any, else the default config")
            return None
        self._memory[k] = entry
        return entry

    def drop(self, key: TuneKey, why: str) -> None:
        """Delete ``key``'s row (a bad one), with one warning saying why."""
        k = key.text()
        self._memory.pop(k, None)
        self._changed()

        def delete(con):
            with _transaction(con):
                con.execute("DELETE FROM entries WHERE key = ?", (k,))

        self._db(delete)
        self._warn_bad(k, f"dropped the autotune cache row for {key.op} {key.variant} "
                          f"[{key.dtype} {key.shape_bucket}] in {self.path or 'memory'}: {why}")

    def _warn_bad(self, k: str, message: str) -> None:
        if k not in self._warned:
            self._warned.add(k)
            warnings.warn(f"opforge: {message}", RuntimeWarning, stacklevel=4)

    def put(self, entry: TuneEntry) -> None:
        self.put_many([entry])

    def put_many(self, entries: Iterable[TuneEntry]) -> int:
        entries = list(entries)
        for e in entries:
            self._memory[e.key.text()] = e
        self._changed()
        rows = [
            (e.key.text(), *asdict(e.key).values(), json.dumps(e.config, sort_keys=True), e.median_ms, e.created)
            for e in entries
        ]

        def write(con):
            with _transaction(con):
                con.executemany("INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)

        if rows:
            self._db(write)
        return len(entries)

    def entries(self) -> list[TuneEntry]:
        rows = self._db(lambda con: con.execute(
            "SELECT op, variant, kernel_version, triton, torch, gpu, sm_count, dtype, shape_bucket,"
            " config, median_ms, created FROM entries ORDER BY key").fetchall())
        if rows is None:
            return list(self._memory.values())
        out = []
        for r in rows:
            fields = dict(zip(TuneKey.__dataclass_fields__, r[:9]))
            try:
                out.append(checked_entry(fields, *r[9:]))
            except BadRow as e:  # skipped here; ``get`` drops it when a call reaches it
                self._warn_bad(json.dumps(list(fields.values())), f"skipped a bad autotune cache row "
                               f"({fields['op']} {fields['variant']}) in {self.path}: {e}")
        return out

    def clear(self) -> None:
        """Forget every entry; a file that cannot be used is replaced by a fresh one."""
        self._memory.clear()
        self._memory_ceilings.clear()
        self._changed()
        if self.path is not None and not self.usable:
            self.reset_file()
            return

        def wipe(con):
            with _transaction(con):
                con.execute("DELETE FROM entries")
                con.execute("DELETE FROM ceilings")

        self._db(wipe)

    def _changed(self) -> None:
        self._version += 1
        self._groups = None

    def groups(self) -> dict[tuple, list[nearest.Indexed]]:
        """Every entry indexed for nearest-bucket lookups (:func:`nearest.index`):
        one scan of the table when first asked and after each write of this
        process, not one per new shape. Rows that other processes write later
        are seen after this process's next write."""
        groups = self._groups
        if groups is None:
            version = self._version
            groups = nearest.index(self.entries())
            if version == self._version:
                self._groups = groups
        return groups

    # -- JSON lines --------------------------------------------------------
    def export_jsonl(self, path: Path | str) -> int:
        entries = self.entries()
        Path(path).write_text("".join(e.to_json() + "\n" for e in entries))
        return len(entries)

    def import_jsonl(self, path: Path | str, *, check: Callable[[TuneEntry], str | None] | None = None,
                     refused: list[str] | None = None) -> int:
        """Merge the entries of a JSON lines file; returns how many were stored.

        A line that is not a well-formed entry, or that ``check`` finds fault
        with, is refused: ``"LINE: why"`` goes to ``refused`` (or a warning
        when no list is given), and the other lines are still imported."""
        problems: list[str] = []
        entries = read_jsonl(Path(path).read_text(), on_bad=lambda n, why: problems.append(f"{n}: {why}"),
                             check=check)
        if refused is not None:
            refused.extend(problems)
        else:
            for p in problems:
                warnings.warn(f"opforge: {path}:{p} (line refused)", RuntimeWarning, stacklevel=2)
        return self.put_many(entries)

    # -- measured ceilings (copy bandwidth, matmul rate) per device --------
    def get_ceilings(self, device: str) -> dict | None:
        if device in self._memory_ceilings:
            return self._memory_ceilings[device]
        row = self._db(lambda con: con.execute("SELECT value FROM ceilings WHERE device = ?", (device,)).fetchone())
        try:
            value = json.loads(row[0]) if row else None
        except (TypeError, ValueError):  # a bad row is measured again, never a crash
            return None
        return value if isinstance(value, dict) else None

    def put_ceilings(self, device: str, value: dict) -> None:
        self._memory_ceilings[device] = value

        def write(con):
            with _transaction(con):
                con.execute("INSERT OR REPLACE INTO ceilings VALUES (?, ?, ?)", (device, json.dumps(value), time.time()))

        self._db(write)


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: one writer at a time, never a torn row."""

    def __init__(self, con: sqlite3.Connection):
        self.con = con

    def __enter__(self):
        self.con.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.con.execute("COMMIT")
        else:
            try:
                self.con.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        return False


def read_jsonl(text: str, *, on_bad: Callable[[int, str], None] | None = None,
               check: Callable[[TuneEntry], str | None] | None = None) -> list[TuneEntry]:
    """The entries of JSON lines text (blank lines skipped). A bad line (or one
    ``check`` faults) raises ``ValueError`` naming its number, or, with
    ``on_bad``, is reported as ``on_bad(line_number, why)`` and left out."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = TuneEntry.from_json(line)
            why = check(entry) if check is not None else None
            if why:
                raise BadRow(why)
        except ValueError as e:
            if on_bad is None:
                raise ValueError(f"line {n}: {e}") from None
            on_bad(n, str(e))
            continue
        out.append(entry)
    return out


class ShippedTable:
    """Tuned defaults that ship inside the package (``runtime/tuned/*.jsonl``)."""

    def __init__(self) -> None:
        self._entries: dict[str, TuneEntry] | None = None
        self._groups: dict[tuple, list[nearest.Indexed]] | None = None

    def _load(self) -> dict[str, TuneEntry]:
        if self._entries is None:
            self._entries = {}
            folder = resources.files("opforge.runtime") / "tuned"
            items = sorted(folder.iterdir(), key=lambda p: p.name) if folder.is_dir() else []
            for item in items:
                if item.name.endswith(".jsonl"):
                    def bad(n, why, name=item.name):
                        warnings.warn(f"opforge: skipped line {n} of the shipped table {name}: {why}",
                                      RuntimeWarning, stacklevel=4)

                    for e in read_jsonl(item.read_text(), on_bad=bad):
                        self._entries[e.key.text()] = e
        return self._entries

    def drop(self, key: TuneKey, why: str) -> None:
        """Forget a shipped entry for this process (a bad one), with one warning."""
        if self._load().pop(key.text(), None) is not None:
            self._groups = None
            warnings.warn(f"opforge: ignoring the shipped tuned entry for {key.op} {key.variant} "
                          f"[{key.dtype} {key.shape_bucket}]: {why}", RuntimeWarning, stacklevel=4)

    def get(self, key: TuneKey) -> TuneEntry | None:
        return self._load().get(key.text())

    def groups(self) -> dict[tuple, list[nearest.Indexed]]:
        """The shipped entries indexed for nearest-bucket lookups, built once."""
        if self._groups is None:
            self._groups = nearest.index(self._load().values())
        return self._groups

    def __len__(self) -> int:
        return len(self._load())


_cache: AutotuneCache | None = None
_cache_dir: Path | None = None
shipped = ShippedTable()


def autotune_cache() -> AutotuneCache:
    """The process-wide cache at ``$OPFORGE_CACHE_DIR/autotune.sqlite``."""
    global _cache, _cache_dir
    folder = default_cache_dir()
    if _cache is None or folder != _cache_dir:
        _cache, _cache_dir = AutotuneCache(folder / FILE_NAME), folder
    return _cache
