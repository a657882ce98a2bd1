"""One column of a Parquet file, decoded row group by row group on several threads.

Why: ``pq.read_table(path, columns=[c])`` decodes a single column on one thread (Arrow parallelizes
across columns, and a first touch reads one). Here the row groups of the column are decoded side
by side in a thread pool (Arrow releases the GIL while decoding). Two ways to consume them:

* iterate ``column_row_groups(...)``: each row group's chunks in file order, handed over as each
  finishes, so the caller stages row group ``k`` while later ones are still being decoded;
* ``RowGroups.parts()``: each row group as a part that a staging thread decodes in batches of
  ``BATCH_ROWS`` rows straight into its place in the destination (``host_staging.fill_to_device``).
  The decoded batch stays in the CPU cache and Arrow's allocator hands the same few pages back
  batch after batch, where decoding whole row groups writes each one to fresh memory (page faults,
  and one more round trip through DRAM before the copy): 2-4x faster for fixed-width columns.

String columns are read with ``read_dictionary``: Parquet's dictionary pages come back as Arrow
dictionary arrays (codes plus the distinct words) instead of one Python-visible string per row.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.sql.errors import SqlError

BATCH_ROWS = 1 << 16  # rows per decoded batch of a part: a few hundred KiB, cache-resident
DISTINCT_SHARE = 8  # a string column with a word per fewer rows than this is "mostly distinct"


def decode_threads(row_groups: int) -> int:
    return max(1, min(row_groups, os.cpu_count() or 1))


class RowGroups:
    """The column ``name`` of a Parquet file, row group by row group (iterable: the chunks in order)."""

    def __init__(self, path: str, meta: pq.FileMetaData, name: str, as_dictionary: bool):
        self.path, self.meta, self.name = path, meta, name
        self.read_dictionary = [name] if as_dictionary else None
        self.threads = decode_threads(meta.num_row_groups)

    def _file(self) -> pq.ParquetFile:
        # a file handle per task: one reader is not shared across threads
        return pq.ParquetFile(self.path, metadata=self.meta, read_dictionary=self.read_dictionary)

    def _error(self, e: Exception) -> SqlError:
        return SqlError(f"reading column {self.name!r} of {self.path!r}: {e}")

    def read(self, i: int) -> pa.ChunkedArray:
        """Row group ``i``'s column, whole."""
        try:
            return self._file().read_row_group(i, columns=[self.name], use_threads=False).column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise self._error(e) from None

    def batches(self, i: int) -> Iterator[pa.Array]:
        """Row group ``i``'s column in batches of at most ``BATCH_ROWS`` rows."""
        try:
            for batch in self._file().iter_batches(BATCH_ROWS, row_groups=[i], columns=[self.name],
                                                   use_threads=False):
                yield batch.column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise self._error(e) from None

    def mostly_distinct(self) -> bool:
        """Whether a string column's first batch holds more than one distinct word in ``DISTINCT_SHARE``
        rows, read with its dictionary (Parquet's dictionary page or, past its fallback to plain
        pages, the words Arrow hashed): such a column is ranked by sorting (``string_sort``)."""
        if self.meta.num_row_groups == 0:
            return False
        groups = RowGroups(self.path, self.meta, self.name, as_dictionary=True)
        first = next(groups.batches(0), None)
        if first is None or not pa.types.is_dictionary(first.type):
            return False
        return len(first.dictionary) * DISTINCT_SHARE > len(first)

    def plain(self) -> "RowGroups":
        """The same column read without dictionaries (a string per row)."""
        return RowGroups(self.path, self.meta, self.name, as_dictionary=False)

    def largest(self) -> int:
        """Rows of the largest row group."""
        return max((self.meta.row_group(i).num_rows for i in range(self.meta.num_row_groups)), default=0)

    def parts(self) -> list[tuple[int, Callable[[], Iterator[pa.Array]]]]:
        """``(rows, batches)`` per row group, in file order: ``batches()`` decodes the row group."""
        return [(self.meta.row_group(i).num_rows, lambda i=i: self.batches(i))
                for i in range(self.meta.num_row_groups)]

    def __iter__(self) -> Iterator[pa.Array]:
        groups = self.meta.num_row_groups
        if groups <= 1:
            for i in range(groups):
                yield from self.read(i).chunks
            return
        with ThreadPoolExecutor(self.threads, thread_name_prefix="parquet-decode") as pool:
            for column in pool.map(self.read, range(groups)):
                yield from column.chunks


def column_row_groups(path: str, meta: pq.FileMetaData, name: str, as_dictionary: bool) -> RowGroups:
    """The column ``name`` of each row group, in order (a row group's column may hold several chunks:
    each is yielded)."""
    return RowGroups(path, meta, name, as_dictionary)
