"""The engine's window operators.

``ColumnarWindowOperator``: ``Aggregations`` over event-time tumbling or
sliding windows, the GPU path. Per micro-batch: assign every record its
windows as tensors, group the (key, window start) pairs with ``torch.unique``,
fold each group with ``opforge.segment_reduce`` into partial accumulators,
then merge the partials into a table of open windows (one row per key and
window: accumulators as columns). A watermark fires the rows whose window
ended, in one gather. A few host syncs per batch (sizing the groups, and a dict
lookup of the batch's distinct (key, window) pairs — not of its records —
to find their table rows; a device hash table would remove it). Late records inside the allowed lateness
are rare; each updates its row and fires it, one by one, as Flink does.

``WindowOperator``: every other case (any ``AggregateFunction``, ``reduce``,
full-window ``process``, session windows, processing time, count triggers),
one record at a time over per-(key, window) state.
"""

from __future__ import annotations

import torch

from opforge.stream.functions import Aggregations, as_callable
from opforge.stream.operators import Operator, records_batch
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema
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


class ColumnarWindowOperator(Operator):
    def __init__(self, name, assigner, agg: Aggregations, key_selector, allowed_lateness=0, late_tag=None):
        super().__init__(name)
        self.assigner, self.agg, self.key_selector = assigner, agg, key_selector
        self.lateness = allowed_lateness
        self.late_tag = late_tag

    def open(self):
        self.late = _LateData(self, self.late_tag)
        self.slot_of: dict[tuple[int, int], int] = {}
        dev = self.device
        self.t_key = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_start = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_fired = torch.empty(0, dtype=torch.bool, device=dev)
        self.t_count = torch.empty(0, dtype=torch.int64, device=dev)
        self.t_acc: dict[str, torch.Tensor] = {}

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

    def _grow(self, new_pairs: list, dtypes: dict) -> None:
        n = len(new_pairs)
        if n == 0:
            return
        base = self.t_key.shape[0]
        for i, p in enumerate(new_pairs):
            self.slot_of[p] = base + i
        dev = self.device
        pairs = torch.tensor(new_pairs, dtype=torch.int64, device=dev).reshape(n, 2)
        self.t_key = torch.cat([self.t_key, pairs[:, 0]])
        self.t_start = torch.cat([self.t_start, pairs[:, 1]])
        self.t_fired = torch.cat([self.t_fired, torch.zeros(n, dtype=torch.bool, device=dev)])
        self.t_count = torch.cat([self.t_count, torch.zeros(n, dtype=torch.int64, device=dev)])
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                continue
            dt = self.t_acc[name].dtype if name in self.t_acc else dtypes[name]
            fresh = torch.full((n,), self._identity(op, dt), dtype=dt, device=dev)
            self.t_acc[name] = torch.cat([self.t_acc[name], fresh]) if name in self.t_acc else fresh

    def _fold(self, slots, counts, partials):
        self.t_count.index_add_(0, slots, counts)
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

    def _slots(self, pairs: torch.Tensor, dtypes) -> torch.Tensor:
        host = [tuple(p) for p in pairs.tolist()]  # the one host sync per batch
        self._grow([p for p in dict.fromkeys(host) if p not in self.slot_of], dtypes)
        return torch.tensor([self.slot_of[p] for p in host], dtype=torch.int64, device=self.device)

    # -- records --------------------------------------------------------------
    def process_batch(self, batch):
        if len(batch) == 0:
            return
        _check_timestamps(batch, self.name)
        from opforge.ops.hashing import segment_reduce

        rows, starts, ends = self.assigner.assign(batch.timestamps)
        keys = batch.keys.index_select(0, rows)
        wm = self.watermark
        max_ts = ends - 1
        kept = max_ts + self.lateness > wm
        # Flink: a record is late when none of its windows took it and it is
        # past the lateness (its side output), not merely when one window is late
        placed = torch.zeros(len(batch), dtype=torch.bool, device=self.device).index_fill_(0, rows[kept], True)
        row_late = ~placed & (batch.timestamps + self.lateness <= wm)
        self.late.handle(batch.select(row_late))
        cols = {}
        dtypes = {}
        for name, (op, col) in self.agg.outputs.items():
            if op != "count":
                c = self._column(batch, col)
                cols[name] = c.index_select(0, rows)
                dtypes[name] = self._acc_dtype(op, c.dtype)
        on_time = kept & (max_ts > wm)
        if bool(on_time.any()):
            idx = torch.nonzero(on_time).flatten()
            uniq, inv = group_pairs(keys[idx], starts[idx])
            g = uniq.shape[0]
            counts = torch.bincount(inv, minlength=g)
            partials = {}
            for name, (op, _) in self.agg.outputs.items():
                if op == "count":
                    continue
                vals = cols[name][idx].to(dtypes[name])
                partials[name] = segment_reduce(vals, inv, g, "sum" if op == "mean" else op,
                                                deterministic=True)
            self._fold(self._slots(uniq, dtypes), counts, partials)
        late_fire = torch.nonzero(kept & (max_ts <= wm)).flatten()
        if late_fire.numel():
            self._late_firings(late_fire, keys, starts, cols, dtypes)

    def _late_firings(self, pairs_idx, keys, starts, cols, dtypes):
        """Each late record updates its window and fires it (Flink's per-record late firing)."""
        fired = []
        for i in pairs_idx.tolist():
            pair = torch.stack([keys[i:i + 1], starts[i:i + 1]], 1)
            slot = self._slots(pair, dtypes)
            self._fold(slot, torch.ones(1, dtype=torch.int64, device=self.device),
                       {n: c[i:i + 1] for n, c in cols.items()})
            self.t_fired[slot] = True
            fired.append(self._results(slot))  # the window as it is now
        self.out.emit(Batch.concat(fired))

    # -- firing -------------------------------------------------------------
    def _emit(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self.out.emit(self._results(slots))

    def _results(self, slots: torch.Tensor) -> Batch:
        out = {}
        size = self.assigner.size
        if self.agg.with_window:
            out["key"] = self.key_selector.decode_many(self.t_key[slots])
            out["window_start"] = self.t_start[slots]
            out["window_end"] = self.t_start[slots] + size
        count = self.t_count[slots]
        for name, (op, _) in self.agg.outputs.items():
            if op == "count":
                out[name] = count
            elif op == "mean":
                out[name] = self.t_acc[name][slots] / count
            else:
                out[name] = self.t_acc[name][slots]
        ts = self.t_start[slots] + size - 1
        return Batch(out, ts, RecordSchema("dict", tuple(out)))

    def on_watermark(self, watermark):
        self.watermark = watermark
        if self.t_key.numel():
            end_ts = self.t_start + self.assigner.size - 1
            due = (end_ts <= watermark) & ~self.t_fired
            slots = torch.nonzero(due).flatten()
            if slots.numel():
                order = torch.argsort(end_ts[slots], stable=True)
                self._emit(slots[order])
                self.t_fired[slots] = True
            gone = end_ts + self.lateness <= watermark
            if bool(gone.any()):
                self._purge(~gone)
        self.out.emit_watermark(watermark)

    def _purge(self, keep: torch.Tensor) -> None:
        idx = torch.nonzero(keep).flatten()
        self.t_key, self.t_start = self.t_key[idx], self.t_start[idx]
        self.t_fired, self.t_count = self.t_fired[idx], self.t_count[idx]
        self.t_acc = {n: a[idx] for n, a in self.t_acc.items()}
        pairs = torch.stack([self.t_key, self.t_start], 1).tolist()
        self.slot_of = {tuple(p): i for i, p in enumerate(pairs)}


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
