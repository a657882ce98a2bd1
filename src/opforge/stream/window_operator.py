"""The engine's window operators.

The columnar operators (``columnar_window_operator`` picks one):
``Aggregations`` over event-time tumbling or sliding windows, the GPU path.
Both keep a table of open rows (one per key and ``start``: accumulators as
columns, rows in order of first appearance) and, per micro-batch, group the
batch's (key, start) pairs (one stable sort of an order-preserving int64 code
``(key - kmin) * starts + start``, or two 1-D sorts when the ranges do not fit
in 62 bits), fold each group with ``opforge.segment_reduce`` into partial
accumulators and merge the partials into the table. A batch's pairs find
their table rows on the device (``searchsorted`` in the table's sorted
codes); new pairs are appended. Host syncs per batch: one small read-back of
the batch's counts and key / start ranges, one for the number of distinct
pairs (the size of the sort's output) and one for the number of new table
rows — none per record or per pair. Dense keys whose starts spread over
the batch but little per key (an auction's bids in a pane or two of a
batch's hundreds) are grouped with each key's starts counted from its
first instead: one more read-back (the widest key's span) and a
direct-address table in place of the sort. A watermark adds one read-back
(and, for panes, a sort of the pane rows and one of the fired windows).
Late records inside the allowed lateness are rare; each updates the table
and fires its windows, one by one, as Flink does.

* ``PanedWindowOperator`` (size a multiple of the slide, tumbling included):
  a row per key and *pane* (a slide-long slice); each record is folded once,
  and a firing window merges its ``size / slide`` panes.
* ``ColumnarWindowOperator`` (other sliding windows): a row per key and
  window; each record is folded into each of its windows.

``WindowOperator``: every other case (any ``AggregateFunction``, ``reduce``,
full-window ``process``, session windows, processing time, count triggers),
one record at a time over per-(key, window) state.
"""

from __future__ import annotations

import torch

from opforge.ops.hashing import direct_groups
from opforge.stream.functions import Aggregations, as_callable
from opforge.stream.operators import Operator, records_batch
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema
from opforge.stream.state_budget import ColdRows
from opforge.stream.timers import InternalTimers
from opforge.stream.windows import GLOBAL_END, TimeWindow


def group_pairs(a: torch.Tensor, b: torch.Tensor):
    """``(unique_pairs [G, 2], inverse [N])`` of the pairs ``(a[i], b[i])``, in
    lexicographic order: two stable 1-D sorts and a scan (``torch.unique(dim=0)``
    does the same far slower)."""
    order = torch.argsort(b, stable=True)
    order = order[torch.argsort(a[order], stable=True)]
    sa, sb = a[order], b[order]
    new = torch.ones_like(sa, dtype=torch.bool)
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    group_sorted = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(group_sorted)
    inverse[order] = group_sorted
    return torch.stack([sa[new], sb[new]], 1), inverse


_CODE_LIMIT = 2**62
_INT64_MAX = 2**63 - 1


def pair_codes(a: torch.Tensor, b: torch.Tensor, bounds, b_step: int):
    """Order-preserving int64 codes of the pairs ``(a[i], b[i])``:
    ``(a - a_lo) * span + (b - b_lo) // b_step``, with ``bounds = (a_lo, a_hi,
    b_lo, b_hi)`` host ints covering the pairs and every ``b - b_lo`` a multiple
    of ``b_step`` (window starts: all equal to the offset modulo the slide).
    ``(None, 0)`` when the product of the ranges does not fit in 62 bits."""
    a_lo, a_hi, b_lo, b_hi = bounds
    span = (b_hi - b_lo) // b_step + 1
    if (a_hi - a_lo + 1) * span >= _CODE_LIMIT:
        return None, 0
    return (a - a_lo) * span + torch.div(b - b_lo, b_step, rounding_mode="floor"), span


def direct_range_ok(code_range: int, n: int) -> bool:
    """Whether codes in ``[0, code_range)`` of ``n`` rows group through a
    direct-address table (a pass over the range) rather than a sort: the
    range is at most twice the rows plus 64 Ki."""
    return code_range <= 2 * n + 65_536


def group_codes(codes: torch.Tensor, code_range: int | None = None):
    """``(unique_codes [G], inverse [N])`` of codes in ``[0, code_range)``.
    When the range is small next to the batch (at most twice the rows plus
    64 Ki) the groups come from a direct-address table, no sort: mark the
    codes present, a prefix sum ranks them; otherwise one stable sort and a
    scan. Either way the output size is the one host sync, and the result is
    the same (codes ascending)."""
    if code_range is not None and direct_range_ok(code_range, codes.shape[0]):
        return direct_groups(codes, code_range)
    order = torch.argsort(codes, stable=True)
    sc = codes[order]
    new = torch.ones_like(sc, dtype=torch.bool)
    new[1:] = sc[1:] != sc[:-1]
    group_sorted = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(group_sorted)
    inverse[order] = group_sorted
    return sc[new], inverse


def range_sums(vals: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, max_width: int) -> torch.Tensor:
    """``vals[lo[i] : lo[i] + width[i]].sum()`` per range (``1 <= width <=
    max_width``), in ``vals``' dtype. Integers: a difference of prefix sums,
    exact (wrapping as a direct sum would); floats: each range's values
    added in order in float64 and rounded once (as ``segment_reduce``'s
    deterministic sums), a prefix difference would not be exact."""
    if not vals.dtype.is_floating_point:
        sums = torch.zeros(vals.shape[0] + 1, dtype=torch.int64, device=vals.device)
        torch.cumsum(vals, 0, dtype=torch.int64, out=sums[1:])
        return (sums.index_select(0, lo + width) - sums.index_select(0, lo)).to(vals.dtype)
    wide = vals.to(torch.float64)
    out = wide.index_select(0, lo)
    for j in range(1, max_width):
        nxt = wide.index_select(0, (lo + j).clamp_(max=vals.shape[0] - 1))
        out = torch.where(width > j, out + nxt, out)
    return out.to(vals.dtype)


def range_extremes(vals: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, max_width: int,
                   op: str) -> torch.Tensor:
    """``op`` (``"min"`` / ``"max"``) of ``vals[lo[i] : lo[i] + width[i]]``
    per range (``1 <= width <= max_width``): a sparse table (level ``j``
    folds ``2**j`` rows from each row) and, per range, the fold of the two
    level-``floor(log2 width)`` blocks at its two ends, which overlap (the
    ops are idempotent) — ``log2(max_width)`` passes over ``vals``, two
    gathers per range, instead of ``max_width``."""
    fold = torch.minimum if op == "min" else torch.maximum
    levels = [vals]
    while 2 ** len(levels) <= max_width:
        prev, half = levels[-1], 2 ** (len(levels) - 1)
        level = prev.clone()  # the last rows fold fewer: no range reads them at this level
        level[:-half] = fold(prev[:-half], prev[half:])
        levels.append(level)
    table, rows = torch.cat(levels), vals.shape[0]
    j = torch.frexp(width.to(torch.float64))[1].to(torch.int64) - 1  # floor(log2 width), exactly
    base = j * rows + lo
    return fold(table.index_select(0, base), table.index_select(0, base + width - torch.pow(2, j)))


def _merge_bounds(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))


def find_pairs(tk: torch.Tensor, ts: torch.Tensor, qk: torch.Tensor, qs: torch.Tensor, step: int, bounds=None):
    """For each query pair ``(qk[i], qs[i])``: whether it is a pair of the table
    ``(tk, ts)`` (pairs distinct) and, if so, its row. By order-preserving codes,
    a sort of the table and ``searchsorted`` (``bounds``: host ints covering both,
    read from the tensors when None); by grouping the union when the codes do not fit."""
    T, dev = tk.shape[0], tk.device
    if T == 0 or qk.shape[0] == 0:
        return (torch.zeros(qk.shape[0], dtype=torch.bool, device=dev),
                torch.zeros(qk.shape[0], dtype=torch.int64, device=dev))
    if bounds is None:
        bounds = tuple(torch.stack([torch.minimum(tk.min(), qk.min()), torch.maximum(tk.max(), qk.max()),
                                    torch.minimum(ts.min(), qs.min()), torch.maximum(ts.max(), qs.max())]).tolist())
    codes_t, _ = pair_codes(tk, ts, bounds, step)
    if codes_t is not None:
        codes_q, _ = pair_codes(qk, qs, bounds, step)
        sorted_t, perm = torch.sort(codes_t)
        pos = torch.searchsorted(sorted_t, codes_q).clamp_(max=T - 1)
        return sorted_t[pos] == codes_q, perm[pos]
    uniq, inv = group_pairs(torch.cat([tk, qk]), torch.cat([ts, qs]))
    owner = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=dev)
    owner[inv[:T]] = torch.arange(T, dtype=torch.int64, device=dev)
    o = owner[inv[T:]]
    return o >= 0, o.clamp(min=0)


def nonzero_known(mask: torch.Tensor, count: int) -> torch.Tensor:
    """``torch.nonzero(mask).flatten()`` when ``count`` (the number of True
    entries) is already known on the host: no second device-to-host sync."""
    global _NONZERO_STATIC
    if _NONZERO_STATIC:
        try:
            return torch.nonzero_static(mask, size=count).flatten()
        except (AttributeError, NotImplementedError, RuntimeError):  # a torch or device without it
            _NONZERO_STATIC = False
    return torch.nonzero(mask).flatten()


_NONZERO_STATIC = hasattr(torch, "nonzero_static")


def _check_timestamps(batch: Batch, where: str) -> None:
    if len(batch) and bool((batch.timestamps == NO_TIMESTAMP).any()):
        raise ValueError(f"{where}: a record has no timestamp; event-time windows need a "
                         "WatermarkStrategy with a timestamp assigner on the source")


def window_output_timestamp(window: TimeWindow) -> int:
    return GLOBAL_END if window.end == GLOBAL_END else window.max_timestamp()


class _LateData:
    """Drop or side-output records past the allowed lateness; counts drops."""

    def __init__(self, op, tag):
        self.op, self.tag, self.dropped = op, tag, 0

    def handle(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        if self.tag is None:
            self.dropped += len(batch)
        else:
            self.op.out.emit_side(self.tag, batch.with_keys(None))


class ColumnarWindows(Operator):
    """What the two columnar window operators share: the table of open rows
    (one per key and ``start``: a window's start, or a pane's), its device,
    host and disk tiers, the per-batch grouping and folding of records into
    rows, and the shape of the results. A row is *fired* exactly when its
    window's last timestamp is at or below the watermark (on-time rows fire
    at the first watermark reaching them, late ones as they come), so the
    watermark is the firing state: no per-row flag."""

    layout: str  # what a row is: "windows" or "panes" (a checkpoint restores into its own layout only)

    def __init__(self, name, assigner, agg: Aggregations, key_selector, allowed_lateness=0, late_tag=None):
        super().__init__(name)
        self.assigner, self.agg, self.key_selector = assigner, agg, key_selector
        self.lateness = allowed_lateness
        self.late_tag = late_tag

    def open(self):
        self.late = _LateData(self, self.late_tag)
        dev = self.device
        self.t_key = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_start = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_count = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_acc: dict[str, torch.Tensor] = {}
        # per row: its order of first appearance (firing order among equal
        # window ends) and the last batch that touched it (for eviction)
        self.t_seq = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_touch = torch.empty(0, dtype=torch.int64, device=dev)
        self._next_seq = 0
        self._batch_no = 0
        budget = getattr(self, "state_budget", None)
        self.cold = ColdRows(budget, f"{self.name}-{self.index}") if budget is not None else None
        self.table_restored()

    def table_restored(self, restored: bool = False) -> None:
        """The table was replaced (open, restore from a checkpoint): its
        host-side key / start bounds are re-read on the next batch; a restored
        table (rows in order of first appearance) gets fresh row orders."""
        self._bounds = None  # host (kmin, kmax, smin, smax) covering the table's pairs
        self._bounds_stale = self.t_key.numel() > 0
        if restored:
            T, dev = self.t_key.shape[0], self.device
            self.t_seq = torch.arange(T, dtype=torch.int64, device=dev)
            self.t_touch = torch.zeros(T, dtype=torch.int64, device=dev)
            self._next_seq = T
            if self.cold is not None:
                self.cold.clear()

    # -- checkpoints (operator_state.py) --------------------------------------
    def full_table(self) -> dict:
        """Every row of every tier, in order of first appearance (checkpoints)."""
        rows = self._rows()
        if self.cold is not None:
            cold = self.cold.take_all()
            if cold is not None:
                rows = {n: torch.cat([c, cold[n].to(self.device)]) for n, c in rows.items()}
            order = torch.argsort(rows["seq"])
            rows = {n: c.index_select(0, order) for n, c in rows.items()}
        return {"layout": self.layout, "key": rows["key"], "start": rows["start"], "count": rows["count"],
                "acc": {n[4:]: c for n, c in rows.items() if n.startswith("acc.")}}

    def restore_table(self, t: dict) -> None:
        """The table of ``full_table`` back (after ``open``). A table saved
        before rows could be panes has no ``layout`` (its rows are windows) and
        a per-row ``fired`` flag, which the restored watermark implies."""
        from opforge.stream.checkpoint import CheckpointRestoreError

        layout = t.get("layout", "windows")
        if layout != self.layout:
            raise CheckpointRestoreError(
                f"{self.name}: the checkpoint's window table has a row per key and {layout!r}, this operator "
                f"keeps one per key and {self.layout!r}; restore it with the engine version that wrote it")
        self.t_key, self.t_start, self.t_count = t["key"], t["start"], t["count"]
        self.t_acc = dict(t["acc"])
        self.table_restored(restored=True)

    # -- the state budget: device rows <-> host / disk (state_budget.py) -------
    def _rows(self, idx=None) -> dict:
        cols = {"key": self.t_key, "start": self.t_start, "count": self.t_count,
                "seq": self.t_seq, "touch": self.t_touch, **{f"acc.{n}": a for n, a in self.t_acc.items()}}
        return cols if idx is None else {n: c.index_select(0, idx) for n, c in cols.items()}

    def _set_rows(self, rows: dict) -> None:
        self.t_key, self.t_start, self.t_count = rows["key"], rows["start"], rows["count"]
        self.t_seq, self.t_touch = rows["seq"], rows["touch"]
        self.t_acc = {n[4:]: c for n, c in rows.items() if n.startswith("acc.")}

    def _restore_rows(self, rows) -> None:
        """Cold rows (CPU) back at the end of the device table."""
        if rows is None:
            return
        dev = self.device
        both = {n: torch.cat([c, rows[n].to(dev)]) for n, c in self._rows().items()}
        self._set_rows(both)
        k, st = rows["key"], rows["start"]
        self._bounds = _merge_bounds(self._bounds, (int(k.min()), int(k.max()), int(st.min()), int(st.max())))

    def table_bytes(self) -> int:
        return sum(c.element_size() * c.numel() for c in self._rows().values())

    def _enforce_budget(self) -> None:
        """Move the coldest rows (least recently touched) to the host tier
        until the device table fits the budget."""
        if self.cold is None:
            return
        T = self.t_key.shape[0]
        size = self.table_bytes()
        limit = self.cold.budget.device_bytes
        if T == 0 or size <= limit:
            return
        keep = min(T, limit * T // size)
        order = torch.argsort(self.t_touch, stable=True)
        evict = order[:T - keep]
        kept = torch.sort(order[T - keep:]).values
        self.cold.add({n: c.cpu() for n, c in self._rows(evict).items()})
        self._set_rows(self._rows(kept))

    def _cold_pairs(self, keys, starts) -> None:
        """Bring back the cold rows of these distinct pairs."""
        if self.cold is None or len(self.cold) == 0:
            return
        qk, qs = keys.cpu(), starts.cpu()
        kmin, kmax, smin, smax = int(qk.min()), int(qk.max()), int(qs.min()), int(qs.max())

        def might_hold(f):
            return f["kmin"] <= kmax and f["kmax"] >= kmin and f["smin"] <= smax and f["smax"] >= smin

        def mask_of(rows):
            found, _ = find_pairs(qk, qs, rows["key"], rows["start"], self.assigner.slide)
            return found

        self._restore_rows(self.cold.take(mask_of, might_hold))

    def _take_cold(self, mask_of, might_hold) -> None:
        """Cold rows a watermark is about to read come back first: those where
        ``mask_of(start column)``, from files where ``might_hold(smin, smax)``."""
        if self.cold is not None and len(self.cold):
            self._restore_rows(self.cold.take(lambda r: mask_of(r["start"]),
                                              lambda f: might_hold(f["smin"], f["smax"])))

    def dispose(self) -> None:
        """The job ended (however): spill files and the host tier go."""
        if self.cold is not None:
            self.cold.clear()

    # -- accumulators -------------------------------------------------------
    def _column(self, batch, col):
        c = batch.columns.get(col)
        if c is None:
            raise ValueError(f"{self.name}: the records have no field {col!r} (fields: {list(batch.columns)})")
        if not isinstance(c, torch.Tensor):
            raise TypeError(f"{self.name}: field {col!r} is not numeric; Aggregations need number columns")
        return c.to(torch.int64) if c.dtype == torch.bool else c

    def _acc_dtype(self, op, col_dtype):
        return torch.float64 if op == "mean" else col_dtype

    def _identity(self, op, dtype):
        if op in ("sum", "mean"):
            return 0
        big = torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max
        return big if op == "min" else -big - (0 if dtype.is_floating_point else 1)

    def _grow(self, n: int, slots, keys, starts, dtypes: dict) -> None:
        """Append ``n`` rows; ``slots`` is each pair's row (old rows are
        rewritten with their own values, the new ones get theirs)."""
        if n == 0:
            return
        dev = self.device

        def ext(t, fill):
            return torch.cat([t, torch.full((n,), fill, dtype=t.dtype, device=dev)])

        self.t_key = ext(self.t_key, 0).index_put_((slots,), keys)
        self.t_start = ext(self.t_start, 0).index_put_((slots,), starts)
        self.t_count = ext(self.t_count, 0)
        self.t_seq = torch.cat([self.t_seq, torch.arange(self._next_seq, self._next_seq + n, dtype=torch.int64,
                                                         device=dev)])
        self._next_seq += n
        self.t_touch = ext(self.t_touch, self._batch_no)
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                continue
            dt = self.t_acc[name].dtype if name in self.t_acc else dtypes[name]
            fresh = torch.full((n,), self._identity(op, dt), dtype=dt, device=dev)
            self.t_acc[name] = torch.cat([self.t_acc[name], fresh]) if name in self.t_acc else fresh

    def _fold(self, slots, counts, partials):
        self.t_count.index_add_(0, slots, counts)
        self.t_touch.index_fill_(0, slots, self._batch_no)
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                continue
            acc, part = self.t_acc[name], partials[name].to(self.t_acc[name].dtype)
            if op in ("sum", "mean"):
                acc.index_add_(0, slots, part)
            elif op == "min":
                acc[slots] = torch.minimum(acc[slots], part)
            else:
                acc[slots] = torch.maximum(acc[slots], part)

    def _group(self, keys, starts, bounds):
        """Distinct (key, start) pairs in lexicographic order and each row's
        pair: by codes over the batch's key and start ranges, or over each
        key's own starts (``_group_within_keys``) when only those are dense."""
        n, n_keys = keys.shape[0], bounds[1] - bounds[0] + 1
        if n and direct_range_ok(n_keys, n) and \
                not direct_range_ok(n_keys * ((bounds[3] - bounds[2]) // self.assigner.slide + 1), n):
            within = self._group_within_keys(keys, starts, bounds)
            if within is not None:
                return within
        codes, span = pair_codes(keys, starts, bounds, self.assigner.slide)
        if codes is None:
            uniq, inv = group_pairs(keys, starts)
            return uniq[:, 0], uniq[:, 1], inv
        uniq, inv = group_codes(codes, (bounds[1] - bounds[0] + 1) * span)
        uk = torch.div(uniq, span, rounding_mode="floor")
        return uk + bounds[0], (uniq - uk * span) * self.assigner.slide + bounds[2], inv

    def _group_within_keys(self, keys, starts, bounds):
        """``_group`` for dense keys whose starts spread over the batch but
        little per key (q5: an auction's bids fall in one or two of a batch's
        hundreds of panes): codes ``(key - kmin) * width + (start -
        first[key]) / slide``, ``first[key]`` the key's least start and
        ``width`` the most starts one key spans (one read-back), still ordered
        lexicographically, make a range small enough for a direct-address
        table: no sort of the batch. None when even that range is too wide."""
        slide, n_keys = self.assigner.slide, bounds[1] - bounds[0] + 1
        key = keys - bounds[0]
        first = torch.full((n_keys,), bounds[3], dtype=starts.dtype, device=starts.device) \
            .scatter_reduce_(0, key, starts, "amin")
        steps = torch.div(starts - first.index_select(0, key), slide, rounding_mode="floor")
        width = int(steps.max()) + 1
        if not direct_range_ok(n_keys * width, keys.shape[0]):
            return None
        uniq, inv = direct_groups(key * width + steps, n_keys * width)
        uk = torch.div(uniq, width, rounding_mode="floor")
        return uk + bounds[0], first.index_select(0, uk) + (uniq - uk * width) * slide, inv

    def _slots(self, keys, starts, dtypes, bounds) -> torch.Tensor:
        """Table rows of the distinct pairs ``(keys[i], starts[i])`` (in
        lexicographic order), appending the pairs not in the table in that
        order. On the device: the table's codes sorted, ``searchsorted``; one
        host sync (the number of new rows)."""
        self._cold_pairs(keys, starts)
        T = self.t_key.shape[0]
        found, old = find_pairs(self.t_key, self.t_start, keys, starts, self.assigner.slide,
                                _merge_bounds(self._bounds, bounds))
        new = ~found
        rank = torch.cumsum(new, 0) - 1
        slots = torch.where(found, old, rank + T)
        n_new = int(rank[-1]) + 1 if rank.numel() else 0  # the host sync: how far the table grows
        if n_new:
            self._grow(n_new, slots, keys, starts, dtypes)
            self._bounds = _merge_bounds(self._bounds, bounds)
        return slots

    def _batch_stats(self, parts: list) -> list:
        """One read-back of ``parts`` (0-d tensors) and, when the table's host
        bounds are stale, the table's key / start ranges (taken as the bounds)."""
        stale = self._bounds_stale and self.t_key.numel() > 0
        if stale:
            parts = parts + [self.t_key.min(), self.t_key.max(), self.t_start.min(), self.t_start.max()]
        stats = torch.stack(parts).tolist()
        if stale:
            self._bounds, self._bounds_stale = tuple(stats[-4:]), False
            stats = stats[:-4]
        return stats

    def _fold_batch(self, keys, starts, vals_of, dtypes, bounds, weight=None) -> None:
        """Group the pairs ``(keys[i], starts[i])``, reduce each group's values
        with ``opforge.segment_reduce`` and fold the partials into the table
        (every pair gets its row; ``weight`` (bool): only those records'
        values go in)."""
        from opforge.ops.hashing import segment_reduce_dense as segment_reduce

        uk, us, inv = self._group(keys, starts, bounds)
        g = uk.shape[0]
        ones = torch.ones_like(inv) if weight is None else weight.to(torch.int64)
        counts = torch.zeros(g, dtype=torch.int64, device=self.device).index_add_(0, inv, ones)
        partials = {}
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                continue
            vals = vals_of[name].to(dtypes[name])
            if weight is not None:
                vals = torch.where(weight, vals, torch.full_like(vals, self._identity(op, vals.dtype)))
            partials[name] = segment_reduce(vals, inv, g, "sum" if op == "mean" else op, deterministic=True)
        self._fold(self._slots(uk, us, dtypes, bounds), counts, partials)

    def _values(self, batch, index=None):
        """Per aggregation (not counts): the column to fold (rows ``index`` of
        it) and its accumulator dtype."""
        cols, dtypes = {}, {}
        for name, (op, col) in self.agg.outputs.items():
            if op != "count":
                c = self._column(batch, col)
                cols[name] = c if index is None else c.index_select(0, index)
                dtypes[name] = self._acc_dtype(op, c.dtype)
        return cols, dtypes

    # -- results --------------------------------------------------------------
    def _window_batch(self, keys, starts, count, accs) -> Batch:
        """Result records of windows ``(keys[i], starts[i])`` with these counts
        and accumulators, timed at each window's last timestamp."""
        out = {}
        size = self.assigner.size
        if self.agg.with_window:
            out["key"] = self.key_selector.decode_many(keys)
            out["window_start"] = starts
            out["window_end"] = starts + size
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                out[name] = count
            elif op == "mean":
                out[name] = accs[name] / count
            else:
                out[name] = accs[name]
        return Batch(out, starts + size - 1, RecordSchema("dict", tuple(out)))

    def _forget(self, gone, n_gone: int, watermark: int) -> None:
        """After a watermark fired its windows: drop the rows past the
        lateness (``gone``; device and cold tiers), fit the budget, pass the
        watermark on."""
        T = self.t_key.shape[0]
        if n_gone:
            self._purge(nonzero_known(~gone, T - n_gone))
        if self.cold is not None and len(self.cold):  # cold rows past the lateness: fired, forgotten
            horizon = watermark - self.lateness - (self.assigner.size - 1)
            self.cold.drop(lambda r: r["start"] <= horizon, lambda f: f["smax"] <= horizon,
                           lambda f: f["smin"] <= horizon)
        self._enforce_budget()
        self.out.emit_watermark(watermark)

    def _purge(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (ascending: rows keep their order)."""
        self._set_rows(self._rows(idx))
        self._bounds_stale = True  # narrowed at the next batch's read-back
        if self.t_key.numel() == 0:
            self._bounds, self._bounds_stale = None, False


class ColumnarWindowOperator(ColumnarWindows):
    """One table row per (key, window): each record goes into each of its
    windows (sliding windows whose size is not a multiple of the slide)."""

    layout = "windows"

    def process_batch(self, batch):
        n = len(batch)
        if n == 0:
            return
        self._batch_no += 1
        ts = batch.timestamps
        rows, starts, ends = self.assigner.assign(ts)
        keys = batch.keys.index_select(0, rows)
        wm = self.watermark
        max_ts = ends - 1
        kept = max_ts + self.lateness > wm
        on_time = kept & (max_ts > wm)
        # Flink: a record is late when none of its windows took it and it is
        # past the lateness (its side output), not merely when one window is late
        placed = torch.zeros(n, dtype=torch.int32, device=self.device) \
            .index_add_(0, rows, kept.to(torch.int32)) > 0
        row_late = ~placed & (ts + self.lateness <= wm)
        m = rows.shape[0]
        # the batch's shape in one read-back: missing timestamps, late rows,
        # kept / on-time pairs, key and window-start ranges (and the table's)
        parts = [(ts == NO_TIMESTAMP).sum(), row_late.sum(), kept.sum(), on_time.sum()]
        if m:
            parts += [keys.min(), keys.max(), starts.min(), starts.max()]
        stats = self._batch_stats(parts)
        if stats[0]:
            raise ValueError(f"{self.name}: a record has no timestamp; event-time windows need a "
                             "WatermarkStrategy with a timestamp assigner on the source")
        n_late, n_kept, n_on = stats[1], stats[2], stats[3]
        bounds = tuple(stats[4:8]) if m else None
        if n_late:
            self.late.handle(batch.select(row_late))
        cols, dtypes = self._values(batch, rows)
        if n_on:
            if n_on == m:  # the usual case: every pair on time, no selection
                self._fold_batch(keys, starts, cols, dtypes, bounds)
            else:
                idx = nonzero_known(on_time, n_on)
                self._fold_batch(keys.index_select(0, idx), starts.index_select(0, idx),
                                 {name: c.index_select(0, idx) for name, c in cols.items()}, dtypes, bounds)
        if n_kept > n_on:
            late_fire = nonzero_known(kept & (max_ts <= wm), n_kept - n_on)
            self._late_firings(late_fire, keys, starts, cols, dtypes, bounds)
        self._enforce_budget()

    def _late_firings(self, pairs_idx, keys, starts, cols, dtypes, bounds):
        """Each late record updates its window and fires it (Flink's per-record late firing)."""
        fired = []
        for i in pairs_idx.tolist():
            slot = self._slots(keys[i:i + 1], starts[i:i + 1], dtypes, bounds)
            self._fold(slot, torch.ones(1, dtype=torch.int64, device=self.device),
                       {n: c[i:i + 1] for n, c in cols.items()})
            fired.append(self._results(slot))  # the window as it is now
        self.out.emit(Batch.concat(fired))

    def _results(self, slots: torch.Tensor) -> Batch:
        return self._window_batch(self.t_key[slots], self.t_start[slots], self.t_count[slots],
                                  {n: a[slots] for n, a in self.t_acc.items()})

    def on_watermark(self, watermark):
        before, self.watermark = self.watermark, watermark
        last = self.assigner.size - 1  # a window's last timestamp: start + size - 1
        # rows whose window ends in (before, watermark] fire now; cold ones come back first
        self._take_cold(lambda s: (s + last > before) & (s + last <= watermark),
                        lambda lo, hi: hi + last > before and lo + last <= watermark)
        gone, n_gone = None, 0
        if self.t_key.shape[0]:
            end_ts = self.t_start + last
            due = (end_ts > before) & (end_ts <= watermark)
            gone = end_ts + self.lateness <= watermark
            n_due, n_gone = torch.stack([due.sum(), gone.sum()]).tolist()  # the one host sync
            if n_due:
                slots = nonzero_known(due, n_due)
                if self.cold is not None:  # restored rows sit at the end: order by first appearance
                    slots = slots[torch.argsort(self.t_seq[slots])]
                order = torch.argsort(end_ts[slots], stable=True)
                self.out.emit(self._results(slots[order]))
        self._forget(gone, n_gone, watermark)


class PanedWindowOperator(ColumnarWindows):
    """Sliding windows whose size is ``k`` times the slide (tumbling: ``k =
    1``): one table row per (key, pane), a pane being the slide-long slice
    ``[p, p + slide)`` that holds a record (``p = ts - (ts - offset) mod
    slide``), so each record is folded once instead of ``k`` times. Window
    ``[s, s + size)`` is panes ``s, s + slide, .., s + size - slide``.

    A watermark moving from ``before`` to ``wm`` fires the windows whose last
    timestamp lies in ``(before, wm]`` (of a key, every start whose window
    holds one of its panes). One sort puts the pane rows in (key, pane)
    order, so a window's panes are a run of consecutive rows. Each firing
    window is found once, with no grouping, from the gaps between a key's
    neighbouring panes: at its first pane (``_window_ends``: the previous
    pane is out of the window) and at its last; the two give its span of
    rows. Its aggregations are range reductions over the span
    (``range_sums``: counts and integer sums are differences of prefix sums,
    float sums add the span's panes; ``range_extremes``: min / max from a
    sparse table; a mean is its sum over its count). The windows are
    ordered as the per-window table fires them, with one more sort: by
    window end, then by first appearance, a window's being the least row
    order (``t_seq``) among its panes (every record of a window that has
    not fired was on time for it, so the window's row would have been made
    with the first of them). A pane is dropped once its last window (start
    ``p``) is past the allowed lateness, when that window's row would be.

    A late record (some of its windows fired, within the lateness) goes into
    its pane alone and then fires, one by one, exactly those windows, each
    the merge of its panes as they are now — the rows, values and order of
    the per-window table's late firings. Records with no late window are
    folded per batch as one group-and-reduce, before the late ones: they
    belong to no window a late record fires."""

    layout = "panes"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.panes_per_window = self.assigner.size // self.assigner.slide

    def process_batch(self, batch):
        n = len(batch)
        if n == 0:
            return
        self._batch_no += 1
        a, lateness, k = self.assigner, self.lateness, self.panes_per_window
        ts, keys = batch.timestamps, batch.keys
        panes = ts - torch.remainder(ts - a.offset, a.slide)
        wm = self.watermark
        # a record's windows end (last timestamp) at first_end + j * slide, j < k
        first_end = panes + (a.slide - 1)
        placed = first_end + ((k - 1) * a.slide + lateness) > wm  # its last window is within the lateness
        row_late = ~placed & (ts + lateness <= wm)  # none of its windows takes it: side output
        # late: its first window within the lateness (end > wm - L) has fired (end <= wm)
        floor = max(wm - lateness, -(2**62))  # no int64 overflow at the minimal watermark
        j = (torch.div(floor - first_end, a.slide, rounding_mode="floor") + 1).clamp_(0, k)
        late = placed & (j < k) & (first_end + j * a.slide <= wm)
        stats = self._batch_stats([(ts == NO_TIMESTAMP).sum(), row_late.sum(), placed.sum(), late.sum(),
                                   keys.min(), keys.max(), panes.min(), panes.max()])
        if stats[0]:
            raise ValueError(f"{self.name}: a record has no timestamp; event-time windows need a "
                             "WatermarkStrategy with a timestamp assigner on the source")
        n_side, n_placed, n_late = stats[1], stats[2], stats[3]
        bounds = tuple(stats[4:8])
        if n_side:
            self.late.handle(batch.select(row_late))
        if n_placed:
            # every placed record's pane gets its row now (new rows in
            # lexicographic order, as the per-window table makes its rows);
            # only the records with no late window are folded in here
            if n_placed == n:
                cols, dtypes = self._values(batch)
                k_p, p_p, late_p = keys, panes, late
            else:
                idx = nonzero_known(placed, n_placed)
                cols, dtypes = self._values(batch, idx)
                k_p, p_p, late_p = keys.index_select(0, idx), panes.index_select(0, idx), late.index_select(0, idx)
            self._fold_batch(k_p, p_p, cols, dtypes, bounds, None if n_late == 0 else ~late_p)
            if n_late:
                self._late_firings(nonzero_known(late_p, n_late), k_p, p_p, cols, dtypes, bounds)
        self._enforce_budget()

    def _late_firings(self, idx, keys, panes, cols, dtypes, bounds):
        """Each late record, in order: into its pane, then its fired windows
        still within the lateness fire again, latest start first (the order
        of the per-window path)."""
        a, k = self.assigner, self.panes_per_window
        wm, dev = self.watermark, self.device
        fired = []
        host = torch.stack([keys.index_select(0, idx), panes.index_select(0, idx)], 1).tolist()
        for i, (key, pane) in zip(idx.tolist(), host):
            one = slice(i, i + 1)
            self._fold(self._slots(keys[one], panes[one], dtypes, bounds),
                       torch.ones(1, dtype=torch.int64, device=dev), {n: c[one] for n, c in cols.items()})
            # every pane sharing a window with this one, back from the cold tiers
            near = pane + torch.arange(1 - k, k, dtype=torch.int64) * a.slide
            self._cold_pairs(torch.full_like(near, key), near)
            # its windows ending in (wm - L, wm] (all of them hold `pane`), over the key's panes
            runs = self._pane_runs(torch.nonzero(self.t_key == key).flatten())
            starts, first, last = self._window_ends(runs, max(wm - self.lateness, pane + a.slide - 2),
                                                    min(wm, pane + a.size - 1))
            spans = self._window_spans(first, last, int(first.sum()))
            latest_first = torch.arange(spans[0].shape[0] - 1, -1, -1, device=dev)  # one key: starts ascend
            fired.append(self._merged(runs, starts, spans, latest_first))
        self.out.emit(Batch.concat(fired))

    # -- firing: a window is a run of its key's panes ---------------------------
    def _pane_runs(self, rows=None) -> torch.Tensor:
        """Table rows (all, or ``rows``) in (key, pane) order, where a
        window's panes are consecutive: one sort of their order-preserving
        codes (two stable sorts when the table's bounds are unknown or too
        wide for the codes). Tumbling windows need no order: each row is a
        window of its own."""
        if self.panes_per_window == 1:
            return torch.arange(self.t_key.shape[0], device=self.device) if rows is None else rows
        keys, panes = self.t_key, self.t_start
        if rows is not None:
            keys, panes = keys.index_select(0, rows), panes.index_select(0, rows)
        codes = None if self._bounds is None else pair_codes(keys, panes, self._bounds, self.assigner.slide)[0]
        if codes is not None:
            order = torch.argsort(codes)
        else:
            order = torch.argsort(panes, stable=True)
            order = order[torch.argsort(keys.index_select(0, order), stable=True)]
        return order if rows is None else rows.index_select(0, order)

    def _window_ends(self, runs, after, upto):
        """For the pane rows ``runs`` (in (key, pane) order): the starts of
        the ``k`` windows holding each row (``[R, k]``; column ``c`` starts
        ``k - 1 - c`` slides before the pane, so that row-major order is
        (key, window start) order) and, among the windows ending (last
        timestamp) in ``(after, upto]``, those where the row is the window's
        first pane (``first``: the gap back to the key's previous pane is
        more than ``k - 1 - c`` slides) and those where it is the last
        (``last``: the gap to the next one is more than ``c``). Each window
        appears once in each mask, at the same rank: its panes are the rows
        from its ``first`` entry's to its ``last`` entry's."""
        a, k, dev = self.assigner, self.panes_per_window, self.device
        panes = self.t_start.index_select(0, runs)
        col = torch.arange(k, dtype=torch.int64, device=dev)
        starts = panes[:, None] - (k - 1 - col) * a.slide
        ends = starts + (a.size - 1)
        due = (ends > after) & (ends <= upto)
        if k == 1:  # tumbling: each row is a window of its own
            return starts, due, due
        keys = self.t_key.index_select(0, runs)
        # gap[i]: slides from row i - 1 to row i when both are the key's, else k (out of a window's reach)
        gap = torch.full((runs.shape[0] + 1,), k, dtype=torch.int64, device=dev)
        steps = torch.div(panes[1:] - panes[:-1], a.slide, rounding_mode="floor").clamp_(max=k)
        gap[1:-1] = torch.where(keys[1:] == keys[:-1], steps, k)
        return starts, due & (k - 1 - col < gap[:-1, None]), due & (col < gap[1:, None])

    def _window_spans(self, first, last, n: int):
        """The ``n`` windows of ``_window_ends``' masks as spans of the runs,
        in (key, start) order: ``(at, lo, width)``, ``at`` a window's place
        in the masks, its panes the rows ``lo .. lo + width - 1``."""
        k = self.panes_per_window
        at = nonzero_known(first.flatten(), n)
        lo = torch.div(at, k, rounding_mode="floor")
        return at, lo, torch.div(nonzero_known(last.flatten(), n), k, rounding_mode="floor") + 1 - lo

    def _merged(self, runs, starts, spans, order) -> Batch:
        """The windows ``spans`` (rows ``order`` of them) as result records:
        each aggregation a reduction over the window's span of pane rows
        (``range_sums``: counts, sums, a mean's sum; ``range_extremes``: min /
        max) — no grouping, no per-pane expansion."""
        k = self.panes_per_window
        at, lo, width = (t.index_select(0, order) for t in spans)
        accs = {}
        for name, (op, _) in self.agg.outputs.items():
            if op != "count":
                vals = self.t_acc[name].index_select(0, runs)
                accs[name] = range_sums(vals, lo, width, k) if op in ("sum", "mean") else \
                    range_extremes(vals, lo, width, k, op)
        return self._window_batch(self.t_key.index_select(0, runs.index_select(0, lo)),
                                  starts.flatten().index_select(0, at),
                                  range_sums(self.t_count.index_select(0, runs), lo, width, k), accs)

    def _firing_order(self, runs, starts, spans) -> torch.Tensor:
        """The order in which the per-window table fires these windows: by
        start, then by first appearance, a window's being its panes' least
        row order (``t_seq``). The pairs are distinct: one sort of their
        order-preserving codes, or two stable sorts when they do not fit."""
        a = self.assigner
        at, lo, width = spans
        starts = starts.flatten().index_select(0, at)
        first = range_extremes(self.t_seq.index_select(0, runs), lo, width, self.panes_per_window, "min")
        codes = None
        if self._bounds is not None:  # the starts lie within the table's pane range and k - 1 slides before it
            s_lo = self._bounds[2] - (self.panes_per_window - 1) * a.slide
            codes, _ = pair_codes(starts, first, (s_lo, self._bounds[3], 0, self._next_seq - 1), 1)
        if codes is not None:
            return torch.argsort(codes)
        order = torch.argsort(first)
        return order[torch.argsort(starts.index_select(0, order), stable=True)]

    def on_watermark(self, watermark):
        before, self.watermark = self.watermark, watermark
        a = self.assigner
        # panes of the windows ending in (before, watermark]: their first
        # window ends at p + slide - 1, their last at p + size - 1
        self._take_cold(lambda p: (p + (a.slide - 1) <= watermark) & (p + (a.size - 1) > before),
                        lambda lo, hi: lo + a.slide - 1 <= watermark and hi + a.size - 1 > before)
        gone, n_gone = None, 0
        if self.t_key.shape[0]:
            runs = self._pane_runs()
            starts, first, last = self._window_ends(runs, before, watermark)
            gone = self.t_start + (a.size - 1 + self.lateness) <= watermark  # its last window is past the lateness
            n_fire, n_gone = torch.stack([first.sum(), gone.sum()]).tolist()  # the one host sync
            if n_fire:
                spans = self._window_spans(first, last, n_fire)
                self.out.emit(self._merged(runs, starts, spans, self._firing_order(runs, starts, spans)))
        self._forget(gone, n_gone, watermark)


def columnar_window_operator(name, assigner, agg: Aggregations, key_selector, allowed_lateness=0,
                             late_tag=None) -> ColumnarWindows:
    """The columnar operator for ``Aggregations`` over event-time sliding (or
    tumbling) windows: panes when the size is a multiple of the slide, else
    one row per window."""
    cls = PanedWindowOperator if assigner.size % assigner.slide == 0 else ColumnarWindowOperator
    return cls(name, assigner, agg, key_selector, allowed_lateness, late_tag)


class _WindowContext:
    def __init__(self, op, window):
        self._op, self._window = op, window

    def window(self) -> TimeWindow:
        return self._window

    def current_watermark(self) -> int:
        return self._op.watermark

    def current_processing_time(self) -> int:
        return self._op.clock.now()


_EMPTY = object()


class WindowOperator(Operator):
    """Record-at-a-time windows; ``function``: ("aggregate", AggregateFunction),
    ("reduce", fn) or ("process", ProcessWindowFunction)."""

    def __init__(self, name, assigner, trigger, function, key_selector, allowed_lateness=0, late_tag=None):
        super().__init__(name)
        self.assigner, self.trigger, self.key_selector = assigner, trigger, key_selector
        self.kind, self.fn = function
        self.lateness = allowed_lateness if assigner.event_time else 0
        self.late_tag = late_tag
        if self.kind == "reduce":
            self.reduce = as_callable(self.fn, "reduce", name)

    def open(self):
        self.late = _LateData(self, self.late_tag)
        self.contents: dict = {}  # (key, window) -> accumulator / value / list
        self.counts: dict = {}
        self.sessions: dict = {}  # key -> set of windows (merging assigners)
        self.fire_timers = InternalTimers()
        self.cleanup_timers = InternalTimers()
        self.out_recs, self.out_ts = [], []

    def _add(self, key, window, record):
        slot = (key, window)
        cur = self.contents.get(slot, _EMPTY)
        if self.kind == "aggregate":
            acc = self.fn.create_accumulator() if cur is _EMPTY else cur
            self.contents[slot] = self.fn.add(record, acc)
        elif self.kind == "reduce":
            self.contents[slot] = record if cur is _EMPTY else self.reduce(cur, record)
        else:
            self.contents[slot] = ([] if cur is _EMPTY else cur) + [record]

    def _merge_contents(self, a, b):
        if self.kind == "aggregate":
            return self.fn.merge(a, b)
        if self.kind == "reduce":
            return self.reduce(a, b)
        return a + b

    def _session(self, key, window):
        """The window ``window`` merges into, or None if that window is late."""
        live = self.sessions.setdefault(key, set())
        hit = [w for w in live if w.intersects(window)]
        merged = window
        for w in hit:
            merged = merged.cover(w)
        if self.assigner.event_time and merged.max_timestamp() + self.lateness <= self.watermark:
            return None
        for w in sorted(hit):
            live.discard(w)
            self.fire_timers.delete(w.max_timestamp(), key, w)
            self.cleanup_timers.delete(w.max_timestamp() + self.lateness, key, w)
            cur = self.contents.pop((key, w), _EMPTY)
            if cur is not _EMPTY:
                prev = self.contents.get((key, merged), _EMPTY)
                self.contents[(key, merged)] = cur if prev is _EMPTY else self._merge_contents(prev, cur)
        live.add(merged)
        return merged

    def process_batch(self, batch):
        if len(batch) == 0:
            return
        if self.assigner.event_time:
            _check_timestamps(batch, self.name)
        keys = batch.keys.tolist()
        times = batch.timestamps.tolist()
        late_rows = []
        now = self.clock.now()
        for i, rec in enumerate(batch.records()):
            key, ts = keys[i], times[i]
            t = ts if self.assigner.event_time else now
            skipped = True
            for w in self.assigner.assign_one(t):
                if self.assigner.merging:
                    w = self._session(key, w)
                    if w is None:
                        continue
                elif self.assigner.event_time and w.max_timestamp() + self.lateness <= self.watermark:
                    continue
                skipped = False
                self._add(key, w, rec)
                self._on_element(key, w)
            if skipped and self.assigner.event_time and ts + self.lateness <= self.watermark:
                late_rows.append(i)
        if late_rows:
            self.late.handle(batch.select(torch.tensor(late_rows, dtype=torch.int64, device=self.device)))
        self._flush()

    def _on_element(self, key, w):
        kind = self.trigger.kind
        if kind == "event_time":
            if w.max_timestamp() <= self.watermark:
                self._fire(key, w)
            else:
                self.fire_timers.register(w.max_timestamp(), key, w)
            self.cleanup_timers.register(w.max_timestamp() + self.lateness, key, w)
        elif kind == "processing_time":
            self.fire_timers.register(w.max_timestamp(), key, w)
        elif kind == "count":
            n = self.counts.get((key, w), 0) + 1
            if n >= self.trigger.count:
                n = 0
                self._fire(key, w)
                if self.trigger.purging:
                    self.contents.pop((key, w), None)
            self.counts[(key, w)] = n

    def _fire(self, key, w):
        cur = self.contents.get((key, w), _EMPTY)
        if cur is _EMPTY:
            return
        ts = window_output_timestamp(w)
        user_key = self.key_selector.decode(key)
        if self.kind == "aggregate":
            res = self.fn.get_result(cur)
            if isinstance(self.fn, Aggregations) and self.fn.with_window:
                res = {"key": user_key, "window_start": w.start, "window_end": w.end, **res}
            results = [res]
        elif self.kind == "reduce":
            results = [cur]
        else:
            results = list(self.fn.process(user_key, _WindowContext(self, w), list(cur)) or ())
        for r in results:
            self.out_recs.append(r)
            self.out_ts.append(ts)

    def _clear(self, key, w):
        self.contents.pop((key, w), None)
        self.counts.pop((key, w), None)
        if self.assigner.merging:
            self.sessions.get(key, set()).discard(w)

    def _flush(self):
        if self.out_recs:
            self.out.emit(records_batch(self.out_recs, self.out_ts, self.device, self.name))
            self.out_recs, self.out_ts = [], []

    def on_watermark(self, watermark):
        self.watermark = watermark
        if self.assigner.event_time:
            for _, key, w in self.fire_timers.pop_due(watermark):
                self._fire(key, w)
            for _, key, w in self.cleanup_timers.pop_due(watermark):
                self._clear(key, w)
        self._flush()
        self.out.emit_watermark(watermark)

    def on_processing_time(self, now):
        if self.trigger.kind == "processing_time":
            for _, key, w in self.fire_timers.pop_due(now):
                self._fire(key, w)
                self._clear(key, w)
            self._flush()
