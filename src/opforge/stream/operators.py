"""The engine's operators: one instance per parallel subtask, fed whole
micro-batches. Stateless operators with ``@vectorized`` functions run as
tensor code on the batch; unmarked functions are called once per record.

An operator emits through ``self.out`` (``emit``, ``emit_side``,
``emit_watermark``). ``on_watermark`` fires due event-time timers before the
watermark moves on, as Flink does. A batch with per-record watermarks
(``Batch.watermarks``) moves event time record by record: a process
function's timers fire before the first record whose watermark makes them
due; map, filter and pass-through operators keep the rows' watermarks.
"""

from __future__ import annotations

import inspect

import torch

from opforge.stream.errors import at_record
from opforge.stream.functions import (as_callable, batch_result, is_vectorized,
                                      with_output_type, RuntimeContext, TimestampedValue)
from opforge.stream.records import NO_TIMESTAMP, Batch
from opforge.stream.state import KeyedStateBackend
from opforge.stream.time import MIN_WATERMARK
from opforge.stream.timers import InternalTimers, TimerService


class Operator:
    # whether ``process_batch`` honours per-record watermarks (``Batch.watermarks``);
    # the engine feeds any other operator runs of one watermark, moving event time between them
    record_watermarks = False

    def __init__(self, name: str):
        self.name = name
        self.out = None
        self.index = 0
        self.parallelism = 1
        self.clock = None
        self.device = None
        self.watermark = MIN_WATERMARK

    def setup(self, out, index: int, parallelism: int, clock, device) -> None:
        self.out, self.index, self.parallelism, self.clock, self.device = out, index, parallelism, clock, device

    def open(self) -> None:
        pass

    def process_batch(self, batch: Batch) -> None:
        raise NotImplementedError

    def process_input(self, batch: Batch, input_index: int) -> None:
        """A batch from input ``input_index`` (two-input operators override this)."""
        self.process_batch(batch)

    def on_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        self.out.emit_watermark(watermark)

    def on_processing_time(self, now: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def runtime_context(self, state=None) -> RuntimeContext:
        return RuntimeContext(self.name, self.index, self.parallelism, state)


def open_function(fn, ctx) -> None:
    """Call ``fn.open(ctx)`` on a function object (not on a plain function)."""
    if not inspect.isroutine(fn) and callable(getattr(fn, "open", None)):
        fn.open(ctx)


def call_per_record(fn, records: list) -> list:
    """``[fn(r) for r in records]``; an exception notes the record it failed on."""
    out: list = []
    add = out.append
    try:
        for r in records:
            add(fn(r))
    except Exception as e:
        raise at_record(e, records[len(out)])
    return out


def records_batch(records: list, timestamps, device, where: str) -> Batch:
    """Records a user function produced, as a batch (shape from the first)."""
    return Batch.from_records(records, device, timestamps=timestamps, where=where)


class PassThrough(Operator):
    """Union and side-output selection: batches go on unchanged."""
    record_watermarks = True

    def process_batch(self, batch):
        self.out.emit(batch.with_keys(None))


class MapOperator(Operator):
    record_watermarks = True

    def __init__(self, name, fn, output=None):
        super().__init__(name)
        self.fn_obj = fn
        self.fn = as_callable(fn, "map", name)
        self.output = output or getattr(self.fn, "__opforge_output__", None)

    def open(self):
        open_function(self.fn_obj, self.runtime_context())

    def process_batch(self, batch):
        if is_vectorized(self.fn):
            out = batch_result(self.fn(batch), batch, self.name, same_length=True)
        else:
            out = records_batch(call_per_record(self.fn, batch.records()), batch.timestamps, self.device, self.name)
        self.out.emit(with_output_type(out, self.output).with_keys(None).marked_like(batch))


class FilterOperator(Operator):
    record_watermarks = True

    def __init__(self, name, fn):
        super().__init__(name)
        self.fn_obj = fn
        self.fn = as_callable(fn, "filter", name)

    def open(self):
        open_function(self.fn_obj, self.runtime_context())

    def process_batch(self, batch):
        if is_vectorized(self.fn):
            mask = self.fn(batch)
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (len(batch),):
                raise ValueError(f"{self.name}: a vectorized filter must return a bool tensor of "
                                 f"shape ({len(batch)},)")
        else:
            mask = torch.tensor([bool(v) for v in call_per_record(self.fn, batch.records())], dtype=torch.bool,
                                device=self.device)
        self.out.emit(batch.select(mask))


class FlatMapOperator(Operator):
    """Outputs keep their input record's timestamp. A vectorized flat_map
    returns columns plus ``"__row__"``: the input row each output row comes
    from. One marked ``@vectorized(record_watermarks=True)`` takes whole
    batches with per-record watermarks (no run of one watermark at a time:
    columnar work per batch) and its outputs keep their row's watermark."""

    def __init__(self, name, fn):
        super().__init__(name)
        self.fn_obj = fn
        self.fn = as_callable(fn, "flat_map", name)
        self.record_watermarks = is_vectorized(self.fn) and getattr(self.fn, "__opforge_record_watermarks__", False)

    def open(self):
        open_function(self.fn_obj, self.runtime_context())

    def process_batch(self, batch):
        if is_vectorized(self.fn):
            res = self.fn(batch)
            rows = None
            if isinstance(res, dict) and "__row__" in res:
                res = dict(res)
                rows = torch.as_tensor(res.pop("__row__"), dtype=torch.int64, device=self.device)
                res["__timestamp__"] = batch.timestamps.index_select(0, rows)
            out = batch_result(res, batch, self.name, same_length=False)
            if batch.watermarks is not None:  # record_watermarks: the outputs keep their rows' watermarks
                if rows is None:
                    raise ValueError(f"{self.name}: a flat_map marked @vectorized(record_watermarks=True) must "
                                     f"return columns and '__row__' (the input row of each output row)")
                out = out.with_watermarks(batch.watermarks.index_select(0, rows),
                                          None if batch.arrival is None else batch.arrival.index_select(0, rows))
            self.out.emit(out)
            return
        recs, ts = [], []
        r = None
        try:
            for r, t in zip(batch.records(), batch.timestamps.tolist()):
                for o in self.fn(r):
                    recs.append(o)
                    ts.append(t)
        except Exception as e:
            raise at_record(e, r)
        self.out.emit(records_batch(recs, ts, self.device, self.name))


class _Collector:
    """Gathers a user function's outputs (main and side) while a batch runs."""

    def __init__(self):
        self.records, self.ts = [], []
        self.side: dict = {}

    def add(self, values, ts):
        if values is None:
            return
        for v in values:
            if type(v) is TimestampedValue:  # an output with its own event time (interval joins)
                v, t = v.value, v.timestamp
            else:
                t = ts
            self.records.append(v)
            self.ts.append(t)

    def add_side(self, tag, value, ts):
        recs, times = self.side.setdefault(tag, ([], []))
        recs.append(value)
        times.append(ts)

    def flush(self, op):
        if self.records:
            op.out.emit(records_batch(self.records, self.ts, op.device, op.name))
        for tag, (recs, times) in self.side.items():
            op.out.emit_side(tag, records_batch(recs, times, op.device, op.name))
        self.records, self.ts, self.side = [], [], {}


class ProcessContext:
    """``ctx`` of ``process_element`` / ``on_timer``."""

    def __init__(self, op, collector):
        self._op = op
        self._collector = collector
        self._ts = NO_TIMESTAMP
        self._key = None
        self._domain = None

    def timestamp(self):
        return None if self._ts == NO_TIMESTAMP else self._ts

    def output(self, tag, value) -> None:
        self._collector.add_side(tag, value, self._ts)

    def get_current_key(self):
        return self._key

    def timer_service(self) -> TimerService:
        return self._op.timers

    def time_domain(self):
        return self._domain


class UnkeyedTimerService(TimerService):
    """A non-keyed stream's timer service: time reads work, timers do not (Flink)."""

    def __init__(self, clock, where):
        super().__init__(clock, InternalTimers(), InternalTimers())
        self.where = where

    def _no(self, *_):
        raise TypeError(f"{self.where}: timers need a keyed stream (key_by before process)")

    register_event_time_timer = register_processing_time_timer = _no
    delete_event_time_timer = delete_processing_time_timer = _no


class ProcessOperator(Operator):
    """A ``ProcessFunction`` (non-keyed) or ``KeyedProcessFunction`` (keyed:
    state and timers per key). One Python call per record."""

    record_watermarks = True

    def __init__(self, name, fn, key_selector=None):
        super().__init__(name)
        self.fn = fn
        self.process = as_callable(fn, "process_element", name)
        self.key_selector = key_selector
        self.timers = None

    def open(self):
        self.collector = _Collector()
        self.ctx = ProcessContext(self, self.collector)
        state = None
        self.event_timers, self.proc_timers = InternalTimers(), InternalTimers()
        if self.key_selector is not None:
            self.state = state = KeyedStateBackend(self.clock, self.name)
            self.timers = TimerService(self.clock, self.event_timers, self.proc_timers)
        else:
            self.timers = UnkeyedTimerService(self.clock, self.name)
        open_function(self.fn, self.runtime_context(state))

    def _set_key(self, key):
        self.ctx._key = key
        if self.key_selector is not None:
            self.state.set_current_key(key)
            self.timers.key = key

    def process_batch(self, batch):
        self._run(batch, self.process)

    def _run(self, batch, process):
        recs = batch.records()
        ts = batch.timestamps.tolist()
        keyed = self.key_selector is not None and batch.keys is not None  # (a broadcast input has no keys)
        keys = self.key_selector.decode_many(batch.keys) if keyed else None
        keys = keys.tolist() if isinstance(keys, torch.Tensor) else keys
        self.ctx._domain = None
        wms = None if batch.watermarks is None else batch.watermarks.tolist()
        i = 0
        try:
            for i, r in enumerate(recs):
                if wms is not None and wms[i] > self.watermark:
                    self._advance(wms[i])  # the timers this record's watermark makes due fire first
                    self.ctx._domain = None
                self.ctx._ts = ts[i]
                if keys is not None:
                    self._set_key(keys[i])
                self.collector.add(process(r, self.ctx), ts[i])
        except Exception as e:
            raise at_record(e, recs[i], *(() if keys is None else (keys[i],)))
        self.collector.flush(self)

    def _fire(self, timers, time, domain):
        on_timer = getattr(self.fn, "on_timer", None)
        for t, key, _ in timers.pop_due(time):
            self._set_key(key)
            self.ctx._ts = t if domain == "event_time" else NO_TIMESTAMP
            self.ctx._domain = domain
            if on_timer is not None:
                try:
                    self.collector.add(on_timer(t, self.ctx), self.ctx._ts)
                except Exception as e:
                    raise at_record(e, f"<{domain} timer {t}>", key)
        self.collector.flush(self)

    def _advance(self, watermark):
        """Event time moves to ``watermark``: due event-time timers fire (their
        outputs a batch of their own: they need not look like the elements')."""
        self.watermark = self.timers.watermark = watermark
        if self.event_timers:
            self.collector.flush(self)
            self._fire(self.event_timers, watermark, "event_time")

    def on_watermark(self, watermark):
        self._advance(watermark)
        super().on_watermark(watermark)

    def on_processing_time(self, now):
        if self.proc_timers:
            self._fire(self.proc_timers, now, "processing_time")


class CoProcessOperator(ProcessOperator):
    """A ``CoProcessFunction`` / ``KeyedCoProcessFunction`` over two inputs:
    ``process_element1`` for the first, ``process_element2`` for the second;
    keyed, both share the key's state and timers. The event time is the
    minimum of both inputs' watermarks."""

    def __init__(self, name, fn, key_selector=None):
        Operator.__init__(self, name)
        self.fn = fn
        self.process = (as_callable(fn, "process_element1", name), as_callable(fn, "process_element2", name))
        self.key_selector = key_selector
        self.timers = None

    def process_batch(self, batch):
        raise TypeError(f"{self.name}: a two-input operator needs the input index")

    def process_input(self, batch, input_index):
        self._run(batch, self.process[input_index])


class SinkOperator(Operator):
    record_watermarks = True

    def __init__(self, name, sink):
        super().__init__(name)
        self.sink = sink

    def process_batch(self, batch):
        self.sink.write(batch, self.index)

    def finish(self):
        if self.index == 0:
            self.sink.finish()
