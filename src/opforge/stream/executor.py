"""The micro-batch engine: runs a job graph in one process.

Every transformation becomes ``parallelism`` subtasks. Sources are polled in
rounds (one micro-batch per source subtask per round); each batch is pushed
through the graph at once, split between downstream subtasks by the edge's
partitioner (two-input operators learn which input a batch came from).
Watermarks follow each source batch; a subtask's event time is the minimum
over its non-idle input channels and never goes back (Flink). With record
granularity (``env.watermark_granularity``, the default) a batch's records
also carry the watermark each saw (``Batch.watermarks``), held back here by
the other channels, so operators move event time record by record. An
operator with two or more inputs (joins, connect, broadcast state, union)
holds such batches until the source poll that made them has gone through
the graph, then runs both inputs' records in the order of the watermarks
they saw (ties: the source's order, ``Batch.arrival``), as Flink would with
a watermark after every record on every input (``_Runner.flush``); an
operator with ``process_merged`` (the columnar interval join) takes the held
batches whole, with that order, instead of their runs one input at a time.
Each round first advances processing time (the job's clock) and fires
processing-time timers; a source subtask whose watermark runs ahead of its
alignment group by more than the allowed drift
(``WatermarkStrategy.with_watermark_alignment``) sits the round out. At the end of the input every source sends the
maximal watermark, which fires all event-time timers and windows; pending
processing-time timers are dropped, as in Flink.

With checkpointing enabled (``env.enable_checkpointing``) the
``CheckpointCoordinator`` snapshots the job between rounds, when no record is
in flight (aligned barriers, see ``checkpoint.py``), and once more at the end
of the input so that transactional sinks commit the last output. A job can
start from a checkpoint or savepoint (``restore_from``); a ``JobControl``
(from ``execute_async``) cancels it or asks for savepoints between rounds.
"""

from __future__ import annotations

import copy
import inspect
import os
import time as _time
from dataclasses import dataclass, field

import torch

from opforge.stream.broadcast_state import BroadcastProcessOperator
from opforge.stream.coordinator import CheckpointCoordinator
from opforge.stream.errors import StreamOperatorError, operator_error
from opforge.stream.functions import Aggregations
from opforge.stream.graph import Transformation
from opforge.stream.operators import (CoProcessOperator, FilterOperator, FlatMapOperator, MapOperator,
                                      PassThrough, ProcessOperator, SinkOperator)
from opforge.stream.partitioning import (BroadcastPartitioner, ForwardPartitioner, RebalancePartitioner)
from opforge.stream.records import NO_TIMESTAMP, Batch
from opforge.stream.rolling import RollingOperator
from opforge.stream.sources import as_batch, positioned
from opforge.stream.time import MAX_WATERMARK, MIN_WATERMARK, SystemClock, WatermarkGenerator
from opforge.stream.timestamps import TimestampsOperator, stamp
from opforge.stream.types import conform_batch
from opforge.stream.columnar_window_operator import columnar_window_operator
from opforge.stream.window_operator import WindowOperator
from opforge.stream.windows import SlidingEventTimeWindows


@dataclass
class OperatorMetrics:
    records_in: int = 0
    records_out: int = 0
    batches_in: int = 0
    busy_ms: float = 0.0
    late_records_dropped: int = 0
    #: source subtasks: rounds in which watermark alignment paused polling
    alignment_pauses: int = 0


@dataclass
class JobExecutionResult:
    """What ``execute`` returns: the job's name, its wall time and, per
    operator, records in/out, batches and busy time."""

    job_name: str
    net_runtime_ms: float
    metrics: dict[str, OperatorMetrics] = field(default_factory=dict)
    #: records the sources emitted in this run, and the checkpoints it completed
    source_records: int = 0
    checkpoints: list[str] = field(default_factory=list)
    restored_from: str | None = None
    #: how many times a restart strategy restarted the job (``restart.py``)
    restarts: int = 0

    def events_per_second(self) -> float:
        """Source records per second of wall time."""
        return self.source_records / max(self.net_runtime_ms, 1e-9) * 1000

    def get_net_runtime(self) -> float:
        return self.net_runtime_ms

    def get_job_name(self) -> str:
        return self.job_name


class _Edge:
    def __init__(self, idx, up: "_Node", down: "_Node", inp, input_index: int):
        self.idx, self.up, self.down, self.input_index = idx, up, down, input_index
        self.key = inp.key
        self.tag = inp.tag
        p = inp.partitioner
        if p is None:
            p = ForwardPartitioner() if up.t.parallelism == down.t.parallelism else RebalancePartitioner()
        if isinstance(p, ForwardPartitioner) and up.t.parallelism != down.t.parallelism:
            raise ValueError(f"{down.t.name}: forward partitioning needs equal parallelism, "
                             f"got {up.t.parallelism} -> {down.t.parallelism}")
        self.partitioner = p.fresh()
        self.connected = [self.partitioner.connected(i, up.t.parallelism, down.t.parallelism)
                          for i in range(up.t.parallelism)]

    def send(self, batch: Batch, up_index: int) -> None:
        if len(batch) == 0:
            return
        if self.key is not None:
            batch = batch.with_keys(self.key.key_ids(batch))
        targets = self.connected[up_index]
        ch = (self.idx, up_index)
        if isinstance(self.partitioner, BroadcastPartitioner) or len(targets) == 1:
            for t in targets:
                self.down.runners[t].receive(batch, ch, self.input_index)
            return
        batch.meta["up_parallelism"] = self.up.t.parallelism
        tgt = self.partitioner.targets(batch, up_index, self.down.t.parallelism)
        for t in targets:
            part = batch.select(tgt == t)
            if len(part):
                self.down.runners[t].receive(part, ch, self.input_index)

    def channels_of(self, down_index: int):
        return [(self.idx, u) for u, ts in enumerate(self.connected) if down_index in ts]


class _Output:
    def __init__(self, runner):
        self.runner = runner
        self.edges: list[_Edge] = []
        self.output_type = runner.node.t.params.get("output_type")  # PyFlink's output_type / type_info

    def emit(self, batch: Batch, tag=None) -> None:
        if tag is None and self.output_type is not None:
            batch = conform_batch(batch, self.output_type, self.runner.node.t.name)
        m = self.runner.metrics
        m.records_out += len(batch)
        for e in self.edges:
            if e.tag == tag:
                e.send(batch, self.runner.index)

    def emit_side(self, tag, batch: Batch) -> None:
        self.emit(batch, tag)

    def _each_target(self):
        for e in self.edges:
            for t in e.connected[self.runner.index]:
                yield e.down.runners[t], (e.idx, self.runner.index)

    def emit_watermark(self, wm: int) -> None:
        for r, ch in self._each_target():
            r.receive_watermark(wm, ch)

    def emit_idle(self, idle: bool) -> None:
        for r, ch in self._each_target():
            r.receive_idle(ch, idle)


class _Runner:
    """One subtask of a (non-source) operator: its input channels' watermarks."""

    def __init__(self, node, index, op, metrics):
        self.node, self.index, self.op, self.metrics = node, index, op, metrics
        self.out = _Output(self)
        self.wms: dict = {}
        self.idle: dict = {}
        self.current = MIN_WATERMARK
        self.out_idle = False
        # two or more inputs (joins, connect, union): batches with record watermarks wait for the
        # end of the source poll, then run interleaved by watermark (``flush``)
        self.merges = len(node.t.inputs) > 1
        self.pending: list = []  # (batch, channel, input index)

    def add_channel(self, ch):
        self.wms[ch] = MIN_WATERMARK
        self.idle[ch] = False

    def _wake(self, ch):
        if self.idle.get(ch):
            self.idle[ch] = False
        if self.out_idle:
            self.out_idle = False
            self.out.emit_idle(False)

    def receive(self, batch: Batch, ch, input_index: int = 0) -> None:
        self._wake(ch)
        self.metrics.records_in += len(batch)
        self.metrics.batches_in += 1
        if self.merges and (batch.watermarks is not None or self.pending):
            if batch.watermarks is None:  # e.g. a window's firing: its records saw the channel's watermark
                batch = batch.with_watermarks(torch.full((len(batch),), self.wms[ch], dtype=torch.int64,
                                                         device=batch.device))
            self.pending.append((batch, ch, input_index))
            return
        t0 = _time.perf_counter()
        with _attributed(self.op):
            if batch.watermarks is None:
                self.op.process_input(batch, input_index)
            else:
                self._run(batch.with_watermarks(self._record_watermarks(batch.watermarks, ch)), input_index)
        self.metrics.busy_ms += (_time.perf_counter() - t0) * 1000

    def _run(self, batch: Batch, input_index: int) -> None:
        """A batch whose records carry the watermarks they see here."""
        if getattr(self.op, "record_watermarks", False):
            self.op.process_input(batch, input_index)
        else:
            self._by_watermark_runs(batch, input_index)

    def flush(self) -> None:
        """Run the batches held since the source poll began (``merges``): every
        input's records in the order of the watermarks they saw (Flink with a
        watermark after each record, on every input), each held back by the
        other inputs' watermarks, so a join or co-process function sees the
        same event time at every batch size. Ties keep arrival order."""
        if not self.pending:
            return
        parts, self.pending = self.pending, []
        t0 = _time.perf_counter()
        with _attributed(self.op):
            wms = torch.cat([self._record_watermarks(b.watermarks, ch) for b, ch, _ in parts])
            part = torch.cat([torch.full((len(b),), i, dtype=torch.int64, device=wms.device)
                              for i, (b, _, _) in enumerate(parts)])
            order = torch.arange(len(wms), device=wms.device)
            if all(b.arrival is not None for b, _, _ in parts):  # ties: the source's order
                order = torch.sort(torch.cat([b.arrival for b, _, _ in parts]), stable=True).indices
            order = order.index_select(0, torch.sort(wms.index_select(0, order), stable=True).indices)
            merged = getattr(self.op, "process_merged", None)
            if merged is not None:  # the operator takes the held batches whole, with the order to meet them in
                merged([(b, i) for b, _, i in parts], order, wms.index_select(0, order))
            else:
                self._runs_in_order(parts, part.index_select(0, order), order, wms.index_select(0, order))
        self.metrics.busy_ms += (_time.perf_counter() - t0) * 1000
        self._advance()

    def _runs_in_order(self, parts: list, part: torch.Tensor, order: torch.Tensor, wms: torch.Tensor) -> None:
        """The held batches' runs of one input each, in ``order`` (``flush``)."""
        offsets = [0]
        for b, _, _ in parts:
            offsets.append(offsets[-1] + len(b))
        cuts = torch.nonzero(part[1:] != part[:-1]).flatten() + 1
        starts = torch.cat([cuts.new_zeros(1), cuts]).tolist()
        ends = starts[1:] + [len(order)]
        firsts = part.index_select(0, torch.tensor(starts, device=part.device)).tolist()
        for lo, hi, i in zip(starts, ends, firsts):
            batch, _, input_index = parts[i]
            rows = order[lo:hi] - offsets[i]
            run = batch if hi - lo == len(batch) else batch.select(rows)
            self._run(run.with_watermarks(wms[lo:hi]), input_index)

    def _by_watermark_runs(self, batch: Batch, input_index: int) -> None:
        """An operator that reads one watermark per batch gets the batch's
        runs of records that saw the same one, event time moving (timers
        firing, the watermark passed on) between them. An operator that says
        where moving event time fires something (``fires_between(prev, wm)``,
        a window join) gets longer runs: cut only there."""
        wms = batch.watermarks
        change = wms[1:] != wms[:-1]
        fires = getattr(self.op, "fires_between", None)
        if fires is not None:
            change &= fires(wms[:-1], wms[1:])
        cuts = torch.nonzero(change).flatten() + 1
        starts = torch.cat([cuts.new_zeros(1), cuts])
        host = torch.stack([starts, wms.index_select(0, starts)], 1).tolist()
        ends = [s for s, _ in host[1:]] + [len(batch)]
        batch = batch.with_watermarks(None)
        for (lo, wm), hi in zip(host, ends):
            if wm > self.current:
                self.current = wm
                self.op.on_watermark(wm)
            run = batch if (lo, hi) == (0, len(batch)) else \
                batch.select(torch.arange(lo, hi, dtype=torch.int64, device=batch.device))
            self.op.process_input(run, input_index)

    def _record_watermarks(self, seen: torch.Tensor, ch) -> torch.Tensor:
        """The event time each record of a batch from ``ch`` sees here: what
        it saw upstream, held back by the other active channels' watermarks,
        never behind this subtask's."""
        others = [w for c, w in self.wms.items() if c != ch and not self.idle[c]]
        if others:
            seen = seen.clamp(max=min(others))
        return seen.clamp(min=self.current)

    def receive_watermark(self, wm: int, ch) -> None:
        self._wake(ch)
        if wm > self.wms[ch]:
            self.wms[ch] = wm
        if not self.pending:  # else after the held batches (``flush``)
            self._advance()

    def receive_idle(self, ch, idle: bool) -> None:
        self.idle[ch] = idle
        if idle and not self.pending:
            self._advance()
        else:
            self._wake(ch)

    def _advance(self) -> None:
        active = [w for ch, w in self.wms.items() if not self.idle[ch]]
        if not active:
            if not self.out_idle:
                self.out_idle = True
                self.out.emit_idle(True)
            return
        m = min(active)
        if m > self.current:
            self.current = m
            t0 = _time.perf_counter()
            with _attributed(self.op):
                if m > self.op.watermark:
                    self.op.on_watermark(m)
                else:  # its records' watermarks already moved it there (timers fired): only pass it on
                    self.out.emit_watermark(m)
            self.metrics.busy_ms += (_time.perf_counter() - t0) * 1000


class _attributed:
    """``with _attributed(op):`` an exception raised inside ``op`` (a user
    function, the operator itself) leaves as ``errors.operator_error``: the
    original's type and attributes, the operator, subtask and (when the
    operator noted it) the record and key in the message, the original as
    ``__cause__``. One raised further downstream keeps its own operator."""

    __slots__ = ("name", "index", "parallelism")

    def __init__(self, op, name=None):
        self.name = op.name if name is None else name
        self.index = op.index
        node = getattr(op, "node", None)  # a source subtask's runner
        self.parallelism = node.t.parallelism if node is not None else op.parallelism

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or not issubclass(kind, Exception) or isinstance(exc, StreamOperatorError):
            return False
        raise operator_error(exc, self.name, self.index, self.parallelism) from exc


class _SourceRunner:
    def __init__(self, node, index, split, env, metrics):
        self.node, self.index, self.split, self.env, self.metrics = node, index, split, env, metrics
        self.out = _Output(self)
        strategy = node.t.params["watermark_strategy"]
        self.strategy = strategy
        self.wmgen = WatermarkGenerator(strategy, node.t.name)
        self.finished = False
        self.idle = False
        self.last_record_ms = env.clock.now()
        self.prev_ts = NO_TIMESTAMP
        self.polled_records = False

    def _timestamps(self, batch: Batch) -> Batch:
        batch, self.prev_ts = stamp(self.strategy, batch, self.prev_ts, self.node.t.name)
        return batch

    def current_watermark(self) -> int:
        """The last watermark this subtask emitted (MAX once finished)."""
        return MAX_WATERMARK if self.finished else self.wmgen.emitted

    def poll(self, now: int) -> None:
        with _attributed(self, self.node.t.name):
            item = next(self.split, None)
        if item is None:
            self.finished = True
            if self.idle:
                self.idle = False
                self.out.emit_idle(False)
            self.out.emit_watermark(MAX_WATERMARK)
            return
        with _attributed(self, self.node.t.name):
            batch = self._timestamps(as_batch(item, self.env.device, self.node.t.name))
        if len(batch) == 0:
            timeout = self.strategy.idle_timeout_ms
            if timeout is not None and not self.idle and now - self.last_record_ms >= timeout:
                self.idle = True
                self.out.emit_idle(True)
            return
        self.polled_records = True
        self.last_record_ms = now
        if self.idle:
            self.idle = False
            self.out.emit_idle(False)
        if self.env.watermark_granularity == "record":
            batch = batch.with_watermarks(self.wmgen.record_watermarks(batch.timestamps),
                                          torch.arange(len(batch), device=batch.device))
        self.wmgen.on_batch(batch.timestamps)
        self.out.emit(batch)
        wm = self.wmgen.current()
        if wm is not None:
            self.out.emit_watermark(wm)


class _Node:
    def __init__(self, t: Transformation):
        self.t = t
        self.runners: list = []
        self.metrics = [OperatorMetrics() for _ in range(t.parallelism)]


def _instance(fn):
    """Each subtask gets its own copy of a function object (Flink ships each a
    deserialized copy), so per-subtask fields set in ``open`` do not collide."""
    return fn if inspect.isroutine(fn) or fn is None else copy.deepcopy(fn)


def build_operator(t: Transformation, key):
    p, name = dict(t.params), t.name
    if "fn" in p:
        p["fn"] = _instance(p["fn"])
    if "function" in p:
        p["function"] = (p["function"][0], _instance(p["function"][1]))
    k = t.kind
    if k in ("process", "co_process") and key is not None:
        # a keyed function with a columnar form (columnar_join.ColumnarForm) runs as that operator
        columnar = getattr(p["fn"], "columnar_operator", None)
        op = columnar(name, key) if callable(columnar) else None
        if op is not None:
            return op
    if k in ("union", "side_output"):
        return PassThrough(name)
    if k == "map":
        return MapOperator(name, p["fn"], p.get("output"))
    if k == "filter":
        return FilterOperator(name, p["fn"])
    if k == "flat_map":
        return FlatMapOperator(name, p["fn"])
    if k == "process":
        return ProcessOperator(name, p["fn"], key)
    if k == "co_process":
        return CoProcessOperator(name, p["fn"], key)
    if k == "broadcast_process":
        return BroadcastProcessOperator(name, p["fn"], p["descriptors"], key)
    if k == "rolling":
        return RollingOperator(name, key, p.get("reduce"), p.get("op"), p.get("field"))
    if k == "sink":
        return SinkOperator(name, p["sink"])
    if k == "timestamps":
        return TimestampsOperator(name, p["watermark_strategy"], p["per_record"])
    if k == "window":
        assigner, trigger, (kind, fn) = p["assigner"], p["trigger"], p["function"]
        evictor = p.get("evictor")
        if kind == "aggregate" and isinstance(fn, Aggregations) and isinstance(assigner, SlidingEventTimeWindows) \
                and assigner.event_time and trigger.vectorized and evictor is None:
            op = columnar_window_operator(name, assigner, fn, key, p["allowed_lateness"], p["late_tag"])
            op.trigger = trigger  # asked for whole batches of windows (Trigger.on_event_time_batch)
            return op
        return WindowOperator(name, assigner, trigger, (kind, fn), key, p["allowed_lateness"], p["late_tag"],
                              evictor)
    raise ValueError(f"stream: unknown transformation kind {k!r}")


def _aligned_pauses(sources) -> set:
    """Watermark alignment (``WatermarkStrategy.with_watermark_alignment``): the
    source subtasks to skip this round, those ahead of their group's minimum
    watermark (over its unfinished, non-idle members, taken at the start of
    the round) by more than the group's drift."""
    groups: dict = {}
    for s in sources:
        g = s.strategy.alignment_group
        if g is not None and not s.finished and not s.idle:
            groups.setdefault(g, []).append(s)
    paused = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        low = min(s.current_watermark() for s in members)
        for s in members:
            if s.current_watermark() - s.strategy.max_allowed_drift_ms > low:
                paused.add(s)
    return paused


def connect_edges(transformations: list[Transformation], nodes: dict) -> None:
    """One ``_Edge`` per input of each operator (numbered in graph order, the channels' names), added
    to the outputs of its upstream subtasks and to the input channels of its downstream ones."""
    edge_idx = 0
    for t in transformations:
        for input_index, inp in enumerate(t.inputs):
            e = _Edge(edge_idx, nodes[inp.upstream.id], nodes[t.id], inp, input_index)
            edge_idx += 1
            for r in e.up.runners:
                r.out.edges.append(e)
            for i, r in enumerate(e.down.runners):
                for ch in e.channels_of(i):
                    r.add_channel(ch)


def run_job(env, transformations: list[Transformation], job_name: str, restore_from=None,
            control=None, allow_non_restored_state: bool = False) -> JobExecutionResult:
    if not any(t.kind == "sink" for t in transformations):
        raise ValueError(f"execute({job_name!r}): the job has no sink (add sink_to, collect or print)")
    from opforge.stream.checkpoint import resolve_restore_path

    restore_path = None
    if restore_from is not None:
        cfg = getattr(env, "checkpoint_config", None)
        # the job's own checkpoint directory, not made yet: a first start
        first_start = cfg is not None and not os.path.exists(restore_from) and \
            os.path.abspath(os.fspath(restore_from)) == os.path.abspath(cfg.checkpoint_dir)
        if not first_start:
            restore_path = resolve_restore_path(restore_from)
    t0 = _time.perf_counter()
    nodes = {t.id: _Node(t) for t in transformations}
    sources = []
    for t in transformations:
        node = nodes[t.id]
        if t.kind == "source":
            splits = t.params["source"].splits(t.parallelism, env.batch_size, env.device)
            node.runners = [_SourceRunner(node, i, positioned(s), env, node.metrics[i])
                            for i, s in enumerate(splits)]
            sources.extend(node.runners)
            continue
        key = next((inp.key for inp in t.inputs if inp.key is not None), None)
        for i in range(t.parallelism):
            op = build_operator(t, key)
            op.setup(None, i, t.parallelism, env.clock, env.device)
            op.state_budget = getattr(env, "state_budget", None)  # columnar keyed state over a budget
            node.runners.append(_Runner(node, i, op, node.metrics[i]))
            op.out = node.runners[-1].out
    connect_edges(transformations, nodes)
    ordered = [nodes[t.id] for t in transformations if t.kind != "source"]
    merging = [n for n in ordered if len(n.t.inputs) > 1]  # topological: a flush feeds only later ones
    for n in ordered:
        for r in n.runners:
            with _attributed(r.op):
                r.op.open()
            if isinstance(r.op, SinkOperator) and callable(getattr(r.op.sink, "open", None)):
                r.op.sink.open(r.index, n.t.parallelism)
    try:
        coordinator = CheckpointCoordinator(env, transformations, nodes, job_name)
        if restore_path is not None:
            coordinator.restore(restore_path, allow_non_restored_state)
        if control is not None:
            control.attach(nodes, coordinator)
        clock = env.clock
        stopped = False
        while not all(s.finished for s in sources):
            clock.tick()
            now = clock.now()
            for n in ordered:
                for r in n.runners:
                    with _attributed(r.op):
                        r.op.on_processing_time(now)
            paused = _aligned_pauses(sources)
            for s in sources:
                s.polled_records = False
                if s.finished:
                    continue
                if s in paused:
                    s.metrics.alignment_pauses += 1
                    continue
                s.poll(now)
                for n in merging:
                    for r in n.runners:
                        r.flush()
            if isinstance(clock, SystemClock) and not any(s.polled_records for s in sources):
                _time.sleep(0.001)  # every source waits for input (a monitored directory): do not spin
            if coordinator.due():
                coordinator.checkpoint()
            if control is not None and control.at_barrier(coordinator):
                stopped = True  # stop-with-savepoint: no end-of-input watermark, no finish
                break
        if not stopped:
            if coordinator.config is not None:
                coordinator.checkpoint()  # the final checkpoint commits the last output
            for n in ordered:
                for r in n.runners:
                    with _attributed(r.op):
                        r.op.finish()
            if control is not None:
                control.at_barrier(coordinator, finished=True)
    finally:  # finished, failed, cancelled or stopped: operators free what they hold outside the job
        for n in ordered:
            for r in n.runners:
                dispose = getattr(r.op, "dispose", None)
                if callable(dispose):
                    dispose()
    metrics = {}
    for t in transformations:
        ms = nodes[t.id].metrics
        agg = OperatorMetrics(sum(m.records_in for m in ms), sum(m.records_out for m in ms),
                              sum(m.batches_in for m in ms), sum(m.busy_ms for m in ms))
        agg.alignment_pauses = sum(m.alignment_pauses for m in ms)
        for r in nodes[t.id].runners:
            late = getattr(getattr(r, "op", None), "late", None)
            if late is not None:
                agg.late_records_dropped += late.dropped
        metrics[t.name if t.name not in metrics else f"{t.name}#{t.id}"] = agg
    source_records = sum(m.records_out for t in transformations if t.kind == "source" for m in nodes[t.id].metrics)
    return JobExecutionResult(job_name, (_time.perf_counter() - t0) * 1000, metrics, source_records,
                              coordinator.completed, restore_path)
