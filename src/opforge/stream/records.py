"""Micro-batches: the unit the stream engine moves between operators.

A ``Batch`` holds a run of records as columns (name -> 1-D tensor on the
job's device, or a Python list for values a tensor cannot hold, e.g.
strings), their event timestamps (int64 milliseconds; ``NO_TIMESTAMP`` when a
record has none) and, on keyed edges, the records' key ids. A ``RecordSchema``
remembers how the source shaped its records (tuple, dict, dataclass or a bare
value) so that records convert back exactly as they came in.

Column naming follows Flink: tuple fields are ``f0, f1, ...``; a bare value is
``f0``; dict keys and dataclass fields keep their names. Python ints become
int64, floats float64, bools bool; anything else stays a list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from opforge.runtime.host_staging import to_device, torch_dtype, values_view
from opforge.stream.state_types import register_state_type

NO_TIMESTAMP = -(2**63)
"""The timestamp of a record that has none (Flink's ``Long.MIN_VALUE``)."""


class Row(tuple):
    """PyFlink's ``Row``: positional (``Row(1, "a")``, fields ``f0, f1, ...``)
    or named (``Row(id=1, name="a")``: ``row.name``, ``row["name"]``, and the
    names become the stream's column names). Equal to the tuple of its values."""

    def __new__(cls, *values, **named):
        if values and named:
            raise TypeError("Row: give the values by position or by name, not both")
        row = super().__new__(cls, tuple(named.values()) if named else values)
        row._names = tuple(named) if named else None
        return row

    def __getnewargs_ex__(self):
        return ((), dict(zip(self._names, self))) if self._names is not None else (tuple(self), {})

    def __getattr__(self, name):
        names = self.__dict__.get("_names")
        if names is not None and name in names:
            return tuple.__getitem__(self, names.index(name))
        raise AttributeError(f"Row has no field {name!r} (fields: {list(names or ())})")

    def __getitem__(self, item):
        if isinstance(item, str):
            if self._names is None or item not in self._names:
                raise KeyError(f"Row has no field {item!r} (fields: {list(self._names or ())})")
            item = self._names.index(item)
        return tuple.__getitem__(self, item)

    def as_dict(self) -> dict:
        if self._names is None:
            raise TypeError("Row.as_dict: the row's fields have no names (make it as Row(name=value, ...))")
        return dict(zip(self._names, self))

    def __repr__(self) -> str:
        if self._names is None:
            return f"Row({', '.join(map(repr, self))})"
        return f"Row({', '.join(f'{n}={v!r}' for n, v in zip(self._names, self))})"


@dataclass(frozen=True)
class RecordSchema:
    """How records look: ``kind`` in tuple / dict / dataclass / value, the
    column names and, for dataclasses, the class."""

    kind: str
    names: tuple[str, ...]
    cls: type | None = None

    def __post_init__(self):
        if self.cls is not None and "<locals>" not in self.cls.__qualname__:
            register_state_type(self.cls)  # a checkpoint of this job may hold its records

    @staticmethod
    def of(record: Any) -> "RecordSchema":
        if isinstance(record, Row):
            names = record._names
            return RecordSchema("named_row", names) if names is not None else \
                RecordSchema("row", tuple(f"f{i}" for i in range(len(record))))
        if isinstance(record, list):
            return RecordSchema("list", tuple(f"f{i}" for i in range(len(record))))
        if isinstance(record, tuple) and not hasattr(record, "_fields"):
            return RecordSchema("tuple", tuple(f"f{i}" for i in range(len(record))))
        if isinstance(record, tuple):  # namedtuple: fields by name
            return RecordSchema("namedtuple", tuple(record._fields), type(record))
        if isinstance(record, Mapping):
            return RecordSchema("dict", tuple(str(k) for k in record.keys()))
        if dataclasses.is_dataclass(record) and not isinstance(record, type):
            return RecordSchema("dataclass", tuple(f.name for f in dataclasses.fields(record)), type(record))
        return RecordSchema("value", ("f0",))

    def fields_of(self, record: Any, where: str) -> tuple:
        """The record's field values in column order; a clear error when the
        record does not match the stream's shape (e.g. a missing field)."""
        try:
            if self.kind == "tuple":
                if not isinstance(record, tuple) or len(record) != len(self.names):
                    raise ValueError
                return record
            if self.kind in ("list", "row", "named_row"):
                want = {"list": list, "row": Row, "named_row": Row}[self.kind]
                if not isinstance(record, want) or len(record) != len(self.names) or \
                        (self.kind == "named_row" and record._names != self.names):
                    raise ValueError
                return tuple(record)
            if self.kind == "namedtuple":
                if type(record) is not self.cls:
                    raise ValueError
                return tuple(record)
            if self.kind == "dict":
                return tuple(record[n] for n in self.names)
            if self.kind == "dataclass":
                if type(record) is not self.cls:
                    raise ValueError
                return tuple(getattr(record, n) for n in self.names)
            return (record,)
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{where}: record {record!r} does not match the stream's records "
                             f"({self.kind} with fields {list(self.names)})") from None

    def make(self, values: tuple) -> Any:
        if self.kind == "tuple":
            return tuple(values)
        if self.kind == "dict":
            return dict(zip(self.names, values))
        if self.kind == "list":
            return list(values)
        if self.kind == "row":
            return Row(*values)
        if self.kind == "named_row":
            return Row(**dict(zip(self.names, values)))
        if self.kind in ("dataclass", "namedtuple"):
            return self.cls(*values)
        return values[0]


def to_column(values: list, device, name: str = "f0", where: str = "stream") -> torch.Tensor | list:
    """A tensor when every value is a bool, an int or a float; else the list.
    An int column holding a value beyond int64 is an error naming the field
    (``where``: the source or operator making the records)."""
    if values and all(type(v) is bool for v in values):
        return torch.tensor(values, dtype=torch.bool, device=device)
    if values and all(type(v) is int for v in values):
        try:
            return torch.tensor(values, dtype=torch.int64, device=device)
        except (RuntimeError, ValueError, OverflowError):  # beyond int64
            bad = next(v for v in values if not -(2**63) <= v < 2**63)
            raise ValueError(f"{where}: field {name!r} holds {bad}, beyond the int64 range [-2**63, 2**63 - 1] "
                             "of its column; give such values as floats or strings") from None
    if values and all(type(v) in (int, float) for v in values):
        return torch.tensor(values, dtype=torch.float64, device=device)
    return list(values)


def column_len(col) -> int:
    return col.shape[0] if isinstance(col, torch.Tensor) else len(col)


def take(col, index: torch.Tensor):
    """Rows ``index`` (int64 tensor) of a column."""
    if isinstance(col, torch.Tensor):
        return col.index_select(0, index.to(col.device))
    return [col[i] for i in index.tolist()]


def concat_columns(cols: list):
    if all(isinstance(c, torch.Tensor) for c in cols):
        return torch.cat(cols)
    out: list = []
    for c in cols:
        out.extend(c.tolist() if isinstance(c, torch.Tensor) else c)
    return out


@dataclass
class Batch:
    """A run of records as columns. ``timestamps``: int64 ms, one per row;
    ``keys``: int64 key ids on keyed edges (None elsewhere); ``watermarks``:
    the event time each row saw when it arrived (int64, non-decreasing), set
    when watermarks have record granularity (``time.py``) and kept by the
    operators that pass rows on, so that lateness, firings and timers do not
    depend on how the input was batched (None: the batch saw one watermark);
    ``arrival``: with them, each row's position in its source poll, so that a
    two-input operator meets both inputs' rows in the source's order."""

    columns: dict[str, torch.Tensor | list]
    timestamps: torch.Tensor
    schema: RecordSchema | None
    keys: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)
    watermarks: torch.Tensor | None = None
    arrival: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.timestamps.shape[0]

    def __getitem__(self, name: str):
        return self.columns[name]

    def __contains__(self, name) -> bool:
        return name in self.columns

    @property
    def device(self) -> torch.device:
        return self.timestamps.device

    @staticmethod
    def empty(device, schema: RecordSchema | None = None) -> "Batch":
        cols = {n: [] for n in schema.names} if schema else {}
        return Batch(cols, torch.empty(0, dtype=torch.int64, device=device), schema)

    @staticmethod
    def from_records(records: Iterable, device, timestamps=None, schema: RecordSchema | None = None,
                     where: str = "stream") -> "Batch":
        """Columns from records shaped alike (the first record sets the shape)."""
        records = list(records)
        if not records:
            return Batch.empty(device, schema)
        schema = schema or RecordSchema.of(records[0])
        rows = [schema.fields_of(r, where) for r in records]
        cols = {n: to_column([row[i] for row in rows], device, n, where) for i, n in enumerate(schema.names)}
        if timestamps is None:
            ts = torch.full((len(records),), NO_TIMESTAMP, dtype=torch.int64, device=device)
        elif isinstance(timestamps, torch.Tensor):
            ts = timestamps.to(device=device, dtype=torch.int64)
        else:
            ts = torch.tensor(list(timestamps), dtype=torch.int64, device=device)
        return Batch(cols, ts, schema)

    @staticmethod
    def from_arrow(record_batch, device) -> "Batch":
        """An Arrow record batch (or table): numeric and bool columns become
        tensors (zero-copy on the host when Arrow allows), others lists."""
        names = tuple(record_batch.schema.names)
        cols = {}
        for name, arr in zip(names, record_batch.columns):
            cols[name] = _arrow_column(arr, device)
        n = record_batch.num_rows
        ts = torch.full((n,), NO_TIMESTAMP, dtype=torch.int64, device=device)
        return Batch(cols, ts, RecordSchema("dict", names))

    def select(self, index: torch.Tensor) -> "Batch":
        """Rows ``index`` (int64) or ``mask`` (bool), in that order."""
        if index.dtype == torch.bool:
            index = torch.nonzero(index).flatten()
        index = index.to(self.device)
        return Batch({n: take(c, index) for n, c in self.columns.items()},
                     self.timestamps.index_select(0, index), self.schema,
                     None if self.keys is None else self.keys.index_select(0, index), dict(self.meta),
                     None if self.watermarks is None else self.watermarks.index_select(0, index),
                     None if self.arrival is None else self.arrival.index_select(0, index))

    def with_keys(self, keys: torch.Tensor | None) -> "Batch":
        return Batch(self.columns, self.timestamps, self.schema, keys, dict(self.meta), self.watermarks, self.arrival)

    def with_timestamps(self, ts: torch.Tensor) -> "Batch":
        return Batch(self.columns, ts, self.schema, self.keys, dict(self.meta), self.watermarks, self.arrival)

    def with_watermarks(self, watermarks: torch.Tensor | None, arrival: torch.Tensor | None = None) -> "Batch":
        """Record watermarks (and arrival positions: kept when not given)."""
        return Batch(self.columns, self.timestamps, self.schema, self.keys, dict(self.meta), watermarks,
                     self.arrival if arrival is None else arrival)

    def marked_like(self, rows: "Batch") -> "Batch":
        """This batch (made row for row from ``rows``) with its record watermarks and arrival positions."""
        return Batch(self.columns, self.timestamps, self.schema, self.keys, dict(self.meta), rows.watermarks,
                     rows.arrival)

    def records(self) -> list:
        """The rows as records shaped like the source's."""
        if len(self) == 0:
            return []
        if self.schema is None:
            raise ValueError("stream: a non-empty batch without a record schema")
        cols = [c.tolist() if isinstance(c, torch.Tensor) else c for c in self.columns.values()]
        return [self.schema.make(vals) for vals in zip(*cols)]

    def to_arrow(self):
        import pyarrow as pa

        arrays = {n: pa.array(c.cpu().numpy() if isinstance(c, torch.Tensor) else c)
                  for n, c in self.columns.items()}
        return pa.table(arrays)

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("stream: concat of no non-empty batches")
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        cols = {n: concat_columns([b.columns[n] for b in batches]) for n in first.columns}
        keys = None if first.keys is None else torch.cat([b.keys for b in batches])
        wms = None if any(b.watermarks is None for b in batches) else torch.cat([b.watermarks for b in batches])
        arrival = None if any(b.arrival is None for b in batches) else torch.cat([b.arrival for b in batches])
        return Batch(cols, torch.cat([b.timestamps for b in batches]), first.schema, keys, watermarks=wms,
                     arrival=arrival)


def _arrow_column(arr, device):
    """One Arrow column (array or chunked) as a tensor: integers as int64, floats as float64, bools;
    a column with NULLs or of another type as a list. Numbers go from Arrow memory through pinned
    staging with an asynchronous copy (``runtime/host_staging.py``) and are widened on the device: no
    host pass besides the one copy into the staging buffer."""
    import pyarrow as pa

    t = arr.type
    wire = _WIRE.get(str(t))
    if arr.null_count == 0 and wire is not None:
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        ten = to_device((values_view(c, wire) for c in chunks), len(arr), torch_dtype(wire), device)
        return ten.to(torch.int64) if pa.types.is_integer(t) else ten.to(torch.float64)
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        np_arr = arr.to_numpy(zero_copy_only=False)
        ten = torch.from_numpy(np_arr.copy())
        ten = ten.to(torch.int64) if pa.types.is_integer(t) else ten.to(torch.float64)
        return ten.to(device)
    if arr.null_count == 0 and pa.types.is_boolean(t):
        return torch.from_numpy(arr.to_numpy(zero_copy_only=False).copy()).to(device)
    if pa.types.is_timestamp(t) and arr.null_count == 0:
        return torch.from_numpy(arr.cast(pa.int64()).to_numpy().copy()).to(device)
    return arr.to_pylist()


# Arrow types whose values buffer moves as is (numpy dtype names), widened on the device
_WIRE = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
         "float": "float32", "double": "float64"}


def records_of(batches: Iterable[Batch]) -> list:
    out: list = []
    for b in batches:
        out.extend(b.records())
    return out
