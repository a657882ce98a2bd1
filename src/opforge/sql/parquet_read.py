"""One column of a Parquet file, decoded row group by row group on several threads.

Why: ``pq.read_table(path, columns=[c])`` decodes a single column on one thread (Arrow parallelizes
across columns, and a first touch reads one). Here the row groups of the column are decoded side
by side in a thread pool (Arrow releases the GIL while decoding). Two ways to consume them:

* iterate ``RowGroups(files, name, ...)``: each row group's chunks in file order, handed over as each
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
    """The column ``name`` of Parquet files (one, or several of one schema: a folder's, a database
    table's), row group by row group in file order (iterable: the chunks in order)."""

    def __init__(self, files: list[tuple[str, pq.FileMetaData]], name: str, as_dictionary: bool):
        self.files, self.name = list(files), name
        self.path = self.files[0][0] if len(self.files) == 1 else os.path.dirname(self.files[0][0]) or "."
        self.read_dictionary = [name] if as_dictionary else None
        self.groups = [(f, g) for f, (_, meta) in enumerate(self.files) for g in range(meta.num_row_groups)]
        self.threads = decode_threads(len(self.groups))

    def _file(self, f: int) -> pq.ParquetFile:
        # a file handle per task: one reader is not shared across threads
        path, meta = self.files[f]
        return pq.ParquetFile(path, metadata=meta, read_dictionary=self.read_dictionary)

    def _error(self, f: int, e: Exception) -> SqlError:
        return SqlError(f"reading column {self.name!r} of {self.files[f][0]!r}: {e}")

    def read(self, i: int) -> pa.ChunkedArray:
        """Row group ``i``'s column (counted over all the files), whole."""
        f, g = self.groups[i]
        try:
            return self._file(f).read_row_group(g, columns=[self.name], use_threads=False).column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise self._error(f, e) from None

    def batches(self, i: int) -> Iterator[pa.Array]:
        """Row group ``i``'s column in batches of at most ``BATCH_ROWS`` rows."""
        f, g = self.groups[i]
        try:
            for batch in self._file(f).iter_batches(BATCH_ROWS, row_groups=[g], columns=[self.name],
                                                    use_threads=False):
                yield batch.column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise self._error(f, e) from None

    def rows(self, i: int) -> int:
        f, g = self.groups[i]
        return self.files[f][1].row_group(g).num_rows

    def mostly_distinct(self) -> bool:
        """Whether a string column's first batch holds more than one distinct word in ``DISTINCT_SHARE``
        rows, read with its dictionary (Parquet's dictionary page or, past its fallback to plain
        pages, the words Arrow hashed): such a column is ranked by sorting (``string_sort``)."""
        if not self.groups:
            return False
        groups = RowGroups(self.files, self.name, as_dictionary=True)
        first = next(groups.batches(0), None)
        if first is None or not pa.types.is_dictionary(first.type):
            return False
        return len(first.dictionary) * DISTINCT_SHARE > len(first)

    def plain(self) -> "RowGroups":
        """The same column read without dictionaries (a string per row)."""
        return RowGroups(self.files, self.name, as_dictionary=False)

    def largest(self) -> int:
        """Rows of the largest row group."""
        return max((self.rows(i) for i in range(len(self.groups))), default=0)

    def parts(self) -> list[tuple[int, Callable[[], Iterator[pa.Array]]]]:
        """``(rows, batches)`` per row group, in file order: ``batches()`` decodes the row group."""
        return [(self.rows(i), lambda i=i: self.batches(i)) for i in range(len(self.groups))]

    def __iter__(self) -> Iterator[pa.Array]:
        groups = len(self.groups)
        if groups <= 1:
            for i in range(groups):
                yield from self.read(i).chunks
            return
        with ThreadPoolExecutor(self.threads, thread_name_prefix="parquet-decode") as pool:
            for column in pool.map(self.read, range(groups)):
                yield from column.chunks
