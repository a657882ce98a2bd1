"""Arrow chunks to a device ``Column`` at transfer speed: the first touch of a column.

Why: the general conversion (``Column.from_arrow``) combines the chunks, casts and fills NULLs
with Arrow on the host, then makes a pageable copy: several host passes per column before the
link sees a byte. Here each chunk's values buffer is read where it lies (a numpy view of Arrow
memory: no Python per value, no cast on the host) and goes to the device through pinned staging
(``host_staging``); the rest happens on the device after the copy. A Parquet column
(``parquet_read.RowGroups``) of a fixed-width type is decoded by the staging threads themselves, a
row group each, in small batches written straight into the pinned buffer the link reads
(``host_staging.fill_to_device``): decoding, the gather and the copies overlap, and no row group is
ever materialized whole on the host.

* integers and floats narrower than their storage type are widened there;
* DECIMAL(p <= 18) arrives as the low 64-bit word of each 128-bit value (exact: |v| < 10^18 < 2^63),
  gathered into the staging buffer by the same copy;
* values under NULLs are set there as the general conversion sets them (0; for strings the code
  of the first non-NULL row);
* strings: the codes of Arrow dictionary arrays (Parquet's dictionary pages, ``parquet_read``) are
  copied, the words that occur are found by one scatter, and the codes are mapped to the sorted
  dictionary's ranks by one gather; only the distinct words are touched on the host. From Parquet
  the codes are numbered across the row groups' dictionaries while staged
  (``_dictionary_row_groups``); a column of mostly distinct strings (past the writer's fallback to
  plain pages) is read plain and ranked on a GPU by a radix sort of its bytes (``string_sort``),
  which also gathers its distinct words there; on a CPU by one Arrow sort of its rows. A
  dictionary of ``LAZY_WORDS`` words or more stays an Arrow array (``ArrowWords``): no Python
  string per word unless a query reads the words.

Types without such a path (BOOL from Arrow's bit-packing is one here; other Arrow types that
``types.from_arrow`` maps) go through ``Column.from_arrow``, unchanged. Results equal the general
conversion bit for bit (``tests/sql/test_column_load.py``); statistics are not computed here
(``planner/statistics.py`` gathers them on the device when the planner first asks).
"""
from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from opforge.sql import types as T
from opforge.sql.column import ArrowWords, Column, arrow_dictionary
from opforge.sql.errors import SqlError
from opforge.sql.parquet_read import RowGroups
from opforge.sql.string_sort import gathered_words, sorted_ranks
from opforge.runtime import host_staging
from opforge.runtime.host_staging import fill_to_device, to_device, torch_dtype, values_view

# Arrow type -> the numpy dtype its values buffer is read as (the type moved over the link)
_FIXED = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
          pa.uint8(): np.uint8, pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64,
          pa.date32(): np.int32}


LAZY_WORDS = 1 << 16  # a dictionary of this many words keeps no Python strings until read (ArrowWords)


def _wire_dtype(t: pa.DataType):
    """The numpy dtype of ``t``'s values as moved to the device, or None (no fast path)."""
    if t in _FIXED:
        return _FIXED[t]
    if pa.types.is_timestamp(t):
        return np.int64
    if pa.types.is_decimal(t) and t.precision <= 18 and t.byte_width in (4, 8, 16):
        return np.int32 if t.byte_width == 4 else np.int64
    return None


def is_string(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def fixed_values(chunk: pa.Array, dtype) -> np.ndarray:
    """A read-only numpy view of a fixed-width chunk's values (no copy; decimal128: the low words,
    a strided view)."""
    if chunk.type.byte_width == 16:  # decimal128: little-endian (low, high) int64 pairs
        off, n = chunk.offset, len(chunk)
        return np.frombuffer(chunk.buffers()[1], dtype=np.int64, count=2 * (off + n)).reshape(-1, 2)[off:, 0]
    return values_view(chunk, dtype)


class _Validity:
    """Each chunk's validity (None: no NULLs), gathered while the values stream past."""

    def __init__(self):
        self.parts: list[tuple[int, np.ndarray | None]] = []

    def note(self, chunk: pa.Array) -> None:
        mask = chunk.is_valid().to_numpy(zero_copy_only=False) if chunk.null_count else None
        self.parts.append((len(chunk), mask))

    def to_device(self, n: int, device) -> torch.Tensor | None:
        if all(m is None for _, m in self.parts):
            return None
        pieces = (np.ones(k, dtype=bool) if m is None else m for k, m in self.parts)
        return to_device(pieces, n, torch.bool, device)


def load_column(chunks: Iterable[pa.Array], n: int, arrow_type: pa.DataType, device, name: str = "") -> Column:
    """The column of ``n`` rows whose Arrow chunks (of ``arrow_type``, or its dictionary encoding
    for strings) ``chunks`` yields, on ``device``."""
    typ = T.from_arrow(arrow_type, name)
    if is_string(arrow_type):
        if isinstance(chunks, RowGroups) and chunks.read_dictionary:
            if not chunks.mostly_distinct():
                if _stageable(chunks, np.int32):
                    return _dictionary_row_groups(chunks, n, typ, device, name)
                return _strings(list(chunks), n, typ, device, name)
            # plain pages: no dictionary rebuilt past the writer's fallback
            if sorts_strings_on(torch.device(device)):
                return distinct_strings(list(chunks.plain()), n, typ, device, name)
            return _sorted_strings(list(chunks.plain()), n, typ, device, name)
        return _strings(list(chunks), n, typ, device, name)
    wire = _wire_dtype(arrow_type)
    if wire is None:
        chunks = list(chunks)
        return Column.from_arrow(pa.chunked_array(chunks, None if chunks else arrow_type), device, name)
    if isinstance(chunks, RowGroups) and _stageable(chunks, wire):
        return _fixed_row_groups(chunks, n, arrow_type, wire, typ, device)
    validity = _Validity()

    def pieces():
        for chunk in chunks:
            if chunk.type != arrow_type:  # a file whose stored type reads back otherwise
                chunk = chunk.cast(arrow_type)
            validity.note(chunk)
            yield fixed_values(chunk, wire)

    values = to_device(pieces(), n, torch_dtype(wire), device)
    values = values.to(typ.torch_dtype)
    valid = validity.to_device(n, device)
    if valid is not None:
        values.masked_fill_(~valid, 0)
    return Column(values, valid, typ)


def _stageable(groups: RowGroups, wire) -> bool:
    """Whether each row group of ``groups`` fits one staging part (``host_staging.PART_BYTES_MAX``)."""
    return groups.largest() * np.dtype(wire).itemsize <= host_staging.PART_BYTES_MAX


def _fixed_row_groups(groups: RowGroups, n: int, arrow_type: pa.DataType, wire, typ: T.SqlType,
                      device) -> Column:
    """A fixed-width Parquet column through ``_stage_row_groups``."""
    def values_of(chunk: pa.Array) -> np.ndarray:
        if chunk.type != arrow_type:  # a file whose stored type reads back otherwise
            chunk = chunk.cast(arrow_type)
        return fixed_values(chunk, wire)

    values, valid = _stage_row_groups(groups, n, wire, values_of, device)
    values = values.to(typ.torch_dtype)
    if valid is not None:
        values.masked_fill_(~valid, 0)
    return Column(values, valid, typ)


def _stage_row_groups(groups: RowGroups, n: int, wire, values_of, device, seen=None):
    """The values (``wire`` dtype) of a Parquet column on ``device``, and its validity (None: no
    NULLs): each row group decoded in batches by one of the staging threads, ``values_of(batch)``
    written straight into its staging buffer (``host_staging.fill_to_device``); ``seen(row, batch)``
    is told of each batch. The validity is gathered into one host mask, made at the first NULL."""
    parts = groups.parts()
    starts = np.cumsum([0] + [rows for rows, _ in parts])
    valid: list[np.ndarray] = []  # the host mask, once a NULL is seen
    lock = threading.Lock()

    def filler(start: int, rows: int, batches):
        def fill(dst: np.ndarray) -> None:
            at = 0
            for chunk in batches():
                k = len(chunk)
                if at + k > rows:
                    break
                np.copyto(dst[at:at + k], values_of(chunk))
                if seen is not None:
                    seen(start + at, chunk)
                if chunk.null_count:
                    with lock:
                        if not valid:
                            valid.append(np.ones(n, dtype=bool))
                    valid[0][start + at:start + at + k] = chunk.is_valid().to_numpy(zero_copy_only=False)
                at += k
            if at != rows:
                raise SqlError(f"reading column {groups.name!r} of {groups.path!r}: a row group holds a number "
                               f"of rows other than its metadata's {rows}")
        return fill

    values = fill_to_device([(rows, filler(int(start), rows, batches)) for (rows, batches), start
                             in zip(parts, starts)], n, torch_dtype(wire), device, groups.threads)
    return values, (to_device(valid, n, torch.bool, device) if valid else None)


class _NullWord(Exception):
    """A dictionary holding a NULL word: the column goes the general way."""


def _dictionary_row_groups(groups: RowGroups, n: int, typ: T.SqlType, device, name: str) -> Column:
    """A string column read as Parquet's dictionaries through ``_stage_row_groups``. Each distinct
    dictionary (one a row group, shared by its batches) has its words numbered in one table shared
    by the staging threads, once (Python per distinct word, not per row); each batch's codes are
    mapped through that numbering by a numpy gather while the batch is in cache, so the device gets
    the table's ids and ranks them (``_ranked``)."""
    table: dict[str, int] = {}  # word -> id
    remaps: dict[tuple, tuple[pa.Array, np.ndarray]] = {}  # the dictionary kept alive: its buffers key it
    lock = threading.Lock()

    def remap(d: pa.Array) -> np.ndarray:
        key = (len(d), d.offset, *(b.address if b is not None else 0 for b in d.buffers()))
        hit = remaps.get(key)
        if hit is None:
            with lock:
                hit = remaps.get(key)
                if hit is None:
                    if d.null_count:
                        raise _NullWord
                    words = d.cast(pa.string()).to_pylist()
                    hit = remaps[key] = (d, np.fromiter((table.setdefault(w, len(table)) for w in words),
                                                        dtype=np.int32, count=len(words)))
        return hit[1]

    def values_of(chunk: pa.Array) -> np.ndarray:
        ids = remap(chunk.dictionary)
        if len(ids) == 0:  # no words: every row is NULL
            return np.zeros(len(chunk), dtype=np.int32)
        indices = chunk.indices
        # the code under a NULL is whatever the buffer held: clipped here, masked on the device
        return np.take(ids, values_view(indices, indices.type.to_pandas_dtype()), mode="clip")

    try:
        ids, valid = _stage_row_groups(groups, n, np.int32, values_of, device)
    except _NullWord:
        return _strings(list(groups), n, typ, device, name)
    idx = ids.long()
    if valid is not None:
        idx.masked_fill_(~valid, 0)
    return _ranked(idx, valid, pa.array(list(table), pa.string()), n, typ, device)


def sorts_strings_on(device: torch.device) -> bool:
    """Whether mostly distinct strings are ranked by ``string_sort`` on ``device``: on a GPU (a few
    ms for millions of words); a CPU runs a dozen sorting passes slower than Arrow's sort
    (``_sorted_strings``)."""
    return device.type == "cuda"


def distinct_strings(chunks: list[pa.Array], n: int, typ: T.SqlType, device, name: str) -> Column:
    """A column of mostly distinct strings: its bytes go to the device chunk by chunk (no host
    copy of the column) and are ranked there by a radix sort (``string_sort``), instead of hashing
    and sorting millions of words on one host thread; only the distinct words, in order, come
    back for the host dictionary, gathered on the device (``string_sort.gathered_words``)."""
    strings = [c if pa.types.is_string(c.type) or pa.types.is_large_string(c.type) else c.cast(pa.large_string())
               for c in chunks]
    nulls = sum(c.null_count for c in strings)
    if nulls == n:  # no words (or no rows): the general conversion
        return Column.from_arrow(pa.chunked_array(strings, pa.large_string() if not strings else None), device, name)
    valid = None
    if nulls:
        valid = to_device((c.is_valid().to_numpy(zero_copy_only=False) for c in strings), n, torch.bool, device)
        strings = [c.drop_null() if c.null_count else c for c in strings]
    m = n - nulls
    spans = [_string_span(c) for c in strings]
    size = sum(hi - lo for _, lo, hi, _ in spans)

    def offset_pieces():
        base = 0
        for offsets, lo, hi, _ in spans:
            yield np.add(offsets[:-1], base - lo, dtype=np.int64)  # one pass: widened and moved
            base += hi - lo
        yield np.array([base], dtype=np.int64)

    offsets = to_device(offset_pieces(), m + 1, torch.int64, device)
    data = to_device((bytes_ for _, lo, hi, bytes_ in spans if hi > lo), size, torch.uint8, device)
    ranks, firsts = sorted_ranks(offsets, data)
    if valid is None:
        codes = ranks
    else:  # a NULL holds the first non-NULL row's code, as the general conversion leaves it
        codes = ranks[:1].expand(n).clone()
        codes[valid] = ranks
    word_offsets, word_bytes = gathered_words(offsets, data, firsts)
    ordered = pa.Array.from_buffers(pa.large_string(), len(word_offsets) - 1,
                                    [None, pa.py_buffer(word_offsets), pa.py_buffer(word_bytes)])
    return Column(codes, valid, typ, words_of(narrowed(ordered)))


def _sorted_strings(chunks: list[pa.Array], n: int, typ: T.SqlType, device, name: str) -> Column:
    """A column of mostly distinct strings where ``string_sort`` does not run (a CPU): one Arrow
    sort of the rows, equal neighbours in sorted order sharing a rank. Why: hashing the row
    groups' dictionaries into one and then sorting the distinct words costs twice as much (TPC-H
    SF1 l_comment: 8.6 s against 6 s)."""
    strings = pa.chunked_array(chunks, None if chunks else pa.string())
    if strings.nbytes > STRING_BYTES_MAX:  # the sorted copy is one array: 64-bit offsets
        strings = strings.cast(pa.large_string())
    nulls = strings.null_count
    if nulls == n:  # no words (or no rows): the general conversion
        return Column.from_arrow(strings, device, name)
    m = n - nulls
    order = pc.sort_indices(strings).slice(0, m)  # NULLs sort last
    ordered = strings.take(order)
    ordered = ordered.combine_chunks() if ordered.num_chunks != 1 else ordered.chunk(0)
    new = np.ones(m, dtype=bool)  # differs from its predecessor in sorted order
    if m > 1:
        new[1:] = pc.not_equal(ordered.slice(1), ordered.slice(0, m - 1)).to_numpy(zero_copy_only=False)
    codes = np.empty(n, dtype=np.int32)
    codes[order.to_numpy(zero_copy_only=False)] = np.cumsum(new, dtype=np.int32) - 1
    valid = None
    if nulls:  # a NULL holds the first non-NULL row's code, as the general conversion leaves it
        mask = strings.is_valid().to_numpy(zero_copy_only=False)
        codes[~mask] = codes[int(np.argmax(mask))]
        valid = torch.from_numpy(mask).to(device)
    words = ordered.filter(pa.array(new))
    return Column(torch.from_numpy(codes).to(device), valid, typ, words_of(narrowed(words)))


def _string_span(chunk: pa.Array) -> tuple[np.ndarray, int, int, np.ndarray]:
    """A string chunk's offsets (a view), the range of its data they cover and those bytes."""
    wide = pa.types.is_large_string(chunk.type)
    buffers = chunk.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32,
                            count=chunk.offset + len(chunk) + 1)[chunk.offset:]
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(buffers[2], dtype=np.uint8, count=hi)[lo:] if hi > lo else np.zeros(0, np.uint8)
    return offsets, lo, hi, data


def _strings(chunks: list[pa.Array], n: int, typ: T.SqlType, device, name: str) -> Column:
    if not chunks:
        return Column.from_arrow(pa.array([], pa.string()), device, name)
    encoded = pa.chunked_array(chunks)
    if not pa.types.is_dictionary(encoded.type):
        encoded = pc.dictionary_encode(encoded)
    encoded = encoded.unify_dictionaries()
    dictionary = encoded.chunk(0).dictionary if encoded.num_chunks else pa.array([], pa.string())
    if dictionary.null_count:  # a NULL word: leave it to the general conversion
        return Column.from_arrow(encoded, device, name)
    if not pa.types.is_string(dictionary.type):
        dictionary = dictionary.cast(pa.string())
    validity = _Validity()
    index_dtype = encoded.type.index_type.to_pandas_dtype()

    def pieces():
        for chunk in encoded.chunks:
            validity.note(chunk)
            yield fixed_values(chunk.indices, index_dtype)

    idx = to_device(pieces(), n, torch_dtype(index_dtype), device).long()
    valid = validity.to_device(n, device)
    if valid is not None:
        idx.masked_fill_(~valid, 0)
    return _ranked(idx, valid, dictionary, n, typ, device)


STRING_BYTES_MAX = (1 << 31) - 1  # what a ``string`` array's 32-bit offsets can address


def narrowed(words: pa.Array) -> pa.Array:
    """Words as ``string``, or as ``large_string`` when their bytes pass what 32-bit offsets address."""
    if pa.types.is_string(words.type):
        return words
    wide = words.cast(pa.large_string())
    if len(wide) == 0:
        return wide.cast(pa.string())
    offsets = np.frombuffer(wide.buffers()[1], dtype=np.int64, count=wide.offset + len(wide) + 1)
    fits = int(offsets[-1]) - int(offsets[wide.offset]) <= STRING_BYTES_MAX
    return wide.cast(pa.string()) if fits else wide


def words_of(ordered: pa.Array):
    """A column's sorted dictionary: past ``LAZY_WORDS`` words kept as Arrow, its Python
    strings made only if a query reads them (``ArrowWords``)."""
    if len(ordered) >= LAZY_WORDS or pa.types.is_large_string(ordered.type):
        return ArrowWords(ordered)
    words = tuple(ordered.to_pylist())
    arrow_dictionary(words, ordered)
    return words


def _ranked(idx: torch.Tensor, valid: torch.Tensor | None, dictionary: pa.Array, n: int, typ: T.SqlType,
            device) -> Column:
    """The column whose rows hold ``dictionary[idx]`` (int64 on the device; 0 under NULLs): the
    words that occur, sorted, and each row's rank among them."""
    size = len(dictionary)
    if size == 0:
        return Column(torch.zeros(n, dtype=torch.int32, device=device), valid, typ, ())
    # the words that occur (a Parquet or Arrow dictionary may hold more), found on the device
    present = torch.zeros(size, dtype=torch.bool, device=idx.device)
    present[idx if valid is None else idx[valid]] = True
    present = present.cpu().numpy()
    used = dictionary.filter(pa.array(present))
    # UTF-8 byte order (Arrow's sort) is code-point order, the order of Python str
    order = pc.sort_indices(used).to_numpy(zero_copy_only=False)
    rank = np.zeros(size, dtype=np.int32)
    rank[np.flatnonzero(present)[order]] = np.arange(len(order), dtype=np.int32)
    codes = torch.from_numpy(rank).to(idx.device)[idx]
    if valid is not None:  # a NULL holds the first non-NULL row's code, as the general conversion leaves it
        codes = torch.where(valid, codes, codes[valid.to(torch.uint8).argmax()])
    ordered = used.take(pa.array(order))
    return Column(codes, valid, typ, words_of(ordered))
