"""One column of a Parquet file, decoded row group by row group on several threads.

Why: ``pq.read_table(path, columns=[c])`` decodes a single column on one thread (Arrow parallelizes
across columns, and a first touch reads one). Here the row groups of the column are decoded side
by side in a thread pool (Arrow releases the GIL while decoding) and handed over in file order as
each finishes, so the caller stages and copies row group ``k`` to the device while later ones are
still being decoded. String columns are read with ``read_dictionary``: Parquet's dictionary pages
come back as Arrow dictionary arrays (codes plus the distinct words) instead of one Python-visible
string per row.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.sql.errors import SqlError


def decode_threads(row_groups: int) -> int:
    return max(1, min(row_groups, os.cpu_count() or 1))


def column_row_groups(path: str, meta: pq.FileMetaData, name: str, as_dictionary: bool) -> Iterator[pa.Array]:
    """The column ``name`` of each row group, in order (a row group's column may hold several chunks:
    each is yielded)."""
    groups = meta.num_row_groups
    read_dictionary = [name] if as_dictionary else None

    def read(i: int) -> pa.ChunkedArray:
        try:
            # a file handle per task: one reader is not shared across threads
            f = pq.ParquetFile(path, metadata=meta, read_dictionary=read_dictionary)
            return f.read_row_group(i, columns=[name], use_threads=False).column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise SqlError(f"reading column {name!r} of {path!r}: {e}") from None

    if groups <= 1:
        for i in range(groups):
            yield from read(i).chunks
        return
    with ThreadPoolExecutor(decode_threads(groups), thread_name_prefix="parquet-decode") as pool:
        for column in pool.map(read, range(groups)):
            yield from column.chunks
