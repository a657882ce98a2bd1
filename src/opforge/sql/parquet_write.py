"""Query results on their way into files (``COPY ... TO``, a database's data files, a table kept in
memory): string columns decoded on every core, Parquet encoded on every core with DuckDB's defaults.

Why: a result's string columns come as dictionary arrays (each row's code into the column's sorted
words, ``Column.to_arrow(dictionary=True)``); plain strings need a gather of every row's word,
which one thread does at a few hundred MB/s (seconds for TPC-H lineitem's comments at SF10).
``decoded`` gathers slice by slice in a thread pool (Arrow's take releases the GIL). pyarrow
encodes one file's row groups one after another on one thread (half a minute for lineitem at
SF10), so ``write`` decodes and encodes each row group of ``ROW_GROUP_ROWS`` rows as an in-memory
file of its own on a thread pool and writes their bodies, in order, under one merged footer
(``parquet_footer``). Row groups are snappy-compressed, as DuckDB and pyarrow default to, and only
the columns whose dictionary stays small are dictionary-encoded (``dictionary_columns``); the
caller makes the file appear whole (``durable_files.write_aside``)."""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opforge.sql import parquet_footer

DECODE_ROWS = 1 << 18  # rows a thread decodes at a time: a few tens of MB of strings
ROW_GROUP_ROWS = 1 << 20
DICTIONARY_PAGE_BYTES = 1 << 20  # the writer's dictionary page limit (pyarrow's default)
SAMPLE_ROWS = 1 << 17  # rows whose distinct values tell whether a column's dictionary stays small


def _threads(tasks: int) -> int:
    return max(1, min(tasks, os.cpu_count() or 1))


def _dictionary_indices(data: pa.Table) -> list[int]:
    return [i for i, f in enumerate(data.schema) if pa.types.is_dictionary(f.type)]


def _replaced(data: pa.Table, columns: dict[int, pa.ChunkedArray]) -> pa.Table:
    arrays = [columns.get(i, c) for i, c in enumerate(data.columns)]
    return pa.Table.from_arrays(arrays, names=data.column_names)


def _plain(data: pa.Table) -> pa.Table:
    """``data`` with its dictionary-encoded columns decoded, on the calling thread."""
    todo = _dictionary_indices(data)
    if not todo:
        return data
    return _replaced(data, {i: data.column(i).cast(data.schema.field(i).type.value_type) for i in todo})


def decoded(data: pa.Table) -> pa.Table:
    """``data`` with its dictionary-encoded columns as plain columns of their value type (chunked
    as decoded; other columns untouched), decoded slice by slice on a thread pool."""
    todo = _dictionary_indices(data)
    if not todo:
        return data
    slices = [(i, chunk.slice(at, DECODE_ROWS)) for i in todo for chunk in data.column(i).chunks
              for at in range(0, len(chunk), DECODE_ROWS)]

    def decode(piece: pa.Array) -> pa.Array:
        return piece.cast(piece.type.value_type)

    pieces = [piece for _, piece in slices]
    threads = _threads(len(pieces))
    if threads == 1:
        plain = [decode(p) for p in pieces]
    else:
        with ThreadPoolExecutor(threads) as pool:
            plain = list(pool.map(decode, pieces))
    return _replaced(data, {i: pa.chunked_array([p for (j, _), p in zip(slices, plain) if j == i],
                                                data.schema.field(i).type.value_type) for i in todo})


def dictionary_columns(data: pa.Table) -> list[str]:
    """The columns worth Parquet's dictionary encoding: those whose dictionary for a row group,
    estimated from the distinct values of a sample, stays under the writer's page limit. Past it
    the writer builds the dictionary and throws it away (plain pages): wasted time, and for TPC-H
    lineitem's keys, prices and comments a larger file. Only the encoding depends on this."""
    keep = []
    sample = _plain(data.slice(0, SAMPLE_ROWS))
    n = sample.num_rows
    for name, col in zip(sample.column_names, sample.columns):
        t = col.type
        variable = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
        if n == 0 or not (variable or pa.types.is_primitive(t) or pa.types.is_decimal(t)):
            keep.append(name)  # nested columns: the writer's default
            continue
        distinct = pc.count_distinct(col, mode="all").as_py()
        if variable:
            width = (pc.sum(pc.binary_length(col)).as_py() or 0) / n + 4  # + the length prefix
        else:
            width = max(1, t.bit_width // 8)
        if distinct * min(ROW_GROUP_ROWS, data.num_rows) / n * width <= DICTIONARY_PAGE_BYTES:
            keep.append(name)
    return keep


def _in_order(pool: ThreadPoolExecutor, fn: Callable, items: Iterable, window: int) -> Iterator:
    """``fn`` of each item, run on ``pool`` with at most ``window`` results pending, in order."""
    pending: deque = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def write(data: pa.Table, path: str, compression: str = "snappy") -> None:
    """``data`` (dictionary-encoded columns are written as plain columns of their values) as the
    Parquet file ``path``, its row groups decoded and encoded side by side."""
    options = {"compression": compression, "use_dictionary": dictionary_columns(data),
               "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES, "row_group_size": ROW_GROUP_ROWS,
               "write_page_index": False}  # page indexes hold offsets the merge would have to move
    starts = range(0, data.num_rows, ROW_GROUP_ROWS)
    if len(starts) <= 1:
        pq.write_table(_plain(data), path, **options)
        return

    def encode(at: int) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        pq.write_table(_plain(data.slice(at, ROW_GROUP_ROWS)), sink, **options)
        return sink.getvalue()

    threads = _threads(len(starts))
    with open(path, "wb") as f, ThreadPoolExecutor(threads, thread_name_prefix="parquet-encode") as pool:
        parquet_footer.concatenate(_in_order(pool, encode, starts, 2 * threads), f)
