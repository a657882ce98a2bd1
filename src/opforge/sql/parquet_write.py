"""Query results on their way into files (``COPY ... TO``, a database's data files, a table kept in
memory): string columns decoded on every core, Parquet written with DuckDB's defaults.

Why: a result's string columns come as dictionary arrays (each row's code into the column's sorted
words, ``Column.to_arrow(dictionary=True)``); plain strings need a gather of every row's word,
which one thread does at a few hundred MB/s (seconds for TPC-H lineitem's comments at SF10).
``decoded`` gathers slice by slice in a thread pool (Arrow's take releases the GIL). ``write``
writes snappy-compressed row groups of ``ROW_GROUP_ROWS`` rows, as DuckDB and pyarrow default to;
the caller makes the file appear whole (``durable_files.write_aside``)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

DECODE_ROWS = 1 << 18  # rows a thread decodes at a time: a few tens of MB of strings
ROW_GROUP_ROWS = 1 << 20


def decoded(data: pa.Table) -> pa.Table:
    """``data`` with its dictionary-encoded columns as plain columns of their value type (chunked
    as decoded; other columns untouched)."""
    todo = [i for i, f in enumerate(data.schema) if pa.types.is_dictionary(f.type)]
    if not todo:
        return data
    slices = [(i, chunk.slice(at, DECODE_ROWS)) for i in todo for chunk in data.column(i).chunks
              for at in range(0, len(chunk), DECODE_ROWS)]

    def decode(piece: pa.Array) -> pa.Array:
        return piece.cast(piece.type.value_type)

    pieces = [piece for _, piece in slices]
    threads = max(1, min(len(pieces), os.cpu_count() or 1))
    if threads == 1:
        plain = [decode(p) for p in pieces]
    else:
        with ThreadPoolExecutor(threads) as pool:
            plain = list(pool.map(decode, pieces))
    columns = list(data.columns)
    for i in todo:
        value_type = data.schema.field(i).type.value_type
        columns[i] = pa.chunked_array([p for (j, _), p in zip(slices, plain) if j == i], value_type)
    return pa.Table.from_arrays(columns, names=data.column_names)


def write(data: pa.Table, path: str, compression: str = "snappy") -> None:
    """``data`` (plain columns: ``decoded``) as the Parquet file ``path``."""
    pq.write_table(data, path, row_group_size=ROW_GROUP_ROWS, compression=compression)
