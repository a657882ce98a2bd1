"""``WindowOperator``: record-at-a-time windows, every case the columnar
operators do not take (any ``AggregateFunction``, ``reduce``, full-window
``process``, session windows, processing time, count and user triggers,
evictors), over per-(key, window) state.

Flink's ``WindowOperator``: each record goes into the windows its assigner
gives (a merging assigner first merges the new window into the key's live
ones, ``merge_into``); the trigger's result for each (``on_element``, and
``on_event_time`` / ``on_processing_time`` for the timers it registered)
fires the window's function and / or purges its contents. A window's state
goes at its cleanup time: its end plus the allowed lateness (event time) or
its end (processing time); global windows never end. With per-record
watermarks (``Batch.watermarks``) event time moves before each record that
saw a later one: what is late and when windows fire do not depend on the
batch size.
"""

from __future__ import annotations

import torch

from opforge.stream.errors import StreamOverflowError, at_record, window_overflow
from opforge.stream.functions import Aggregations, as_callable
from opforge.stream.late_data import LateData, require_timestamps
from opforge.stream.operators import Operator, records_batch
from opforge.stream.timers import InternalTimers
from opforge.stream.triggers import TriggerResult, TriggerState, merge_state, state_name
from opforge.stream.windows import GLOBAL_END, TimeWindow, output_timestamp


class _WindowContext:
    """``ctx`` of ``ProcessWindowFunction.process``."""

    def __init__(self, op, window):
        self._op, self._window = op, window

    def window(self) -> TimeWindow:
        return self._window

    def current_watermark(self) -> int:
        return self._op.watermark

    def current_processing_time(self) -> int:
        return self._op.clock.now()


class _TriggerContext:
    """The trigger's view of one key and window (``triggers.py``)."""

    __slots__ = ("op", "key", "window", "merged")

    def __init__(self, op):
        self.op, self.key, self.window, self.merged = op, None, None, ()

    def at(self, key, window, merged=()) -> "_TriggerContext":
        self.key, self.window, self.merged = key, window, merged
        return self

    def get_current_watermark(self) -> int:
        return self.op.watermark

    def get_current_processing_time(self) -> int:
        return self.op.clock.now()

    def register_event_time_timer(self, time: int) -> None:
        self.op.event_timers.register(int(time), self.key, self.window)

    def delete_event_time_timer(self, time: int) -> None:
        self.op.event_timers.delete(int(time), self.key, self.window)

    def register_processing_time_timer(self, time: int) -> None:
        self.op.proc_timers.register(int(time), self.key, self.window)

    def delete_processing_time_timer(self, time: int) -> None:
        self.op.proc_timers.delete(int(time), self.key, self.window)

    def get_partitioned_state(self, descriptor) -> TriggerState:
        return TriggerState(self.op.trigger_state, (self.key, self.window), state_name(descriptor))

    def merge_partitioned_state(self, descriptor, combine) -> None:
        merge_state(self.op.trigger_state, (self.key, self.window), self.merged, descriptor, combine)


_EMPTY = object()


def _host_lists(*columns):
    """The columns (None stays None) as lists, the int64 ones in one read-back."""
    same = [c for c in columns if c is not None and c.dtype == torch.int64]
    host = iter(torch.stack(same).tolist() if len(same) > 1 else [c.tolist() for c in same])
    return [None if c is None else next(host) if c.dtype == torch.int64 else c.tolist() for c in columns]


class WindowOperator(Operator):
    """Record-at-a-time windows; ``function``: ("aggregate", AggregateFunction),
    ("reduce", fn) or ("process", ProcessWindowFunction); ``evictor``: an
    ``Evictor`` (the window then keeps its records, as Flink's
    ``EvictingWindowOperator``)."""

    record_watermarks = True

    def __init__(self, name, assigner, trigger, function, key_selector, allowed_lateness=0, late_tag=None,
                 evictor=None):
        super().__init__(name)
        self.assigner, self.trigger, self.key_selector = assigner, trigger, key_selector
        self.kind, self.fn = function
        self.lateness = allowed_lateness if assigner.event_time else 0
        self.late_tag = late_tag
        self.evictor = evictor
        if self.kind == "reduce":
            self.reduce = as_callable(self.fn, "reduce", name)

    def open(self):
        self.late = LateData(self, self.late_tag)
        self.contents: dict = {}  # (key, window) -> accumulator / value / list ([(record, ts)] with an evictor)
        self.trigger_state: dict = {}  # (key, window) -> {name: value}, the trigger's own
        self.sessions: dict = {}  # key -> set of windows (merging assigners)
        self.event_timers = InternalTimers()  # the trigger's timers
        self.proc_timers = InternalTimers()
        self.cleanup_timers = InternalTimers()  # in the assigner's time domain
        self.ctx = _TriggerContext(self)
        self.out_recs, self.out_ts = [], []

    # -- window contents ----------------------------------------------------------
    def _add(self, key, window, record, ts):
        slot = (key, window)
        cur = self.contents.get(slot, _EMPTY)
        if self.evictor is not None:
            self.contents[slot] = ([] if cur is _EMPTY else cur) + [(record, ts)]
        elif self.kind == "aggregate":
            acc = self.fn.create_accumulator() if cur is _EMPTY else cur
            self.contents[slot] = self.fn.add(record, acc)
        elif self.kind == "reduce":
            self.contents[slot] = record if cur is _EMPTY else self.reduce(cur, record)
        else:
            self.contents[slot] = ([] if cur is _EMPTY else cur) + [record]

    def _merge_contents(self, a, b):
        if self.evictor is not None:
            return a + b
        if self.kind == "aggregate":
            return self.fn.merge(a, b)
        if self.kind == "reduce":
            return self.reduce(a, b)
        return a + b

    def _late(self, w) -> bool:
        return self.assigner.event_time and w.max_timestamp() + self.lateness <= self.watermark

    def _cleanup_time(self, w):
        if w.end == GLOBAL_END:
            return None
        return w.max_timestamp() + self.lateness if self.assigner.event_time else w.max_timestamp()

    def _merge(self, key, window):
        """The window ``window`` merges into (``assigner.merge_into``), or None
        if that window is late. The merged windows' contents, trigger state
        (``on_merge``) and timers go to it."""
        live = self.sessions.setdefault(key, set())
        merged, hits = self.assigner.merge_into(live, window)
        if self._late(merged):
            return None
        if hits:
            states = []
            for w in sorted(hits):
                live.discard(w)
                states.append(self.trigger_state.pop((key, w), None))  # taken before clear() empties it
                self.trigger.clear(w, self.ctx.at(key, w))
                cleanup = self._cleanup_time(w)
                if cleanup is not None:
                    self.cleanup_timers.delete(cleanup, key, w)
                cur = self.contents.pop((key, w), _EMPTY)
                if cur is not _EMPTY:
                    prev = self.contents.get((key, merged), _EMPTY)
                    self.contents[(key, merged)] = cur if prev is _EMPTY else self._merge_contents(prev, cur)
            self.trigger.on_merge(merged, self.ctx.at(key, merged, states))
        live.add(merged)
        return merged

    # -- records ----------------------------------------------------------------------
    def process_batch(self, batch):
        if len(batch) == 0:
            return
        event_time = self.assigner.event_time
        if event_time:
            require_timestamps(batch, self.name)
        wms = batch.watermarks if event_time else None
        keys, times, wms = _host_lists(batch.keys, batch.timestamps, wms)
        recs = batch.records()
        late_rows = []
        now = self.clock.now()
        i = 0
        try:
            for i, rec in enumerate(recs):
                if wms is not None and wms[i] > self.watermark:
                    self._move_time(wms[i])  # windows and timers due at this record's watermark fire first
                ts = times[i]
                if not self._element(keys[i], rec, ts, ts if event_time else now) and event_time \
                        and ts + self.lateness <= self.watermark:
                    late_rows.append(i)
        except Exception as e:
            raise at_record(e, recs[i], self.key_selector.decode(keys[i]))
        if late_rows:
            self.late.handle(batch.select(torch.tensor(late_rows, dtype=torch.int64, device=self.device)))
        self._flush()

    def _element(self, key, rec, ts, t) -> bool:
        """One record (``t``: its time in the assigner's domain); whether a window took it."""
        placed = False
        for w in self.assigner.assign_one(t):
            if self.assigner.merging:
                w = self._merge(key, w)
                if w is None:
                    continue
            elif self._late(w):
                continue
            placed = True
            self._add(key, w, rec, ts)
            self._act(key, w, self.trigger.on_element(rec, ts, w, self.ctx.at(key, w)))
            cleanup = self._cleanup_time(w)
            if cleanup is not None:
                self.cleanup_timers.register(cleanup, key, w)
        return placed

    def _act(self, key, w, result) -> None:
        if result & TriggerResult.FIRE:
            self._fire(key, w)
        if result & TriggerResult.PURGE:
            self.contents.pop((key, w), None)

    # -- firing -------------------------------------------------------------------------
    def _fire(self, key, w):
        cur = self.contents.get((key, w), _EMPTY)
        if cur is _EMPTY:
            return
        ts = output_timestamp(w)
        user_key = self.key_selector.decode(key)
        if self.evictor is not None:
            cur = self._evicted(key, w, cur)
            if not cur:
                return
        if self.kind == "aggregate":
            try:
                res = self.fn.get_result(cur)
            except StreamOverflowError as e:
                raise window_overflow(self.name, e, user_key, w) from None
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

    def _evicted(self, key, w, elements):
        """The window's records after ``evict_before``, folded as the function
        wants them (``evict_after`` trims what the window keeps)."""
        ctx = _WindowContext(self, w)
        kept = self.evictor.evict_before(list(elements), w, ctx)
        out = None
        if kept:
            records = [r for r, _ in kept]
            if self.kind == "aggregate":
                acc = self.fn.create_accumulator()
                for r in records:
                    acc = self.fn.add(r, acc)
                out = acc
            elif self.kind == "reduce":
                out = records[0]
                for r in records[1:]:
                    out = self.reduce(out, r)
            else:
                out = records
        self.contents[(key, w)] = self.evictor.evict_after(kept, w, ctx)
        return out

    def _clear(self, key, w):
        self.contents.pop((key, w), None)
        self.trigger.clear(w, self.ctx.at(key, w))
        self.trigger_state.pop((key, w), None)
        if self.assigner.merging:
            self.sessions.get(key, set()).discard(w)

    def _flush(self):
        if self.out_recs:
            self.out.emit(records_batch(self.out_recs, self.out_ts, self.device, self.name))
            self.out_recs, self.out_ts = [], []

    def _advance(self, watermark):
        self._move_time(watermark)
        self._flush()

    def _move_time(self, watermark):
        """Event time moves to ``watermark``: due trigger timers fire, windows
        past their cleanup time go. Their results wait in ``out_recs``: inside a
        batch (record watermarks) they leave with the batch's, as one batch, not
        one small batch per firing (issue 26: q7's window fired ~10 times a batch)."""
        self.watermark = watermark
        for t, key, w in self.event_timers.pop_due(watermark):
            self._act(key, w, self.trigger.on_event_time(t, w, self.ctx.at(key, w)))
        if self.assigner.event_time:
            for _, key, w in self.cleanup_timers.pop_due(watermark):
                self._clear(key, w)

    def on_watermark(self, watermark):
        self._advance(watermark)
        self.out.emit_watermark(watermark)

    def on_processing_time(self, now):
        for t, key, w in self.proc_timers.pop_due(now):
            self._act(key, w, self.trigger.on_processing_time(t, w, self.ctx.at(key, w)))
        if not self.assigner.event_time:
            for _, key, w in self.cleanup_timers.pop_due(now):
                self._clear(key, w)
        self._flush()
