"""A record-at-a-time reference executor: the test oracle of the engine.

It reads the same job graph as the micro-batch engine but shares none of its
operators: each record is pushed alone through the graph, keyed state is a
dict per key, timers are a list scanned in order, and a window keeps its
records and folds them only when it fires. Semantics are Flink's; the
watermark follows each record (``env.watermark_granularity="record"``) or
each source batch of ``env.batch_size`` records (``"batch"``), as in the
engine, so late data is decided at the same points of the stream.

Scope: one source subtask (parallelism of other operators is irrelevant to
results), event time only: triggers (the engine's classes, ``triggers.py``,
driven through their per-element methods) may use event-time timers and
their own state, not processing time. A
``@vectorized`` function is called on one-row batches, except a vectorized
join function: it gets the batch of one key's and one window's pairs.

``run_reference(env) -> {sink: [(record, timestamp), ...]}``.
"""

from __future__ import annotations

from opforge.stream.errors import StreamOverflowError, window_overflow
from opforge.stream.functions import Aggregations, TimestampedValue, as_callable, field_of, is_vectorized
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema
from opforge.stream.sources import as_batch
from opforge.stream.state import KeyedStateBackend
from opforge.stream.time import MAX_WATERMARK, MIN_WATERMARK
from opforge.stream.triggers import TriggerResult, TriggerState, merge_state, state_name
from opforge.stream.windows import GLOBAL_END


class _FixedClock:
    def now(self) -> int:
        return 0


def _one_row(record, ts, device):
    return Batch.from_records([record], device, timestamps=[ts])


class _Node:
    """One operator of the reference: ``element(record, ts)``, ``watermark(wm)``."""

    def __init__(self, t, env):
        self.t, self.env = t, env
        self.outputs: list = []  # (node, tag)
        self.wm = MIN_WATERMARK
        self.input_wms: dict = {}
        self.key = next((i.key for i in t.inputs if i.key is not None), None)

    def emit(self, record, ts, tag=None):
        output_type = self.t.params.get("output_type")
        if tag is None and output_type is not None:
            record = output_type.conform(record, self.t.name)
        for node, t, input_index in self.outputs:
            if t == tag:
                node.element_from(input_index, record, ts)

    def element_from(self, input_index, record, ts):
        self.element(record, ts)

    def emit_wm(self, wm):
        for node, _, _ in self.outputs:
            node.upstream_watermark(self, wm)

    def upstream_watermark(self, upstream, wm):
        self.input_wms[upstream] = max(self.input_wms.get(upstream, MIN_WATERMARK), wm)
        if len(self.input_wms) < self.n_inputs:
            return
        m = min(self.input_wms.values())
        if m > self.wm:
            self.wm = m
            self.watermark(m)

    def watermark(self, wm):
        self.emit_wm(wm)

    def key_of(self, record, key=None):
        key = key or self.key
        if is_vectorized(key.selector):
            return key.decode(int(key.key_ids(_one_row(record, 0, self.env.device))[0]))
        return key.of_record(record)


class _Stateless(_Node):
    def element(self, record, ts):
        k, p = self.t.kind, self.t.params
        if k in ("union", "side_output"):
            self.emit(record, ts)
            return
        method = {"map": "map", "filter": "filter", "flat_map": "flat_map"}[k]
        fn = as_callable(p["fn"], method, self.t.name)
        if is_vectorized(fn):
            outs = self._vectorized(fn, record, ts)
        elif k == "map":
            outs = [fn(record)]
        elif k == "filter":
            outs = [record] if fn(record) else []
        else:
            outs = list(fn(record))
        for o in outs:
            self.emit(o, ts)

    def _vectorized(self, fn, record, ts):
        from opforge.stream.functions import batch_result, with_output_type

        b = _one_row(record, ts, self.env.device)
        res = fn(b)
        if self.t.kind == "filter":
            return [record] if bool(res[0]) else []
        if self.t.kind == "flat_map" and isinstance(res, dict):
            res = {n: c for n, c in res.items() if n != "__row__"}
        out = batch_result(res, b, self.t.name, same_length=self.t.kind == "map")
        if self.t.kind == "map":
            out = with_output_type(out, self.t.params.get("output") or getattr(fn, "__opforge_output__", None))
        return out.records()


class _Ctx:
    def __init__(self, node):
        self.node = node
        self.ts = None
        self.current_key = None
        self.domain = None
        self.writing = False  # in process_broadcast_element

    def timestamp(self):
        return self.ts

    def output(self, tag, value):
        self.node.emit(value, NO_TIMESTAMP if self.ts is None else self.ts, tag)

    def get_current_key(self):
        return self.current_key

    def get_broadcast_state(self, descriptor):
        from opforge.stream.broadcast_state import BroadcastState, ReadOnlyBroadcastState

        values = self.node.broadcast.setdefault(descriptor.name, {})
        return (BroadcastState if self.writing else ReadOnlyBroadcastState)(values, descriptor.name)

    def timer_service(self):
        if self.node.key is None:
            raise TypeError(f"{self.node.t.name}: timers need a keyed stream")
        return self

    def time_domain(self):
        return self.domain

    # TimerService
    def current_watermark(self):
        return self.node.wm

    def current_processing_time(self):
        return 0

    def register_event_time_timer(self, t):
        if (int(t), self.current_key) not in self.node.timer_set:
            self.node.timer_set.add((int(t), self.current_key))
            self.node.timers.append((int(t), self.current_key))

    def delete_event_time_timer(self, t):
        if (int(t), self.current_key) in self.node.timer_set:
            self.node.timer_set.discard((int(t), self.current_key))
            self.node.timers.remove((int(t), self.current_key))

    def register_processing_time_timer(self, t):
        raise ValueError(f"{self.node.t.name}: the reference executor models event time only")

    delete_processing_time_timer = register_processing_time_timer


class _Process(_Node):
    def open(self):
        self.state = KeyedStateBackend(_FixedClock(), self.t.name) if self.key is not None else None
        self.timers: list = []
        self.timer_set: set = set()
        self.broadcast: dict = {}  # broadcast state: name -> map
        self.ctx = _Ctx(self)
        fn = self.t.params["fn"]
        if hasattr(fn, "open") and not callable(fn):
            from opforge.stream.functions import RuntimeContext

            fn.open(RuntimeContext(self.t.name, 0, 1, self.state))

    def _run(self, gen, ts):
        for o in gen or ():
            if type(o) is TimestampedValue:
                self.emit(o.value, o.timestamp)
            else:
                self.emit(o, ts)

    def element_from(self, input_index, record, ts):
        self.ctx.ts = None if ts == NO_TIMESTAMP else ts
        self.ctx.domain = None
        fn = self.t.params["fn"]
        if self.t.kind == "broadcast_process" and input_index == 1:  # no key; may change the broadcast state
            self.ctx.current_key, self.ctx.writing = None, True
            self._run(fn.process_broadcast_element(record, self.ctx), ts)
            self.ctx.writing = False
            return
        if self.key is not None:
            k = self.key_of(record, self.t.inputs[input_index].key)
            self.ctx.current_key = k
            self.state.set_current_key(k)
        if self.t.kind == "co_process":
            process = fn.process_element1 if input_index == 0 else fn.process_element2
        else:
            process = fn.process_element
        self._run(process(record, self.ctx), ts)

    def watermark(self, wm):
        while True:
            due = sorted((t for t in self.timers if t[0] <= wm), key=lambda t: t[0])
            if not due:
                break
            t, k = due[0]
            self.timers.remove((t, k))
            self.timer_set.discard((t, k))
            self.ctx.ts, self.ctx.current_key, self.ctx.domain = t, k, "event_time"
            self.state.set_current_key(k)
            self._run(self.t.params["fn"].on_timer(t, self.ctx), t)
        self.emit_wm(wm)


class _Rolling(_Node):
    def open(self):
        self.acc = {}

    def element(self, record, ts):
        k = self.key_of(record)
        p = self.t.params
        if k not in self.acc:
            self.acc[k] = record
        elif p.get("reduce") is not None:
            self.acc[k] = as_callable(p["reduce"], "reduce", self.t.name)(self.acc[k], record)
        else:
            prev = self.acc[k]
            a, b = field_of(prev, p["field"], self.t.name), field_of(record, p["field"], self.t.name)
            v = {"sum": a + b, "min": min(a, b), "max": max(a, b)}[p["op"]]
            schema = RecordSchema.of(prev)
            name = p["field"] if isinstance(p["field"], str) else f"f{p['field']}"
            vals = list(schema.fields_of(prev, self.t.name))
            vals[schema.names.index(name)] = v
            self.acc[k] = schema.make(tuple(vals))
        self.emit(self.acc[k], ts)


class _TriggerCtx:
    """A trigger's context in the reference: timers in a list, state in a dict."""

    def __init__(self, node):
        self.node, self.key, self.window, self.merged = node, None, None, ()

    def at(self, key, window, merged=()):
        self.key, self.window, self.merged = key, window, merged
        return self

    def get_current_watermark(self):
        return self.node.wm

    def get_current_processing_time(self):
        return 0

    def register_event_time_timer(self, t):
        self.node.timers.setdefault((int(t), self.key, self.window), None)

    def delete_event_time_timer(self, t):
        self.node.timers.pop((int(t), self.key, self.window), None)

    def register_processing_time_timer(self, t):
        raise ValueError(f"{self.node.t.name}: the reference executor models event time only")

    delete_processing_time_timer = register_processing_time_timer

    def get_partitioned_state(self, descriptor):
        return TriggerState(self.node.tstate, (self.key, self.window), state_name(descriptor))

    def merge_partitioned_state(self, descriptor, combine):
        merge_state(self.node.tstate, (self.key, self.window), self.merged, descriptor, combine)


class _Window(_Node):
    """Windows keep their records; results are folded at firing time. The
    trigger's methods decide (``triggers.py``), as in the engine."""

    def open(self):
        p = self.t.params
        self.assigner, self.trigger = p["assigner"], p["trigger"]
        self.evictor = p.get("evictor")
        self.lateness = p["allowed_lateness"] if self.assigner.event_time else 0
        self.late_tag = p["late_tag"]
        self.kind, self.fn = p["function"]
        self.panes: dict = {}  # (key, window) -> [(record, ts)]
        self.tstate: dict = {}  # (key, window) -> the trigger's state
        self.live: dict = {}  # key -> its session windows (a purge empties a window, it stays)
        self.timers: dict = {}  # (time, key, window) -> None: the trigger's event-time timers, in registration order
        self.ctx = _TriggerCtx(self)

    def _late(self, w):
        return self.assigner.event_time and w.max_timestamp() + self.lateness <= self.wm

    def element(self, record, ts):
        if self.assigner.event_time and ts == NO_TIMESTAMP:
            raise ValueError(f"{self.t.name}: a record has no timestamp")
        key = self.key_of(record)
        placed = False
        for w in self.assigner.assign_one(ts):
            if self.assigner.merging:
                live = self.live.setdefault(key, set())
                merged, mine = self.assigner.merge_into(live, w)
                if self._late(merged):
                    continue
                if mine:
                    recs, states = [], []
                    for x in sorted(mine):
                        live.discard(x)
                        recs += self.panes.pop((key, x), [])
                        states.append(self.tstate.pop((key, x), None))
                        self.trigger.clear(x, self.ctx.at(key, x))
                    self.panes[(key, merged)] = recs
                    self.trigger.on_merge(merged, self.ctx.at(key, merged, states))
                live.add(merged)
                w = merged
            elif self._late(w):
                continue
            placed = True
            self.panes.setdefault((key, w), []).append((record, ts))
            self._act(key, w, self.trigger.on_element(record, ts, w, self.ctx.at(key, w)))
        if not placed and self.assigner.event_time and ts + self.lateness <= self.wm \
                and self.late_tag is not None:
            self.emit(record, ts, self.late_tag)

    def _act(self, key, w, result):
        if TriggerResult(result).is_fire():
            self._fire(key, w)
        if TriggerResult(result).is_purge():
            self.panes.pop((key, w), None)

    def _fire(self, key, w):
        elements = self.panes.get((key, w))
        if not elements:
            return
        if self.evictor is not None:
            ctx = _WinCtx(w, self.wm)
            elements = self.evictor.evict_before(list(elements), w, ctx)
            self.panes[(key, w)] = self.evictor.evict_after(list(elements), w, ctx)
            if not elements:
                return
        recs = [r for r, _ in elements]
        ts = GLOBAL_END if w.end == GLOBAL_END else w.end - 1
        if self.kind == "aggregate":
            acc = self.fn.create_accumulator()
            for r in recs:
                acc = self.fn.add(r, acc)
            try:
                res = self.fn.get_result(acc)
            except StreamOverflowError as e:
                raise window_overflow(self.t.name, e, key, w) from None
            if isinstance(self.fn, Aggregations) and self.fn.with_window:
                res = {"key": key, "window_start": w.start, "window_end": w.end, **res}
            outs = [res]
        elif self.kind == "reduce":
            red = as_callable(self.fn, "reduce", self.t.name)
            acc = recs[0]
            for r in recs[1:]:
                acc = red(acc, r)
            outs = [acc]
        else:
            outs = list(self.fn.process(key, _WinCtx(w, self.wm), list(recs)) or ())
        for o in outs:
            self.emit(o, ts)

    def watermark(self, wm):
        while True:  # the trigger's timers in time order (ties: registration order)
            due = sorted((t for t in self.timers if t[0] <= wm), key=lambda t: t[0])
            if not due:
                break
            for timer in due:
                if timer in self.timers:
                    del self.timers[timer]
                    t, key, w = timer
                    self._act(key, w, self.trigger.on_event_time(t, w, self.ctx.at(key, w)))
        if self.assigner.event_time:
            gone = {(key, w) for (key, w) in list(self.panes) + list(self.tstate) +
                    [(k, x) for k, ws in self.live.items() for x in ws]
                    if w.end != GLOBAL_END and w.max_timestamp() + self.lateness <= wm}
            for key, w in gone:
                self.panes.pop((key, w), None)
                self.trigger.clear(w, self.ctx.at(key, w))
                self.tstate.pop((key, w), None)
                self.live.get(key, set()).discard(w)
        self.emit_wm(wm)


class _WinCtx:
    def __init__(self, w, wm):
        self._w, self._wm = w, wm

    def window(self):
        return self._w

    def current_watermark(self):
        return self._wm


class _Timestamps(_Node):
    """``assign_timestamps_and_watermarks``: its own timestamps and watermarks;
    upstream's are dropped but the end of input's."""

    def open(self):
        self.strategy = self.t.params["watermark_strategy"]
        self.max_ts, self.emitted = MIN_WATERMARK, MIN_WATERMARK

    def element(self, record, ts):
        a = self.strategy.timestamp_assigner
        if isinstance(a, str):
            ts = int(field_of(record, a, self.t.name))
        elif a is not None:
            ts = int(getattr(a, "extract_timestamp", a)(record, ts))
        self.max_ts = max(self.max_ts, ts)
        self.emit(record, ts)
        if self.t.params["per_record"]:
            self.end_batch()

    def end_batch(self):
        self.emitted = _watermark(self, self.strategy, self.max_ts, self.emitted)

    def watermark(self, wm):
        if wm == MAX_WATERMARK:
            self.emit_wm(wm)


class _Sink(_Node):
    def __init__(self, t, env, results):
        super().__init__(t, env)
        self.results = results.setdefault(t.params["sink"], [])

    def element(self, record, ts):
        self.results.append((record, ts))


def run_reference(env) -> dict:
    """Run ``env``'s job record by record; the graph is left in place."""
    ts_list = env.transformations
    results: dict = {}
    nodes = {}
    sources = [t for t in ts_list if t.kind == "source"]
    if len(sources) != 1 or sources[0].parallelism != 1:
        raise ValueError("run_reference: one source with parallelism 1 is modeled")
    for t in ts_list:
        cls = {"process": _Process, "co_process": _Process, "broadcast_process": _Process, "rolling": _Rolling,
               "window": _Window, "timestamps": _Timestamps}.get(t.kind, _Stateless)
        if t.kind == "sink":
            node = _Sink(t, env, results)
        elif t.kind == "source":
            node = _Node(t, env)
        else:
            node = cls(t, env)
        node.n_inputs = len({id(i.upstream) for i in t.inputs})
        nodes[t.id] = node
        for input_index, inp in enumerate(t.inputs):
            nodes[inp.upstream.id].outputs.append((node, inp.tag, input_index))
    for n in nodes.values():
        if hasattr(n, "open"):
            n.open()
    src = sources[0]
    source_node = nodes[src.id]
    strategy = src.params["watermark_strategy"]
    (split,) = src.params["source"].splits(1, env.batch_size, env.device)
    max_ts, emitted, prev = MIN_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP
    per_record = getattr(env, "watermark_granularity", "record") == "record"
    for item in split:
        batch = as_batch(item, env.device, src.name)
        a = strategy.timestamp_assigner
        for rec, ts in zip(batch.records(), batch.timestamps.tolist()):
            if isinstance(a, str):
                ts = int(field_of(rec, a, src.name))
            elif a is not None:
                ts = int(getattr(a, "extract_timestamp", a)(rec, prev))
            prev = ts
            if strategy.monotonous and ts < max_ts:
                raise ValueError(f"{src.name}: for_monotonous_timestamps got {ts} after {max_ts}")
            max_ts = max(max_ts, ts)
            source_node.emit(rec, ts)
            if per_record:
                emitted = _watermark(source_node, strategy, max_ts, emitted)
        emitted = _watermark(source_node, strategy, max_ts, emitted)
        for n in nodes.values():
            if isinstance(n, _Timestamps) and not n.t.params["per_record"]:
                n.end_batch()
    source_node.emit_wm(MAX_WATERMARK)
    return results


def _watermark(source_node, strategy, max_ts: int, emitted: int) -> int:
    """Emit the source's watermark if it advanced; the last one emitted."""
    if strategy.out_of_orderness_ms is not None and max_ts != MIN_WATERMARK:
        wm = max_ts - strategy.out_of_orderness_ms - 1
        if wm > emitted:
            source_node.emit_wm(wm)
            return wm
    return emitted
