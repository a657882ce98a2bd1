"""ORDER BY over more rows than the device limit: an external merge sort.

Runs: the input arrives in chunks, held until they reach half the limit, sorted on the device
(``physical/sort.run_sort``) and spilled in blocks. Merge: one block of each run is on the device
with the rows not yet output (``carry``, already in order); each step sorts the carry, finds where
each unfinished run's last loaded row landed, outputs every row up to the earliest of those (no
row still unread can sort before it: each run is in order) and reads the next block of the run
that row came from. Rows are told apart by a tag column (run number and row), so no step compares
key tuples by hand: the sort itself decides, with the same NULL order and directions as in memory.
Memory: one block per run plus the carry, blocks sized so that this stays under half the limit."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.expr import Batch
from opforge.sql.outofcore.grace import concat
from opforge.sql.outofcore.spill import SpillStore
from opforge.sql.physical.sort import run_sort
from opforge.sql.plan import Sort
from opforge.sql.profile import batch_bytes

TAG = -(1 << 40)  # the tag column's cid: negative, never a plan's
_ROW_BITS = 40


def external_sort(node: Sort, chunks: Iterable[Batch], limit: int, store: SpillStore, counts: dict) -> Batch:
    return concat(list(sorted_chunks(node, chunks, limit, store, counts)))


def sorted_chunks(node: Sort, chunks: Iterable[Batch], limit: int, store: SpillStore,
                  counts: dict) -> Iterator[Batch]:
    """The rows in the sort's order, a block at a time (at least one batch): what a consumer that
    streams in order (a window without PARTITION BY) reads without the whole output resident."""
    block_rows: list[int] = []
    runs, first = _runs(node, chunks, limit, store, block_rows, counts)
    counts["runs"] = len(runs)
    if not runs:  # nothing was read: the first (empty) chunk
        yield first
        return
    if len(runs) == 1:  # one run: read it back in order
        for i in range(runs[0]):
            yield _untag(concat(list(store.take(("run", 0, i)))))
        return
    # blocks (about limit / 32 bytes each) read per load: one load of each run and the carry stay
    # within half the limit
    per_load = max(1, (limit // 2 // (len(runs) + 1)) // max(1, limit // 32))
    loaded = [0] * len(runs)  # blocks read of each run
    last_tag = [0] * len(runs)

    def load(r: int) -> Batch:
        pieces = []
        for _ in range(per_load):
            if loaded[r] == runs[r]:
                break
            pieces += store.take(("run", r, loaded[r]))
            loaded[r] += 1
        block = concat(pieces)
        last_tag[r] = int(block.cols[TAG].values[-1])
        return block

    carry = concat([load(r) for r in range(len(runs))])
    while True:
        carry = run_sort(node, carry)
        open_runs = [r for r in range(len(runs)) if loaded[r] < runs[r]]
        if not open_runs:
            yield _untag(carry)
            break
        tags = carry.cols[TAG].values
        where = {r: int(torch.nonzero(tags == last_tag[r])[0, 0]) for r in open_runs}
        r = min(open_runs, key=lambda x: where[x])
        idx = torch.arange(carry.n, device=carry.device)
        yield _untag(carry.take(idx[: where[r] + 1]))
        carry = concat([carry.take(idx[where[r] + 1:]), load(r)])
        counts["merge_steps"] = counts.get("merge_steps", 0) + 1


def _runs(node: Sort, chunks: Iterable[Batch], limit: int, store: SpillStore, block_rows: list,
          counts: dict) -> tuple[list, Batch]:
    """Sorted runs of about half the limit each, spilled in blocks of about ``limit / 32`` bytes:
    ([blocks of each run], the first chunk); ``counts`` gets the rows."""
    held, size, runs, first = [], 0, [], None

    def flush():
        run = run_sort(node, _tag(concat(held), len(runs)))
        if not block_rows:
            block_rows.append(max(1, limit // 32 // max(1, batch_bytes(run) // run.n)))
        rows = block_rows[0]
        blocks = 0
        for start in range(0, run.n, rows):
            store.put(("run", len(runs), blocks), run.take(torch.arange(start, min(start + rows, run.n),
                                                                        device=run.device)))
            blocks += 1
        runs.append(blocks)
    for b in chunks:
        first = first if first is not None else b
        if b.n == 0:
            continue
        held.append(b)
        size += batch_bytes(b)
        counts["rows"] = counts.get("rows", 0) + b.n
        if size >= limit // 2:
            flush()
            held, size = [], 0
    if held:
        flush()
    return runs, first


def _tag(batch: Batch, run: int) -> Batch:
    tag = torch.arange(batch.n, device=batch.device, dtype=torch.int64) + (run << _ROW_BITS)
    return Batch({**batch.cols, TAG: Column(tag, None, T.INT64)}, batch.n, batch.device)


def _untag(batch: Batch) -> Batch:
    return Batch({k: c for k, c in batch.cols.items() if k != TAG}, batch.n, batch.device)
