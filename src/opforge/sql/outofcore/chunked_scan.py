"""A scan read in chunks: the table's selected columns never sit on the device all at once.

A table of Parquet files (a file; a folder's or a persistent database table's several) is read
from the host cache, or, when its columns would not fit that, file after file with
``ParquetFile.iter_batches`` (``chunk_rows`` rows at a time, only the selected columns), so it need
not fit in host memory; an Arrow table (registered Arrow or pandas data) is sliced on the host;
each chunk then moves to the device. Only a table built from device columns is cut into row
ranges of those. Each
chunk gets the scan's filters and the runtime filters pushed to it (``physical/scan.run_scan`` on
the chunk), so what leaves a chunk is only the rows that survive.

Host cache: a Parquet column a chunked scan reads is decoded once (all row groups, in parallel)
and kept in host memory (``HOST_CACHE``, least recently used first out, up to
``$OPFORGE_SQL_HOST_CACHE``, default a quarter of the machine's memory), so later chunks and
later queries cost a slice and a copy over the link, not a Parquet decode. A scan whose columns
would not fit the cache reads the files batch by batch instead (``iter_batches``).

String columns: every chunk must code a word the same way (a join or GROUP BY downstream compares
codes), so each string column gets one dictionary for the whole table: the distinct words, sorted
(code order is string order), cached per table and column. A column the host cache
takes is coded in one pass over all its rows, as the in-memory load codes it
(``column_load.load_column``: mostly distinct words ranked by a radix sort on the device when
their bytes and the sort's work fit the memory limit, else sorted on the host); only the codes stay
in the cache. Why: mapping each row group's words onto a dictionary of 150 M comments
(``pc.index_in``) rebuilds a hash table of those 150 M words per row group. The other readers map
a chunk's words onto the dictionary with ``pc.index_in``."""
from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from opforge.sql import column_load, parquet_read, string_sort
from opforge.sql.column import Column, arrow_dictionary
from opforge.sql.expr import Batch
from opforge.sql.outofcore.sizes import default_host_limit, parse_size
from opforge.sql.physical.scan import run_scan
from opforge.sql.plan import Scan
from opforge.sql.table import LazyColumns, Table

_DICTIONARIES: dict[tuple, tuple[tuple, pa.Array]] = {}


def row_bytes(table: Table, names: list[str]) -> int:
    """Device bytes per row of these columns (values plus a validity byte)."""
    types = {n: t for n, t in zip(table.names, table.types)}
    return sum(torch.empty(0, dtype=types[n].torch_dtype).element_size() + 1 for n in names) or 1


def scan_bytes(table: Table, node: Scan) -> int:
    return table.num_rows * row_bytes(table, [o.name for o in node.outputs])


# device bytes the operators over a chunk make per row beside its columns (int64 group ids, sort
# permutations, gather indices: about six 8-byte temporaries); a chunk of few narrow columns is
# sized by these. TPC-H q18's lineitem [l_orderkey, l_quantity] (18 bytes a row) aggregated per
# chunk took the whole limit (SF1 under 256 MiB, live tensors on the CPU).
CHUNK_ROW_WORK_BYTES = 48


def chunk_rows(table: Table, node: Scan, limit: int) -> int:
    """Rows per chunk: a quarter of the limit, leaving room for what the pipeline makes of it
    (a row counts at least ``CHUNK_ROW_WORK_BYTES``)."""
    nbytes = max(row_bytes(table, [o.name for o in node.outputs]), CHUNK_ROW_WORK_BYTES)
    return max(1024, limit // 4 // nbytes)


def chunks(node: Scan, table: Table, device, pushed, rows: int, counts: dict, limit: int | None = None
           ) -> Iterator[Batch]:
    """The scan's output, chunk by chunk; ``counts`` gets rows_read / chunks."""
    names = [o.name for o in node.outputs]
    for n, cols in column_chunks(table, names, device, rows, limit):
        counts["chunks"] = counts.get("chunks", 0) + 1
        counts["rows_read"] = counts.get("rows_read", 0) + n
        box = [Table(names, [cols[o.name] for o in node.outputs])]
        del cols
        # neither the chunk nor its filtered rows stay in this frame while the consumers work
        yield _scanned(node, box, device, pushed)


def _scanned(node: Scan, box: list, device, pushed) -> Batch:
    return run_scan(node, box.pop(), device, pushed, None)


def column_chunks(table: Table, names: list[str], device, rows: int, limit: int | None = None
                  ) -> Iterator[tuple[int, dict[str, Column]]]:
    """(rows, name -> device Column) for consecutive row ranges of at most ``rows`` rows of these
    columns, read from the host (a Parquet file: the host cache or its batches; an Arrow table:
    its slices) so that no whole column reaches the device. Every chunk codes a string column
    with one table-wide dictionary (``limit``: the device memory limit, which says whether a
    string column may be ranked on the device). A table without host data (built from device
    columns) is cut from its device columns."""
    lazy = table.columns if isinstance(table.columns, LazyColumns) else None
    names = list(dict.fromkeys(names))
    if lazy is not None and lazy.files and names:
        yield from _parquet_chunks(lazy, names, device, rows, limit)
    elif lazy is not None and lazy.arrow is not None and names:
        yield from _arrow_chunks(lazy, names, device, rows)
    else:
        for start in range(0, table.num_rows, rows):
            idx = torch.arange(start, min(start + rows, table.num_rows), device=device)
            yield len(idx), {n: table.column(n).take(idx) for n in names}


Files = list[tuple[str, pq.FileMetaData]]  # a table's Parquet files, their rows one after the other


def _parquet_chunks(lazy: LazyColumns, names: list[str], device, rows: int, limit: int | None):
    """A table of Parquet files (one; a folder's or a database table's several): from the host
    cache when the columns fit it, else each file batch by batch (never whole in host memory)."""
    files = lazy.files
    types = dict(zip(lazy.names, lazy.arrow_types))
    sql_types = dict(zip(lazy.names, lazy.types))
    strings = [n for n in names if column_load.is_string(types[n])]
    if HOST_CACHE.fits(files, names):
        host, words = {}, {}
        for n in names:
            if n in strings:
                host[n], words[n] = HOST_CACHE.strings(files, n, types[n], _sort_device(files, n, device, limit))
            else:
                host[n] = HOST_CACHE.column(files, n)
        def load(start: int, n_rows: int) -> dict[str, Column]:
            cols = {}
            for n in names:
                piece = host[n].slice(start, n_rows)
                if n in words:
                    cols[n] = _codes_column(piece, words[n][0], sql_types[n], device)
                else:  # cached in the narrowest integer that holds the values: widened on the device
                    cols[n] = _widened(column_load.load_column(piece.chunks, n_rows, piece.type, device, n),
                                       sql_types[n])
            return cols
        for start in range(0, lazy.num_rows, rows):
            n_rows = min(rows, lazy.num_rows - start)
            yield n_rows, load(start, n_rows)  # not kept in this frame while the consumers work
        return
    words = {n: _dictionary(files, n) for n in strings}
    for path, meta in files:
        yield from _batches(path, meta, names, words, lazy, device, rows)


def _batches(path, meta, names: list[str], words: dict, lazy: LazyColumns, device, rows: int):
    """A Parquet file's columns ``rows`` rows at a time (``iter_batches``)."""
    types = dict(zip(lazy.names, lazy.arrow_types))
    sql_types = dict(zip(lazy.names, lazy.types))
    f = pq.ParquetFile(path, metadata=meta, read_dictionary=list(words) or None)
    for rb in f.iter_batches(batch_size=rows, columns=names):
        cols = {}
        for n in names:
            arr = rb.column(rb.schema.get_field_index(n))
            if n in words:
                cols[n] = _string_column(arr, words[n], sql_types[n], device)
            else:
                cols[n] = column_load.load_column([arr], len(arr), types[n], device, n)
        yield rb.num_rows, cols


def _arrow_chunks(lazy: LazyColumns, names: list[str], device, rows: int):
    """An Arrow table's columns sliced on the host (zero copy), each slice moved to the device."""
    source = lazy.arrow
    types = dict(zip(lazy.names, lazy.arrow_types))
    sql_types = dict(zip(lazy.names, lazy.types))
    words = {n: _arrow_dictionary(lazy, n) for n in names if column_load.is_string(types[n])}
    for start in range(0, lazy.num_rows, rows):
        n_rows = min(rows, lazy.num_rows - start)
        cols = {}
        for n in names:
            piece = source.column(lazy.names.index(n)).slice(start, n_rows)
            if n in words:
                codes = pa.chunked_array([_codes(c, words[n][1]) for c in piece.chunks], pa.int32())
                cols[n] = _codes_column(codes, words[n][0], sql_types[n], device)
            else:
                cols[n] = column_load.load_column(piece.chunks, n_rows, types[n], device, n)
        yield n_rows, cols


def _decoded_width(t: pa.DataType) -> int:
    """Bytes per row of a column once decoded: one code for strings and LIST / STRUCT values
    (dictionary-coded), the width of a fixed-width type, 8 for anything else."""
    if column_load.is_string(t) or pa.types.is_nested(t):
        return 4
    if _narrowed_decimal(t) is not None:
        return 8
    try:
        return max(1, t.byte_width)
    except ValueError:  # a variable-width type (binary)
        return 8


class HostCache:
    """Decoded Parquet columns in host memory, least recently used evicted first. A string column
    is kept as int32 codes into its file-wide dictionary (``_dictionary``)."""

    def __init__(self):
        self._entries: OrderedDict[tuple, pa.ChunkedArray] = OrderedDict()
        self.bytes = 0

    @staticmethod
    def limit() -> int:
        return parse_size(os.environ.get(HOST_CACHE_ENV) or None, HOST_CACHE_ENV) or default_host_limit()

    def fits(self, files: Files, names: list[str]) -> bool:
        """Whether these columns (their decoded size, estimated from the files) fit the cache."""
        schema = files[0][1].schema.to_arrow_schema()
        rows = sum(meta.num_rows for _, meta in files)
        return sum(rows * (_decoded_width(schema.field(n).type) + 1) for n in names) <= self.limit()

    def column(self, files: Files, name: str) -> pa.ChunkedArray:
        """A fixed-width column, decoded, its integers (dates, decimals' unscaled values) in the
        narrowest type that holds them (``narrowest``): the reader widens them on the device."""
        key = _key(files, name)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        typ = files[0][1].schema.to_arrow_schema().field(name).type
        chunks = list(parquet_read.RowGroups(files, name, as_dictionary=False))
        return self._keep(key, narrowest(pa.chunked_array(chunks, typ)))

    def strings(self, files: Files, name: str, arrow_type: pa.DataType, sort_device
                ) -> tuple[pa.ChunkedArray, tuple[tuple, pa.Array]]:
        """A string column's int32 codes into its table-wide dictionary, and that dictionary
        (``_dictionary``'s pair), coded in one pass over the column on ``sort_device``."""
        key = _key(files, name)
        hit, known = self._entries.get(key), _DICTIONARIES.get(key)
        if hit is not None and known is not None:
            self._entries.move_to_end(key)
            return hit, known
        col = column_load.load_column(parquet_read.RowGroups(files, name, as_dictionary=True),
                                      sum(meta.num_rows for _, meta in files), arrow_type, sort_device, name)
        words = col.dictionary or ()
        if known is None or len(known[0]) != len(words):  # the same files' sorted words: the same list
            known = _DICTIONARIES[key] = (words, arrow_dictionary(words))
        codes = col.values.to(torch.int32).cpu().numpy()
        mask = None if col.valid is None else ~col.valid.cpu().numpy()
        return self._keep(key, narrowest(pa.chunked_array([pa.array(codes, pa.int32(), mask=mask)]))), known

    def _keep(self, key: tuple, data: pa.ChunkedArray) -> pa.ChunkedArray:
        self._entries[key] = data
        self.bytes += data.nbytes
        limit = self.limit()
        while self.bytes > limit and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
        return data


HOST_CACHE_ENV = "OPFORGE_SQL_HOST_CACHE"
HOST_CACHE = HostCache()


def _narrowed_decimal(t: pa.DataType) -> pa.DataType | None:
    """decimal64 for a 128-bit decimal of at most 18 digits (its values fit an int64), else None."""
    decimal64 = getattr(pa, "decimal64", None)  # pyarrow >= 18
    if decimal64 is None or not pa.types.is_decimal128(t) or t.precision > 18:
        return None
    return decimal64(t.precision, t.scale)


_NARROWER = (np.int8, np.int16, np.int32)  # the widths a cached integer column may narrow to


def _integer_storage(t: pa.DataType):
    """The signed integer dtype ``t``'s values are stored as when narrowing them is exact (integers,
    dates, times, timestamps, decimals' unscaled values of up to 18 digits: a decimal128's low
    words), else None (floats, unsigned, others)."""
    if _narrowed_decimal(t) is not None:
        return np.dtype(np.int64)
    if pa.types.is_signed_integer(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return np.dtype(np.int64)
    if pa.types.is_decimal(t) and t.byte_width == 8:
        return np.dtype(np.int64)
    return None


def narrowest(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column``'s values in the narrowest signed integer type holding all of them (NULLs keep
    their validity; the values under them are masked on the device), or ``column`` itself; a
    decimal128 of up to 18 digits that fits no narrower integer becomes decimal64 (its low words;
    the high word is their sign).

    Why: a chunked scan sends the host cache's bytes over the link at every query; TPC-H's lineitem
    dates fit int16, its quantities, discounts and taxes (decimals' unscaled values) int16 and
    int8, a string column of a few words int8 codes: a third of the bytes of the stored types (and
    its four decimals took 38 GB decoded at SF100 as decimal128). The range is measured on the
    values themselves (a pass per row group, in parallel), never taken from the files' statistics,
    so that a wrong statistic cannot wrap a value."""
    storage = _integer_storage(column.type)
    chunks = [c if c.offset == 0 else pa.concat_arrays([c]) for c in column.chunks]  # bitmaps from bit 0
    chunks = [c for c in chunks if len(c)]
    if storage is None or storage.itemsize == 1 or not chunks:
        return column
    views = [column_load.fixed_values(c, storage) for c in chunks]
    with ThreadPoolExecutor(min(len(views), os.cpu_count() or 1)) as pool:  # numpy lets the GIL go
        ranges = list(pool.map(lambda v: (int(v.min()), int(v.max())), views))
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        fits = [d for d in _NARROWER if np.dtype(d).itemsize < storage.itemsize
                and np.iinfo(d).min <= lo and hi <= np.iinfo(d).max]
        if fits:
            dtype, typ = fits[0], pa.from_numpy_dtype(fits[0])
        elif _narrowed_decimal(column.type) is not None:
            dtype, typ = np.int64, _narrowed_decimal(column.type)
        else:
            return column
        narrowed = list(pool.map(
            lambda cv: pa.Array.from_buffers(typ, len(cv[0]), [cv[0].buffers()[0], pa.py_buffer(cv[1].astype(dtype))],
                                             null_count=cv[0].null_count), zip(chunks, views)))
    return pa.chunked_array(narrowed, typ)


def _widened(col: Column, typ) -> Column:
    """A column read from a ``narrowest`` cache entry in its table's type (others as they are)."""
    if col.type == typ:
        return col
    return Column(col.values.to(typ.torch_dtype), col.valid, typ)


def _codes(arr: pa.Array, ordered: pa.Array) -> pa.Array:
    """A chunk of strings as int32 codes into ``ordered`` (NULL stays NULL)."""
    if pa.types.is_dictionary(arr.type):
        return pc.index_in(arr.dictionary.cast(ordered.type), value_set=ordered).take(arr.indices)
    return pc.index_in(arr.cast(ordered.type), value_set=ordered)


DEVICE_SORT_ROW_BYTES = 80  # device bytes a row's ranking takes beside its words (string_sort's int64 passes)
DEVICE_SORT_SHARE = 0.9  # of the memory limit, at most, for ranking one string column on the device


def _sort_device(files: Files, name: str, device, limit: int | None):
    """Where a string column is coded: ``device``, unless ranking its words there (their bytes plus
    ``DEVICE_SORT_ROW_BYTES`` a row, plus the gather's batch, ``string_sort.GATHER_WORK_BYTES``)
    would pass ``DEVICE_SORT_SHARE`` of the memory limit; then the host. The batch is fixed: under
    a small limit it alone passes it (TPC-H q13 at SF1 under 256 MiB peaked at 2.4x on the H200)."""
    if limit is None or torch.device(device).type == "cpu":
        return device
    col = files[0][1].schema.to_arrow_schema().get_field_index(name)
    words = sum(meta.row_group(g).column(col).total_uncompressed_size
                for _, meta in files for g in range(meta.num_row_groups))
    rows = sum(meta.num_rows for _, meta in files)
    fits = words + DEVICE_SORT_ROW_BYTES * rows + string_sort.GATHER_WORK_BYTES <= DEVICE_SORT_SHARE * limit
    return device if fits else torch.device("cpu")


def _codes_column(piece: pa.ChunkedArray, words: tuple, typ, device) -> Column:
    """A string column's codes (of any signed integer width; NULL: code 0) as its int32 Column,
    moved through the pinned staging (``column_load.load_column``)."""
    col = column_load.load_column(piece.chunks, len(piece), piece.type, device)
    return Column(col.values.to(torch.int32), col.valid, typ, words)


def _key(files: Files, name: str) -> tuple:
    return (*((path, id(meta)) for path, meta in files), name)


def _dictionary(files: Files, name: str) -> tuple[tuple, pa.Array]:
    """The column's distinct words, sorted, over all the files (cached)."""
    key = _key(files, name)
    hit = _DICTIONARIES.get(key)
    if hit is None:
        hit = _DICTIONARIES[key] = _sorted_words(parquet_read.RowGroups(files, name, as_dictionary=True))
    return hit


def _arrow_dictionary(lazy: LazyColumns, name: str) -> tuple[tuple, pa.Array]:
    """The distinct words of an Arrow table's column, sorted (kept with the table's columns)."""
    hit = lazy.host_dictionaries.get(name)
    if hit is None:
        hit = lazy.host_dictionaries[name] = _sorted_words(lazy.arrow.column(lazy.names.index(name)).chunks)
    return hit


def _sorted_words(chunks) -> tuple[tuple, pa.Array]:
    seen = []
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            used = pc.unique(chunk.indices).drop_null()
            seen.append(chunk.dictionary.take(used).cast(pa.string()))
        else:
            seen.append(pc.unique(chunk).drop_null().cast(pa.string()))
    # 64-bit offsets while hashing and sorting: the distinct words may pass 2 GiB
    seen = [c.cast(pa.large_string()) for c in seen]
    distinct = pc.unique(pa.chunked_array(seen, pa.large_string())) if seen else pa.array([], pa.large_string())
    ordered = distinct.take(pc.sort_indices(distinct))
    if isinstance(ordered, pa.ChunkedArray):
        ordered = ordered.combine_chunks()
    words = column_load.words_of(column_load.narrowed(ordered))
    return words, arrow_dictionary(words)


def _string_column(arr: pa.Array, dictionary: tuple[tuple, pa.Array], typ, device) -> Column:
    words, ordered = dictionary
    return _codes_column(pa.chunked_array([_codes(arr, ordered)], pa.int32()), words, typ, device)
