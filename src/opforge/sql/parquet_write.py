"""Query results on their way into files (``COPY ... TO``, a database's data files, a table kept in
memory): string columns decoded on every core, Parquet written with DuckDB's defaults.

Why: a result's string columns come as dictionary arrays (each row's code into the column's sorted
words, ``Column.to_arrow(dictionary=True)``); plain strings need a gather of every row's word,
which one thread does at a few hundred MB/s (seconds for TPC-H lineitem's comments at SF10).
``decoded`` gathers slice by slice in a thread pool (Arrow's take releases the GIL). ``write``
writes snappy-compressed row groups of ``ROW_GROUP_ROWS`` rows, as DuckDB and pyarrow default to,
dictionary-encoding only the columns whose dictionary stays small (``dictionary_columns``); the
caller makes the file appear whole (``durable_files.write_aside``)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DECODE_ROWS = 1 << 18  # rows a thread decodes at a time: a few tens of MB of strings
ROW_GROUP_ROWS = 1 << 20
DICTIONARY_PAGE_BYTES = 1 << 20  # the writer's dictionary page limit (pyarrow's default)
SAMPLE_ROWS = 1 << 17  # rows whose distinct values tell whether a column's dictionary stays small


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


def dictionary_columns(data: pa.Table) -> list[str]:
    """The columns worth Parquet's dictionary encoding: those whose dictionary for a row group,
    estimated from the distinct values of a sample, stays under the writer's page limit. Past it
    the writer builds the dictionary and throws it away (plain pages): wasted time, and for TPC-H
    lineitem's keys, prices and comments a larger file. Only the encoding depends on this."""
    keep = []
    for name, col in zip(data.column_names, data.columns):
        sample = col.slice(0, SAMPLE_ROWS)
        n = len(sample)
        t = col.type
        variable = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
        if n == 0 or not (variable or pa.types.is_primitive(t) or pa.types.is_decimal(t)):
            keep.append(name)  # nested columns: the writer's default
            continue
        distinct = pc.count_distinct(sample, mode="all").as_py()
        if variable:
            width = (pc.sum(pc.binary_length(sample)).as_py() or 0) / n + 4  # + the length prefix
        else:
            width = max(1, t.bit_width // 8)
        if distinct * min(ROW_GROUP_ROWS, len(col)) / n * width <= DICTIONARY_PAGE_BYTES:
            keep.append(name)
    return keep


def write(data: pa.Table, path: str, compression: str = "snappy") -> None:
    """``data`` (plain columns: ``decoded``) as the Parquet file ``path``."""
    pq.write_table(data, path, row_group_size=ROW_GROUP_ROWS, compression=compression,
                   use_dictionary=dictionary_columns(data), dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
