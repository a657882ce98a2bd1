"""Window functions, ``f(...) OVER (PARTITION BY p ORDER BY o ROWS | RANGE ...)``, the GPU way.

One stable sort by (partition keys, order keys) puts each partition's rows together in window
order. Boundary flags between neighbours mark partition and peer-group starts; prefix sums of
the flags (``opforge.cumsum``, through dispatch) number them. Every row's frame is then a range
[start, end) of sorted positions: ROWS bounds are arithmetic on positions, RANGE bounds with an
offset a vectorized binary search inside the partition. Over a frame:

* ranking functions read positions (row_number, rank, dense_rank, percent_rank, cume_dist, ntile);
* offset functions gather (lag / lead in the partition, first / last / nth_value in the frame);
* count / sum / avg are differences of prefix sums (a frame of the whole partition instead uses
  ``segment_reduce`` per partition, exact for floats); min / max read a sparse table (log2 of the
  longest frame levels of elementwise min / max: two lookups per row).

The results are scattered back to the input's row order (SQL leaves the order unspecified; the
rows keep theirs)."""
from __future__ import annotations

import torch

from opforge.ops import hashing, scan
from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.column import Column, unify_strings
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr import Batch, cast_values, evaluate
from opforge.sql.physical.aggregate import _reduce
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.keys import dense_ids, key_tensor
from opforge.sql.physical.sort import sort_permutation
from opforge.sql.plan import Frame, WindowCall, WindowFunctions

RANKING = ("row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile")
VALUE = ("lag", "lead", "first_value", "last_value", "nth_value")
AGGREGATE = ("count", "count_star", "count_distinct", "sum", "avg", "min", "max")


def run_window_functions(node: WindowFunctions, batch: Batch, ctx: ExecContext | None = None) -> Batch:
    n, dev = batch.n, batch.device
    if n == 0:
        return Batch({**batch.cols, **{o.cid: Column.constant(None, o.type, 0, dev) for o, _ in node.calls}}, 0, dev)
    part = [_ranked(evaluate(e, batch)) for e in node.partition]
    order = [(_narrowed(evaluate(e, batch)), d, nf) for e, d, nf in node.order]
    keys = [(c.values, c.valid, False, False) for c in part] + [(c.values, c.valid, d, nf) for c, d, nf in order]
    perm = sort_permutation(keys, n, dev) if keys else torch.arange(n, device=dev)
    layout = Layout(n, dev, [c.take(perm) for c in part], [(c.take(perm), d, nf) for c, d, nf in order],
                    lambda e: evaluate(e, batch).take(perm))
    if ctx is not None:
        ctx.note(f"window functions: {n} rows in {layout.partitions} partitions, {len(node.calls)} call(s)")
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=dev)
    out = dict(batch.cols)
    for o, call in node.calls:
        args = [_narrowed(evaluate(a, batch).take(perm)) for a in call.args]
        narrow = T.decimal(o.type.precision, o.type.scale, False) if o.type.wide else o.type
        out[o.cid] = _widened(_call(call, args, layout, narrow), o.type).take(inverse)
    return Batch(out, n, dev)


def _narrowed(col: Column) -> Column:
    """A 128-bit DECIMAL argument or ORDER BY column as the int64 DECIMAL of the same type, when every
    value fits int64 (the window kernels run on int64 storage); else a clear refusal."""
    if not col.type.wide:
        return col
    fits = decimal128.fits_int64(col.values)
    if col.valid is not None:
        fits = fits | ~col.valid
    if not bool(fits.all()):
        raise NotSupportedError(f"window functions over {col.type} values beyond 64 bits")
    return Column(decimal128.lo(col.values), col.valid, T.decimal(col.type.precision, col.type.scale, False))


def _widened(col: Column, typ: T.SqlType) -> Column:
    """A window result computed in int64 storage back in ``typ``'s 128-bit storage."""
    if not typ.wide or col.type.wide:
        return col
    return Column(decimal128.from_int64(col.values), col.valid, typ)


def _ranked(col: Column) -> Column:
    """A PARTITION BY column of 128-bit DECIMALs as its dense ranks (partitions need only equality)."""
    if not col.type.wide:
        return col
    return Column(key_tensor(col), col.valid, T.INT64)


def _prefix(v: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sums with a leading 0 (``p[j] - p[i]`` sums positions [i, j))."""
    s = scan.cumsum(v, 0) if len(v) else v.to(torch.float64 if v.dtype.is_floating_point else torch.int64)
    return torch.cat([s.new_zeros(1), s])


def _starts(cols: list[Column], n: int, dev) -> torch.Tensor:
    """True where a row's values differ from the previous row's (NULL equal to NULL), and at row 0."""
    flag = torch.zeros(n, dtype=torch.bool, device=dev)
    if n:
        flag[0] = True
    for c in cols:
        k, v = key_tensor(c), c.valid_mask()
        flag[1:] |= (k[1:] != k[:-1]) | (v[1:] != v[:-1])
    return flag


class Layout:
    """Sorted positions of the rows, each with its partition's and peer group's [begin, end)."""

    def __init__(self, n: int, dev, part: list[Column], order: list[tuple[Column, bool, bool]], evaluate_sorted):
        self.n, self.dev = n, dev
        self.evaluate = evaluate_sorted  # an expression's column over the rows in sorted order (frame offsets)
        self.pos = torch.arange(n, device=dev)
        self.order = order
        part_flag = _starts(part, n, dev)
        peer_flag = part_flag | _starts([c for c, _, _ in order], n, dev)
        self.part_id, self.part_begin, self.part_end, self.partitions, _ = self._segments(part_flag)
        self.peer_id, self.peer_begin, self.peer_end, _, self.peer_bounds = self._segments(peer_flag)

    def _segments(self, flag: torch.Tensor):
        """Per row: its segment's number, begin and end; the number of segments; their (begins, ends)."""
        ids = _prefix(flag.long())[1:] - 1
        starts = self.pos[flag]
        ends = torch.cat([starts[1:], starts.new_full((1,), self.n)])
        return ids, starts[ids], ends[ids], len(starts), (starts, ends)

    @property
    def size(self) -> torch.Tensor:
        return self.part_end - self.part_begin


# ------------------------------------------------------------------------------------------ calls
def _call(call: WindowCall, args: list[Column], L: Layout, typ: T.SqlType) -> Column:
    if call.func in RANKING:
        return _ranking(call.func, args, L)
    if call.func in ("lag", "lead"):
        return _lag_lead(call.func, args, L, typ, call.ignore_nulls)
    if call.func == "fill":
        from opforge.sql.physical.window_fill import fill
        return fill(args[0], args[1], L.part_id, typ)
    start, end = frame_bounds(call.frame, L)
    if call.func in VALUE:
        return _frame_value(call.func, args, start, end, L, call.ignore_nulls)
    return _aggregate(call, args[0] if args else None, start, end, L, typ)


def _ranking(func: str, args: list[Column], L: Layout) -> Column:
    row = L.pos - L.part_begin  # 0-based position in the partition
    if func == "row_number":
        return Column(row + 1, None, T.INT64)
    if func == "rank":
        return Column(L.peer_begin - L.part_begin + 1, None, T.INT64)
    if func == "dense_rank":
        return Column(L.peer_id - L.peer_id[L.part_begin] + 1, None, T.INT64)
    size = L.size.double()
    if func == "percent_rank":
        rank = (L.peer_begin - L.part_begin).double()
        return Column(torch.where(size > 1, rank / (size - 1).clamp(min=1), torch.zeros_like(size)), None, T.FLOAT64)
    if func == "cume_dist":
        return Column((L.peer_end - L.part_begin).double() / size.clamp(min=1), None, T.FLOAT64)
    return ntile(row, L.size, args[0])


def ntile(row: torch.Tensor, total: torch.Tensor, k: Column) -> Column:
    """ntile(k) of the rows at 0-based ``row`` of partitions of ``total`` rows, as DuckDB (after
    SQLite): the first total % k buckets hold one row more."""
    buckets = k.values.long()
    if bool((k.valid_mask() & (buckets <= 0)).any()):
        raise SqlError("ntile: argument must be greater than zero")
    buckets = torch.minimum(buckets.clamp(min=1), total.clamp(min=1))
    small = total // buckets
    large = total - buckets * small
    i_small = large * (small + 1)
    tile = torch.where(row < i_small, 1 + row // (small + 1), 1 + large + (row - i_small) // small.clamp(min=1))
    return Column(tile, k.valid, T.INT64)


def _choose(take: torch.Tensor, a: Column, b: Column, typ: T.SqlType) -> Column:
    """``a`` where ``take``, else ``b`` (both cast to ``typ``)."""
    if T.is_coded(typ):
        a, b = unify_strings([a, b])
        va, vb = a.values, b.values
    else:
        va, vb = cast_values(a, typ), cast_values(b, typ)
    valid = torch.where(take, a.valid_mask(), b.valid_mask())
    return Column(torch.where(take, va, vb), None if bool(valid.all()) else valid, typ,
                  a.dictionary if T.is_coded(typ) else None)


def _nth_valid(x: Column, j: torch.Tensor) -> torch.Tensor:
    """The position of the j-th (1-based) non-NULL value of ``x`` in sorted order (n past the last):
    a search in the running count of non-NULL values, which ascends."""
    counts = _prefix(x.valid_mask().long())[1:]
    return torch.searchsorted(counts, j.clamp(min=1))


def _lag_lead(func: str, args: list[Column], L: Layout, typ: T.SqlType, ignore_nulls: bool = False) -> Column:
    x, offset, default = args[0], args[1], args[2]
    off = offset.values.long()
    target = L.pos - off if func == "lag" else L.pos + off
    if ignore_nulls:  # the off-th non-NULL value before (after) the row; offset 0: the row itself
        back = off if func == "lag" else -off  # rows to step back; negative: forward
        before = _prefix(x.valid_mask().long())
        j = torch.where(back > 0, before[L.pos] - back + 1, before[L.pos + 1] - back)
        found = _nth_valid(x, j)
        target = torch.where(back == 0, L.pos, torch.where(j >= 1, found, L.part_begin - 1))
    inside = (target >= L.part_begin) & (target < L.part_end)
    got = x.take(target.clamp(0, max(L.n - 1, 0)))
    out = _choose(inside, got, default, typ)
    if offset.valid is not None:  # a NULL offset: NULL
        out = Column(out.values, out.valid_mask() & offset.valid, out.type, out.dictionary)
    return out


def _frame_value(func: str, args: list[Column], start, end, L: Layout, ignore_nulls: bool = False) -> Column:
    x = args[0]
    k = args[1].values.long() if func == "nth_value" else None
    if ignore_nulls:  # the first / last / k-th non-NULL value of the frame
        counts = _prefix(x.valid_mask().long())
        seen, upto = counts[start], counts[end]
        j = seen + 1 if func == "first_value" else upto if func == "last_value" else seen + k
        target = torch.where((j > seen) & (j <= upto), _nth_valid(x, j), end)
    elif func == "first_value":
        target = start
    elif func == "last_value":
        target = end - 1
    else:
        target = torch.where(k > 0, start + k - 1, end)  # a row number below 1: NULL (DuckDB)
    inside = (target >= start) & (target < end)
    if func == "nth_value" and args[1].valid is not None:
        inside &= args[1].valid
    got = x.take(target.clamp(0, max(L.n - 1, 0)))
    valid = got.valid_mask() & inside
    return Column(got.values, None if bool(valid.all()) else valid, got.type, got.dictionary)


# ----------------------------------------------------------------------------------------- frames
def frame_bounds(frame: Frame, L: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sorted row's frame as positions [start, end), inside its partition (start <= end)."""
    start = _bound(frame, frame.start, L, is_start=True)
    end = _bound(frame, frame.end, L, is_start=False)
    start = torch.minimum(torch.maximum(start, L.part_begin), L.part_end)
    end = torch.minimum(torch.maximum(end, start), L.part_end)
    return start, end


def _offset(bound, L: Layout, dtype, used: torch.Tensor | None = None) -> torch.Tensor:
    """The bound's offset per sorted row; NULL or negative where ``used`` (default: every row) is
    an error, as in DuckDB."""
    col = L.evaluate(bound.offset)
    v = cast_values(col, T.FLOAT64) if dtype == torch.float64 else col.values.long()
    if used is None:
        used = torch.ones(L.n, dtype=torch.bool, device=L.dev)
    if col.valid is not None and bool((used & ~col.valid).any()):
        raise SqlError(f"window frame offset {bound.offset} must not be NULL")
    if bool((used & col.valid_mask() & (v < 0)).any()):
        raise SqlError(f"window frame offset {bound.offset} must not be negative")
    return torch.where(col.valid_mask(), v, torch.zeros_like(v))


def _bound(frame: Frame, bound, L: Layout, is_start: bool) -> torch.Tensor:
    kind = bound.kind
    if kind == "unbounded_preceding":
        return L.part_begin
    if kind == "unbounded_following":
        return L.part_end
    if kind == "current":
        if frame.unit == "rows":
            return L.pos if is_start else L.pos + 1
        return L.peer_begin if is_start else L.peer_end
    if frame.unit == "rows":
        off = _offset(bound, L, torch.int64)
        shift = -off if kind == "preceding" else off
        return L.pos + shift + (0 if is_start else 1)
    if frame.unit == "groups":
        return _groups_bound(bound, L, is_start)
    return _range_bound(bound, L, is_start)


def _groups_bound(bound, L: Layout, is_start: bool) -> torch.Tensor:
    """GROUPS n PRECEDING / FOLLOWING: the begin (start) or end (end) of the peer group n groups
    before / after the current row's; past the partition's first or last group, the partition's end."""
    off = _offset(bound, L, torch.int64)
    g = L.peer_id - off if bound.kind == "preceding" else L.peer_id + off
    first, last = L.peer_id[L.part_begin], L.peer_id[L.part_end - 1]
    begins, ends = L.peer_bounds
    at = (begins if is_start else ends)[g.clamp(0, len(begins) - 1)]
    return torch.where(g < first, L.part_begin, torch.where(g > last, L.part_end, at))


def _range_bound(bound, L: Layout, is_start: bool) -> torch.Tensor:
    """RANGE n PRECEDING / FOLLOWING over the one ORDER BY key: the first row (start) or the row
    after the last (end) whose key is within n of the current row's, searched among the partition's
    rows with a non-NULL key; a row whose key is NULL has its peers (the NULLs) as the bound."""
    col, desc, nulls_first = L.order[0]
    w = cast_values(col, T.FLOAT64).double()
    if desc:
        w = -w  # ascending in the partition's non-NULL stretch
    off = _offset(bound, L, torch.float64, used=col.valid_mask())
    target = w - off if bound.kind == "preceding" else w + off
    nulls = _prefix((~col.valid_mask()).long())
    in_part = nulls[L.part_end] - nulls[L.part_begin]
    lo = L.part_begin + in_part if nulls_first else L.part_begin
    hi = L.part_end if nulls_first else L.part_end - in_part
    found = _search(w, lo, hi, target, strict=not is_start)
    peer = L.peer_begin if is_start else L.peer_end
    return torch.where(col.valid_mask(), found, peer)


def _search(w: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, target: torch.Tensor, strict: bool) -> torch.Tensor:
    """Per row, the first position in [lo, hi) whose ``w`` is >= target (> target when ``strict``);
    ``w`` ascends within each [lo, hi). All rows search at once, log2(n) + 1 halvings."""
    lo, hi = lo.clone(), hi.clone()
    last = max(len(w) - 1, 0)
    for _ in range(max(len(w), 1).bit_length() + 1):
        active = lo < hi
        mid = (lo + hi) // 2
        m = w[mid.clamp(0, last)] if len(w) else target
        right = (m <= target) if strict else (m < target)
        lo = torch.where(active & right, mid + 1, lo)
        hi = torch.where(active & ~right, mid, hi)
    return lo


# ------------------------------------------------------------------------------------- aggregates
def _aggregate(call: WindowCall, x: Column | None, start, end, L: Layout, typ: T.SqlType) -> Column:
    f = call.frame
    whole = f.start.kind == "unbounded_preceding" and f.end.kind == "unbounded_following"
    if whole:  # one reduction per partition, gathered onto its rows
        return _reduce(call.func, x, L.part_id, L.partitions, L.n, L.dev, typ, []).take(L.part_id)
    if call.func == "count_distinct":
        return _running_distinct(x, start, end, L, from_start=f.start.kind == "unbounded_preceding")
    if call.func == "count_star":
        return Column(end - start, None, T.INT64)
    ok = x.valid_mask()
    counts = _prefix(ok.long())
    cnt = counts[end] - counts[start]
    valid = cnt > 0
    valid = None if bool(valid.all()) else valid
    if call.func == "count":
        return Column(cnt, None, T.INT64)
    if call.func in ("sum", "avg"):
        if call.func == "avg" or typ.is_float:
            v = torch.where(ok, cast_values(x, T.FLOAT64).double(), torch.zeros((), dtype=torch.float64))
            p = _prefix(v)
            s = p[end] - p[start]
            return Column(s / cnt.clamp(min=1) if call.func == "avg" else s, valid, T.FLOAT64)
        v = torch.where(ok, x.values.long(), torch.zeros((), dtype=torch.int64))
        # the prefix sums may wrap around (two's complement: a difference is still exact) but a
        # frame's own sum must fit int64 (DuckDB sums in 128 bits): refuse rather than wrap
        lo, hi, longest = (int(t) for t in torch.stack([v.min(), v.max(), (end - start).max()]).tolist())
        if max(-lo, hi) * longest >= 2 ** 63:
            raise NotSupportedError(f"sum OVER a frame: the sums may not fit the int64 storage of {typ} "
                                    "in this engine (DuckDB sums in 128 bits)")
        p = _prefix(v)
        return Column(p[end] - p[start], valid, typ)
    return _range_extreme(x, start, end, call.func, valid)


def _running_distinct(x: Column, start, end, L: Layout, from_start: bool) -> Column:
    """count(DISTINCT x) over frames that start at the partition's first row (``from_start``) or
    end at its last: each value counts at its first (last) row in the partition, so the count is a
    difference of prefix sums of those rows. The rows of one (partition, value) come from
    ``group_by``; their first (last) position from ``segment_reduce``. NULLs never count."""
    ok = x.valid_mask()
    gid, groups = dense_ids([Column(L.part_id, None, T.INT64), Column(key_tensor(x), None, T.INT64)], L.n, L.dev)
    pos = torch.where(ok, L.pos, torch.full_like(L.pos, L.n if from_start else -1))
    edge = hashing.segment_reduce_dense(pos, gid, groups, "min" if from_start else "max")
    counted = _prefix((ok & (edge[gid] == L.pos)).long())
    return Column(counted[end] - counted[start], None, T.INT64)


def _extreme(dtype: torch.dtype, for_min: bool):
    if dtype.is_floating_point:
        return float("inf") if for_min else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if for_min else info.min


def _range_extreme(x: Column, start, end, func: str, valid) -> Column:
    """min / max of ``x`` over [start, end) per row from a sparse table: level k holds the extreme of
    the 2^k values from each position, and a frame of length l is covered by two level-floor(log2 l)
    windows. NULLs take the identity; NaN is the largest value, as in SQL."""
    v = x.values
    if v.dtype in (torch.bool, torch.int8, torch.int16, torch.uint8):
        v = v.to(torch.int32)
    elif v.dtype in (torch.float16, torch.bfloat16):
        v = v.float()
    ident = _extreme(v.dtype, func == "min")
    v = torch.where(x.valid_mask(), v, torch.full_like(v, ident))
    op = torch.maximum if func == "max" else (torch.fmin if v.dtype.is_floating_point else torch.minimum)
    length = (end - start).clamp(min=1)
    longest = int(length.max()) if len(length) else 1
    levels = [v]
    while (2 << (len(levels) - 1)) <= longest:
        prev, half = levels[-1], 1 << (len(levels) - 1)
        levels.append(torch.cat([op(prev[:-half], prev[half:]), torch.full_like(prev[:half], ident)]))
    table = torch.stack(levels)
    k = torch.floor(torch.log2(length.double())).long()
    k = torch.where((1 << (k + 1)) <= length, k + 1, k)
    k = torch.where((1 << k) > length, k - 1, k).clamp(0, len(levels) - 1)
    last = max(len(v) - 1, 0)
    a = table[k, start.clamp(0, last)]
    b = table[k, (end - (1 << k)).clamp(0, last)]
    r = op(a, b).to(x.values.dtype)
    return Column(r, valid, x.type, x.dictionary)
