"""The DataStream API (Flink's model) executed in columnar micro-batches:
``env = opforge.stream.StreamExecutionEnvironment(device=..., parallelism=...)``."""

from opforge.stream.broadcast_state import (BroadcastProcessFunction, BroadcastStream,
                                            KeyedBroadcastProcessFunction)
from opforge.stream.checkpoint import (CheckpointConfig, CheckpointRestoreError,
                                       CheckpointSerializationError)
from opforge.stream.coordinator import MissingUidWarning
from opforge.stream.datastream import ConnectedStreams, DataStream, KeyedStream, WindowedStream
from opforge.stream.evictors import CountEvictor, Evictor, TimeEvictor
from opforge.stream.environment import StreamExecutionEnvironment
from opforge.stream.executor import JobExecutionResult
from opforge.stream.functions import (AggregateFunction, Aggregations, CoGroupFunction, CoProcessFunction,
                                      FilterFunction, FlatJoinFunction, FlatMapFunction, JoinFunction,
                                      KeyedCoProcessFunction, KeyedProcessFunction, MapFunction,
                                      ProcessFunction, ProcessJoinFunction, ProcessWindowFunction,
                                      ReduceFunction, RuntimeContext, TimestampedValue, vectorized)
from opforge.stream.file_sink import FileSink, read_committed
from opforge.stream.nats_sink import NatsSink
from opforge.stream.nats_source import NatsSource
from opforge.stream.file_source import FileSource
from opforge.stream.graph import OutputTag
from opforge.stream.job_client import JobCancellationException, JobClient, JobStatus
from opforge.stream.joins import (CoGroupedStreams, IntervalJoin, IntervalJoined, JoinedStreams)
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema, Row
from opforge.stream.restart import RestartStrategies, RestartStrategy
from opforge.stream.sinks import CallbackSink, CollectSink, PrintSink, Sink
from opforge.stream.sources import (ArrowSource, CollectionSource, IteratorSource, NumberSequenceSource,
                                    Source, SourceSplit, SplitSource)
from opforge.stream.state import (AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor,
                                  ReducingStateDescriptor, StateTtlConfig, ValueStateDescriptor)
from opforge.stream.state_budget import StateBudget
from opforge.stream.state_types import register_state_type
from opforge.stream.time import (MAX_WATERMARK, MIN_WATERMARK, SimulatedClock, SystemClock,
                                 TimestampAssigner, WatermarkStrategy)
from opforge.stream.types import Types
from opforge.stream.triggers import (CountTrigger, EventTimeTrigger, ProcessingTimeTrigger, PurgingTrigger, Trigger,
                                     TriggerResult)
from opforge.stream.windows import (EventTimeSessionWindows, GlobalWindows, ProcessingTimeSessionWindows,
                                    SlidingEventTimeWindows, SlidingProcessingTimeWindows, TimeWindow,
                                    TumblingEventTimeWindows, TumblingProcessingTimeWindows)

__all__ = [
    "AggregateFunction", "AggregatingStateDescriptor", "Aggregations", "ArrowSource", "Batch",
    "BroadcastProcessFunction", "BroadcastStream", "CallbackSink",
    "CheckpointConfig", "CheckpointRestoreError", "CheckpointSerializationError", "CoGroupFunction",
    "MissingUidWarning",
    "CoGroupedStreams", "CoProcessFunction", "CollectSink", "CollectionSource", "ConnectedStreams",
    "CountEvictor", "CountTrigger", "DataStream", "EventTimeSessionWindows", "EventTimeTrigger", "Evictor",
    "FileSink", "FileSource", "NatsSink", "NatsSource", "FilterFunction", "FlatJoinFunction", "FlatMapFunction", "GlobalWindows",
    "IntervalJoin", "IntervalJoined", "IteratorSource", "JobCancellationException", "JobClient",
    "JobExecutionResult", "JobStatus", "JoinFunction", "JoinedStreams", "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction", "KeyedStream", "ListStateDescriptor", "MAX_WATERMARK", "MIN_WATERMARK",
    "MapFunction", "MapStateDescriptor", "NO_TIMESTAMP", "NumberSequenceSource", "OutputTag", "PrintSink",
    "ProcessFunction", "ProcessJoinFunction", "ProcessWindowFunction", "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger", "PurgingTrigger", "RecordSchema", "ReduceFunction", "ReducingStateDescriptor",
    "RestartStrategies", "RestartStrategy", "Row", "RuntimeContext", "SimulatedClock", "Sink",
    "SlidingEventTimeWindows", "SlidingProcessingTimeWindows",
    "Source", "SourceSplit", "SplitSource", "StateBudget", "StateTtlConfig", "StreamExecutionEnvironment",
    "SystemClock", "TimeEvictor", "TimeWindow", "TimestampAssigner", "TimestampedValue", "Trigger",
    "TriggerResult", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "Types", "ValueStateDescriptor",
    "WatermarkStrategy", "WindowedStream", "read_committed", "register_state_type", "vectorized",
]
