"""LIST and STRUCT columns.

A nested column is dictionary-encoded as a string column is: on the device one int32 code per row
(and the validity mask), and the column's ``dictionary`` holds its distinct values, sorted in
DuckDB's order (lists lexicographically, structs field by field, NULL last). Why: every operator
that moves rows (filter, join, sort, take, union) already carries a dictionary along with the
codes, so LIST and STRUCT go through them unchanged, and as the dictionary is sorted and unique,
equal codes are equal values and code order is value order (GROUP BY, DISTINCT, ORDER BY and
``=`` work on the codes, after :func:`opforge.sql.column.unify_strings` re-codes two columns
against one dictionary). Functions of a nested value run once per distinct value on the host
(:func:`per_value`) and are gathered through the codes on the device, or per row (:func:`per_row`)
where they read several columns; their results are columns of any type (nested ones encoded again).
"""
from __future__ import annotations

import datetime
import functools
from decimal import Decimal
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from opforge.sql import types as T

if TYPE_CHECKING:
    from opforge.sql.column import Column


def sort_key(v):
    """DuckDB's order of nested values (NULL after every value, at every depth)."""
    if v is None:
        return (1,)
    if isinstance(v, dict):
        return (0, tuple(sort_key(x) for x in v.values()))
    if isinstance(v, (list, tuple)):
        return (0, tuple(sort_key(x) for x in v))
    return (0, v)


def stable_bytes(v) -> bytes:
    """The value's bytes for a hash that must agree across chunks and processes: equal for equal
    values (a float's -0.0 as 0.0, as ``sort_key`` compares them), never Python's salted ``hash``."""
    def canon(x):
        if isinstance(x, float):
            return x + 0.0
        if isinstance(x, dict):
            return tuple((k, canon(y)) for k, y in x.items())
        if isinstance(x, (list, tuple)):
            return tuple(canon(y) for y in x)
        return x

    return repr(canon(v)).encode()


@functools.total_ordering
class NestedValue:
    """One distinct value of a LIST / STRUCT column (a Python list / dict), hashable and ordered."""
    __slots__ = ("value", "key")

    def __init__(self, value):
        self.value, self.key = value, sort_key(value)

    def __eq__(self, other):
        return isinstance(other, NestedValue) and self.key == other.key

    def __lt__(self, other):
        return self.key < other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"NestedValue({self.value!r})"


def encode(values: list, typ: T.SqlType, device) -> "Column":
    """The column of Python values (None: NULL) of the nested type ``typ``."""
    from opforge.sql.column import Column

    words = sorted({NestedValue(v) for v in values if v is not None})
    index = {w.key: i for i, w in enumerate(words)}
    codes = np.array([0 if v is None else index[sort_key(v)] for v in values], dtype=np.int32)
    valid = None
    if any(v is None for v in values):
        valid = torch.tensor([v is not None for v in values], dtype=torch.bool, device=device)
    return Column(torch.from_numpy(codes).to(device), valid, typ, tuple(words))


def from_arrow(arr: pa.Array, typ: T.SqlType, device) -> "Column":
    return encode(arr.to_pylist(), typ, device)


def to_arrow(col) -> pa.Array:
    atype = T.to_arrow(col.type)
    n = len(col)
    if not col.dictionary:
        return pa.nulls(n, atype)
    store = pa.array([w.value for w in col.dictionary], atype)
    codes = col.values.detach().cpu().numpy().astype(np.int32)
    mask = None if col.valid is None else ~col.valid.cpu().numpy()
    if mask is not None:
        codes = np.where(mask, 0, codes)
    return store.take(pa.array(codes, mask=mask))


def constant(value, typ: T.SqlType, n: int, device) -> "Column":
    from opforge.sql.column import Column

    codes = torch.zeros(n, dtype=torch.int32, device=device)
    if value is None:
        return Column(codes, torch.zeros(n, dtype=torch.bool, device=device), typ, ())
    return Column(codes, None, typ, (NestedValue(value),))


def from_python(values: list, typ: T.SqlType, device) -> "Column":
    """A column of any type from Python values (None: NULL), through Arrow."""
    from opforge.sql.column import Column

    if typ.kind in T.NESTED:
        return encode(values, typ, device)
    return Column.from_arrow(pa.array(values, T.to_arrow(typ)), device)


def python_values(col) -> list:
    """The column's values as Python values (None: NULL)."""
    return col.to_arrow().to_pylist()


def per_value(col, fn, out: T.SqlType) -> "Column":
    """``fn`` of each distinct value of the nested column ``col`` (once each, on the host), gathered
    through the codes on the device; NULL rows give NULL."""
    from opforge.sql.column import Column

    table = from_python([fn(w.value) for w in col.dictionary] or [None], out, col.device)
    res = table.take(col.values.long() if col.dictionary else torch.zeros_like(col.values).long())
    valid = res.valid if col.valid is None else (col.valid if res.valid is None else res.valid & col.valid)
    return Column(res.values, valid, out, res.dictionary)


def per_row(cols: list, fn, out: T.SqlType, device, n: int) -> "Column":
    """``fn(*row values)`` of each row (Python values; the function decides about NULLs)."""
    lists = [python_values(c) for c in cols]
    rows = zip(*lists) if lists else ([] for _ in range(n))
    return from_python([fn(*r) for r in rows], out, device)


def cast_column(col, typ: T.SqlType) -> "Column":
    """The nested column as one of the wider type ``typ`` (``frontend/nested_calls.widens``)."""
    return per_value(col, lambda v: coerce(v, typ), typ) if col.type != typ else col


def group_lists(col, gid: torch.Tensor, groups: int, out: T.SqlType) -> "Column":
    """The ``list`` aggregate (array_agg): each group's values, NULLs included, in row order; a
    group of no rows (the one row of an aggregate without GROUP BY over no input) is NULL."""
    lists: list = [None] * groups
    for g, v in zip(gid.tolist(), python_values(col)):
        if lists[g] is None:
            lists[g] = []
        lists[g].append(v)
    return encode(lists, out, col.device)


def list_element(values, i):
    """``l[i]``: 1-based; a negative index counts from the end; 0 or out of range is NULL (DuckDB)."""
    if values is None or i is None:
        return None
    if i > 0:
        return values[i - 1] if i <= len(values) else None
    if i < 0:
        return values[i] if -i <= len(values) else None
    return None


def slice_values(values, b, e):
    """``l[b:e]`` as DuckDB's list_slice: 1-based, inclusive, negative from the end, clamped."""
    if values is None or b is None or e is None:
        return None
    n = len(values)
    b = n + b + 1 if b < 0 else b
    e = n + e + 1 if e < 0 else e
    b, e = max(b, 1), min(e, n)
    return list(values[b - 1:e]) if b <= e else []


def python_literal(value, typ: T.SqlType):
    """A bound literal's value as the Python value an Arrow array of ``typ`` takes."""
    if value is None:
        return None
    if typ.kind == "DATE":
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=int(value))
    if typ.kind == "TIMESTAMP":
        micros = int(value) * 10**6 // 10**typ.scale
        return datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    if typ.kind == "DECIMAL":
        return Decimal(str(value))
    if typ.is_float:
        return float(value)
    if typ.is_integer:
        return int(value)
    return value


def coerce(value, typ: T.SqlType):
    """A Python value converted to an element of ``typ`` (a list of INTEGER and DECIMAL literals)."""
    if value is None:
        return None
    if typ.kind == "DECIMAL":
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-typ.scale))
    if typ.is_float:
        return float(value)
    if typ.kind == "LIST":
        return [coerce(v, typ.fields[0][1]) for v in value]
    if typ.kind == "STRUCT":
        named = {k.lower(): v for k, v in value.items()}
        return {n: coerce(named.get(n.lower()), t) for n, t in typ.fields}
    return value


def text(v) -> str:
    """DuckDB's text of a value inside a nested one: ``[1, 2]``, ``{'a': x}``, strings unquoted."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"'{k}': {text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, Decimal):
        return format(v, "f")
    if v == "":
        return "''"
    if isinstance(v, datetime.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, datetime.date):
        return v.isoformat()
    return str(v)
