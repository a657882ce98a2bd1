"""Columnar joins: two-input keyed operators that pair whole micro-batches
with tensor ops (sorts, ``searchsorted``, ``repeat_interleave``) instead of
one Python call per record.

* ``WindowJoinOperator``: Flink's window join,
  ``a.join(b).where(k).equal_to(k).window(TumblingEventTimeWindows |
  SlidingEventTimeWindows).apply(fn)`` with a ``@vectorized`` ``fn``. Each
  input's rows are buffered once, as columns (not once per window). When the
  watermark passes window ends (``(previous watermark, watermark]`` holds a
  window's ``max_timestamp``), the rows' due windows are expanded, both sides
  grouped by (key, window start) and every pair made at once; rows whose last
  window has fired are dropped. A row is late for the windows that had fired
  when it came (their ends are not after the watermark it met), and only for
  those, as in the record-at-a-time ``WindowCoGroupFunction``.
* ``RegularJoin`` / ``RegularJoinOperator``: Flink SQL's regular (unwindowed)
  inner equi-join: both inputs kept for ever (no state TTL), each pair
  emitted once, when the later of its two records arrives (Nexmark q3).

**The vectorized join function.** ``fn(first, second)`` gets two ``Batch`` es
of equal length: row ``i`` of ``first`` (a first-input record) is paired
with row ``i`` of ``second`` (a second-input record) — Flink's
``join(first, second)``, one call for a batch of pairs. It returns what a
vectorized map returns (a ``Batch``, a mapping of columns or one tensor), one
row per pair; a flat join (``with_flat_join``) returns columns plus
``"__row__"``, the pair each output row comes from, as a vectorized flat_map.
Both batches' timestamps are the pairs' time: a window's ``max_timestamp``
for window joins, the arriving record's time for regular joins. Outputs
carry it.

**Exactness.** The operators give the records of their record-at-a-time
forms, in the same order: a window join fires windows by end, then by the
arrival of the window's first record (the record path's timer order), and a
window's pairs first-input-major, both in arrival order; a regular join's
pairs follow the arriving batch's rows, each with the other side's records
in arrival order. The record forms are what the reference executor runs
(they call a vectorized function on the batch of one key's pairs).

State is tensors and column lists (``Rows``), checkpointed through
``snapshot_state`` / ``restore_state`` (no pickle).

**State budget.** Under ``env.set_state_budget(device_bytes, host_bytes,
spill_dir)`` a subtask's buffered rows (both inputs together) stay within
``device_bytes`` on the device; the coldest rows move to host memory and,
past ``host_bytes`` (both inputs together), to Arrow IPC files
(``state_budget.ColdRows``, one per input: their columns differ; zone maps
of key and event time). Rows come back before they are needed, so results
(records, order, times) are those of the job without a budget:

* window join: the coldest rows are those needed latest — the latest event
  times (a row is next needed when its first unfired window ends, which
  grows with its time). When the watermark fires windows, exactly the cold
  rows with a window ending in ``(previous watermark, watermark]`` come
  back (files whose time range cannot hold one stay closed); cold rows
  whose last window has ended are forgotten there, as device rows are.
* regular join: rows are kept for ever, so no time says which are needed
  next; the coldest are those of the keys met longest ago (a key is met
  when a batch of either input holds it: the batch's rows of that key
  arrive, and the key's rows of both inputs are touched) — a key recently
  met (a hot auction, an active person) is likely met again. Whole keys
  move, both inputs' rows together, and a batch brings back every cold row
  (both inputs) of its keys (files by key range, then exact key match): a
  key's rows are all on the device or all cold, so merging rows back keeps
  each key's rows in arrival order.

Host syncs stay per batch, not per record: a read-back of the batch's keys
(regular join, when rows are cold) and a few for an eviction. Checkpoints
hold every tier (rows in their no-budget order), so a job restored with or
without a budget sees the same state; a restore brings every row to the
device, and the budget is applied again.
"""

from __future__ import annotations

import torch

from opforge.ops.hashing import expand_runs
from opforge.stream.checkpoint import schema_from_state, schema_state
from opforge.stream.functions import (KeyedCoProcessFunction, as_callable, batch_result, is_vectorized)
from opforge.stream.operators import Operator, open_function
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema, concat_columns, take
from opforge.stream.state import ListStateDescriptor
from opforge.stream.state_budget import ColdRows, batch_keys, clear_tiers
from opforge.stream.grouping import group_pairs

_INT64_MAX = 2**63 - 1


# -- buffered rows ------------------------------------------------------------

class Rows:
    """Buffered rows of one input as columns: the records' fields, event
    times, key ids and arrival numbers (``seq``: the order in which the
    record-at-a-time path would have seen them, over both inputs)."""

    def __init__(self, columns: dict, ts: torch.Tensor, key: torch.Tensor, seq: torch.Tensor):
        self.columns, self.ts, self.key, self.seq = columns, ts, key, seq

    def __len__(self) -> int:
        return self.ts.shape[0]

    @staticmethod
    def empty(device) -> "Rows":
        none = torch.empty(0, dtype=torch.int64, device=device)
        return Rows({}, none, none, none)

    @staticmethod
    def of(batch: Batch, first_seq: int) -> "Rows":
        if batch.keys is None:
            raise ValueError("columnar join: a batch without key ids (the inputs must be keyed)")
        seq = torch.arange(first_seq, first_seq + len(batch), dtype=torch.int64, device=batch.device)
        return Rows(dict(batch.columns), batch.timestamps, batch.keys, seq)

    def take(self, idx: torch.Tensor) -> "Rows":
        return Rows({n: take(c, idx) for n, c in self.columns.items()}, self.ts.index_select(0, idx),
                    self.key.index_select(0, idx), self.seq.index_select(0, idx))

    @staticmethod
    def concat(parts: list) -> "Rows":
        full = [p for p in parts if len(p)]
        if len(full) <= 1:
            return full[0] if full else parts[0]
        return Rows({n: concat_columns([p.columns[n] for p in full]) for n in full[0].columns},
                    torch.cat([p.ts for p in full]), torch.cat([p.key for p in full]),
                    torch.cat([p.seq for p in full]))

    def batch(self, ts: torch.Tensor, schema: RecordSchema | None) -> Batch:
        return Batch(dict(self.columns), ts, schema)

    def nbytes(self) -> int:
        """Bytes of the tensors (what a state budget counts; list columns live on the host)."""
        cols = [c for c in self.columns.values() if isinstance(c, torch.Tensor)] + [self.ts, self.key, self.seq]
        return sum(c.element_size() * c.numel() for c in cols)

    def cold(self) -> dict:
        """As ``ColdRows`` rows: host columns, the record fields prefixed ``col.``."""
        rows = {"key": self.key.cpu(), "ts": self.ts.cpu(), "seq": self.seq.cpu()}
        rows.update({f"col.{n}": c.cpu() if isinstance(c, torch.Tensor) else list(c) for n, c in self.columns.items()})
        return rows

    @staticmethod
    def from_cold(rows: dict, device) -> "Rows":
        """Rows of ``cold`` back on ``device``, in arrival order."""
        cols = {n[4:]: c.to(device) if isinstance(c, torch.Tensor) else list(c)
                for n, c in rows.items() if n.startswith("col.")}
        back = Rows(cols, rows["ts"].to(device), rows["key"].to(device), rows["seq"].to(device))
        return back.take(torch.argsort(back.seq))

    def by_arrival(self) -> "Rows":
        return self.take(torch.argsort(self.seq)) if len(self) else self

    def by_key(self) -> "Rows":
        """Sorted by key, equal keys in arrival order (``SortedRows``' order)."""
        if len(self) == 0:
            return self
        order = torch.argsort(self.seq)
        return self.take(order.index_select(0, torch.argsort(self.key.index_select(0, order), stable=True)))

    def state(self) -> dict:
        return {"columns": self.columns, "ts": self.ts, "key": self.key, "seq": self.seq}

    @staticmethod
    def from_state(s: dict, device) -> "Rows":
        cols = {n: c.to(device) if isinstance(c, torch.Tensor) else list(c) for n, c in s["columns"].items()}
        return Rows(cols, s["ts"].to(device), s["key"].to(device), s["seq"].to(device))


class SortedRows:
    """Rows kept sorted by key, equal keys in arrival order: a batch finds its
    keys' runs with ``searchsorted`` and new rows are merged in (no re-sort of
    the table). ``touched``: also keep, per row, the last batch that met its
    key (``touch``; a state budget evicts the keys met longest ago)."""

    def __init__(self, device, touched: bool = False):
        self.rows = Rows.empty(device)
        self.touch = torch.empty(0, dtype=torch.int64, device=device) if touched else None

    def __len__(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: Rows, touch: int = 0) -> None:
        """Replace the table (rows already in its order); every row touched at ``touch``."""
        self.rows = rows
        if self.touch is not None:
            self.touch = torch.full((len(rows),), touch, dtype=torch.int64, device=rows.ts.device)

    def touch_keys(self, keys: torch.Tensor, now: int) -> None:
        """Mark the rows of ``keys`` as met at ``now`` (runs summed as +1 / -1 steps: no host sync)."""
        n = len(self.rows)
        if self.touch is None or n == 0:
            return
        lo, count = self.runs(keys)
        steps = torch.zeros(n + 1, dtype=torch.int64, device=keys.device)
        one = torch.ones_like(lo)
        steps.index_add_(0, lo, one).index_add_(0, lo + count, -one)
        self.touch = self.touch.masked_fill(torch.cumsum(steps, 0)[:n] > 0, now)

    def runs(self, keys: torch.Tensor):
        """``(lo, count)`` per key: its rows are ``lo .. lo + count - 1``."""
        lo = torch.searchsorted(self.rows.key, keys, right=False)
        return lo, torch.searchsorted(self.rows.key, keys, right=True) - lo

    def insert(self, new: Rows, touch: int = 0) -> None:
        """Merge ``new`` (in arrival order) in: after the table's rows of equal
        keys (touched at ``touch``)."""
        key, order = torch.sort(new.key, stable=True)
        new = new.take(order)
        old = self.rows
        if len(old) == 0:
            self.set_rows(new, touch)
            return
        dev = key.device
        n_old, n_new = len(old), len(new)
        at_old = torch.arange(n_old, device=dev) + torch.searchsorted(key, old.key, right=False)
        at_new = torch.arange(n_new, device=dev) + torch.searchsorted(old.key, key, right=True)
        perm = torch.empty(n_old + n_new, dtype=torch.int64, device=dev)
        perm[at_old] = torch.arange(n_old, device=dev)
        perm[at_new] = torch.arange(n_old, n_old + n_new, device=dev)
        self.rows = Rows.concat([old, new]).take(perm)
        if self.touch is not None:
            fresh = torch.full((n_new,), touch, dtype=torch.int64, device=dev)
            self.touch = torch.cat([self.touch, fresh]).index_select(0, perm)

    def keep(self, mask: torch.Tensor) -> None:
        idx = torch.nonzero(mask).flatten()
        self.rows = self.rows.take(idx)
        if self.touch is not None:
            self.touch = self.touch.index_select(0, idx)


# -- calling the join function ----------------------------------------------------

def join_pairs(fn, first: Batch, second: Batch, flat: bool, where: str) -> Batch:
    """The vectorized join function on aligned pair batches, as an output batch
    timed like the pairs (``first.timestamps``)."""
    like = Batch({}, first.timestamps, None)
    res = fn(first, second)
    if flat:
        if not isinstance(res, dict) or "__row__" not in res:
            raise ValueError(f"{where}: a vectorized flat join returns columns and '__row__' "
                             "(the pair each output row comes from)")
        res = dict(res)
        rows = torch.as_tensor(res.pop("__row__"), dtype=torch.int64, device=first.device)
        res["__timestamp__"] = first.timestamps.index_select(0, rows)
        return batch_result(res, like, where, same_length=False).with_keys(None)
    return batch_result(res, like, where, same_length=True).with_keys(None)


def join_records(fn, firsts: list, seconds: list, ts, flat: bool, where: str) -> list:
    """The record path of a vectorized join function: one call on the pairs
    ``(firsts[i], seconds[i])`` (host batches), the outputs as records."""
    if not firsts:
        return []
    times = [NO_TIMESTAMP if ts is None else ts] * len(firsts)
    a = Batch.from_records(firsts, "cpu", timestamps=times, where=where)
    b = Batch.from_records(seconds, "cpu", timestamps=times, where=where)
    return join_pairs(fn, a, b, flat, where).records()


class ColumnarForm:
    """A process function that also runs as a columnar operator: the engine
    builds ``make_operator(name, key_selector)``; the reference executor (and
    the engine, with ``columnar = False``) runs the record-at-a-time methods."""

    columnar = True

    def columnar_operator(self, name: str, key_selector):
        return self.make_operator(name, key_selector) if self.columnar else None

    def make_operator(self, name: str, key_selector):
        raise NotImplementedError


class _TwoInputs(Operator):
    """Shared by the columnar joins: the join function, both inputs' record
    shapes and the arrival counter."""

    def __init__(self, name, function, key_selector, flat=False, method="join"):
        super().__init__(name)
        self.function, self.key_selector, self.flat = function, key_selector, flat
        self.fn = as_callable(function, method, name)

    def open(self):
        self.schemas = [None, None]
        self.next_seq = 0
        budget = getattr(self, "state_budget", None)
        self.cold = None  # per input: its host and disk tiers (under a state budget)
        if budget is not None:
            self.cold = [ColdRows(budget, f"{self.name}-{self.index}-{side}", zone=("key", "ts"))
                         for side in ("first", "second")]
            self.cold[0].share_host_budget(self.cold[1])
        open_function(self.function, self.runtime_context())

    # -- the state budget (see the module doc) ---------------------------------
    def _over_budget(self, sizes: list) -> bool:
        return sum(sizes) > self.cold[0].budget.device_bytes

    def _evict(self, sides: list, order: torch.Tensor, weight: torch.Tensor, runs=None) -> list:
        """Keep on the device the rows first in ``order`` (over both inputs'
        rows, the first input's first) while their bytes (``weight`` per row)
        fit the budget; ``runs``: ids of groups of consecutive rows in
        ``order`` that stay or go together. The others go to the host tier.
        Returns, per input, the mask of the rows kept (rows keep their order)."""
        cum = torch.cumsum(weight.index_select(0, order), 0)
        if runs is not None:  # a group's bytes end where its last row's do
            cum = torch.zeros_like(cum).scatter_reduce(0, runs, cum, "amax").index_select(0, runs)
        keep = torch.empty(order.shape[0], dtype=torch.bool, device=order.device)
        keep[order] = cum <= self.cold[0].budget.device_bytes
        n0 = len(sides[0])
        masks = [keep[:n0], keep[n0:]]
        for side, (rows, kept) in enumerate(zip(sides, masks)):
            gone = torch.nonzero(~kept).flatten()
            if gone.numel():
                self.cold[side].add(rows.take(gone).cold())
        return masks

    def _all_rows(self, side: int, hot: Rows) -> Rows:
        """``hot`` and the input's cold rows, in arrival order (checkpoints)."""
        cold = self.cold[side].take_all() if self.cold is not None and len(self.cold[side]) else None
        if cold is None:
            return hot
        return Rows.concat([hot, Rows.from_cold(cold, self.device)]).by_arrival()

    def _clear_cold(self) -> None:
        clear_tiers(self.cold)

    def dispose(self) -> None:
        """The job ended (however): spill files and the host tiers go."""
        self._clear_cold()

    def _rows(self, batch: Batch, side: int) -> Rows:
        if self.schemas[side] is None:
            self.schemas[side] = batch.schema
        rows = Rows.of(batch, self.next_seq)
        self.next_seq += len(batch)
        return rows

    def _emit_pairs(self, first: Rows, second: Rows, ts: torch.Tensor) -> None:
        out = join_pairs(self.fn, first.batch(ts, self.schemas[0]), second.batch(ts, self.schemas[1]), self.flat,
                         self.name)
        if len(out):
            self.out.emit(out)

    def process_batch(self, batch):
        raise TypeError(f"{self.name}: a two-input operator needs the input index")

    def _base_state(self) -> dict:
        return {"schemas": [schema_state(s) for s in self.schemas], "next_seq": self.next_seq}

    def _restore_base(self, s: dict) -> None:
        self.schemas = [schema_from_state(x) for x in s["schemas"]]
        self.next_seq = s["next_seq"]


# -- window join ------------------------------------------------------------------

class WindowJoinOperator(_TwoInputs):
    """A window join of event-time tumbling or sliding windows, whole batches at a time."""

    def __init__(self, name, assigner, function, key_selector, flat=False, method="join"):
        super().__init__(name, function, key_selector, flat, method)
        self.assigner = assigner

    def open(self):
        super().open()
        self.buffers: list[list[Rows]] = [[], []]  # per input: chunks in arrival order

    def process_input(self, batch, input_index):
        if len(batch):
            self.buffers[input_index].append(self._rows(batch, input_index))
            self._enforce_budget()

    def on_watermark(self, watermark):
        prev, self.watermark = self.watermark, watermark
        if self._window_end_within(prev, watermark):
            self._fire(prev, watermark)
        self.out.emit_watermark(watermark)

    def fires_between(self, prev: torch.Tensor, wm: torch.Tensor) -> torch.Tensor:
        """Per pair of watermarks, whether moving from ``prev`` to ``wm`` fires
        a window (the engine moves event time there only: in between, nothing
        fires and no row is late, so records need not wait for their watermark)."""
        a = self.assigner
        grid = a.offset + a.size - 1
        return wm - torch.remainder(wm - grid, a.slide) > prev

    def _window_end_within(self, prev: int, wm: int) -> bool:
        """Whether some window's ``max_timestamp`` lies in ``(prev, wm]`` (host
        arithmetic: ends sit on the slide grid); else nothing fires or expires."""
        a = self.assigner
        grid = a.offset + a.size - 1
        return wm - (wm - grid) % a.slide > prev

    def _input(self, side: int) -> Rows:
        rows = Rows.concat(self.buffers[side]) if self.buffers[side] else Rows.empty(self.device)
        self.buffers[side] = [rows] if len(rows) else []
        return rows

    def _due(self, rows: Rows, prev: int, wm: int):
        """``(row, window start)`` of the rows' windows ending in ``(prev, wm]``."""
        r, starts, ends = self.assigner.assign(rows.ts)
        max_ts = ends - 1
        idx = torch.nonzero((max_ts > prev) & (max_ts <= wm)).flatten()
        return r.index_select(0, idx), starts.index_select(0, idx)

    def _fire(self, prev: int, wm: int) -> None:
        if self.cold is not None:
            self._bring_back(prev, wm)
        first, second = self._input(0), self._input(1)
        missing = [(rows.ts == NO_TIMESTAMP).sum() for rows in (first, second) if len(rows)]
        if missing and int(torch.stack(missing).sum()):
            raise ValueError(f"{self.name}: a record has no timestamp; joins run in event time (give the "
                             "sources a WatermarkStrategy with a timestamp assigner)")
        self._join_windows(first, second, prev, wm)
        for side, rows in enumerate((first, second)):
            if len(rows):
                self.buffers[side] = self._unexpired(rows, wm)
        if self.cold is not None:
            self._forget_cold(wm)
            self._enforce_budget()

    def _join_windows(self, first: Rows, second: Rows, prev: int, wm: int) -> None:
        """The fired windows' outputs (a co-group overrides this: its groups fire with one side empty)."""
        if len(first) and len(second):
            self._pair_windows(first, second, prev, wm)

    def _pair_windows(self, first: Rows, second: Rows, prev: int, wm: int) -> None:
        r0, s0 = self._due(first, prev, wm)
        r1, s1 = self._due(second, prev, wm)
        n0 = r0.shape[0]
        if n0 == 0 or r1.shape[0] == 0:
            return
        # panes: (key, window start) groups over both sides
        panes, inv = group_pairs(torch.cat([first.key.index_select(0, r0), second.key.index_select(0, r1)]),
                                 torch.cat([s0, s1]))
        g0, g1 = inv[:n0], inv[n0:]
        groups, starts = panes.shape[0], panes[:, 1]
        seqs = torch.cat([first.seq.index_select(0, r0), second.seq.index_select(0, r1)])
        opened = torch.full((groups,), _INT64_MAX, dtype=torch.int64, device=inv.device) \
            .scatter_reduce(0, inv, seqs, "amin")
        rank = _firing_rank(starts, opened)
        probe = torch.argsort(rank.index_select(0, g0), stable=True)  # first input: by pane, then arrival
        build = torch.argsort(g1, stable=True)  # second input: by pane, then arrival
        count = torch.bincount(g1, minlength=groups)
        lo = torch.cumsum(count, 0) - count
        g = g0.index_select(0, probe)
        pi, pos = expand_runs(lo.index_select(0, g), count.index_select(0, g))
        if pi.numel() == 0:
            return
        a, b = probe.index_select(0, pi), build.index_select(0, pos)
        ts = s0.index_select(0, a) + (self.assigner.size - 1)
        self._emit_pairs(first.take(r0.index_select(0, a)), second.take(r1.index_select(0, b)), ts)

    def _unexpired(self, rows: Rows, wm: int) -> list:
        """The rows with a window still to fire (the last one ends after ``wm``)."""
        a = self.assigner
        last_end = rows.ts - torch.remainder(rows.ts - a.offset, a.slide) + (a.size - 1)
        kept = rows.take(torch.nonzero(last_end > wm).flatten())
        return [kept] if len(kept) else []

    # -- the state budget: the rows needed latest wait on the host / disk ----------
    def _enforce_budget(self) -> None:
        """Over the budget: keep on the device the rows of earliest event time
        (then arrival) that fit, over both inputs; the others go cold."""
        if self.cold is None:
            return
        sizes = [sum(r.nbytes() for r in chunks) for chunks in self.buffers]
        if not self._over_budget(sizes):
            return
        sides = [self._input(0), self._input(1)]
        weight = torch.cat([torch.full((len(r),), size // max(len(r), 1), dtype=torch.int64, device=self.device)
                            for r, size in zip(sides, sizes)])
        ts = torch.cat([r.ts for r in sides])
        order = torch.argsort(torch.cat([r.seq for r in sides]))
        order = order.index_select(0, torch.argsort(ts.index_select(0, order), stable=True))
        masks = self._evict(sides, order, weight)
        for side, (rows, kept) in enumerate(zip(sides, masks)):
            rows = rows.take(torch.nonzero(kept).flatten())
            self.buffers[side] = [rows] if len(rows) else []

    def _window_ends(self, ts: torch.Tensor):
        """Per row: the last timestamps of its first and last windows (the first
        one's is past the last one's when no window holds the row)."""
        a = self.assigner
        last_start = ts - torch.remainder(ts - a.offset, a.slide)
        back = torch.div(a.size - 1 - (ts - last_start), a.slide, rounding_mode="floor")
        last_end = last_start + (a.size - 1)
        return last_end - back * a.slide, last_end

    def _first_end_at_least(self, t: int) -> int:
        """The earliest window last-timestamp at or after ``t`` (ends sit on the slide grid)."""
        a = self.assigner
        return t + (a.offset + a.size - 1 - t) % a.slide

    def _last_end(self, t: int) -> int:
        a = self.assigner
        return t - (t - a.offset) % a.slide + (a.size - 1)

    def _bring_back(self, prev: int, wm: int) -> None:
        """The cold rows with a window ending in ``(prev, wm]`` (and any without
        a timestamp, which fail the firing as on the device) back into their
        inputs, in arrival order."""

        def due(r):
            first_end, last_end = self._window_ends(r["ts"])
            return ((first_end <= wm) & (last_end > prev) & (first_end <= last_end)) | (r["ts"] == NO_TIMESTAMP)

        def might_hold(f):
            lo, hi = f["smin"], f["smax"]
            return lo == NO_TIMESTAMP or (self._first_end_at_least(lo) <= wm and self._last_end(hi) > prev)

        for side, cold in enumerate(self.cold):
            if len(cold) == 0:
                continue
            back = cold.take(due, might_hold)
            if back is not None:
                rows = Rows.concat([self._input(side), Rows.from_cold(back, self.device)]).by_arrival()
                self.buffers[side] = [rows]

    def _forget_cold(self, wm: int) -> None:
        """Cold rows whose last window has ended by ``wm`` (late rows that no
        window took) are forgotten, as ``_unexpired`` forgets device rows."""

        def ended(r):
            return (self._window_ends(r["ts"])[1] <= wm) & (r["ts"] != NO_TIMESTAMP)

        for cold in self.cold:
            if len(cold):
                cold.drop(ended, lambda f: f["smin"] != NO_TIMESTAMP and self._last_end(f["smax"]) <= wm,
                          lambda f: f["smin"] != NO_TIMESTAMP and self._last_end(f["smin"]) <= wm)

    # -- checkpoints ------------------------------------------------------------------
    def snapshot_state(self) -> dict:
        return {**self._base_state(), "inputs": [self._all_rows(side, self._input(side)).state() for side in (0, 1)]}

    def restore_state(self, s: dict) -> None:
        self._restore_base(s)
        self._clear_cold()
        self.buffers = [[r] if len(r) else [] for r in (Rows.from_state(x, self.device) for x in s["inputs"])]
        self._enforce_budget()


def _firing_rank(starts: torch.Tensor, opened: torch.Tensor) -> torch.Tensor:
    """Each pane's place in the firing order: by window (all of one size, so
    by start), then by the arrival of its first record (when the record path
    registered its timer)."""
    by_open = torch.argsort(opened, stable=True)
    order = by_open.index_select(0, torch.argsort(starts.index_select(0, by_open), stable=True))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=order.device)
    return rank


# -- regular join --------------------------------------------------------------------

class RegularJoin(ColumnarForm, KeyedCoProcessFunction):
    """Flink SQL's regular inner join of two connected keyed streams
    (``a.connect(b).key_by(ka, kb).process(RegularJoin(fn))``): every pair of
    records with equal keys, emitted once, when the later of the two arrives,
    timed like it; both inputs are kept for ever (no state TTL). ``fn(first,
    second)``: a ``@vectorized`` join function (the columnar operator) or a
    plain one called per pair. Record path: each key's records in list state."""

    def __init__(self, function):
        if not (callable(function) or hasattr(function, "join")):
            raise TypeError("RegularJoin: expected a join function (first, second)")
        self.function = function

    def make_operator(self, name, key_selector):
        if not is_vectorized(as_callable(self.function, "join", name)):
            return None
        return RegularJoinOperator(name, self.function, key_selector)

    def open(self, ctx):
        self.where = ctx.task_name
        self.call = as_callable(self.function, "join", self.where)
        self.inputs = (ctx.get_list_state(ListStateDescriptor("regular-join-first")),
                       ctx.get_list_state(ListStateDescriptor("regular-join-second")))
        open_function(self.function, ctx)

    def _arrive(self, side: int, value, ctx):
        others = list(self.inputs[1 - side].get())
        self.inputs[side].add(value)
        firsts, seconds = ([value] * len(others), others) if side == 0 else (others, [value] * len(others))
        if is_vectorized(self.call):
            return join_records(self.call, firsts, seconds, ctx.timestamp(), False, self.where)
        return [self.call(a, b) for a, b in zip(firsts, seconds)]

    def process_element1(self, value, ctx):
        return self._arrive(0, value, ctx)

    def process_element2(self, value, ctx):
        return self._arrive(1, value, ctx)


class RegularJoinOperator(_TwoInputs):
    """``RegularJoin`` on whole batches: each input's rows sorted by key; an
    arriving batch finds its keys' runs in the other input (``searchsorted``),
    its pairs are expanded at once, then its rows are merged into its own input.

    Under a state budget the keys met longest ago go cold, whole and from both
    inputs at once, and a batch first brings back its keys' cold rows (see the
    module doc: rows are kept for ever, so recency of use is the only guide)."""

    def open(self):
        super().open()
        touched = self.cold is not None
        self.inputs = [SortedRows(self.device, touched), SortedRows(self.device, touched)]
        self._batch_no = 0

    def process_input(self, batch, input_index):
        if len(batch) == 0:
            return
        rows = self._rows(batch, input_index)
        if self.cold is not None:
            self._batch_no += 1
            self._bring_back(rows.key)
        other = self.inputs[1 - input_index]
        if len(other):
            probe, build = expand_runs(*other.runs(rows.key))
            if probe.numel():
                mine, theirs = rows.take(probe), other.rows.take(build)
                pair = (mine, theirs) if input_index == 0 else (theirs, mine)
                self._emit_pairs(*pair, mine.ts)
        if self.cold is not None:
            for side in self.inputs:
                side.touch_keys(rows.key, self._batch_no)
        self.inputs[input_index].insert(rows, self._batch_no)
        self._enforce_budget()

    # -- the state budget: keys met longest ago wait on the host / disk ------------
    def _bring_back(self, keys: torch.Tensor) -> None:
        """Every cold row (both inputs) of these keys back into its input: the
        files whose key range holds one of the batch's keys, then an exact key
        match. A key's rows are all cold or all on the device, so each comes
        back after no row of its key (the merge keeps arrival order within a key)."""
        if not any(len(c) for c in self.cold):
            return
        want, might_hold = batch_keys(keys)  # the batch's keys on the host: the one read-back
        for side, cold in zip(self.inputs, self.cold):
            if len(cold) == 0:
                continue
            back = cold.take(lambda r: torch.isin(r["key"], want), might_hold)
            if back is not None:
                side.insert(Rows.from_cold(back, self.device), self._batch_no)

    def _enforce_budget(self) -> None:
        """Over the budget: keep on the device the keys met most recently that
        fit (both inputs' rows of a key count together); the others go cold."""
        if self.cold is None:
            return
        sides = [t.rows for t in self.inputs]
        sizes = [r.nbytes() + t.touch.numel() * 8 for r, t in zip(sides, self.inputs)]
        if not self._over_budget(sizes):
            return
        dev = self.device
        weight = torch.cat([torch.full((len(r),), size // max(len(r), 1), dtype=torch.int64, device=dev)
                            for r, size in zip(sides, sizes)])
        key = torch.cat([r.key for r in sides])
        touch = torch.cat([t.touch for t in self.inputs])
        order = torch.argsort(key, stable=True)
        order = order.index_select(0, torch.argsort(touch.index_select(0, order), descending=True, stable=True))
        sk, st = key.index_select(0, order), touch.index_select(0, order)
        new = torch.ones_like(sk, dtype=torch.bool)
        new[1:] = (sk[1:] != sk[:-1]) | (st[1:] != st[:-1])
        masks = self._evict(sides, order, weight, runs=torch.cumsum(new, 0) - 1)
        for table, kept in zip(self.inputs, masks):
            table.keep(kept)

    # -- checkpoints ------------------------------------------------------------------
    def snapshot_state(self) -> dict:
        inputs = []
        for i, side in enumerate(self.inputs):
            rows = self._all_rows(i, side.rows)
            inputs.append((rows.by_key() if rows is not side.rows else rows).state())
        return {**self._base_state(), "inputs": inputs}

    def restore_state(self, s: dict) -> None:
        self._restore_base(s)
        self._clear_cold()
        for side, state in zip(self.inputs, s["inputs"]):
            side.set_rows(Rows.from_state(state, self.device))
        self._enforce_budget()
