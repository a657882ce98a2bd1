"""A table: named columns of equal length on one device, loaded from Arrow, pandas, Parquet or CSV.

Partitioned tables: a list of Arrow tables / record batches, or a Parquet file of several row
groups, is registered as one table whose rows keep their partitions (``bounds``: the first row of
each partition, then the row count). Each column's per-partition min / max (``partition_range``,
storage units, NULLs ignored) lets a scan skip partitions that a filter or a runtime filter
excludes. ``partition_key``: the column whose hash places the rows on workers in the simulated
multi-worker mode (``physical/simulated_workers.py``).

Columns load lazily (``LazyColumns``): a table read from Arrow, pandas, Parquet or CSV keeps the
Arrow data on the host and a column reaches the device the first time something reads it; names,
types and the row count come from the Arrow schema without loading anything."""
from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from opforge.sql import column_load, parquet_read
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import SqlError


class LazyColumns(Sequence):
    """The columns of a table loaded from Arrow or Parquet, each converted to a device ``Column``
    (with its sortedness checked) on first access and cached. Why: device memory and load time;
    only the columns queries read reach the device (TPC-H's wide comment strings, which no query
    reads, cost most of an eager load: dictionary encoding, sorting, a Python tuple of millions of
    strings). The types are mapped from the Arrow schema up front, so an unsupported type still
    fails at register. ``read(i)`` gives column ``i``'s Arrow data: from an Arrow table in memory,
    or from a Parquet file, which is then read one column at a time (its other columns are never
    read). An Arrow table stays on the host (it is the data an out-of-core scan slices)."""

    def __init__(self, schema: pa.Schema, num_rows: int, read, device):
        self.device = device
        self.names = list(schema.names)
        self.types = [T.from_arrow(f.type, f.name) for f in schema]
        self.arrow_types = list(schema.types)
        self.num_rows = num_rows
        self._read = read
        self._columns: list[Column | None] = [None] * len(self.names)
        self.parquet: tuple[str, pq.FileMetaData] | None = None  # the file, when read from one
        self.files: list[tuple[str, pq.FileMetaData]] = []  # the Parquet files, in row order, when read from them
        self.arrow: pa.Table | None = None  # the host data, when read from Arrow
        self.host_dictionaries: dict = {}  # column -> its sorted words, for chunks (sql/outofcore)

    @staticmethod
    def of_arrow(source: pa.Table, device) -> "LazyColumns":
        """Kept on the host: an out-of-core scan reads it in slices (``sql/outofcore/chunked_scan.py``)
        and a column unloaded from the device can be read again."""
        columns = LazyColumns(source.schema, source.num_rows, lambda i: source.column(i).chunks, device)
        columns.arrow = source
        return columns

    @staticmethod
    def of_parquet(path: str, meta: pq.FileMetaData, device) -> "LazyColumns":
        """Each column of the file ``meta`` describes, its row groups decoded in parallel on first
        access (``parquet_read``); string columns as Parquet's dictionaries."""
        schema = meta.schema.to_arrow_schema()
        columns = LazyColumns(schema, meta.num_rows, _parquet_reader([(path, meta)], schema), device)
        columns.parquet = (path, meta)  # an out-of-core scan reads it in chunks (sql/outofcore/chunked_scan.py)
        columns.files = [(path, meta)]
        return columns

    @staticmethod
    def of_parquet_files(files: list[tuple[str, pq.FileMetaData]], device) -> "LazyColumns":
        """The rows of several Parquet files of one schema, one after the other (a database's
        table, ``sql/database.py``): nothing is read until a column is used, and an out-of-core
        scan reads the files batch by batch, so the table never has to fit in host memory."""
        if len(files) == 1:
            return LazyColumns.of_parquet(*files[0], device)
        schema = files[0][1].schema.to_arrow_schema()
        columns = LazyColumns(schema, sum(meta.num_rows for _, meta in files), _parquet_reader(files, schema), device)
        columns.files = list(files)
        return columns

    def __len__(self) -> int:
        return len(self._columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        col = self._columns[i]
        if col is None:
            col = column_load.load_column(self._read(i), self.num_rows, self.arrow_types[i], self.device,
                                          self.names[i]).mark_sorted()
            self._columns[i] = col
        return col

    def loaded(self) -> list[str]:
        """Names of the columns already on the device."""
        return [n for n, c in zip(self.names, self._columns) if c is not None]

    def loaded_bytes(self) -> int:
        return sum(_column_bytes(c) for c in self._columns if c is not None)

    def unload(self, keep=()) -> int:
        """Drop the device copies of the loaded columns not named in ``keep``, when they can be read
        again (a Parquet file's, an Arrow table's); the bytes freed. Why: under a device memory limit
        (``sql/outofcore``) columns cached by earlier queries must not crowd out this one's."""
        if not self.files and self.arrow is None:
            return 0
        freed = 0
        for i, c in enumerate(self._columns):
            if c is not None and self.names[i] not in keep:
                freed += _column_bytes(c)
                self._columns[i] = None
        return freed

    def __repr__(self) -> str:
        return f"LazyColumns({len(self)} columns, loaded: {self.loaded()})"


def _parquet_reader(files: list[tuple[str, pq.FileMetaData]], schema: pa.Schema):
    """``read(i)`` for LazyColumns: column ``i``'s row groups of each file in turn (string columns as
    Parquet's dictionaries)."""
    def read(i):
        field = schema.field(i)
        as_dictionary = column_load.is_string(field.type) and not pa.types.is_dictionary(field.type)
        return parquet_read.RowGroups(files, field.name, as_dictionary)
    return read


def _described(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _column_bytes(c: Column) -> int:
    return c.values.numel() * c.values.element_size() + (0 if c.valid is None else c.valid.numel())


@dataclass
class Table:
    names: list[str]
    columns: list[Column] | LazyColumns  # LazyColumns: loaded on first access of each column
    bounds: list[int] | None = None  # partitions: [start_0, start_1, ..., num_rows]
    partition_key: str | None = None
    _ranges: dict = field(default_factory=dict, repr=False)

    @property
    def num_partitions(self) -> int:
        return 1 if self.bounds is None else len(self.bounds) - 1

    def partition_range(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(min, max) of column ``name`` in each partition (int64, or float64 for floating
        columns); a partition with only NULLs gets (max, min) of the dtype: no range meets it.
        None for an unpartitioned table or a column without order (BOOL)."""
        if self.bounds is None:
            return None
        if name not in self._ranges:
            col = self.column(name)
            v = col.values
            if v.dtype == torch.bool:
                self._ranges[name] = None
                return None
            v = v.double() if v.dtype.is_floating_point else v.long()
            info = torch.finfo(v.dtype) if v.dtype.is_floating_point else torch.iinfo(v.dtype)
            sizes = torch.tensor([b - a for a, b in zip(self.bounds[:-1], self.bounds[1:])], device=v.device)
            pid = torch.repeat_interleave(torch.arange(len(sizes), device=v.device), sizes)
            lo = torch.full((len(sizes),), info.max, dtype=v.dtype, device=v.device)
            hi = torch.full((len(sizes),), info.min, dtype=v.dtype, device=v.device)
            if col.valid is not None:
                pid, v = pid[col.valid], v[col.valid]
            lo.scatter_reduce_(0, pid, v, reduce="amin")
            hi.scatter_reduce_(0, pid, v, reduce="amax")
            self._ranges[name] = (lo, hi)
        return self._ranges[name]

    def partition_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Row indices (ascending) of the partitions where ``keep`` is True."""
        starts = torch.tensor(self.bounds[:-1], device=keep.device)
        sizes = torch.tensor(self.bounds[1:], device=keep.device) - starts
        starts, sizes = starts[keep], sizes[keep]
        total = int(sizes.sum()) if sizes.numel() else 0
        pid = torch.repeat_interleave(torch.arange(len(sizes), device=keep.device), sizes, output_size=total)
        offset = torch.cumsum(sizes, 0) - sizes
        return starts[pid] + torch.arange(total, device=keep.device) - offset[pid]

    @property
    def num_rows(self) -> int:
        if isinstance(self.columns, LazyColumns):
            return self.columns.num_rows
        return len(self.columns[0]) if self.columns else 0

    def column(self, name: str) -> Column:
        return self.columns[self.names.index(name)]

    @property
    def types(self) -> list[T.SqlType]:
        """The columns' types (loads nothing)."""
        if isinstance(self.columns, LazyColumns):
            return list(self.columns.types)
        return [c.type for c in self.columns]

    def column_type(self, name: str) -> T.SqlType:
        """The type of column ``name`` (loads nothing)."""
        return self.types[self.names.index(name)]

    def loaded_columns(self) -> list[str]:
        """Names of the columns on the device (every column of a table built from Columns)."""
        if isinstance(self.columns, LazyColumns):
            return self.columns.loaded()
        return list(self.names)

    @staticmethod
    def from_arrow(t: pa.Table, device) -> "Table":
        # each column is converted on first access; its sortedness is checked then, so joins on
        # a table loaded in key order can merge
        return Table(list(t.column_names), LazyColumns.of_arrow(t, device))

    @staticmethod
    def from_pandas(df: pd.DataFrame, device) -> "Table":
        return Table.from_arrow(pa.Table.from_pandas(df, preserve_index=False), device)

    @staticmethod
    def from_partitions(parts: list, device) -> "Table":
        """One table from several Arrow tables / record batches of one schema, one partition each."""
        tables = [pa.Table.from_batches([p]) if isinstance(p, pa.RecordBatch) else p for p in parts]
        if not tables or not all(isinstance(t, pa.Table) for t in tables):
            raise TypeError("register: a partitioned table is a non-empty list of pyarrow Tables / RecordBatches")
        if any(not t.schema.equals(tables[0].schema) for t in tables):
            raise SqlError("register: the partitions' schemas differ")
        table = Table.from_arrow(pa.concat_tables(tables), device)
        bounds = [0]
        for t in tables:
            bounds.append(bounds[-1] + t.num_rows)
        table.bounds = bounds
        return table

    @staticmethod
    def from_parquet(path: str, device) -> "Table":
        """A Parquet file as a table whose columns are read on first use; several row groups make
        it a partitioned table (a row group is a partition)."""
        try:
            meta = pq.ParquetFile(path).metadata
            columns = LazyColumns.of_parquet(path, meta, device)
        except (pa.ArrowInvalid, OSError) as e:
            raise SqlError(f"register: {path!r} is not a readable Parquet file: {e}") from None
        return Table._of_row_groups(columns, [meta])

    @staticmethod
    def from_parquet_folder(path: str, device) -> "Table":
        """The Parquet files of a folder (``*.parquet``, in name order; names starting with ``.`` or
        ``_`` skipped, as Arrow's datasets skip them) as one table (``from_parquet_files``): what a
        partitioned data set or a parallel writer leaves."""
        names = sorted(f for f in os.listdir(path) if f.endswith(".parquet") and f[0] not in "._")
        if not names:
            raise SqlError(f"register: folder {path!r} holds no .parquet file")
        return Table.from_parquet_files([os.path.join(path, n) for n in names], device, f"folder {path!r}")

    @staticmethod
    def from_parquet_files(paths: list[str], device, what: str = "the list") -> "Table":
        """Parquet files as one lazy table, their rows one after the other (each column read on first
        use, out of core in chunks); every file must have the first one's columns and types."""
        files = []
        for file in paths:
            try:
                files.append((file, pq.ParquetFile(file).metadata))
            except (pa.ArrowInvalid, OSError) as e:
                raise SqlError(f"register: {file!r} is not a readable Parquet file: {e}") from None
        schema = files[0][1].schema.to_arrow_schema()
        for file, meta in files[1:]:
            other = meta.schema.to_arrow_schema()
            if not other.equals(schema):
                raise SqlError(f"register: the files of {what} differ: {file!r} has columns "
                               f"{_described(other)}, {files[0][0]!r} has {_described(schema)}")
        return Table._of_row_groups(LazyColumns.of_parquet_files(files, device), [meta for _, meta in files])

    @staticmethod
    def _of_row_groups(columns: "LazyColumns", metas: list) -> "Table":
        """A lazy Parquet table; several row groups make it a partitioned table (a row group is a
        partition)."""
        table = Table(list(columns.names), columns)
        sizes = [meta.row_group(i).num_rows for meta in metas for i in range(meta.num_row_groups)]
        if len(sizes) > 1:
            table.bounds = [0, *itertools.accumulate(sizes)]
        return table

    @staticmethod
    def load(obj, device) -> "Table":
        """Accepts a pyarrow.Table, a pandas.DataFrame, a list of pyarrow Tables / RecordBatches (one
        partition each), a path to a .parquet (row groups are partitions) / .csv file, a folder of
        .parquet files or a list of their paths."""
        if isinstance(obj, pa.Table):
            return Table.from_arrow(obj, device)
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(o, (str, os.PathLike)) for o in obj):
                return Table.from_parquet_files([os.fspath(o) for o in obj], device)
            return Table.from_partitions(list(obj), device)
        if isinstance(obj, pd.DataFrame):
            return Table.from_pandas(obj, device)
        if isinstance(obj, (str, os.PathLike)):
            path = os.fspath(obj)
            if not os.path.exists(path):
                raise SqlError(f"register: file {path!r} does not exist")
            if os.path.isdir(path):
                return Table.from_parquet_folder(path, device)
            if path.endswith(".parquet"):
                return Table.from_parquet(path, device)
            if path.endswith(".csv"):
                # empty fields are NULL, as DuckDB reads them
                opts = pacsv.ConvertOptions(strings_can_be_null=True)
                return Table.from_arrow(pacsv.read_csv(path, convert_options=opts), device)
            raise SqlError(f"register: {path!r} is neither .parquet nor .csv")
        raise TypeError(f"register: expected a pyarrow.Table, pandas.DataFrame or path, got {type(obj).__name__}")

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays([c.to_arrow() for c in self.columns], names=self.names)

    def to(self, device: torch.device) -> "Table":
        return Table(self.names, [Column(c.values.to(device), None if c.valid is None else c.valid.to(device),
                                         c.type, c.dictionary, c.sorted) for c in self.columns],
                     self.bounds, self.partition_key)
