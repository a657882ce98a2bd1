"""``FileSource``: records from Parquet, Arrow IPC, CSV or JSON-lines files
(read by pyarrow), one file or a directory (Flink's ``FileSource``).

A directory's files are read in name order; hidden files (``.x``, ``_x``)
are skipped, as Flink does, so a writer can write ``.name`` and rename it in
when complete. Files are dealt to subtasks by a hash of their name (stable as
files arrive). ``monitor_interval_ms=None`` is the bounded mode: the files
present at the start are read and the source ends. With an interval the
source is continuous (unbounded): when a subtask has read all it knows, it
lists the directory again at most every ``monitor_interval_ms`` and picks up
new files; it never ends (cancel the job, or stop it with a savepoint).

The split's position is ``{"done": [files read], "file": name, "row": n}``,
kept in checkpoints: a restored job skips read files and resumes ``name`` at
row ``n``. Files are assumed immutable once visible.
"""

from __future__ import annotations

import os
import time as _time
import zlib

from opforge.stream.sources import Source, SourceSplit

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow", ".csv": "csv",
           ".json": "json", ".jsonl": "json", ".ndjson": "json"}


def read_table(path: str, fmt: str):
    """The whole file as an Arrow table."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if fmt == "arrow":
        import pyarrow.feather as feather

        return feather.read_table(path, memory_map=False)
    if fmt == "csv":
        import pyarrow.csv as pcsv

        return pcsv.read_csv(path)
    import pyarrow.json as pjson

    return pjson.read_json(path)


class FileSource(Source):
    def __init__(self, path, format: str | None = None, monitor_interval_ms: int | None = None):
        self.path = os.fspath(path)
        if format is None:
            ext = os.path.splitext(self.path)[1].lower()
            if os.path.isdir(self.path) or ext not in FORMATS:
                raise ValueError(f"FileSource: give format= ('parquet', 'arrow', 'csv' or 'json') for {self.path!r}")
            format = FORMATS[ext]
        if format not in ("parquet", "arrow", "csv", "json"):
            raise ValueError(f"FileSource: format must be 'parquet', 'arrow', 'csv' or 'json', got {format!r}")
        if monitor_interval_ms is not None and (isinstance(monitor_interval_ms, bool)
                                                or not isinstance(monitor_interval_ms, int)
                                                or monitor_interval_ms < 0):
            raise ValueError(f"FileSource: monitor_interval_ms must be None or a non-negative int, "
                             f"got {monitor_interval_ms!r}")
        if monitor_interval_ms is not None and not os.path.isdir(self.path):
            raise ValueError(f"FileSource: monitoring needs a directory, {self.path!r} is not one")
        if monitor_interval_ms is None and not os.path.exists(self.path):
            raise ValueError(f"FileSource: {self.path!r} does not exist")
        self.format = format
        self.monitor_interval_ms = monitor_interval_ms

    @staticmethod
    def for_parquet(path, monitor_interval_ms: int | None = None) -> "FileSource":
        return FileSource(path, "parquet", monitor_interval_ms)

    @staticmethod
    def for_arrow(path, monitor_interval_ms: int | None = None) -> "FileSource":
        """Arrow IPC files (Feather v2): no encoding, the fastest to write and read back."""
        return FileSource(path, "arrow", monitor_interval_ms)

    @staticmethod
    def for_csv(path, monitor_interval_ms: int | None = None) -> "FileSource":
        return FileSource(path, "csv", monitor_interval_ms)

    @staticmethod
    def for_json_lines(path, monitor_interval_ms: int | None = None) -> "FileSource":
        return FileSource(path, "json", monitor_interval_ms)

    @property
    def bounded(self) -> bool:
        return self.monitor_interval_ms is None

    def list_files(self) -> list[str]:
        if os.path.isfile(self.path):
            return [self.path]
        names = sorted(n for n in os.listdir(self.path) if not n.startswith((".", "_")))
        return [os.path.join(self.path, n) for n in names if os.path.isfile(os.path.join(self.path, n))]

    def splits(self, parallelism, batch_size, device):
        return [FileSplit(self, i, parallelism, batch_size) for i in range(parallelism)]


def _owner(path: str, parallelism: int) -> int:
    return zlib.crc32(os.path.basename(path).encode()) % parallelism


class FileSplit(SourceSplit):
    """One subtask's files: read whole by pyarrow, handed out ``batch_size`` rows at a time."""

    def __init__(self, source: FileSource, index: int, parallelism: int, batch_size: int):
        self.source, self.index, self.parallelism, self.batch_size = source, index, parallelism, batch_size
        self.done: list[str] = []
        self.done_set: set[str] = set()
        self.queue: list[str] = []
        self.file: str | None = None
        self.row = 0
        self.table = None
        self.last_listing: float | None = None
        self.listed_once = False

    def _list(self) -> None:
        known = self.done_set | set(self.queue) | ({self.file} if self.file else set())
        for f in self.source.list_files():
            name = os.path.relpath(f, self.source.path) if os.path.isdir(self.source.path) else f
            if name not in known and _owner(f, self.parallelism) == self.index:
                self.queue.append(name)
        self.last_listing = _time.monotonic()
        self.listed_once = True

    def _full_path(self, name: str) -> str:
        return os.path.join(self.source.path, name) if os.path.isdir(self.source.path) else name

    def __next__(self):
        while True:
            if self.file is not None:
                if self.table is None:
                    self.table = read_table(self._full_path(self.file), self.source.format)
                if self.row < self.table.num_rows:
                    chunk = self.table.slice(self.row, self.batch_size)
                    self.row += chunk.num_rows
                    return chunk
                self.done.append(self.file)
                self.done_set.add(self.file)
                self.file, self.table, self.row = None, None, 0
            if self.queue:
                self.file = self.queue.pop(0)
                continue
            interval = self.source.monitor_interval_ms
            if not self.listed_once:
                self._list()
                continue
            if interval is None:
                raise StopIteration
            if (_time.monotonic() - self.last_listing) * 1000 >= interval:
                self._list()
                if self.queue:
                    continue
            return []  # nothing new yet: the subtask may go idle

    def position(self):
        return {"done": list(self.done), "file": self.file, "row": self.row}

    def seek(self, position) -> None:
        self.done = list(position["done"])
        self.done_set = set(self.done)
        self.file, self.row, self.table = position["file"], int(position["row"]), None
        self.queue = []
        self.listed_once = False
