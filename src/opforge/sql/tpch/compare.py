"""Compare a query result with DuckDB's answer the way TPC-H validation does.

Exact for integers, decimals, strings and dates; 1e-9 relative for floats;
NULL equals NULL. Types must be compatible as DuckDB gives them: an integer
column matches any integer type or a scale-0 decimal (DuckDB sums integers to
HUGEINT, which Arrow shows as decimal128(38, 0)); a decimal matches a decimal of
the same scale (sums keep the scale, the precision may differ); a double must
be a double (avg -> DOUBLE); strings match any Arrow string encoding.
Row order is checked only where ORDER BY defines it: rows tied on the ORDER BY
keys are compared as a multiset.
"""

from __future__ import annotations

import math
from decimal import Decimal
from itertools import groupby

import pyarrow as pa
import pyarrow.compute as pc

FLOAT_RTOL = 1e-9
FLOAT_ATOL = 1e-12
MAX_REPORTED = 10


def type_class(t: pa.DataType) -> str:
    """The compatibility class of an Arrow type: 'int', 'decimal(s)', 'double', 'float', 'string', ..."""
    if pa.types.is_dictionary(t):
        return type_class(t.value_type)
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_decimal(t):
        return "int" if t.scale == 0 else f"decimal(scale={t.scale})"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def _is_float(t: pa.DataType) -> bool:
    return type_class(t) in ("double", "float")


def _pylist(col: pa.ChunkedArray | pa.Array) -> list:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_pylist()


def values_equal(a, b, floating: bool) -> bool:
    """One cell: NULL == NULL, NaN == NaN, floats within 1e-9 relative, everything else exact."""
    if a is None or b is None:
        return a is None and b is None
    if floating:
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL)
    if isinstance(a, (Decimal, int)) and isinstance(b, (Decimal, int)):
        return Decimal(a) == Decimal(b)
    return a == b


def _sort_key(row: tuple, float_cols: set[int]) -> tuple:
    """Total order over rows with NULLs: exact columns first, float columns last."""
    order = [i for i in range(len(row)) if i not in float_cols] + sorted(float_cols)
    return tuple((row[i] is None, 0 if row[i] is None else row[i]) for i in order)


def _rows(table: pa.Table) -> list[tuple]:
    return list(zip(*(_pylist(c) for c in table.columns))) if table.num_columns else []


def _fmt(row: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in row) + ")"


def compare(
    ours: pa.Table,
    ref: pa.Table,
    *,
    ordered: bool,
    order_by: list[str] | None = None,
) -> list[str]:
    """Differences between ``ours`` and the reference ``ref``; an empty list means equal.

    ``ordered``: the query has an ORDER BY, so row order counts. ``order_by``:
    the output columns of that ORDER BY (see :func:`order_keys`); rows tied on
    them may come in any order. Without it an ordered comparison is row by row.
    """
    if not isinstance(ours, pa.Table) or not isinstance(ref, pa.Table):
        raise TypeError(f"compare: ours and ref must be pyarrow.Table, got {type(ours).__name__}, {type(ref).__name__}")
    diffs: list[str] = []
    ours_names = [n.lower().replace(" ", "") for n in ours.column_names]
    ref_names = [n.lower().replace(" ", "") for n in ref.column_names]
    if len(ours_names) != len(ref_names):
        return [f"column count: ours {ours.num_columns} {ours.column_names}, reference {ref.num_columns} {ref.column_names}"]
    for i, (a, b) in enumerate(zip(ours_names, ref_names)):
        if a != b:
            diffs.append(f"column {i}: name {ours.column_names[i]!r}, reference {ref.column_names[i]!r}")
    for i, (a, b) in enumerate(zip(ours.schema.types, ref.schema.types)):
        if type_class(a) != type_class(b):
            diffs.append(f"column {ref.column_names[i]!r}: type {a} ({type_class(a)}), reference {b} ({type_class(b)})")
    if diffs:
        return diffs
    if ours.num_rows != ref.num_rows:
        diffs.append(f"row count: ours {ours.num_rows}, reference {ref.num_rows}")

    float_cols = {i for i, t in enumerate(ref.schema.types) if _is_float(t)}
    ours_rows, ref_rows = _rows(ours), _rows(ref)
    if ordered and order_by:
        unknown = [k for k in order_by if k.lower().replace(" ", "") not in ref_names]
        if unknown:
            raise ValueError(f"compare: order_by names {unknown}, not columns of the reference {ref.column_names}")
        keys = [ref_names.index(k.lower().replace(" ", "")) for k in order_by]
        ours_rows, ref_rows, order_diffs = _align_tie_groups(ours_rows, ref_rows, keys, float_cols)
        diffs += order_diffs
    elif not ordered:
        ours_rows = sorted(ours_rows, key=lambda r: _sort_key(r, float_cols))
        ref_rows = sorted(ref_rows, key=lambda r: _sort_key(r, float_cols))
    if diffs:
        return diffs + _set_difference(ours_rows, ref_rows, float_cols)

    bad = []
    for r, (a, b) in enumerate(zip(ours_rows, ref_rows)):
        for c in range(len(ref_names)):
            if not values_equal(a[c], b[c], c in float_cols):
                bad.append(f"row {r}, column {ref.column_names[c]!r}: ours {a[c]!r}, reference {b[c]!r}")
    if len(bad) > MAX_REPORTED:
        bad = bad[:MAX_REPORTED] + [f"... and {len(bad) - MAX_REPORTED} more differing values"]
    return bad


def _align_tie_groups(ours_rows, ref_rows, keys, float_cols):
    """Check the ORDER BY key sequence row by row, then sort each tie group by all columns."""
    diffs = []
    for r, (a, b) in enumerate(zip(ours_rows, ref_rows)):
        if not all(values_equal(a[k], b[k], k in float_cols) for k in keys):
            diffs.append(
                f"order: row {r} has ORDER BY key {_fmt(tuple(a[k] for k in keys))}, "
                f"reference {_fmt(tuple(b[k] for k in keys))}"
            )
            return ours_rows, ref_rows, diffs
    if len(ours_rows) != len(ref_rows):
        return ours_rows, ref_rows, diffs
    aligned_ours, aligned_ref, start = [], [], 0
    for _, group in groupby(range(len(ref_rows)), key=lambda r: tuple(_sort_key(ref_rows[r], set())[k] for k in keys)):
        size = len(list(group))
        aligned_ours += sorted(ours_rows[start : start + size], key=lambda r: _sort_key(r, float_cols))
        aligned_ref += sorted(ref_rows[start : start + size], key=lambda r: _sort_key(r, float_cols))
        start += size
    return aligned_ours, aligned_ref, diffs


def _set_difference(ours_rows, ref_rows, float_cols) -> list[str]:
    """Rows missing from ours / extra in ours (floats rounded to 9 significant digits)."""

    def norm(row):
        return tuple(float(f"{float(v):.9g}") if (i in float_cols and v is not None) else v for i, v in enumerate(row))

    from collections import Counter

    a, b = Counter(map(norm, ours_rows)), Counter(map(norm, ref_rows))
    out = [f"missing row {_fmt(r)}" for r in (b - a).elements()][:MAX_REPORTED]
    out += [f"extra row {_fmt(r)}" for r in (a - b).elements()][:MAX_REPORTED]
    return out


def order_keys(sql: str) -> list[str] | None:
    """The output columns named by the outermost ORDER BY of ``sql``; None when it has none.

    Keys that are not output columns (an ORDER BY on an expression that is not
    selected, or on an unaliased expression, whose name is the engine's own) end
    the list: rows tied on the keys before it are then compared as a multiset,
    which is weaker but never wrong.
    """
    found = _order(sql)
    if found is None:
        return None
    positions, outputs = found
    keys = []
    for i in positions:
        if not outputs[i]:
            break
        keys.append(outputs[i])
    return keys


def order_positions(sql: str) -> list[int] | None:
    """The 0-based output positions the outermost ORDER BY of ``sql`` sorts by (up to the
    first key that is not an output); None when it has no ORDER BY."""
    found = _order(sql)
    return None if found is None else found[0]


def _order(sql: str) -> tuple[list[int], list[str]] | None:
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="duckdb")
    order = tree.args.get("order")
    if order is None:
        return None
    selects = tree.selects if isinstance(tree, exp.Query) else []
    outputs = [s.alias_or_name for s in selects]
    lower = [o.lower() for o in outputs]
    positions = []
    for item in order.expressions:
        key = item.this
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(outputs):
            positions.append(int(key.this) - 1)
        elif isinstance(key, exp.Column) and key.name.lower() in lower:
            positions.append(lower.index(key.name.lower()))
        else:
            match = [i for i, s in enumerate(selects) if s.unalias() == key]
            if not match:
                break
            positions.append(match[0])
    return positions, outputs


def order_is_determined(sql: str, ref: pa.Table) -> bool:
    """True when ``sql`` has an ORDER BY whose keys are unique in its answer ``ref``,
    i.e. every row's position is fixed and a row-by-row comparison is exact."""
    keys = order_keys(sql)
    if not keys:
        return False
    if ref.num_rows <= 1:
        return True
    lower = [n.lower() for n in ref.column_names]
    cols = [ref.column_names[lower.index(k.lower())] for k in keys]
    distinct = ref.group_by(cols).aggregate([]).num_rows if cols else 1
    return distinct == ref.num_rows
