"""Per-column statistics for the join planner, gathered once per column, the first time the
planner looks the column up (``LazyColumnStats``; a column no query reads is never loaded or counted),
and within a column only the statistics the planner reads (``ColumnStatsOnDemand``), with torch
ops on the column's device after its copy.

For each column: row count, NULL count, min / max (in storage units: DECIMAL unscaled, DATE days,
STRING dictionary codes, whose order is string order), a distinct-count estimate and the most
common values with their frequencies (skew detection, equality selectivity): every value when a
column has at most ``MCV_COUNT`` of them, else the values noticeably above the uniform share.

Distinct counts are exact (``torch.unique``) for columns of at most ``EXACT_DISTINCT_ROWS`` rows and
HyperLogLog otherwise: 2^``HLL_PRECISION`` registers, standard error 1.04 / sqrt(2^p) (1.6 % at
p = 12), computed with torch ops on the column's device (a 64-bit mix hash, a register index from
the top bits, the rank from the rest by ``frexp``, one ``scatter_reduce``). Most-common values come
from the exact counts, or from a strided sample of ``MCV_SAMPLE_ROWS`` rows for larger columns.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field

import torch

from opforge.ops.bloom import mix64  # SplitMix64's finalizer: one implementation, beside the Bloom probe op
from opforge.sql import decimal128
from opforge.sql.column import Column

EXACT_DISTINCT_ROWS = 1 << 17
HLL_PRECISION = 12
MCV_COUNT = 8
MCV_SAMPLE_ROWS = 1 << 16
MCV_MIN_SAMPLE_COUNT = 10


@dataclass
class ColumnStats:
    rows: int
    nulls: int
    min: float | None  # storage units; None when every value is NULL
    max: float | None
    distinct: float  # of the non-NULL values
    exact: bool  # distinct is exact (else a HyperLogLog estimate)
    mcv: list[tuple[float, float]] = field(default_factory=list)  # (value, fraction of all rows)
    dictionary: tuple[str, ...] | None = None  # STRING: the sorted dictionary the codes index
    unique: bool = False  # every row holds a distinct non-NULL value (checked exactly): a key
    sorted: bool | None = None  # ascending without NULLs (None: ask the column, ``Column.sorted``)
    _like: dict[str, float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def null_fraction(self) -> float:
        return self.nulls / self.rows if self.rows else 0.0

    def frequency(self, value: float) -> float:
        """Fraction of rows equal to ``value``: its MCV frequency, else the non-MCV mass spread evenly."""
        for v, f in self.mcv:
            if v == value:
                return f
        rest_rows = max(0.0, 1.0 - self.null_fraction - sum(f for _, f in self.mcv))
        rest_values = max(1.0, self.distinct - len(self.mcv))
        if self.min is not None and not (self.min <= value <= self.max):
            return 0.0
        return rest_rows / rest_values

    def like_fraction(self, pattern: str, sample_words: int) -> float:
        """Fraction of rows whose string matches the LIKE ``pattern``: by the most-common values when
        they hold the whole distribution, else the share of the dictionary's words (or of an even
        sample of ``sample_words`` of them), taken as equally common. Memoized per pattern: the
        statistics never change once gathered, and matching a sample costs milliseconds, which
        would otherwise be paid on every planning of the query."""
        hit = self._like.get(pattern)
        if hit is None:
            from opforge.sql.expr import like_regex

            rx, words = like_regex(pattern), self.dictionary
            if self.mcv_complete:
                hit = sum(f for v, f in self.mcv if 0 <= int(v) < len(words) and rx.fullmatch(words[int(v)]))
            else:
                sample = words[::max(1, len(words) // sample_words)]
                hit = (1.0 - self.null_fraction) * sum(1 for w in sample if rx.fullmatch(w)) / len(sample)
            self._like[pattern] = hit
        return hit

    @property
    def mcv_complete(self) -> bool:
        """The most-common values list every value (few distinct values, counted exactly)."""
        return self.exact and len(self.mcv) == self.distinct

    def fraction_between(self, lo: float, hi: float, step: float) -> float:
        """Fraction of rows with ``lo <= value <= hi`` (``step`` 1 for integer-valued storage, 0
        for continuous): the MCVs inside, plus the other values spread evenly over [min, max]."""
        if self.min is None or hi < lo:
            return 0.0
        inside = sum(f for v, f in self.mcv if lo <= v <= hi)
        if self.mcv_complete:
            return inside
        rest = max(0.0, 1.0 - self.null_fraction - sum(f for _, f in self.mcv))
        width = self.max - self.min + step
        spread = (hi - lo + step) / width if width > 0 else 1.0
        return min(1.0, inside + rest * min(1.0, spread))

    def heavy_hitters(self, threshold: float) -> list[tuple[float, float]]:
        """The MCVs holding more than ``threshold`` of the rows (skewed join keys)."""
        return [(v, f) for v, f in self.mcv if f > threshold]


class LazyColumnStats(MutableMapping):
    """Column name -> ``ColumnStats``, each computed by ``compute(name)`` on first lookup and cached
    (``in`` and iteration compute nothing). Computing a column's statistics loads the column onto
    the device, so a registered table's unread columns stay on the host, uncounted."""

    def __init__(self, names, compute: Callable[[str], ColumnStats]):
        self._names = dict.fromkeys(names)  # ordered; ``in`` in constant time (asked per scan column)
        self._compute = compute
        self._done: dict[str, ColumnStats] = {}

    def __getitem__(self, name: str) -> ColumnStats:
        if name not in self._done:
            if name not in self._names:
                raise KeyError(name)
            self._done[name] = self._compute(name)
        return self._done[name]

    def __setitem__(self, name: str, value: ColumnStats) -> None:
        self._names.setdefault(name)
        self._done[name] = value

    def __delitem__(self, name: str) -> None:
        del self._names[name]
        self._done.pop(name, None)

    def __contains__(self, name) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def computed(self) -> list[str]:
        """Names of the columns whose statistics have been computed."""
        return list(self._done)

    def __repr__(self) -> str:
        return f"LazyColumnStats({len(self)} columns, computed: {self.computed()})"


@dataclass
class TableStats:
    rows: int
    columns: MutableMapping[str, ColumnStats]  # a dict, or LazyColumnStats (computed on lookup)


# ------------------------------------------------------------------------------------- hashing
def as_int64(values: torch.Tensor) -> torch.Tensor:
    """Values as int64 bit patterns that are equal exactly when the values are (floats by bits,
    with -0.0 folded onto 0.0)."""
    if values.dtype.is_floating_point:
        v = values.double()
        v = torch.where(v == 0, torch.zeros_like(v), v)
        return v.view(torch.int64)
    return values.long()


def hyperloglog(values: torch.Tensor, precision: int = HLL_PRECISION) -> float:
    """HyperLogLog distinct-count estimate of ``values`` (Flajolet et al. 2007, with linear counting
    for small cardinalities). Runs on the tensor's device; one host sync for the result."""
    if values.numel() == 0:
        return 0.0
    return hll_estimate(hll_registers(values, precision))


HLL_SLICE_ROWS = 1 << 20  # rows hashed at once: ~80 bytes of temporaries a row (~80 MB a slice)


def hll_registers(values: torch.Tensor, precision: int = HLL_PRECISION) -> torch.Tensor:
    """The HyperLogLog registers of ``values`` (2^precision int32): the sketch of a union is the
    element-wise max of its parts' registers, so a column read in chunks is counted chunk by chunk,
    and each chunk ``HLL_SLICE_ROWS`` rows at a time. Why the slices: hashing a row takes about 80
    bytes of temporaries (int64 hashes, float64 for the bit length), and an out-of-core column's
    statistics chunk is a quarter of the memory limit of 4-8-byte values: whole, its hashing took
    1.3x the limit (TPC-H q01's first run, SF0.1 under 25 MiB and SF100 under 24 GiB alike)."""
    if not 4 <= precision <= 16:
        raise ValueError(f"hyperloglog: precision must be in [4, 16], got {precision}")
    m = 1 << precision
    registers = torch.zeros(m, dtype=torch.int32, device=values.device)
    for start in range(0, values.numel(), HLL_SLICE_ROWS):
        _fold_registers(registers, values[start:start + HLL_SLICE_ROWS], precision)
    return registers


def _fold_registers(registers: torch.Tensor, values: torch.Tensor, precision: int) -> None:
    """``registers`` raised to ``values``' ranks (the max per register)."""
    m = registers.numel()
    h = mix64(as_int64(values))
    index = (h >> (64 - precision)) & (m - 1)
    rest_bits = 64 - precision
    rest = h & ((1 << rest_bits) - 1)  # < 2^52: exact in float64
    _, exponent = torch.frexp(rest.double())  # rest = mantissa * 2^exponent: exponent = bit length
    rank = torch.where(rest == 0, torch.full_like(exponent, rest_bits + 1), rest_bits - exponent + 1)
    registers.scatter_reduce_(0, index, rank.to(torch.int32), reduce="amax")


def hll_estimate(registers: torch.Tensor) -> float:
    """The distinct count ``registers`` (``hll_registers``) estimate; one host sync."""
    m = registers.numel()
    alpha = 0.7213 / (1 + 1.079 / m)
    harmonic, zeros = torch.stack([torch.pow(2.0, -registers.double()).sum(),
                                   (registers == 0).sum().double()]).tolist()
    estimate = alpha * m * m / harmonic
    if estimate <= 2.5 * m and zeros > 0:
        estimate = m * math.log(m / zeros)
    return float(estimate)


# ------------------------------------------------------------------------------------- gathering
class _OnDemand:
    """A field of ``ColumnStatsOnDemand``: reading it before it is set runs the method that
    sets its group (a non-data descriptor, so the stored value is read from then on)."""

    def __init__(self, compute):
        self.compute = compute

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        self.compute(obj)
        return obj.__dict__[self.name]


class ColumnStatsOnDemand(ColumnStats):
    """``ColumnStats`` of a device column whose fields are computed the first time one is read,
    in groups: ``nulls``; ``min`` / ``max``; ``distinct`` / ``exact`` / ``mcv``; ``unique``.
    Why: the planner asks different questions of different columns. Functional dependencies ask
    every scanned column whether it is a key (``unique``), which a sample of 64 Ki rows answers
    for most columns with one ``torch.unique``; the HyperLogLog count and the most-common values
    are only worth their passes (and, on the GPU, the first-use cost of their kernels inside a
    user's first query) for the columns whose selectivity or join size is estimated. Each field
    has the value ``column_stats`` gave when it computed them all at once; ``unique`` is exact."""

    def __init__(self, col: Column, exact_rows: int = EXACT_DISTINCT_ROWS, mcv_count: int = MCV_COUNT):
        self._col, self._exact_rows, self._mcv_count = col, exact_rows, mcv_count
        self.rows = len(col)
        self.dictionary = col.dictionary
        self._like = {}

    def _present(self) -> torch.Tensor:
        """The non-NULL values (BOOL as int8), computed once."""
        if "_values" not in self.__dict__:
            values = self._col.values
            if self._col.valid is not None:
                values = values[self._col.valid]
            if values.dim() == 2:  # a 128-bit DECIMAL: its unscaled values as doubles (estimates only)
                values = decimal128.to_float64(values)
            self._values = values.to(torch.int8) if values.dtype == torch.bool else values
        return self._values

    def _nulls(self) -> None:
        self.nulls = self.rows - int(self._present().numel())

    def _range(self) -> None:
        values = self._present()
        if values.numel() == 0:
            self.min = self.max = None
            return
        lo, hi = torch.aminmax(values)
        self.min, self.max = float(lo), float(hi)

    def _distribution(self) -> None:
        values, n = self._present(), self.rows
        if values.numel() == 0:
            self.distinct, self.exact, self.mcv = 0.0, True, []
            return
        if values.numel() <= self._exact_rows:
            uniq, counts = torch.unique(values, return_counts=True)
            distinct, exact, scale, min_count = float(uniq.numel()), True, 1.0, 1
        else:
            distinct, exact = hyperloglog(values), False
            step = max(1, values.numel() // MCV_SAMPLE_ROWS)
            uniq, counts = torch.unique(values[::step], return_counts=True)
            scale = values.numel() / values[::step].numel()
            distinct = max(distinct, float(uniq.numel()))
            min_count = MCV_MIN_SAMPLE_COUNT  # fewer sightings in a sample are noise, not skew
        k = min(self._mcv_count, uniq.numel())
        top_counts, top = torch.topk(counts, k)
        uniform = values.numel() / distinct
        complete = exact and uniq.numel() <= self._mcv_count  # few values: keep the whole distribution
        self.mcv = [(float(v), c * scale / n) for v, c in zip(uniq[top].tolist(), top_counts.tolist())
                    if complete or (c * scale > uniform * 1.5 and c >= min_count)]  # else only the skewed ones
        self.distinct, self.exact = distinct, exact

    def _unique(self) -> None:
        """Every row holds a distinct non-NULL value, proved exactly: a repeat in an even sample
        refutes it at once (most columns), else the whole column is checked."""
        values = self._present()
        if self.nulls or values.numel() == 0:
            self.unique = False
            return
        sample = values[::max(1, values.numel() // MCV_SAMPLE_ROWS)]
        self.unique = torch.unique(sample).numel() == sample.numel() and _all_distinct(values)

    nulls = _OnDemand(_nulls)
    min = _OnDemand(_range)
    max = _OnDemand(_range)
    distinct = _OnDemand(_distribution)
    exact = _OnDemand(_distribution)
    mcv = _OnDemand(_distribution)
    unique = _OnDemand(_unique)




def column_stats(col: Column, exact_rows: int = EXACT_DISTINCT_ROWS, mcv_count: int = MCV_COUNT) -> ColumnStats:
    """Statistics of one column, each group computed when first read (``ColumnStatsOnDemand``)."""
    return ColumnStatsOnDemand(col, exact_rows, mcv_count)


def _all_distinct(values: torch.Tensor) -> bool:
    """Exactly: no value twice (one pass when ascending, as keys often are; else one sort)."""
    if bool((values[1:] > values[:-1]).all()):
        return True
    return torch.unique(values).numel() == values.numel()


def chunked_column_stats(chunks: Iterable[Column], rows: int, exact_rows: int = EXACT_DISTINCT_ROWS,
                         mcv_count: int = MCV_COUNT) -> ColumnStats:
    """Statistics of a column seen chunk by chunk, never whole on the device (a column over the
    memory limit, ``sql/outofcore``). NULL counts add up and min / max merge; the distinct values
    are counted exactly (merged ``torch.unique`` counts) in a column of at most ``exact_rows`` rows,
    else by HyperLogLog, whose registers merge by max (as ``column_stats`` counts a resident one);
    the most-common values come from the exact counts, or from an even sample of every chunk
    (copies: no chunk stays on the device); ``unique`` is proved by exact counts of one, or
    by values ascending strictly across the chunks (keys usually are), else taken as False (the
    planner then skips an optimization, never an answer); ``sorted`` as ``Column.mark_sorted``
    would find it (the planner's merge-join costing reads it instead of loading the column)."""
    nulls, lo, hi = 0, None, None
    registers, exact = None, rows <= exact_rows
    uniq = counts = last = None
    ascending, samples, dictionary, floating = 2, [], None, False
    step = max(1, rows // MCV_SAMPLE_ROWS)
    for col in chunks:
        dictionary = col.dictionary if dictionary is None else dictionary
        floating = col.values.dtype.is_floating_point or col.values.dtype == torch.bool
        values = col.values if col.valid is None else col.values[col.valid]
        values = values.to(torch.int8) if values.dtype == torch.bool else values
        nulls += len(col) - values.numel()
        if values.numel() == 0:
            continue
        a, b = torch.aminmax(values)
        lo, hi = (a, b) if lo is None else (torch.minimum(lo, a), torch.maximum(hi, b))
        if ascending:  # non-decreasing (1), strictly (2)
            step_up = (values[1:] > values[:-1]).all() if values.numel() > 1 else True
            flat_up = (values[1:] >= values[:-1]).all() if values.numel() > 1 else True
            strict = bool(step_up) and (last is None or bool(values[0] > last))
            flat = bool(flat_up) and (last is None or bool(values[0] >= last))
            ascending = 2 if strict and ascending == 2 else int(flat)
            last = values[-1].clone()  # a copy: a view would keep the chunk on the device
        part = hll_registers(values)
        registers = part if registers is None else torch.maximum(registers, part)
        samples.append(values[::step].clone())
        if exact:
            u, c = torch.unique(values, return_counts=True)
            if uniq is not None:
                u, inverse = torch.unique(torch.cat([uniq, u]), return_inverse=True)
                c = torch.zeros(len(u), dtype=c.dtype, device=c.device).scatter_add_(0, inverse, torch.cat([counts, c]))
            uniq, counts = u, c
    present = rows - nulls
    stats = ColumnStats(rows, nulls, None if lo is None else float(lo), None if hi is None else float(hi),
                        0.0, True, [], dictionary, False, sorted=nulls == 0 and not floating and ascending > 0)
    if present == 0:
        return stats
    if exact:
        distinct, scale, min_count = float(len(uniq)), 1.0, 1
        stats.unique = nulls == 0 and bool((counts == 1).all())
    else:
        sample = torch.cat(samples)
        uniq, counts = torch.unique(sample, return_counts=True)
        distinct = max(hll_estimate(registers), float(len(uniq)))
        scale, min_count = present / sample.numel(), MCV_MIN_SAMPLE_COUNT
        stats.unique = nulls == 0 and ascending == 2
    k = min(mcv_count, len(uniq))
    top_counts, top = torch.topk(counts, k)
    uniform = present / distinct
    complete = exact and len(uniq) <= mcv_count
    stats.mcv = [(float(v), c * scale / rows) for v, c in zip(uniq[top].tolist(), top_counts.tolist())
                 if complete or (c * scale > uniform * 1.5 and c >= min_count)]
    stats.distinct, stats.exact = distinct, exact
    return stats


def table_stats(table, memory_limit: Callable[[], int | None] | None = None) -> TableStats:
    """Statistics of the columns of a ``sql.table.Table``, each computed (and the column loaded) on
    its first lookup. Under a device memory limit (``memory_limit()``, read at the lookup) a column
    not on the device is read in chunks of a quarter of the limit from the host instead
    (``chunked_column_stats``), as the out-of-core scan reads it, and is not kept on the device:
    the statistics of the columns a query plans with never crowd the limit together."""

    def compute(name: str) -> ColumnStats:
        limit = memory_limit() if memory_limit is not None else None
        if limit is not None and name not in table.loaded_columns():
            from opforge.sql.outofcore.chunked_scan import column_chunks, row_bytes

            rows = max(1024, limit // 4 // row_bytes(table, [name]))
            chunks = (cols[name] for _, cols in column_chunks(table, [name], table.columns.device, rows, limit))
            return chunked_column_stats(chunks, table.num_rows)
        return column_stats(table.column(name))
    return TableStats(table.num_rows, LazyColumnStats(table.names, compute))
