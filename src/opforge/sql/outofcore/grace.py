"""The partitioned (grace) hash join and hash aggregation, over spilled partitions.

Both sides of a join (or an aggregation's input) arrive as chunks; each chunk is cut into 2^bits
partitions by a hash of its key values (``partition.split``) and the pieces go to the spill store
(host, then disk). Equal keys share a partition, so partition p of the output is the join of the
two sides' partition p (the aggregation of partition p's rows): the operator then reads the
partitions back one at a time and runs the ordinary in-memory operator (``physical/join.run_join``,
``physical/aggregate.run_aggregate``) on each.

A partition whose build side (a join's right input; an aggregation's rows) is still over the limit
is split again with a new hash seed, up to ``MAX_DEPTH`` levels. A join build partition holding a
single key value cannot be split by any hash: that is data skew beyond the limit, and the join
stops with an error that says so. An aggregation's single-key partition is aggregated as it is (its
result is one group) and noted. The probe side of inner / left / semi / anti joins is read back in
pieces of at most the limit, each joined with the build partition (those joins distribute over a
split of their left input); right / full joins read the probe partition whole."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from opforge.sql import types as T
from opforge.sql.column import Column, unify_strings
from opforge.sql.errors import SqlError
from opforge.sql.expr import Batch
from opforge.sql.outofcore import partition
from opforge.sql.outofcore.sizes import format_size
from opforge.sql.outofcore.spill import SpillStore
from opforge.sql.physical.aggregate import run_aggregate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.join import run_join
from opforge.sql.plan import Aggregate, Join
from opforge.sql.profile import batch_bytes

MAX_DEPTH = 4
MAX_BITS = 10
PROBE_SPLIT_KINDS = ("inner", "left", "semi", "anti")


@dataclass
class GraceRun:
    """One grace operator's state: the limit, its spill store and what it did (for EXPLAIN ANALYZE)."""

    limit: int
    store: SpillStore
    partitions: int = 0
    resplits: int = 0
    oversized: int = 0
    tags: Iterator[int] = field(default_factory=itertools.count)

    def report(self, ctx: ExecContext, what: str) -> None:
        s = self.store.stats
        ctx.note(f"out of core: {what}, {self.partitions} partitions ({self.resplits} split again"
                 f"{f', {self.oversized} single-key over the limit' if self.oversized else ''}); spilled "
                 f"{format_size(s.host_bytes)} to host, {format_size(s.disk_bytes)} to disk "
                 f"(limit {format_size(self.limit)})")
        ctx.count("spill_host_bytes", s.host_bytes)
        ctx.count("spill_disk_bytes", s.disk_bytes)
        ctx.count("spill_partitions", self.partitions)
        ctx.count("spill_resplits", self.resplits)


def fanout_bits(nbytes: int, limit: int) -> int:
    """Least bits (at least 1) whose partitions hold about half the limit each."""
    bits = 1
    while (nbytes >> bits) > limit // 2 and bits < MAX_BITS:
        bits += 1
    return bits


def quiet(ctx: ExecContext) -> ExecContext:
    """A copy of ``ctx`` whose notes go nowhere: one note per partition would bury the plan."""
    return dataclasses.replace(ctx, notes=[], metrics={})


def concat(batches: list[Batch]) -> Batch:
    """One batch from several with the same columns (coded columns, strings and LIST / STRUCT
    values, re-coded to one dictionary when their pieces' dictionaries differ)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    cols = {}
    for cid, c0 in first.cols.items():
        parts = [b.cols[cid] for b in batches]
        if T.is_coded(c0.type) and any(p.dictionary is not c0.dictionary for p in parts):
            parts = unify_strings(parts)
        valid = None
        if any(p.valid is not None for p in parts):
            valid = torch.cat([p.valid_mask() for p in parts])
        cols[cid] = Column(torch.cat([p.values for p in parts]), valid, parts[0].type, parts[0].dictionary)
    return Batch(cols, sum(b.n for b in batches), first.device)


def _spill(chunks: Iterable[Batch], exprs, types, bits: int, seed: int, run: GraceRun, key,
           nulls_equal: bool = False) -> Batch | None:
    """Partitions every chunk into the store; an empty batch with the chunks' columns (or None)."""
    template = None
    for b in chunks:
        if template is None:
            template = b.take(torch.zeros(0, dtype=torch.int64, device=b.device))
        for p, piece in enumerate(partition.split(b, exprs, types, bits, seed, nulls_equal)):
            run.store.put((key, p), piece)
    return template


def _pieces_up_to(pieces: Iterable[Batch], limit: int) -> Iterator[Batch]:
    """Consecutive pieces merged while they stay within ``limit`` bytes."""
    group, size = [], 0
    for b in pieces:
        nb = batch_bytes(b)
        if group and size + nb > limit:
            yield concat(group)
            group, size = [], 0
        group.append(b)
        size += nb
    if group:
        yield concat(group)


def grace_join(node: Join, left: Iterable[Batch], right: Iterable[Batch], ctx: ExecContext, run: GraceRun,
               bits: int, depth: int = 0) -> Iterator[Batch]:
    """The join's output, one partition at a time (at least one batch, possibly empty)."""
    types = partition.key_types([e.type for e in node.left_keys], [e.type for e in node.right_keys])
    tag = next(run.tags)
    rt = _spill(right, node.right_keys, types, bits, depth, run, (tag, "R"))
    lt = _spill(left, node.left_keys, types, bits, depth, run, (tag, "L"))
    run.partitions += 1 << bits
    inner = quiet(ctx)
    produced = False
    for p in range(1 << bits):
        lkey, rkey = ((tag, "L"), p), ((tag, "R"), p)
        if run.store.rows(lkey) == 0 and node.kind in PROBE_SPLIT_KINDS \
                or run.store.rows(rkey) == 0 and node.kind in ("inner", "semi"):
            run.store.drop(lkey)
            run.store.drop(rkey)
            continue
        rbytes = run.store.nbytes(rkey)
        rparts = list(run.store.take(rkey))
        build = concat(rparts) if rparts else rt
        if rbytes > run.limit:
            if partition.distinct_keys(build, node.right_keys, types) <= 1:
                raise SqlError(f"out of core: a single join key value has {build.n} rows "
                               f"({format_size(rbytes)}) on the build side of {node.describe()}, over the "
                               f"memory limit of {format_size(run.limit)}; one key cannot be split "
                               f"(raise memory_limit)")
            if depth + 1 >= MAX_DEPTH:
                raise SqlError(f"out of core: a build partition of {node.describe()} is still "
                               f"{format_size(rbytes)} after {depth + 1} splits, over the memory limit "
                               f"of {format_size(run.limit)}")
            run.resplits += 1
            probe = run.store.take(lkey)
            for out in grace_join(node, probe, [build], ctx, run, fanout_bits(rbytes, run.limit), depth + 1):
                produced = True
                yield out
            continue
        probe = run.store.take(lkey)
        if node.kind in PROBE_SPLIT_KINDS:
            for piece in _pieces_up_to(probe, run.limit):
                produced = True
                yield run_join(node, piece, build, inner)
        else:
            pieces = list(probe)
            produced = True
            yield run_join(node, concat(pieces) if pieces else lt, build, inner)
    if not produced and lt is not None and rt is not None:
        yield run_join(node, lt, rt, inner)


def grace_aggregate(node: Aggregate, chunks: Iterable[Batch], ctx: ExecContext, run: GraceRun, bits: int,
                    depth: int = 0) -> list[Batch]:
    """The aggregation's output groups, partition by partition (at least one batch, possibly empty)."""
    on = node.keys if node.grouped is None else [node.keys[i] for i in node.grouped]
    inner = quiet(ctx)
    return list(grace_each([e for _, e in on], chunks, lambda rows: run_aggregate(node, rows, inner), run, bits, depth))


def grace_each(exprs, chunks: Iterable[Batch], fn: Callable[[Batch], Batch], run: GraceRun, bits: int,
               depth: int = 0) -> Iterator[Batch]:
    """``fn`` of each partition of the rows by the hash of ``exprs`` (NULL a value like any other),
    one partition at a time: right for any operator whose rows with equal keys must meet and that
    keeps nothing across them (GROUP BY, DISTINCT, a window's PARTITION BY). A partition over the
    limit is split again with a new seed, up to ``MAX_DEPTH`` levels; one holding a single key
    value runs as it is (counted in ``run.oversized``). At least one batch: ``fn`` of no rows when
    there were none."""
    types = partition.key_types([e.type for e in exprs])
    tag = next(run.tags)
    template = _spill(chunks, exprs, types, bits, depth, run, tag, nulls_equal=True)
    run.partitions += 1 << bits
    produced = False
    for p in range(1 << bits):
        nbytes = run.store.nbytes((tag, p))
        pieces = list(run.store.take((tag, p)))
        if not pieces:
            continue
        rows = concat(pieces)
        if nbytes > run.limit:
            if depth + 1 < MAX_DEPTH and partition.distinct_keys(rows, exprs, types, nulls_equal=True) > 1:
                run.resplits += 1
                for out in grace_each(exprs, [rows], fn, run, fanout_bits(nbytes, run.limit), depth + 1):
                    produced = True
                    yield out
                continue
            run.oversized += 1
        produced = True
        yield fn(rows)
    if not produced and template is not None and depth == 0:
        yield fn(template)
