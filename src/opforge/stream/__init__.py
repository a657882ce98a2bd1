"""The DataStream API (Flink's model) executed in columnar micro-batches:
``env = opforge.stream.StreamExecutionEnvironment(device=..., parallelism=...)``."""

from opforge.stream.datastream import ConnectedStreams, DataStream, KeyedStream, WindowedStream
from opforge.stream.environment import StreamExecutionEnvironment
from opforge.stream.executor import JobExecutionResult
from opforge.stream.functions import (AggregateFunction, Aggregations, CoProcessFunction, FilterFunction,
                                      FlatMapFunction, KeyedCoProcessFunction, KeyedProcessFunction,
                                      MapFunction, ProcessFunction, ProcessWindowFunction, ReduceFunction,
                                      RuntimeContext, vectorized)
from opforge.stream.graph import OutputTag
from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema
from opforge.stream.sinks import CallbackSink, CollectSink, PrintSink, Sink
from opforge.stream.sources import (ArrowSource, CollectionSource, IteratorSource, NumberSequenceSource,
                                    Source, SplitSource)
from opforge.stream.state import (AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor,
                                  ReducingStateDescriptor, StateTtlConfig, ValueStateDescriptor)
from opforge.stream.time import (MAX_WATERMARK, MIN_WATERMARK, SimulatedClock, SystemClock,
                                 TimestampAssigner, WatermarkStrategy)
from opforge.stream.windows import (CountTrigger, EventTimeSessionWindows, EventTimeTrigger, GlobalWindows,
                                    ProcessingTimeSessionWindows, ProcessingTimeTrigger, PurgingTrigger,
                                    SlidingEventTimeWindows, SlidingProcessingTimeWindows, TimeWindow,
                                    TumblingEventTimeWindows, TumblingProcessingTimeWindows)

__all__ = [
    "AggregateFunction", "AggregatingStateDescriptor", "Aggregations", "ArrowSource", "Batch",
    "CallbackSink", "CoProcessFunction", "CollectSink", "CollectionSource", "ConnectedStreams", "CountTrigger", "DataStream",
    "EventTimeSessionWindows", "EventTimeTrigger", "FilterFunction", "FlatMapFunction", "GlobalWindows",
    "IteratorSource", "JobExecutionResult", "KeyedCoProcessFunction", "KeyedProcessFunction", "KeyedStream", "ListStateDescriptor",
    "MAX_WATERMARK", "MIN_WATERMARK", "MapFunction", "MapStateDescriptor", "NO_TIMESTAMP",
    "NumberSequenceSource", "OutputTag", "PrintSink", "ProcessFunction", "ProcessWindowFunction",
    "ProcessingTimeSessionWindows", "ProcessingTimeTrigger", "PurgingTrigger", "RecordSchema",
    "ReduceFunction", "ReducingStateDescriptor", "RuntimeContext", "SimulatedClock", "Sink",
    "SlidingEventTimeWindows", "SlidingProcessingTimeWindows", "Source", "SplitSource", "StateTtlConfig",
    "StreamExecutionEnvironment", "SystemClock", "TimeWindow", "TimestampAssigner",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "ValueStateDescriptor", "WatermarkStrategy",
    "WindowedStream", "vectorized",
]
