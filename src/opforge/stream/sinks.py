"""Sinks: ``CollectSink`` (records, Arrow, pandas), ``CallbackSink`` (a Python
function per record) and ``PrintSink``. A sink sees whole micro-batches; the
conversion to records happens only where the user asks for records.

These sinks are not part of checkpoints: after a restore they see the output
after the checkpoint again (at least once). For exactly-once output use the
transactional ``FileSink`` (``file_sink.py``); a sink joins the two-phase
commit by defining ``snapshot_state(subtask, checkpoint_id)``,
``notify_checkpoint_complete(subtask, checkpoint_id)`` and
``restore_state(subtask, state)`` (and ``open(subtask, parallelism)``)."""

from __future__ import annotations

import sys
from typing import Callable

from opforge.stream.records import Batch


class Sink:
    def write(self, batch: Batch, subtask: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


class CollectSink(Sink):
    """Keeps the batches; ``records()``, ``to_arrow()`` and ``to_pandas()``
    read them after ``execute``. Subtasks' outputs interleave in arrival order."""

    def __init__(self):
        self.batches: list[Batch] = []

    def write(self, batch, subtask):
        if len(batch):
            self.batches.append(batch)

    def records(self) -> list:
        out: list = []
        for b in self.batches:
            out.extend(b.records())
        return out

    def timestamps(self) -> list[int]:
        return [t for b in self.batches for t in b.timestamps.tolist()]

    def to_arrow(self):
        import pyarrow as pa

        if not self.batches:
            return pa.table({})
        return pa.concat_tables([b.to_arrow() for b in self.batches])

    def to_pandas(self):
        return self.to_arrow().to_pandas()


class CallbackSink(Sink):
    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"CallbackSink: expected a callable, got {type(fn).__name__}")
        self.fn = fn

    def write(self, batch, subtask):
        for r in batch.records():
            self.fn(r)


class PrintSink(Sink):
    def __init__(self, prefix: str = "", stream=None):
        self.prefix = prefix
        self.stream = stream or sys.stdout

    def write(self, batch, subtask):
        for r in batch.records():
            print(f"{self.prefix}{subtask + 1}> {r!r}" if self.prefix else f"{subtask + 1}> {r!r}",
                  file=self.stream)


class CollectIterator:
    """What ``DataStream.execute_and_collect()`` returns (PyFlink's
    ``CloseableIterator``): the job's records, iterated once, usable in
    ``with ... as it:``; ``list(it)`` gives them all."""

    def __init__(self, records: list):
        self._records = iter(records)
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        return next(self._records)

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
