"""A query that only reads columns of one table as they are, answered from the table's host data.

Why: ``CREATE TABLE t AS SELECT * FROM 'lineitem.parquet'`` or ``COPY (SELECT a, b FROM t) TO ...``
compute nothing: sending the columns to the device and back (string dictionaries sorted on the
way) only adds time to the decode and the encode, most of a write (TPC-H SF10 lineitem: 10 s of
14). Such a plan (a scan without filters, under at most a projection of its columns, renamed or
not) reads the table's Parquet files with Arrow's multi-threaded reader, or slices its Arrow
table in memory. Only columns whose Arrow type is the engine's own for them are passed through
(the answer then has the types the device path would give); anything else takes the device path.
A table registered on a cluster reaches the workers the same way (``table``).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Ref


def columns(node: P.Node) -> tuple[P.Scan, list[tuple[str, str]]] | None:
    """The scan a plan only reads, and its output columns as (source column, output name) pairs;
    None when the plan computes anything."""
    names = None
    if isinstance(node, P.Project):
        if not all(isinstance(e, Ref) for _, e in node.exprs):
            return None
        names = [(e.cid, o.name) for o, e in node.exprs]
        node = node.child
    if not isinstance(node, P.Scan) or node.filters:
        return None
    source = {o.cid: o.name for o in node.outputs}
    if names is None:
        names = [(o.cid, o.name) for o in node.outputs]
    if any(cid not in source for cid, _ in names):
        return None
    return node, [(source[cid], name) for cid, name in names]


def read(node: P.Node, tables: dict) -> pa.Table | None:
    """The answer of a plan that only reads columns of one table, from its host data; None when
    the plan computes anything or the table has no host data to read (it lives on the device)."""
    found = columns(node)
    if found is None:
        return None
    scan, pairs = found
    lazy = getattr(tables.get(scan.table), "columns", None)
    index = {n: i for i, n in enumerate(getattr(lazy, "names", ()))}
    data = _host_columns(lazy, sorted({src for src, _ in pairs}, key=lambda n: index.get(n, -1)))
    if data is None:
        return None
    return pa.Table.from_arrays([data.column(src) for src, _ in pairs], names=[name for _, name in pairs])


def table(t) -> pa.Table | None:
    """Every column of the table ``t`` from its host data (a cluster places it from this, with no
    trip through the driver's device); None as for :func:`read`."""
    lazy = getattr(t, "columns", None)
    return _host_columns(lazy, list(getattr(lazy, "names", ())))


def _host_columns(lazy, wanted: list[str]) -> pa.Table | None:
    """Columns ``wanted`` (in table order) of a table's ``LazyColumns`` read on the host: its Arrow
    table in memory, or its Parquet files by Arrow's multi-threaded reader. None when the table has
    no host data (columns made on the device) or a column's Arrow type is not the engine's own."""
    if not hasattr(lazy, "arrow_types"):
        return None
    index = {n: i for i, n in enumerate(lazy.names)}
    for src in wanted:
        t = lazy.arrow_types[index[src]]
        if pa.types.is_dictionary(t) or T.to_arrow(T.from_arrow(t, src)) != t:
            return None
    if lazy.arrow is not None:
        data = lazy.arrow.select(wanted)
    elif lazy.files:
        parts = [pq.read_table(path, columns=wanted, use_threads=True) for path, _ in lazy.files]
        data = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    else:
        return None
    if any(data.schema.field(src).type != lazy.arrow_types[index[src]] for src in wanted):
        return None  # the reader's types are not the ones registered (a file's stored Arrow schema)
    return data
