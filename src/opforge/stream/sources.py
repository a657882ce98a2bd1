"""Sources. A source hands each parallel subtask a *split*: an iterator of
micro-batches (a list of records, an Arrow record batch or table, or a
``Batch``). An empty batch means "nothing available now" (the subtask may go
idle); the end of the iterator ends the split.

* ``CollectionSource(records)``: a Python sequence, cut into micro-batches,
  batches dealt round-robin to the subtasks.
* ``IteratorSource(factory)``: ``factory(subtask, parallelism)`` returns an
  iterator of records (a generator), cut into micro-batches.
* ``SplitSource(splits)``: one iterable of batches per subtask, as given
  (tests use it to shape batch boundaries and idle stretches exactly).
* ``ArrowSource(batches)``: Arrow record batches or tables, dealt round-robin.
* ``NumberSequenceSource(start, end)``: the integers ``[start, end]`` made on
  the device, ``batch_size`` at a time (no Python per record).
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Iterable, Iterator

import torch

from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema


class Source:
    def splits(self, parallelism: int, batch_size: int, device) -> list[Iterator]:
        raise NotImplementedError

    #: a source that cannot run in parallel (Flink's from_collection)
    max_parallelism: int | None = None


def _chunks(records: Iterable, size: int) -> Iterator[list]:
    it = iter(records)
    while True:
        chunk = list(islice(it, size))
        if not chunk:
            return
        yield chunk


class CollectionSource(Source):
    def __init__(self, records):
        self.records = list(records)

    def splits(self, parallelism, batch_size, device):
        chunks = list(_chunks(self.records, batch_size))
        return [iter(chunks[i::parallelism]) for i in range(parallelism)]


class IteratorSource(Source):
    def __init__(self, factory: Callable[[int, int], Iterable]):
        if not callable(factory):
            raise TypeError("IteratorSource: expected factory(subtask, parallelism) -> iterable of records")
        self.factory = factory

    def splits(self, parallelism, batch_size, device):
        return [_chunks(self.factory(i, parallelism), batch_size) for i in range(parallelism)]


class SplitSource(Source):
    def __init__(self, splits: list[Iterable]):
        self.split_list = [list(s) for s in splits]

    def splits(self, parallelism, batch_size, device):
        if parallelism != len(self.split_list):
            raise ValueError(f"SplitSource: {len(self.split_list)} splits for parallelism {parallelism}")
        return [iter(s) for s in self.split_list]


class ArrowSource(Source):
    def __init__(self, batches):
        self.batches = list(batches)

    def splits(self, parallelism, batch_size, device):
        return [iter(self.batches[i::parallelism]) for i in range(parallelism)]


class NumberSequenceSource(Source):
    """Flink's ``NumberSequenceSource``: ``start..end`` inclusive, as ``f0``."""

    def __init__(self, start: int, end: int):
        if end < start:
            raise ValueError(f"NumberSequenceSource: end {end} is before start {start}")
        self.start, self.end = start, end

    def splits(self, parallelism, batch_size, device):
        total = self.end - self.start + 1
        bounds = [self.start + total * i // parallelism for i in range(parallelism + 1)]

        def gen(lo, hi):
            for s in range(lo, hi, batch_size):
                vals = torch.arange(s, min(s + batch_size, hi), dtype=torch.int64, device=device)
                yield Batch({"f0": vals}, torch.full_like(vals, NO_TIMESTAMP), RecordSchema("value", ("f0",)))

        return [gen(bounds[i], bounds[i + 1]) for i in range(parallelism)]


def as_batch(item, device, where: str) -> Batch:
    """One polled item as a ``Batch`` (records, Arrow, or a Batch)."""
    if isinstance(item, Batch):
        return item
    if hasattr(item, "schema") and hasattr(item, "num_rows"):
        return Batch.from_arrow(item, device)
    if isinstance(item, (list, tuple)):
        return Batch.from_records(item, device, where=where)
    raise TypeError(f"{where}: a split yielded {type(item).__name__}; expected a list of records, "
                    "an Arrow record batch or a Batch")
