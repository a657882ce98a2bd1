"""A column on the device: one value tensor, an optional validity mask (None = no NULLs), a logical type
and, for strings, a sorted host dictionary so that code order is string order."""
from __future__ import annotations

import bisect
import datetime
import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from opforge.sql import decimal128
from opforge.sql import types as T


@dataclass
class Column:
    values: torch.Tensor
    valid: torch.Tensor | None
    type: T.SqlType
    dictionary: tuple[str, ...] | None = None  # sorted, unique; STRING only (large ones: ArrowWords)
    sorted: bool = False  # values ascending and no NULLs (lets a join merge instead of hash)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def device(self) -> torch.device:
        return self.values.device

    def take(self, idx: torch.Tensor) -> "Column":
        return Column(self.values[idx], None if self.valid is None else self.valid[idx], self.type, self.dictionary)

    def mark_sorted(self) -> "Column":
        """Set ``sorted`` when the values are ascending with no NULLs (one pass, one host sync)."""
        v = self.values
        if self.valid is None and v.dim() == 1 and v.dtype != torch.bool and not v.dtype.is_floating_point:
            self.sorted = bool((v[1:] >= v[:-1]).all()) if len(v) > 1 else True
        return self

    def null_mask(self) -> torch.Tensor:
        """True where the value is NULL."""
        if self.valid is None:
            return torch.zeros(len(self), dtype=torch.bool, device=self.device)
        return ~self.valid

    def valid_mask(self) -> torch.Tensor:
        if self.valid is None:
            return torch.ones(len(self), dtype=torch.bool, device=self.device)
        return self.valid

    # -- Arrow -------------------------------------------------------------------------------------------
    @staticmethod
    def from_arrow(arr: pa.Array | pa.ChunkedArray, device: torch.device | str, name: str = "") -> "Column":
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        typ = T.from_arrow(arr.type, name)
        if typ.kind in T.NESTED:
            from opforge.sql import nested
            return nested.from_arrow(arr, typ, device)
        valid = None
        if arr.null_count:
            valid = torch.from_numpy(np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)).to(device)
        if typ.kind == "STRING":
            if pa.types.is_dictionary(arr.type):
                arr = arr.cast(arr.type.value_type)
            if pa.types.is_string_view(arr.type) or pa.types.is_large_string(arr.type):
                arr = arr.cast(pa.string())
            enc = pc.dictionary_encode(arr)
            # UTF-8 byte order (Arrow's sort) is code-point order, the order of Python str
            order = pc.sort_indices(enc.dictionary).to_numpy(zero_copy_only=False)
            size = len(enc.dictionary)
            rank = np.empty(size, dtype=np.int32)
            rank[order] = np.arange(size, dtype=np.int32)
            idx = enc.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            codes = rank[idx] if size else np.zeros(len(arr), dtype=np.int32)
            codes = np.array(codes, dtype=np.int32, copy=True)
            ordered = enc.dictionary.take(pa.array(order))
            words = tuple(ordered.to_pylist())
            arrow_dictionary(words, ordered)
            return Column(torch.from_numpy(codes).to(device), valid, typ, words)
        if typ.wide:
            return Column(decimal128_from_arrow(arr, typ, device), valid, typ)
        if typ.kind == "DECIMAL":
            wide = pc.cast(arr, pa.decimal128(38, typ.scale))
            # reinterpret the unscaled 128-bit integers: value * 10^s exactly
            unscaled = pa.Array.from_buffers(pa.decimal128(38, 0), len(wide), wide.buffers(), null_count=wide.null_count)
            vals = pc.cast(unscaled, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        elif typ.kind == "DATE":
            vals = arr.cast(pa.date32()).cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False)
        elif typ.kind == "TIMESTAMP":
            vals = arr.cast(T.to_arrow(typ)).cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        elif typ.kind == "BOOL":
            vals = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        elif pa.types.is_null(arr.type):
            vals = np.zeros(len(arr), dtype=np.int32)
            valid = torch.zeros(len(arr), dtype=torch.bool, device=device)
        else:
            vals = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(torch.empty(0, dtype=typ.torch_dtype).numpy().dtype)
        return Column(torch.from_numpy(np.array(vals, copy=True)).to(device), valid, typ)

    def to_arrow(self, dictionary: bool = False) -> pa.Array:
        """The column as Arrow; ``dictionary``: strings as a dictionary array over the column's
        dictionary (no per-row gather of words: what a writer decodes in parallel, ``parquet_write``)."""
        if self.type.kind in T.NESTED:
            from opforge.sql import nested
            return nested.to_arrow(self)
        vals = self.values.detach().cpu().numpy()
        mask = None if self.valid is None else ~self.valid.cpu().numpy()
        kind = self.type.kind
        if kind == "STRING":
            if not self.dictionary:
                return pa.nulls(len(vals), pa.string()) if len(vals) else pa.array([], pa.string())
            # Gather only the rows' words from the (cached) Arrow dictionary: a 20-row result over
            # a dictionary of 1.5M comments must not rebuild the dictionary.
            codes = pa.array(vals.astype(np.int32, copy=False), mask=mask)
            if dictionary:
                return pa.DictionaryArray.from_arrays(codes, arrow_dictionary(self.dictionary))
            return arrow_dictionary(self.dictionary).take(codes).cast(pa.string())
        if self.type.wide:
            return decimal128_to_arrow(vals, mask, self.type)
        if kind == "DECIMAL":
            return _scaled_to_decimal(vals, mask, self.type)
        if kind == "DATE":
            return pa.array(vals.astype(np.int32, copy=False), mask=mask).cast(pa.date32())
        if kind == "TIMESTAMP":
            return pa.array(vals.astype(np.int64), mask=mask).cast(T.to_arrow(self.type))
        return pa.array(vals, type=T.to_arrow(self.type), mask=mask)

    # -- helpers -----------------------------------------------------------------------------------------
    @staticmethod
    def constant(value, typ: T.SqlType, n: int, device) -> "Column":
        """A column of n copies of one Python value (None = NULL)."""
        if typ.kind in T.NESTED:
            from opforge.sql import nested
            return nested.constant(value, typ, n, device)
        if typ.wide:
            values = decimal128.full(0 if value is None else storage_value(value, typ), n, device)
            return Column(values, None if value is not None else torch.zeros(n, dtype=torch.bool, device=device), typ)
        if value is None:
            return Column(torch.zeros(n, dtype=typ.torch_dtype, device=device),
                          torch.zeros(n, dtype=torch.bool, device=device), typ,
                          () if typ.kind == "STRING" else None)
        if typ.kind == "STRING":
            return Column(torch.zeros(n, dtype=torch.int32, device=device), None, typ, (value,))
        return Column(torch.full((n,), storage_value(value, typ), dtype=typ.torch_dtype, device=device), None, typ)


def storage_value(value, typ: T.SqlType):
    """A Python literal as the number stored on the device for `typ`."""
    if typ.kind == "DATE":
        if isinstance(value, datetime.date):
            return (value - datetime.date(1970, 1, 1)).days
        return int(value)
    if typ.kind == "TIMESTAMP":
        if isinstance(value, datetime.datetime):
            return timestamp_value(value, typ)
        return int(value)
    if typ.kind == "DECIMAL":
        import decimal
        with decimal.localcontext(prec=100):  # 38 digits and a scale: beyond the default 28
            return int((decimal.Decimal(str(value)) * (10 ** typ.scale)).to_integral_value())
    if typ.kind == "BOOL":
        return bool(value)
    if typ.is_integer:
        return int(value)
    return float(value)


def decimal128_from_arrow(arr: pa.Array, typ: T.SqlType, device) -> torch.Tensor:
    """A decimal128 array as [n, 2] int64 (low, high) words: its buffer, rescaled to ``typ``'s scale."""
    if arr.type != pa.decimal128(typ.precision, typ.scale):
        arr = pc.cast(arr, pa.decimal128(typ.precision, typ.scale))
    if arr.null_count:
        arr = arr.fill_null(0)
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset: 2 * (arr.offset + len(arr))]
    return torch.from_numpy(words.reshape(len(arr), 2).copy()).to(device)


def decimal128_to_arrow(vals: np.ndarray, mask, typ: T.SqlType) -> pa.Array:
    words = np.ascontiguousarray(vals.astype(np.int64).reshape(-1, 2))  # a copy: ``vals`` may be the tensor's
    return _decimal_array(words, mask, pa.decimal128(typ.precision, typ.scale))


def _decimal_array(words: np.ndarray, mask, arrow_type: pa.DataType) -> pa.Array:
    """Contiguous [n, 2] int64 (low, high) words, owned by the caller, as a decimal128 array over
    their memory (the buffer keeps ``words`` alive)."""
    validity = None
    if mask is not None and mask.any():
        validity = pa.array(~mask, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(arrow_type, len(words), [validity, pa.py_buffer(words)],
                                 null_count=int(mask.sum()) if validity is not None else 0)


def _scaled_to_decimal(vals: np.ndarray, mask, typ: T.SqlType) -> pa.Array:
    """The unscaled int64 values as decimal128 words built by numpy (low word, sign-extended high
    word): exact, and no Arrow cast per value. The precision is the declared one, unchecked, as the
    unsafe cast this replaces left it."""
    words = np.empty((len(vals), 2), dtype=np.int64)
    words[:, 0] = vals
    np.right_shift(words[:, 0], 63, out=words[:, 1])
    return _decimal_array(words, mask, pa.decimal128(max(typ.precision, typ.scale, 1), typ.scale))


# Below this many words in all, the host merges dictionaries faster than a trip to the device.
DEVICE_MERGE_WORDS = 1 << 16


def merge_dictionaries(*dicts: tuple, device=None) -> tuple[tuple, list[np.ndarray]]:
    """One sorted dictionary covering several (sorted, distinct) ones, and for each input the code
    map old -> new. ``device``: the columns'. On a GPU, large string dictionaries are merged there
    by ``string_sort``'s radix sort: on the host, Python compares the words (an exchange of
    1.5 M customer names took seconds). The host path sorts the inputs' runs (Timsort merges them)
    and maps each word through one dict: strings or LIST / STRUCT values alike."""
    if device is not None and sum(map(len, dicts)) >= DEVICE_MERGE_WORDS and all(
            isinstance(d, ArrowWords) or not d or isinstance(d[0], str) for d in dicts):
        from opforge.sql import column_load

        if column_load.sorts_strings_on(torch.device(device)):
            return _merge_on_device(dicts, torch.device(device))
    merged = tuple(dict.fromkeys(sorted(itertools.chain.from_iterable(dicts))))
    index = {w: i for i, w in enumerate(merged)}
    return merged, [np.fromiter(map(index.__getitem__, d), dtype=np.int64, count=len(d)) for d in dicts]


def _merge_on_device(dicts: tuple, device: torch.device) -> tuple[tuple, list[np.ndarray]]:
    """The dictionaries' words loaded as one column of strings on ``device`` (ranked there, the
    distinct words gathered there: ``column_load``): its dictionary is the merge and its codes,
    input by input, the maps."""
    from opforge.sql import column_load

    arrays = [arrow_dictionary(d) for d in dicts if len(d)]
    n = sum(map(len, arrays))
    merged = column_load.distinct_strings(arrays, n, T.STRING, device, "merged dictionary")
    codes = merged.values.cpu().numpy().astype(np.int64)
    ends = np.cumsum([0] + [len(d) for d in dicts])
    return merged.dictionary, [codes[a:b] for a, b in zip(ends[:-1], ends[1:])]


def recode(col: Column, merged: tuple[str, ...], code_map: np.ndarray) -> Column:
    """The same strings expressed as codes into `merged`."""
    if len(code_map) == 0:
        return Column(torch.zeros_like(col.values), col.valid, col.type, merged)
    m = torch.from_numpy(code_map).to(col.device)
    codes = col.values.long()
    if col.valid is not None:  # a NULL row's code can be anything (a window min's sentinel): never looked up
        codes = torch.where(col.valid, codes, 0)
    return Column(m[codes].to(torch.int32), col.valid, col.type, merged)


def unify_strings(cols: list[Column]) -> list[Column]:
    """Coded columns (strings, LIST / STRUCT values) re-coded against one shared dictionary (needed
    before comparing codes)."""
    dicts = [c.dictionary or () for c in cols]
    if all(d is dicts[0] or d == dicts[0] for d in dicts):
        return cols
    merged, maps = merge_dictionaries(*dicts, device=cols[0].device)
    return [recode(c, merged, m) for c, m in zip(cols, maps)]


class ArrowWords:
    """A column's sorted dictionary kept as its Arrow string array, its Python strings made on
    first use (then a tuple, which every tuple operation reads).

    Why: a column of tens of millions of distinct words (TPC-H's l_comment at SF10) that a query
    passes through to a writer (CREATE TABLE AS, COPY) needs only the Arrow array
    (``arrow_dictionary``); one Python string per word costs seconds and gigabytes. Length and
    truth need no strings either; anything else (indexing, iteration, comparison, hashing, numpy)
    reads the tuple, so a reader sees a tuple's answers. The array is ``large_string`` only when the
    words pass 2 GiB of bytes (TPC-H's o_comment at SF100), which ``string`` cannot offset."""
    __slots__ = ("arrow", "_words")

    def __init__(self, arrow: pa.Array):
        if arrow.type != pa.string() and arrow.type != pa.large_string():
            raise TypeError(f"ArrowWords: expected a string array, got {arrow.type}")
        self.arrow, self._words = arrow, None

    @property
    def words(self) -> tuple[str, ...]:
        if self._words is None:
            self._words = tuple(self.arrow.to_pylist())
        return self._words

    def __len__(self) -> int:
        return len(self.arrow)

    def __bool__(self) -> bool:
        return len(self.arrow) > 0

    def __getitem__(self, i):
        return self.words[i]

    def __iter__(self):
        return iter(self.words)

    def __reversed__(self):
        return reversed(self.words)

    def __contains__(self, word) -> bool:
        return word in self.words

    def index(self, *args) -> int:
        return self.words.index(*args)

    def count(self, word) -> int:
        return self.words.count(word)

    @staticmethod
    def _other(other):
        return other.words if isinstance(other, ArrowWords) else other

    def __eq__(self, other):
        return other is self or self.words == self._other(other)

    def __ne__(self, other):
        return not self == other

    def __lt__(self, other):
        return self.words < self._other(other)

    def __le__(self, other):
        return self.words <= self._other(other)

    def __gt__(self, other):
        return self.words > self._other(other)

    def __ge__(self, other):
        return self.words >= self._other(other)

    def __hash__(self) -> int:
        return hash(self.words)

    def __add__(self, other):
        return self.words + self._other(other)

    def __radd__(self, other):
        return other + self.words

    def __mul__(self, n):
        return self.words * n

    __rmul__ = __mul__

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.words, dtype=dtype)

    def __reduce__(self):  # sent or copied as the tuple it stands for
        return tuple, (self.words,)

    def __repr__(self) -> str:
        return repr(self.words)


# Arrow copies of string dictionaries, by identity: a table's columns and every column derived from
# them (take, filter, join) share one dictionary tuple, so Arrow's vectorized string kernels can run
# over it without rebuilding the array from Python strings each time.
_ARROW_DICTIONARIES: OrderedDict[int, tuple[tuple, pa.Array]] = OrderedDict()
_ARROW_DICTIONARY_CACHE = 64
ARROW_MIN_WORDS = 4096  # below this the per-word Python loop costs less than the conversions


def arrow_dictionary(words: tuple[str, ...], known: pa.Array | None = None) -> pa.Array:
    """``words`` as an Arrow string array (``known``: one already built, remembered for later)."""
    if isinstance(words, ArrowWords):
        return words.arrow
    hit = _ARROW_DICTIONARIES.get(id(words))
    if hit is not None and hit[0] is words:
        _ARROW_DICTIONARIES.move_to_end(id(words))
        return hit[1]
    arr = known if known is not None else pa.array(words, pa.string())
    _ARROW_DICTIONARIES[id(words)] = (words, arr)
    if len(_ARROW_DICTIONARIES) > _ARROW_DICTIONARY_CACHE:
        _ARROW_DICTIONARIES.popitem(last=False)
    return arr


def map_dictionary_arrow(col: Column, fn, out_type: T.SqlType) -> Column:
    """As :func:`map_dictionary` with ``fn`` an Arrow kernel over the whole dictionary (one call
    instead of one Python call per word): bool or string results, gathered through the codes."""
    words = arrow_dictionary(col.dictionary)
    results = fn(words)
    if out_type.kind == "STRING":
        uniques = pc.unique(results)
        merged = pc.take(uniques, pc.sort_indices(uniques))
        table = pc.index_in(results, value_set=merged).to_numpy(zero_copy_only=False).astype(np.int32)
        table = torch.from_numpy(table).to(col.device)
        return Column(table[col.values.long()], col.valid, out_type, tuple(merged.to_pylist()))
    table = torch.from_numpy(np.asarray(results.to_numpy(zero_copy_only=False), dtype=bool)).to(col.device)
    return Column(table[col.values.long()], col.valid, out_type)


def map_dictionary(col: Column, fn, out_type: T.SqlType = T.STRING) -> Column:
    """Apply a per-string Python function once per dictionary entry, then gather through the codes."""
    words = col.dictionary or ()
    results = [fn(w) for w in words]
    if out_type.kind == "STRING":
        merged = tuple(sorted(set(results)))
        pos = {w: i for i, w in enumerate(merged)}
        table = torch.tensor([pos[r] for r in results] or [0], dtype=torch.int32, device=col.device)
        return Column(table[col.values.long()] if words else torch.zeros_like(col.values), col.valid, out_type, merged)
    table = torch.tensor(results or [0], dtype=out_type.torch_dtype, device=col.device)
    vals = table[col.values.long()] if words else torch.zeros(len(col), dtype=out_type.torch_dtype, device=col.device)
    return Column(vals, col.valid, out_type)


def code_bound(dictionary: tuple[str, ...], value: str, side: str = "left") -> int:
    """Position of `value` in a sorted dictionary (bisect), for comparing codes against a literal."""
    return (bisect.bisect_left if side == "left" else bisect.bisect_right)(dictionary, value)


_EPOCH = datetime.datetime(1970, 1, 1)


def timestamp_value(value: datetime.datetime, typ: T.SqlType) -> int:
    """A datetime as the int64 a TIMESTAMP column of ``typ`` stores: a naive one as wall time (for a
    TIMESTAMPTZ: in UTC, as DuckDB reads a literal without an offset when TimeZone is UTC), an aware
    one as its UTC instant."""
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    d = value - _EPOCH
    micros = (d.days * 86400 + d.seconds) * 10**6 + d.microseconds
    return micros * 10**typ.scale // 10**6
