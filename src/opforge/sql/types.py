"""Logical SQL types and their device storage: the one place that maps SQL types to torch and Arrow."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch

from opforge.sql.errors import NotSupportedError


@dataclass(frozen=True)
class SqlType:
    kind: str  # INT32 INT64 FLOAT32 FLOAT64 BOOL DATE DECIMAL STRING TIMESTAMP
    precision: int = 0
    scale: int = 0  # DECIMAL: digits after the point; TIMESTAMP: digits of a second (0 s, 3 ms, 6 us, 9 ns)
    tz: str | None = None  # TIMESTAMP: the zone of a TIMESTAMPTZ (values are UTC instants), None: naive
    # DECIMAL: 128-bit storage ([n, 2] int64, sql/decimal128.py): every precision above 18, as in
    # DuckDB; False above 18 only for the int64 view of values that fit (``decimal(p, s, False)``)
    wide: bool = False
    # LIST: (("", element type),); STRUCT: ((field name, type), ...) -- see sql/nested.py
    fields: tuple = ()

    def __hash__(self) -> int:
        """The fields' hash, computed once: types key the planner's dicts (``shared_subtrees``'
        shapes hash some 130 K of them over TPC-DS's 99 plans)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.precision, self.scale, self.tz, self.wide, self.fields))
            object.__setattr__(self, "_hash", h)
        return h

    def __str__(self) -> str:
        if self.kind == "LIST":
            return f"{self.fields[0][1]}[]"
        if self.kind == "STRUCT":
            return "STRUCT(" + ", ".join(f"{n} {t}" for n, t in self.fields) + ")"
        if self.kind == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        if self.kind == "TIMESTAMP":
            return "TIMESTAMPTZ" if self.tz is not None else "TIMESTAMP"
        return self.kind

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH[self.kind]

    @property
    def is_numeric(self) -> bool:
        return self.kind in ("INT32", "INT64", "FLOAT32", "FLOAT64", "DECIMAL", "BOOL")

    @property
    def is_integer(self) -> bool:
        return self.kind in ("INT32", "INT64")

    @property
    def is_float(self) -> bool:
        return self.kind in ("FLOAT32", "FLOAT64")


INT32 = SqlType("INT32")
INT64 = SqlType("INT64")
FLOAT32 = SqlType("FLOAT32")
FLOAT64 = SqlType("FLOAT64")
BOOL = SqlType("BOOL")
DATE = SqlType("DATE")
STRING = SqlType("STRING")


NESTED = ("LIST", "STRUCT")


def is_coded(t: SqlType) -> bool:
    """Stored as codes into the column's sorted dictionary (strings, and LIST / STRUCT values)."""
    return t.kind == "STRING" or t.kind in NESTED


def list_of(element: SqlType) -> SqlType:
    return SqlType("LIST", fields=(("", element),))


def struct_of(fields) -> SqlType:
    return SqlType("STRUCT", fields=tuple((n, t) for n, t in fields))


def decimal(precision: int, scale: int, wide: bool | None = None) -> SqlType:
    """DECIMAL(p, s); above 18 digits in 128-bit storage (DuckDB's HUGEINT-backed decimals), unless
    ``wide=False`` asks for int64 storage (the window and SUM kernels' view of values that fit)."""
    precision = min(precision, 38)
    return SqlType("DECIMAL", precision, scale, None, precision > 18 if wide is None else wide)


def wide_decimal(precision: int, scale: int) -> SqlType:
    """DECIMAL(p, s) in 128-bit storage (any p <= 38: a declared wide one keeps its storage)."""
    return decimal(precision, scale, True)


def declared_decimal(precision: int, scale: int) -> SqlType:
    """A DECIMAL as written in SQL or read from Arrow: 128-bit storage above 18 digits."""
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise NotSupportedError(f"DECIMAL({precision},{scale}): the width must be 1..38 and the scale 0..width")
    return decimal(precision, scale)


_UNITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def timestamp(digits: int = 6, tz: str | None = None) -> SqlType:
    """TIMESTAMP (``tz`` None) or TIMESTAMPTZ, stored as int64 counts of 10^-digits s since the epoch,
    as Arrow stores them: a column keeps its source's unit and zone, and comes back out with them."""
    return SqlType("TIMESTAMP", 0, digits, tz)


def same_time_unit(a: SqlType, b: SqlType) -> bool:
    return a.kind == b.kind == "TIMESTAMP" and a.scale == b.scale


_TORCH = {
    "INT32": torch.int32, "INT64": torch.int64, "FLOAT32": torch.float32, "FLOAT64": torch.float64,
    "BOOL": torch.bool, "DATE": torch.int32, "DECIMAL": torch.int64, "STRING": torch.int32,
    "TIMESTAMP": torch.int64, "LIST": torch.int32, "STRUCT": torch.int32,  # nested: codes, as strings
}


def from_arrow(t: pa.DataType, where: str = "") -> SqlType:
    if pa.types.is_dictionary(t):
        return from_arrow(t.value_type, where)
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return INT32
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return INT64
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FLOAT32
    if pa.types.is_float64(t):
        return FLOAT64
    if pa.types.is_boolean(t):
        return BOOL
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_timestamp(t):
        return timestamp(_UNITS[t.unit], t.tz)
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise NotSupportedError(f"column {where}: DECIMAL({t.precision},{t.scale}) wider than 38 digits")
        return declared_decimal(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return STRING
    if pa.types.is_null(t):
        return INT32
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        return list_of(from_arrow(t.value_type, where))
    if pa.types.is_struct(t):
        return struct_of((t.field(i).name, from_arrow(t.field(i).type, where)) for i in range(t.num_fields))
    raise NotSupportedError(f"column {where}: Arrow type {t} is not supported")


def to_arrow(t: SqlType) -> pa.DataType:
    if t.kind == "LIST":
        return pa.list_(to_arrow(t.fields[0][1]))
    if t.kind == "STRUCT":
        return pa.struct([(n, to_arrow(ft)) for n, ft in t.fields])
    if t.kind == "TIMESTAMP":
        return pa.timestamp({v: k for k, v in _UNITS.items()}[t.scale], t.tz)
    return {
        "INT32": pa.int32(), "INT64": pa.int64(), "FLOAT32": pa.float32(), "FLOAT64": pa.float64(),
        "BOOL": pa.bool_(), "DATE": pa.date32(), "STRING": pa.string(),
    }.get(t.kind) or pa.decimal128(t.precision, t.scale)


_RANK = {"BOOL": 0, "INT32": 1, "INT64": 2, "DECIMAL": 3, "FLOAT32": 4, "FLOAT64": 5}


def common_numeric(a: SqlType, b: SqlType) -> SqlType:
    """The type both operands are cast to for comparison or CASE/COALESCE (DuckDB-like)."""
    if a == b:
        return a
    wide = a.wide or b.wide
    if a.kind == "DECIMAL" and b.kind == "DECIMAL":
        s = max(a.scale, b.scale)
        p = max(a.precision - a.scale, b.precision - b.scale) + s
        if p > 38:  # DuckDB: no DECIMAL holds both; the wider one is the result
            w = a if (a.precision, a.scale) >= (b.precision, b.scale) else b
            return decimal(w.precision, w.scale, wide or None)
        return decimal(p, s, wide or None)
    hi = a if _RANK[a.kind] >= _RANK[b.kind] else b
    lo = b if hi is a else a
    if hi.kind == "DECIMAL" and lo.kind in ("INT32", "INT64", "BOOL"):
        digits = 19 if lo.kind == "INT64" else 10
        return decimal(max(hi.precision - hi.scale, digits) + hi.scale, hi.scale, wide or None)
    if hi.kind == "FLOAT32" and lo.kind in ("INT64", "DECIMAL"):
        return FLOAT64
    return hi
