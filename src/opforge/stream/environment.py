"""``StreamExecutionEnvironment``: where a job is built and run (Flink's name).

``device`` holds the micro-batches' columns (CPU or a GPU), ``parallelism``
is the default number of subtasks per operator, ``batch_size`` the records a
source subtask polls at a time, ``clock`` the source of processing time.
``watermark_granularity``: ``"record"`` (the default) — inside a
micro-batch each record sees the watermark the records before it produced,
so lateness, window firings and timers give the same output at every batch
size (Flink with a watermark after every record); ``"batch"`` — the
watermark advances only between micro-batches (fewer, larger steps; the
output then depends on where the input's batches end).
``enable_checkpointing`` makes the job fault tolerant (``checkpoint.py``);
``execute(restore_from=...)`` resumes one; ``execute_async`` runs it in the
background behind a ``JobClient``. ``set_state_budget`` bounds the device
memory of columnar keyed state (spilling to host memory, then disk).
``cluster`` (an ``opforge.cluster`` cluster) runs the job on its workers
(``cluster/stream_job.py``): keyed state in key-group regions placed by the
placement driver, parallelism by default two key-group ranges per worker.
"""

from __future__ import annotations

import os

import torch

from opforge.stream.checkpoint import CheckpointConfig
from opforge.stream.state_budget import StateBudget
from opforge.stream.datastream import DataStream
from opforge.stream.executor import JobExecutionResult, run_job
from opforge.stream.graph import Transformation
from opforge.stream.restart import RestartStrategy, run_restarting
from opforge.stream.sources import ArrowSource, CollectionSource, IteratorSource, Source
from opforge.stream.time import WATERMARK_GRANULARITIES, SystemClock, WatermarkStrategy
from opforge.stream.types import checked_type


class StreamExecutionEnvironment:
    def __init__(self, device=None, parallelism: int | None = None, batch_size: int = 1024, clock=None,
                 watermark_granularity: str = "record", cluster=None):
        if parallelism is None:
            parallelism = 1 if cluster is None else cluster.regions_per_table
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(f"StreamExecutionEnvironment: parallelism must be a positive int, got {parallelism!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"StreamExecutionEnvironment: batch_size must be a positive int, got {batch_size!r}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.parallelism = parallelism
        if watermark_granularity not in WATERMARK_GRANULARITIES:
            raise ValueError("StreamExecutionEnvironment: watermark_granularity must be one of "
                             f"{WATERMARK_GRANULARITIES}, got {watermark_granularity!r}")
        self.batch_size = batch_size
        self.watermark_granularity = watermark_granularity
        self.clock = clock or SystemClock()
        self.transformations: list[Transformation] = []
        self._next_id = 0
        self.checkpoint_config: CheckpointConfig | None = None
        self.state_budget: StateBudget | None = None
        self.restart_strategy: RestartStrategy | None = None
        self.cluster = cluster

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
                    source_name: str = "Source", type_info=None) -> DataStream:
        if not isinstance(source, Source):
            raise TypeError(f"from_source: expected a Source, got {type(source).__name__}")
        strategy = watermark_strategy or WatermarkStrategy.no_watermarks()
        if not isinstance(strategy, WatermarkStrategy):
            raise TypeError(f"from_source: expected a WatermarkStrategy, got {type(strategy).__name__}")
        p = self.parallelism if source.max_parallelism is None else min(self.parallelism, source.max_parallelism)
        t = self._add_transformation("source", source_name,
                                     {"source": source, "watermark_strategy": strategy,
                                      "max_parallelism": source.max_parallelism,
                                      "output_type": checked_type(type_info, f"{source_name}(type_info=...)")},
                                     [], p)
        return DataStream(self, t)

    def from_collection(self, collection, type_info=None,
                        watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        """A source over a Python sequence (Flink's fromCollection): one subtask,
        unless ``set_parallelism(n)`` deals its micro-batches round-robin to ``n``.
        ``type_info``: a ``Types`` value the records are checked and shaped by
        (a WatermarkStrategy in its place is taken as ``watermark_strategy``)."""
        if isinstance(type_info, WatermarkStrategy):
            type_info, watermark_strategy = None, type_info
        stream = self.from_source(CollectionSource(collection), watermark_strategy, "Collection Source", type_info)
        stream.transformation.parallelism = 1
        return stream

    def from_iterator(self, factory, watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self.from_source(IteratorSource(factory), watermark_strategy, "Iterator Source")

    def from_arrow(self, batches, watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self.from_source(ArrowSource(batches), watermark_strategy, "Arrow Source")

    def enable_checkpointing(self, interval_ms: int, checkpoint_dir=None, mode: str = "EXACTLY_ONCE",
                             max_retained_checkpoints: int = 1) -> "StreamExecutionEnvironment":
        """Checkpoint every ``interval_ms`` of processing time (0: every round)
        into ``checkpoint_dir``, and at the end of the input."""
        if checkpoint_dir is None:
            raise ValueError("enable_checkpointing: give checkpoint_dir, the directory checkpoints go to")
        self.checkpoint_config = CheckpointConfig(interval_ms, checkpoint_dir, mode, max_retained_checkpoints)
        return self

    def set_state_budget(self, device_bytes: int | None, host_bytes: int | None = None,
                         spill_dir=None) -> "StreamExecutionEnvironment":
        """Keep at most ``device_bytes`` of each columnar operator subtask's keyed
        state (window tables, join buffers) on the device; colder rows move to host memory,
        and past ``host_bytes`` (None: no limit) to Arrow IPC files in ``spill_dir``
        (None: a temporary directory), coming back when touched (``state_budget.py``).
        ``device_bytes=None`` removes the budget."""
        if device_bytes is None:
            self.state_budget = None
            return self
        self.state_budget = StateBudget(device_bytes, host_bytes,
                                        None if spill_dir is None else os.fspath(spill_dir))
        return self

    def get_state_budget(self) -> StateBudget | None:
        return self.state_budget

    def get_checkpoint_config(self) -> CheckpointConfig | None:
        return self.checkpoint_config

    def from_file(self, path, format: str | None = None, monitor_interval_ms: int | None = None,
                  watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        """Parquet / Arrow IPC / CSV / JSON-lines records of a file or directory (``FileSource``)."""
        from opforge.stream.file_source import FileSource

        return self.from_source(FileSource(path, format, monitor_interval_ms), watermark_strategy, "File Source")

    def _take_graph(self, job_name: str) -> list[Transformation]:
        transformations, self.transformations = self.transformations, []
        return transformations

    def execute(self, job_name: str = "opforge stream job", restore_from=None,
                allow_non_restored_state: bool = False) -> JobExecutionResult:
        """Run the job to the end of its (bounded) input; the graph is then cleared.
        ``restore_from``: a checkpoint or savepoint directory, or a checkpoint
        directory (its latest completed checkpoint; a fresh start if none).
        State is matched by operator uid (``DataStream.uid``); state of an
        operator the job no longer has fails the restore unless
        ``allow_non_restored_state`` (Flink's ``--allowNonRestoredState``)."""
        transformations = self._take_graph(job_name)
        if self.cluster is not None:
            if restore_from is not None:
                raise ValueError(f"execute({job_name!r}) on a cluster: restore_from is not supported there; "
                                 "the job restores itself from the checkpoints its regions hold")
            return self.cluster.run_stream_job(self, transformations, job_name)  # cluster/stream_job.py
        return run_restarting(self, lambda restore: run_job(self, transformations, job_name, restore, None,
                                                            allow_non_restored_state), restore_from)

    def set_restart_strategy(self, strategy: RestartStrategy) -> "StreamExecutionEnvironment":
        """What a failure of ``execute`` does (``restart.py``): e.g.
        ``RestartStrategies.fixed_delay_restart(3, 1000)``."""
        if not isinstance(strategy, RestartStrategy):
            raise TypeError(f"set_restart_strategy: expected a RestartStrategies value, got {strategy!r}")
        self.restart_strategy = strategy
        return self

    def get_restart_strategy(self) -> RestartStrategy | None:
        return self.restart_strategy

    def execute_async(self, job_name: str = "opforge stream job", restore_from=None,
                      allow_non_restored_state: bool = False):
        """Start the job in a background thread; a ``JobClient`` controls it."""
        from opforge.stream.job_client import JobClient

        if self.cluster is not None:
            raise NotImplementedError(f"execute_async({job_name!r}): not on a cluster yet; use execute()")
        transformations = self._take_graph(job_name)
        if not any(t.kind == "sink" for t in transformations):
            raise ValueError(f"execute_async({job_name!r}): the job has no sink (add sink_to, collect or print)")
        return JobClient(self, transformations, job_name, restore_from, allow_non_restored_state)
