"""``StreamExecutionEnvironment``: where a job is built and run (Flink's name).

``device`` holds the micro-batches' columns (CPU or a GPU), ``parallelism``
is the default number of subtasks per operator, ``batch_size`` the records a
source subtask polls at a time, ``clock`` the source of processing time.
"""

from __future__ import annotations

import torch

from opforge.stream.datastream import DataStream
from opforge.stream.executor import JobExecutionResult, run_job
from opforge.stream.graph import Transformation
from opforge.stream.sources import ArrowSource, CollectionSource, IteratorSource, Source
from opforge.stream.time import SystemClock, WatermarkStrategy


class StreamExecutionEnvironment:
    def __init__(self, device=None, parallelism: int = 1, batch_size: int = 1024, clock=None):
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(f"StreamExecutionEnvironment: parallelism must be a positive int, got {parallelism!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"StreamExecutionEnvironment: batch_size must be a positive int, got {batch_size!r}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.parallelism = parallelism
        self.batch_size = batch_size
        self.clock = clock or SystemClock()
        self.transformations: list[Transformation] = []
        self._next_id = 0

    @staticmethod
    def get_execution_environment(**kwargs) -> "StreamExecutionEnvironment":
        return StreamExecutionEnvironment(**kwargs)

    def set_parallelism(self, parallelism: int) -> "StreamExecutionEnvironment":
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(f"set_parallelism: expected a positive int, got {parallelism!r}")
        self.parallelism = parallelism
        return self

    def _add_transformation(self, kind, name, params, inputs, parallelism) -> Transformation:
        t = Transformation(self._next_id, kind, name, parallelism, inputs, params)
        self._next_id += 1
        self.transformations.append(t)
        return t

    def from_source(self, source: Source, watermark_strategy: WatermarkStrategy | None = None,
                    source_name: str = "Source") -> DataStream:
        if not isinstance(source, Source):
            raise TypeError(f"from_source: expected a Source, got {type(source).__name__}")
        strategy = watermark_strategy or WatermarkStrategy.no_watermarks()
        if not isinstance(strategy, WatermarkStrategy):
            raise TypeError(f"from_source: expected a WatermarkStrategy, got {type(strategy).__name__}")
        p = self.parallelism if source.max_parallelism is None else min(self.parallelism, source.max_parallelism)
        t = self._add_transformation("source", source_name,
                                     {"source": source, "watermark_strategy": strategy,
                                      "max_parallelism": source.max_parallelism}, [], p)
        return DataStream(self, t)

    def from_collection(self, collection, watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        """A non-parallel source over a Python sequence (Flink's fromCollection)."""
        src = CollectionSource(collection)
        src.max_parallelism = 1
        return self.from_source(src, watermark_strategy, "Collection Source")

    def from_iterator(self, factory, watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self.from_source(IteratorSource(factory), watermark_strategy, "Iterator Source")

    def from_arrow(self, batches, watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self.from_source(ArrowSource(batches), watermark_strategy, "Arrow Source")

    def execute(self, job_name: str = "opforge stream job") -> JobExecutionResult:
        """Run the job to the end of its (bounded) input; the graph is then cleared."""
        transformations, self.transformations = self.transformations, []
        return run_job(self, transformations, job_name)
