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
* ``FileSource`` (``file_source.py``): Parquet, CSV or JSON-lines files.

Replay (checkpoints): a split is a ``SourceSplit`` that reports its
``position()`` (JSON: an index, a next value, a (file, row)) and can
``seek`` back to it. A split given as a plain iterator (``IteratorSource``)
is replayed by polling a fresh one past the batches already taken, which
assumes the factory yields the same records again (a deterministic source).
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Iterable, Iterator

import torch

from opforge.stream.records import NO_TIMESTAMP, Batch, RecordSchema


class SourceSplit:
    """An iterator of micro-batches with a position (Flink's split state)."""

    def __iter__(self):
        return self

    def __next__(self):
        raise NotImplementedError

    def position(self):
        """Where the next batch starts; JSON values only."""
        raise NotImplementedError

    def seek(self, position) -> None:
        """Continue from ``position`` (one that ``position()`` returned)."""
        raise NotImplementedError


class ListSplit(SourceSplit):
    """A list of micro-batches; the position is the index of the next."""

    def __init__(self, items: list):
        self.items, self.index = items, 0

    def __next__(self):
        if self.index >= len(self.items):
            raise StopIteration
        self.index += 1
        return self.items[self.index - 1]

    def position(self):
        return self.index

    def seek(self, position) -> None:
        self.index = int(position)


class RangeSplit(SourceSplit):
    """The numbers ``[lo, hi)`` ``step`` at a time, each run made by
    ``make(start, stop)``; the position is the next start."""

    def __init__(self, lo: int, hi: int, step: int, make: Callable[[int, int], object]):
        self.next, self.hi, self.step, self.make = lo, hi, step, make

    def __next__(self):
        if self.next >= self.hi:
            raise StopIteration
        s, self.next = self.next, min(self.next + self.step, self.hi)
        return self.make(s, self.next)

    def position(self):
        return self.next

    def seek(self, position) -> None:
        self.next = int(position)


class ReplaySplit(SourceSplit):
    """Any iterator; the position is the number of batches taken, and
    ``seek`` takes that many again (the source must be deterministic)."""

    def __init__(self, iterator):
        self.it, self.taken = iter(iterator), 0

    def __next__(self):
        item = next(self.it)
        self.taken += 1
        return item

    def position(self):
        return self.taken

    def seek(self, position) -> None:
        while self.taken < int(position):
            try:
                next(self)
            except StopIteration:
                raise ValueError(f"ReplaySplit: the source ended after {self.taken} batches while replaying "
                                 f"to {position}; it is not deterministic") from None


def positioned(split) -> SourceSplit:
    return split if isinstance(split, SourceSplit) else ReplaySplit(split)


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
        return [ListSplit(chunks[i::parallelism]) for i in range(parallelism)]


class IteratorSource(Source):
    def __init__(self, factory: Callable[[int, int], Iterable]):
        if not callable(factory):
            raise TypeError("IteratorSource: expected factory(subtask, parallelism) -> iterable of records")
        self.factory = factory

    def splits(self, parallelism, batch_size, device):
        return [ReplaySplit(_chunks(self.factory(i, parallelism), batch_size)) for i in range(parallelism)]


class SplitSource(Source):
    def __init__(self, splits: list[Iterable]):
        self.split_list = [list(s) for s in splits]

    def splits(self, parallelism, batch_size, device):
        if parallelism != len(self.split_list):
            raise ValueError(f"SplitSource: {len(self.split_list)} splits for parallelism {parallelism}")
        return [ListSplit(s) for s in self.split_list]


class ArrowSource(Source):
    def __init__(self, batches):
        self.batches = list(batches)

    def splits(self, parallelism, batch_size, device):
        return [ListSplit(self.batches[i::parallelism]) for i in range(parallelism)]


class NumberSequenceSource(Source):
    """Flink's ``NumberSequenceSource``: ``start..end`` inclusive, as ``f0``."""

    def __init__(self, start: int, end: int):
        if end < start:
            raise ValueError(f"NumberSequenceSource: end {end} is before start {start}")
        self.start, self.end = start, end

    def splits(self, parallelism, batch_size, device):
        total = self.end - self.start + 1
        bounds = [self.start + total * i // parallelism for i in range(parallelism + 1)]

        def make(s, e):
            vals = torch.arange(s, e, dtype=torch.int64, device=device)
            return Batch({"f0": vals}, torch.full_like(vals, NO_TIMESTAMP), RecordSchema("value", ("f0",)))

        return [RangeSplit(bounds[i], bounds[i + 1], batch_size, make) for i in range(parallelism)]


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
