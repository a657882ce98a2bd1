"""``DataStream``, ``KeyedStream`` and ``WindowedStream``: Flink's
DataStream API. Each call adds a transformation to the environment's job
graph; nothing runs until ``env.execute()``.
"""

from __future__ import annotations

import dataclasses

from opforge.stream.broadcast_state import BroadcastConnectedStream, BroadcastStream, broadcast_descriptors
from opforge.stream.evictors import Evictor
from opforge.stream.functions import AggregateFunction, ProcessWindowFunction, is_vectorized
from opforge.stream.graph import Input, OutputTag, Transformation
from opforge.stream.joins import CoGroupedStreams, IntervalJoin, JoinedStreams
from opforge.stream.keys import KeySelector, KeySpace
from opforge.stream.partitioning import (BroadcastPartitioner, CustomPartitioner, ForwardPartitioner,
                                         KeyGroupPartitioner, Partitioner, RebalancePartitioner,
                                         RescalePartitioner, ShufflePartitioner)
from opforge.stream.sinks import CollectIterator, CollectSink, PrintSink, Sink
from opforge.stream.time import WatermarkStrategy
from opforge.stream.types import checked_type
from opforge.stream.triggers import CountTrigger, NeverTrigger, PurgingTrigger, Trigger
from opforge.stream.windows import GlobalWindows, WindowAssigner


class DataStream:
    def __init__(self, env, transformation: Transformation, partitioner: Partitioner | None = None,
                 key: KeySelector | None = None):
        self.env = env
        self.transformation = transformation
        self._partitioner = partitioner
        self._key = key

    # -- plumbing -------------------------------------------------------------
    def _input(self) -> Input:
        return Input(self.transformation, self._partitioner, self._key)

    def _add(self, kind: str, name: str, params: dict, inputs=None, parallelism=None) -> "DataStream":
        t = self.env._add_transformation(kind, name, params, inputs or [self._input()],
                                         parallelism or self.env.parallelism)
        return DataStream(self.env, t)

    def name(self, name: str) -> "DataStream":
        self.transformation.name = name
        return self

    def get_name(self) -> str:
        return self.transformation.name

    def uid(self, uid: str) -> "DataStream":
        """The id this operator's state is stored under in checkpoints and
        savepoints (Flink's ``uid``): state is matched by it on restore, so it
        survives changes to the job graph around the operator. Without one the
        id comes from the operator's place in the graph."""
        if not isinstance(uid, str) or not uid:
            raise ValueError(f"{self.transformation.name}.uid: expected a non-empty str, got {uid!r}")
        other = next((t for t in self.env.transformations if t.uid == uid and t is not self.transformation), None)
        if other is not None:
            raise ValueError(f"uid {uid!r} is already the uid of operator {other.name!r}: "
                             "uids must be unique within a job")
        self.transformation.uid = uid
        return self

    def get_uid(self) -> str | None:
        return self.transformation.uid

    def set_parallelism(self, parallelism: int) -> "DataStream":
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(f"{self.transformation.name}.set_parallelism: expected a positive int, "
                             f"got {parallelism!r}")
        limit = self.transformation.params.get("max_parallelism")
        if limit is not None and parallelism > limit:
            raise ValueError(f"{self.transformation.name}: this source runs with parallelism {limit} at most")
        self.transformation.parallelism = parallelism
        return self

    def get_parallelism(self) -> int:
        return self.transformation.parallelism

    # -- transformations ----------------------------------------------------
    def map(self, func, output_type=None) -> "DataStream":
        """``output_type``: a ``Types`` value (PyFlink's), or for a ``@vectorized``
        function the dataclass its columns make."""
        if isinstance(output_type, type) and dataclasses.is_dataclass(output_type):
            return self._add("map", "Map", {"fn": func, "output": output_type})
        return self._add("map", "Map", {"fn": func, "output_type": _typed(output_type, "map")})

    def filter(self, func) -> "DataStream":
        return self._add("filter", "Filter", {"fn": func})

    def flat_map(self, func, output_type=None) -> "DataStream":
        return self._add("flat_map", "FlatMap", {"fn": func, "output_type": _typed(output_type, "flat_map")})

    def process(self, func, output_type=None) -> "DataStream":
        if not hasattr(func, "process_element"):
            raise TypeError("process: expected a ProcessFunction (an object with process_element)")
        return self._add("process", "Process", {"fn": func, "output_type": _typed(output_type, "process")})

    def key_by(self, key_selector, key_type=None) -> "KeyedStream":
        key = KeySelector(_keyed_as(key_selector, key_type, "key_by"), "key_by")
        return KeyedStream(self.env, self.transformation, KeyGroupPartitioner(), key)

    def assign_timestamps_and_watermarks(self, watermark_strategy: WatermarkStrategy) -> "DataStream":
        """Timestamps and watermarks from here on (Flink's
        ``TimestampsAndWatermarksOperator``): the strategy's assigner stamps
        each record, its generator makes the watermarks (after every record
        with ``watermark_granularity="record"``); watermarks from upstream are
        dropped, except the end of input's."""
        if not isinstance(watermark_strategy, WatermarkStrategy):
            raise TypeError(f"assign_timestamps_and_watermarks: expected a WatermarkStrategy, "
                            f"got {type(watermark_strategy).__name__}")
        params = {"watermark_strategy": watermark_strategy,
                  "per_record": self.env.watermark_granularity == "record"}
        return self._add("timestamps", "Timestamps/Watermarks", params, parallelism=self.transformation.parallelism)

    def union(self, *streams: "DataStream") -> "DataStream":
        for s in streams:
            if not isinstance(s, DataStream):
                raise TypeError(f"union: expected DataStreams, got {type(s).__name__}")
        inputs = [self._input()] + [s._input() for s in streams]
        return self._add("union", "Union", {}, inputs)

    def connect(self, other: "DataStream"):
        """Two streams into one co-process function; with a ``BroadcastStream``,
        the broadcast state pattern (``broadcast_state.py``)."""
        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self, other)
        if not isinstance(other, DataStream):
            raise TypeError(f"connect: expected a DataStream, got {type(other).__name__}")
        return ConnectedStreams(self, other)

    def join(self, other: "DataStream"):
        """A window join (Flink's ``JoinedStreams``): ``.where(key).equal_to(key)
        .window(assigner).apply(join_function)``; see ``opforge.stream.joins``."""
        return JoinedStreams(self, _other_stream(other, "JoinedStreams"))

    def co_group(self, other: "DataStream"):
        """Flink's ``CoGroupedStreams``: ``.where(key).equal_to(key).window(assigner)
        .apply(co_group_function)`` sees both inputs' records of a key and window."""
        return CoGroupedStreams(self, _other_stream(other, "CoGroupedStreams"))

    def get_side_output(self, tag: OutputTag) -> "DataStream":
        if not isinstance(tag, OutputTag):
            raise TypeError(f"get_side_output: expected an OutputTag, got {type(tag).__name__}")
        inp = Input(self.transformation, ForwardPartitioner(), None, tag)
        return self._add("side_output", f"SideOutput({tag.tag_id})", {"tag": tag}, [inp],
                         self.transformation.parallelism)

    # -- partitioning (costs: see opforge.stream.partitioning) -----------------
    def _with(self, partitioner) -> "DataStream":
        return DataStream(self.env, self.transformation, partitioner)

    def forward(self) -> "DataStream":
        return self._with(ForwardPartitioner())

    def rebalance(self) -> "DataStream":
        return self._with(RebalancePartitioner())

    def rescale(self) -> "DataStream":
        return self._with(RescalePartitioner())

    def shuffle(self) -> "DataStream":
        return self._with(ShufflePartitioner())

    def broadcast(self, *broadcast_state_descriptors):
        """Every record to every downstream subtask; with ``MapStateDescriptor``s,
        a ``BroadcastStream`` for ``connect`` (broadcast state)."""
        stream = self._with(BroadcastPartitioner())
        if not broadcast_state_descriptors:
            return stream
        return BroadcastStream(stream, broadcast_descriptors(broadcast_state_descriptors, "broadcast"))

    def partition_custom(self, partitioner, key_selector) -> "DataStream":
        if not callable(getattr(partitioner, "partition", partitioner)):
            raise TypeError("partition_custom: expected partitioner(key, num_partitions) -> int")
        fn = getattr(partitioner, "partition", partitioner)
        return self._with(CustomPartitioner(fn, KeySelector(key_selector, "partition_custom")))

    # -- sinks --------------------------------------------------------------
    def sink_to(self, sink: Sink) -> "DataStream":
        if not isinstance(sink, Sink):
            raise TypeError(f"sink_to: expected a Sink, got {type(sink).__name__}")
        return self._add("sink", f"Sink({type(sink).__name__})", {"sink": sink},
                         parallelism=self.transformation.parallelism)

    def add_sink(self, fn) -> "DataStream":
        from opforge.stream.sinks import CallbackSink

        return self.sink_to(fn if isinstance(fn, Sink) else CallbackSink(fn))

    def print(self, prefix: str = "") -> "DataStream":
        return self.sink_to(PrintSink(prefix))

    def collect(self) -> CollectSink:
        """A ``CollectSink`` filled by the next ``env.execute()``."""
        sink = CollectSink()
        self.sink_to(sink)
        return sink

    def execute_and_collect(self, job_name: str = "collect", limit: int | None = None) -> CollectIterator:
        """Run the job; a closeable iterator over its records (``limit``: the
        first ``limit`` only, then a list, as PyFlink's)."""
        sink = self.collect()
        self.env.execute(job_name)
        if limit is not None:
            return sink.records()[:limit]
        return CollectIterator(sink.records())


class KeyedStream(DataStream):
    """A stream partitioned by key: keyed state, timers, rolling aggregates and windows."""

    def _keyed(self, kind, name, params) -> DataStream:
        return self._add(kind, name, params)

    def uid(self, uid: str) -> DataStream:
        raise TypeError("KeyedStream.uid: key_by adds no operator of its own; set the uid on the "
                        "operator that follows it (e.g. key_by(...).process(fn).uid(...))")

    def process(self, func, output_type=None) -> DataStream:
        if not hasattr(func, "process_element"):
            raise TypeError("KeyedStream.process: expected a KeyedProcessFunction (with process_element)")
        return self._keyed("process", "KeyedProcess", {"fn": func,
                                                       "output_type": _typed(output_type, "KeyedStream.process")})

    def reduce(self, func) -> DataStream:
        return self._keyed("rolling", "Reduce", {"reduce": func})

    def _rolling(self, op, position_to_sum) -> DataStream:
        if not isinstance(position_to_sum, (int, str)):
            raise TypeError(f"KeyedStream.{op}: expected a field name or position, got {position_to_sum!r}")
        return self._keyed("rolling", op.capitalize(), {"op": op, "field": position_to_sum})

    def sum(self, position_to_sum=0) -> DataStream:
        return self._rolling("sum", position_to_sum)

    def min(self, position_to_min=0) -> DataStream:
        return self._rolling("min", position_to_min)

    def max(self, position_to_max=0) -> DataStream:
        return self._rolling("max", position_to_max)

    def interval_join(self, other: "KeyedStream"):
        """An interval join with another keyed stream (Flink's ``IntervalJoin``):
        ``.between(lower, upper).process(ProcessJoinFunction)``; see ``opforge.stream.joins``."""
        if not isinstance(other, KeyedStream):
            raise TypeError(f"interval_join: the right input must be a KeyedStream (key_by first), "
                            f"got {type(other).__name__}")
        return IntervalJoin(self, other)

    def window(self, assigner: WindowAssigner) -> "WindowedStream":
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"KeyedStream.window: expected a WindowAssigner, got {type(assigner).__name__}")
        return WindowedStream(self, assigner)

    def count_window(self, size: int) -> "WindowedStream":
        """Flink's count window: every ``size`` records of a key, then purge."""
        return self.window(GlobalWindows.create()).trigger(PurgingTrigger.of(CountTrigger.of(size)))


def _typed(output_type, where: str):
    return checked_type(output_type, f"{where}(output_type=...)")


def _keyed_as(selector, key_type, where: str):
    """A key selector whose keys are conformed to ``key_type`` (checked; a
    column name or position is read as is: its column has one type)."""
    key_type = checked_type(key_type, f"{where}(key_type=...)")
    if key_type is None or isinstance(selector, (str, int)) or not callable(selector):
        return selector
    if is_vectorized(selector):
        return selector

    def typed_key(record):
        return key_type.conform(selector(record), where)

    return typed_key


def _other_stream(other, api: str):
    if not isinstance(other, DataStream):
        raise TypeError(f"{api}: expected a DataStream to join with, got {type(other).__name__}")
    return other


class WindowedStream:
    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner):
        self.keyed = keyed
        self.assigner = assigner
        self._trigger = assigner.get_default_trigger()
        self._lateness = 0
        self._late_tag = None
        self._evictor = None

    def trigger(self, trigger: Trigger) -> "WindowedStream":
        if not isinstance(trigger, Trigger):
            raise TypeError(f"WindowedStream.trigger: expected a Trigger, got {type(trigger).__name__}")
        if self.assigner.merging and not trigger.can_merge():
            raise TypeError(f"WindowedStream.trigger: {type(self.assigner).__name__} merges windows and "
                            f"{type(trigger).__name__} cannot merge (define can_merge / on_merge)")
        self._trigger = trigger
        return self

    def evictor(self, evictor: Evictor) -> "WindowedStream":
        """Drop records of a firing window before / after its function
        (``CountEvictor``, ``TimeEvictor``); the window keeps its records."""
        if not isinstance(evictor, Evictor):
            raise TypeError(f"WindowedStream.evictor: expected an Evictor, got {type(evictor).__name__}")
        self._evictor = evictor
        return self

    def allowed_lateness(self, time_ms) -> "WindowedStream":
        from opforge.stream.time import _millis

        self._lateness = _millis(time_ms, "WindowedStream.allowed_lateness")
        return self

    def side_output_late_data(self, tag: OutputTag) -> "WindowedStream":
        if not isinstance(tag, OutputTag):
            raise TypeError(f"side_output_late_data: expected an OutputTag, got {type(tag).__name__}")
        self._late_tag = tag
        return self

    def _apply(self, name, function, output_type=None) -> DataStream:
        if isinstance(self._trigger, NeverTrigger):
            raise ValueError(f"{name}: GlobalWindows never fire without a trigger (e.g. CountTrigger.of(n))")
        params = {"assigner": self.assigner, "trigger": self._trigger, "function": function,
                  "allowed_lateness": self._lateness, "late_tag": self._late_tag, "evictor": self._evictor,
                  "output_type": _typed(output_type, name)}
        return self.keyed._keyed("window", name, params)

    def aggregate(self, aggregate_function: AggregateFunction, window_function=None, accumulator_type=None,
                  output_type=None) -> DataStream:
        """``accumulator_type`` is checked and not needed (accumulators stay Python
        values or columns); ``window_function`` (PyFlink's) is not supported."""
        if window_function is not None:
            raise TypeError("WindowedStream.aggregate: window_function is not supported; use process() "
                            "with a ProcessWindowFunction that folds the elements")
        _typed(accumulator_type, "WindowedStream.aggregate(accumulator_type)")
        for m in ("create_accumulator", "add", "get_result", "merge"):
            if not hasattr(aggregate_function, m):
                raise TypeError(f"WindowedStream.aggregate: the AggregateFunction lacks {m}()")
        return self._apply("WindowAggregate", ("aggregate", aggregate_function), output_type)

    def reduce(self, reduce_function, window_function=None, output_type=None) -> DataStream:
        if window_function is not None:
            raise TypeError("WindowedStream.reduce: window_function is not supported; use process()")
        return self._apply("WindowReduce", ("reduce", reduce_function), output_type)

    def process(self, process_window_function: ProcessWindowFunction, output_type=None) -> DataStream:
        if not hasattr(process_window_function, "process"):
            raise TypeError("WindowedStream.process: expected a ProcessWindowFunction")
        return self._apply("WindowProcess", ("process", process_window_function), output_type)


class ConnectedStreams:
    """Two streams processed together by one ``CoProcessFunction``; after
    ``key_by(key1, key2)`` records of equal keys meet in the same subtask and
    share keyed state and timers."""

    def __init__(self, first: DataStream, second: DataStream):
        self.first, self.second = first, second

    def key_by(self, key_selector1, key_selector2, key_type=None) -> "ConnectedStreams":
        space = KeySpace()
        k1 = KeySelector(_keyed_as(key_selector1, key_type, "connect.key_by"), "connect.key_by", space)
        k2 = KeySelector(_keyed_as(key_selector2, key_type, "connect.key_by"), "connect.key_by", space)
        return ConnectedStreams(KeyedStream(self.first.env, self.first.transformation, KeyGroupPartitioner(), k1),
                                KeyedStream(self.second.env, self.second.transformation, KeyGroupPartitioner(), k2))

    def process(self, func, output_type=None) -> DataStream:
        for m in ("process_element1", "process_element2"):
            if not hasattr(func, m):
                raise TypeError(f"ConnectedStreams.process: expected a CoProcessFunction with {m}()")
        keyed = [s._key is not None for s in (self.first, self.second)]
        if keyed[0] != keyed[1]:
            raise ValueError("ConnectedStreams.process: key both inputs (connect(...).key_by(k1, k2)) or neither")
        name = "KeyedCoProcess" if keyed[0] else "CoProcess"
        return self.first._add("co_process", name, {"fn": func, "output_type": _typed(output_type, name)},
                               [self.first._input(), self.second._input()])
