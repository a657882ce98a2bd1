"""The executor's out-of-core side: which subtrees stream chunk by chunk and which operators
consume the streams, under ``ExecContext.memory_limit``.

A subtree *streams* when its data would not fit: a scan whose selected columns exceed the limit
(``chunked_scan``), a filter or projection over a streaming child (applied chunk by chunk), and an
equi-join with a streaming input. A streaming join whose other input fits the limit joins each
chunk against it (the chunked side must be one the join distributes over: the left side of inner /
left / semi / anti joins, either side of an inner join), with the runtime filter of the resident
side pushed into the chunked scan; otherwise it is a grace join (``grace``), whose output streams
partition by partition. UNION ALL streams its inputs' chunks one input after the other. DISTINCT
(and UNION) over a stream, and window functions with PARTITION BY over one, partition the rows by
a hash of their keys (all columns; the PARTITION BY keys), spilled, and stream their output
partition by partition, each computed on its own (``grace.grace_each``); a window without
PARTITION BY is externally sorted by its ORDER BY and streamed in that order (``ordered_window``;
frames without a bound in rows take the input whole, EXPLAIN ANALYZE says why). Consumers: an
aggregation over a stream aggregates each chunk, then the partials (``partial_aggregate``; the
partials go through a grace aggregation when they do not fit), or, with count(DISTINCT), is a
grace aggregation of the rows; ORDER BY over a stream is an external merge sort
(``external_sort``), ORDER BY ... LIMIT the top rows of each chunk, then of those; any other operator gets the stream concatenated (its input is then what survived the filters and
joins, usually far smaller than the tables). Operators whose inputs are resident but whose build
side (join) or input (grouped aggregation, DISTINCT, partitioned window) exceeds the limit also go
through ``grace``.

EXPLAIN ANALYZE: every operator keeps its own row (a streamed one: its time summed over its chunks,
its inputs' excluded), with notes and metrics for chunks read, bytes spilled to host and to disk,
partitions and partitions split again."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.expr import Batch, Ref
from opforge.sql.outofcore import chunked_scan
from opforge.sql.outofcore import ordered_window
from opforge.sql.outofcore.external_sort import external_sort, sorted_chunks
from opforge.sql.outofcore.grace import GraceRun, concat, fanout_bits, grace_aggregate, grace_each, grace_join, quiet
from opforge.sql.outofcore.partial_aggregate import decomposable, two_step
from opforge.sql.outofcore.partition import key_types
from opforge.sql.outofcore.sizes import default_host_limit
from opforge.sql.outofcore.spill import SpillStore
from opforge.sql.physical import runtime_filter as RF
from opforge.sql.physical.aggregate import run_aggregate, run_window
from opforge.sql.physical.distinct import run_distinct
from opforge.sql.physical.filter import keep_rows
from opforge.sql.physical.join import run_join
from opforge.sql.physical.project import run_project
from opforge.sql.physical.scan import run_scan
from opforge.sql.physical.sort import run_sort
from opforge.sql.physical.topk import run_topk
from opforge.sql.physical.union import run_union
from opforge.sql.physical.window_functions import run_window_functions
from opforge.sql.profile import batch_bytes
from opforge.sql.table import LazyColumns

_STREAM_KINDS = ("inner", "left", "right", "full", "semi", "anti")
# device bytes a resident scan takes per byte of its columns: the columns, and a join's hash table or a
# sort over them (TPC-H q21 at SF100: lineitem's keys, 10.8 GB under a 24 GiB limit, were kept whole
# and built into a hash table beside the rest: a peak of 75 GB)
RESIDENT_FACTOR = 2
_ROW = -1  # the column of left row positions in a marked join's pairs (no plan column has a negative id)


def _each(fn, chunks) -> Iterator[Batch]:
    """``fn`` of each chunk; this frame holds neither the chunk nor its result while it waits.
    Why: a generator's local keeps its last chunk alive while the consumers downstream work and
    while the next chunk is made; a chunk is a quarter of the limit, and such stale ones along a
    pipeline (the scan's, the filter's, the join's) add up (TPC-H q01 at SF0.1 under 25 MiB, live
    tensors on the CPU: 0.78x the limit before, 0.57x after)."""
    for b in chunks:
        box = [b]
        del b
        yield _apply(fn, box)


def _apply(fn, box: list):
    return fn(box.pop())


def all_of(node: P.Union) -> P.Union:
    """The UNION ALL of a union's inputs (a UNION's rows before they are made distinct)."""
    return node if node.all else dataclasses.replace(node, all=True)


class OutOfCore:
    def __init__(self, executor):
        self.ex = executor
        self.ctx = executor.ctx
        self.limit: int = executor.ctx.memory_limit
        self._streams: dict[int, bool] = {}
        self._accounts: dict[int, _Account] = {}  # EXPLAIN ANALYZE figures of streamed operators
        self._frames: list[float] = []
        self._planned = False

    # -- what streams ------------------------------------------------------------------------------
    def streams(self, node: P.Node) -> bool:
        key = id(node)
        if key not in self._streams:
            self._streams[key] = self._decide(node)
        return self._streams[key]

    def plan(self, root: P.Node) -> None:
        """Before the query runs: which scans read in chunks, and room on the device for the rest.
        The largest scans are chunked until the others take at most half the limit (the other half
        is for intermediates), each counted at ``RESIDENT_FACTOR`` times its columns (what a hash
        table or a sort over them adds), a scan of less than ``limit / 16`` never (chunks cost a
        copy over the link each query, and a small table's columns are better left on the device);
        then columns that earlier queries left on the device and
        this one does not read are dropped if they would crowd it."""
        scans = []

        def walk(n):
            if isinstance(n, P.Scan) and n.table in self.ex.tables:
                scans.append((chunked_scan.scan_bytes(self.ex.tables[n.table], n), n))
            for c in n.inputs():
                walk(c)
        walk(root)
        scans.sort(key=lambda x: -x[0])
        resident = sum(b for b, _ in scans) * RESIDENT_FACTOR
        for nbytes, scan in scans:
            chunk = nbytes * RESIDENT_FACTOR > self.limit or (resident > self.limit // 2 and nbytes > self.limit // 16)
            self._streams[id(scan)] = chunk
            if chunk:
                resident -= nbytes * RESIDENT_FACTOR
        keep: dict[str, set] = {}
        for _, scan in scans:
            if not self._streams[id(scan)]:
                keep.setdefault(scan.table, set()).update(o.name for o in scan.outputs)
        cached = sum(t.columns.loaded_bytes() for t in self.ex.tables.values() if isinstance(t.columns, LazyColumns))
        if cached > self.limit // 2:
            freed = sum(t.columns.unload(keep.get(name, ())) for name, t in self.ex.tables.items()
                        if isinstance(t.columns, LazyColumns))
            if freed:
                self.ctx.note(f"out of core: dropped {freed} B of columns cached by earlier queries")

    def _decide(self, node: P.Node) -> bool:
        if isinstance(node, P.Scan):
            table = self.ex.tables.get(node.table)
            return table is not None and chunked_scan.scan_bytes(table, node) > self.limit
        if isinstance(node, (P.Filter, P.Project)):
            return self.streams(node.child)
        if isinstance(node, P.Join):
            return self.partitionable(node) and (self.streams(node.left) or self.streams(node.right))
        if isinstance(node, P.Union):
            return any(self.streams(c) for c in node.children) and (node.all or self._hashable(node.outputs))
        if isinstance(node, P.Distinct):
            return self.streams(node.child) and self._hashable(node.outputs)
        if isinstance(node, (P.Window, P.WindowFunctions)):
            if not node.partition:
                return self.streams(node.child) and self._ordered(node)
            return self.streams(node.child) and self._hashable(node.partition)
        return False

    def _ordered(self, node) -> bool:
        """A window without PARTITION BY streams in its ORDER BY's order (``ordered_window``); when
        it cannot, EXPLAIN ANALYZE says why its input is taken whole."""
        why = ordered_window.unstreamable(node)
        if why is not None:
            self.ctx.note(f"out of core: the window without PARTITION BY takes its input whole: {why}")
        return why is None and self.ctx.workers == 1

    def _hashable(self, keys) -> bool:
        """Rows can be partitioned by these columns / expressions (``partition.key_types``)."""
        return self.ctx.workers == 1 and key_types([k.type for k in keys]) is not None

    def partitionable(self, node: P.Join) -> bool:
        return (bool(node.left_keys) and node.kind in _STREAM_KINDS and not node.null_aware
                and self.ctx.workers == 1
                and key_types([e.type for e in node.left_keys], [e.type for e in node.right_keys]) is not None)

    # -- the executor's hooks ----------------------------------------------------------------------
    def run(self, node: P.Node, pushed: list) -> Batch | None:
        """``node``'s output when it runs out of core (None: the executor runs it as usual)."""
        if not self._planned:
            self._planned = True
            self.plan(node)
        if isinstance(node, P.Aggregate) and self.streams(node.child):
            keyed = key_types([e.type for _, e in node.keys]) is not None
            routes = RF.route(node, pushed)
            est = self._estimate(node.child)
            if decomposable(node) and (keyed or not node.keys):
                return self._measured(node, lambda: self._two_step(node, self.stream(node.child, routes[0]), est))
            if node.keys and keyed:
                return self._measured(node, lambda: self._aggregate(node, self.stream(node.child, routes[0]), est))
        if isinstance(node, P.Sort) and self.streams(node.child):
            routes = RF.route(node, pushed)
            return self._measured(node, lambda: self._sort(node, self.stream(node.child, routes[0])))
        if isinstance(node, P.TopK) and self.streams(node.child):
            routes = RF.route(node, pushed)
            return self._measured(node, lambda: self._topk(node, self.stream(node.child, routes[0])))
        if self.streams(node):  # a consumer that needs it whole
            out = concat(list(self.stream(node, pushed)))
            self._flush()
            return out
        return None

    def operator(self, node: P.Node, inputs: list[Batch]) -> Batch | None:
        """A resident operator over the limit: a join whose build side or a grouped aggregation whose
        input exceeds it runs partitioned (None: in memory as usual)."""
        if isinstance(node, P.Join) and self.partitionable(node) and batch_bytes(inputs[1]) > self.limit:
            run = self._grace_run()
            try:
                bits = fanout_bits(batch_bytes(inputs[1]), self.limit)
                out = concat(list(grace_join(node, [inputs[0]], [inputs[1]], self.ctx, run, bits)))
            finally:
                run.store.close()
            run.report(self.ctx, "grace hash join")
            return out
        if isinstance(node, P.Sort) and batch_bytes(inputs[0]) > self.limit:
            return self._sort(node, [inputs[0]])
        if isinstance(node, P.Aggregate) and node.keys and batch_bytes(inputs[0]) > self.limit \
                and key_types([e.type for _, e in node.keys]) is not None:
            return self._aggregate(node, [inputs[0]], batch_bytes(inputs[0]))
        if isinstance(node, P.Distinct) and batch_bytes(inputs[0]) > self.limit and self._hashable(node.outputs):
            return concat(list(self._distinct(node.outputs, [inputs[0]], batch_bytes(inputs[0]))))
        if isinstance(node, (P.Window, P.WindowFunctions)) and batch_bytes(inputs[0]) > self.limit \
                and (self._hashable(node.partition) if node.partition else self._ordered(node)):
            return concat(list(self._window(node, [inputs[0]])))
        return None

    # -- streams -----------------------------------------------------------------------------------
    def stream(self, node: P.Node, pushed: list) -> Iterator[Batch]:
        """``node``'s output as a sequence of batches (at least one)."""
        if not self.streams(node):
            yield self._resident(node, pushed)
            return
        yield from self._timed(node, self._stream(node, pushed))

    def _stream(self, node: P.Node, pushed: list) -> Iterator[Batch]:
        if isinstance(node, P.Scan):
            yield from self._scan(node, pushed)
        elif isinstance(node, P.Filter):
            yield from _each(lambda b: keep_rows(node.predicate, b), self.stream(node.child, RF.route(node, pushed)[0]))
        elif isinstance(node, P.Project):
            yield from _each(lambda b: run_project(node, b), self.stream(node.child, RF.route(node, pushed)[0]))
        elif isinstance(node, P.Union):
            yield from self._union(node, pushed)
        elif isinstance(node, P.Distinct):
            yield from self._distinct(node.outputs, self.stream(node.child, RF.route(node, pushed)[0]),
                                      self._estimate(node.child))
        elif isinstance(node, (P.Window, P.WindowFunctions)):
            yield from self._window(node, self.stream(node.child, RF.route(node, pushed)[0]))
        else:
            yield from self._join(node, pushed)

    def _union(self, node: P.Union, pushed: list) -> Iterator[Batch]:
        """UNION ALL: each input's chunks in turn, cast to the union's columns; UNION: those, made
        distinct (``_distinct``)."""
        routes = RF.route(node, pushed)

        def chunks():
            for child, route in zip(node.children, routes):
                cids = [o.cid for o in child.outputs]
                yield from _each(lambda b: run_union(all_of(node), [b], [cids]), self.stream(child, route))
        if node.all:
            yield from chunks()
        else:
            yield from self._distinct(node.outputs, chunks(), self._estimate(node))

    def _distinct(self, outputs, chunks, estimate: int) -> Iterator[Batch]:
        """DISTINCT over a stream: each chunk made distinct, then the rows partitioned by all their
        columns (spilled), each partition made distinct on its own; out partition by partition."""
        keys = [Ref(o.cid, o.type, o.name) for o in outputs]

        def own(b: Batch) -> Batch:
            return run_distinct(Batch({o.cid: b.cols[o.cid] for o in outputs}, b.n, b.device))
        yield from self._partitioned(keys, (own(b) for b in chunks), own, estimate, "DISTINCT")

    def _window(self, node, chunks) -> Iterator[Batch]:
        """Window functions with PARTITION BY over a stream (or an input over the limit): the rows
        partitioned by a hash of the PARTITION BY keys (spilled), each partition's windows computed
        on their own: a window never crosses partitions. Out partition by partition. Without
        PARTITION BY: in ORDER BY order (``_ordered_window``)."""
        if not node.partition:
            yield from self._ordered_window(node, chunks)
            return
        inner = quiet(self.ctx)
        fn = (lambda b: run_window(node, b, inner)) if isinstance(node, P.Window) else (
            lambda b: run_window_functions(node, b, inner))
        yield from self._partitioned(node.partition, chunks, fn, self._estimate(node.child), "window")

    def _ordered_window(self, node: P.WindowFunctions, chunks) -> Iterator[Batch]:
        """A window without PARTITION BY: its input externally sorted by the ORDER BY, then computed
        segment by segment in that order, carrying what each needs from the rows before and after
        (``ordered_window``)."""
        chunks, fits = self._buffer(chunks)
        if fits:
            self.ctx.note("out of core: the window's input stream fit the limit; computed in memory")
            yield run_window_functions(node, concat(chunks), quiet(self.ctx))
            return
        store = self._grace_run().store
        counts: dict = {}
        try:
            ordered = sorted_chunks(P.Sort(node.child, node.order), chunks, self.limit, store, counts)
            yield from ordered_window.stream(node, ordered, self.limit // 4, counts)
        finally:
            store.close()
        s = store.stats
        self.ctx.note(f"out of core: window without PARTITION BY over an external sort ({counts.get('runs', 0)} "
                      f"sorted runs), streamed in {counts.get('segments', 0)} segments; spilled {s.host_bytes} B "
                      f"to host, {s.disk_bytes} B to disk")
        self.ctx.count("spill_host_bytes", s.host_bytes)
        self.ctx.count("spill_disk_bytes", s.disk_bytes)

    def _partitioned(self, keys, chunks, fn, estimate: int, what: str) -> Iterator[Batch]:
        """``fn`` over the stream whole when it ends within the limit, else over each hash partition
        of it by ``keys`` (``grace.grace_each``)."""
        chunks, fits = self._buffer(chunks)
        if fits:
            self.ctx.note(f"out of core: the {what}'s input stream fit the limit; computed in memory")
            yield fn(concat(chunks))
            return
        run = self._grace_run()
        try:
            yield from grace_each(keys, chunks, fn, run, fanout_bits(estimate, self.limit))
        finally:
            run.store.close()
        run.report(self.ctx, f"partitioned {what}")

    def _scan(self, node: P.Scan, pushed: list) -> Iterator[Batch]:
        table = self.ex.tables[node.table]
        mine = [p for p in pushed if p.cid in {o.cid for o in node.outputs}]
        counts: dict = {}
        rows = chunked_scan.chunk_rows(table, node, self.limit)
        yield from chunked_scan.chunks(node, table, self.ex.device, mine, rows, counts, self.limit)
        if not counts:  # an empty table: one empty batch
            yield run_scan(node, table, self.ex.device, mine, None)
        self.ctx.note(f"chunked scan of {node.table}: {counts.get('chunks', 0)} chunks, "
                      f"{counts.get('rows_read', 0)} rows read")
        self.ctx.count("scan_chunks", counts.get("chunks", 0))

    def _join(self, node: P.Join, pushed: list) -> Iterator[Batch]:
        routes = RF.route(node, pushed)
        ls, rs = self.streams(node.left), self.streams(node.right)
        inner = quiet(self.ctx)
        if ls and not rs:  # probe the left chunks against the resident right side
            right = self._resident(node.right, routes[1])
            if batch_bytes(right) <= self.limit and node.kind in ("inner", "left", "semi", "anti"):
                plan = RF.filter_plan(node) if self.ctx.runtime_filters else None
                extra = [RF.make(node, plan, right)] if plan is not None and plan.source == "right" else []
                yield from _each(lambda b: run_join(node, b, right, inner), self.stream(node.left, routes[0] + extra))
                self.ctx.note(f"streamed join {node.kind}: left chunks probe the resident right side")
                return
            yield from self._grace(node, self.stream(node.left, routes[0]), [right])
            return
        if rs and not ls:
            left = self._resident(node.left, routes[0])
            if batch_bytes(left) <= self.limit and node.kind in ("semi", "anti"):
                yield self._marked(node, left, routes[1])
                return
            if batch_bytes(left) <= self.limit and node.kind == "inner":
                plan = RF.filter_plan(node) if self.ctx.runtime_filters else None
                extra = [RF.make(node, plan, left)] if plan is not None and plan.source == "left" else []
                yield from _each(lambda b: run_join(node, left, b, inner), self.stream(node.right, routes[1] + extra))
                self.ctx.note("streamed join inner: right chunks against the resident left side")
                return
            yield from self._grace(node, [left], self.stream(node.right, routes[1]))
            return
        left = None
        if node.kind in ("semi", "anti"):  # the left side is often the small one: marked from the right
            # at most half the limit: held while the right side is buffered when it does not fit
            held, fits = self._buffer(self.stream(node.left, routes[0]), self.limit // 2)
            if fits:
                yield self._marked(node, concat(held), routes[1])
                return
            left = held
        right, fits = self._buffer(self.stream(node.right, routes[1]))
        if fits and node.kind in ("inner", "left", "semi", "anti"):  # the build side turned out small
            build = concat(right)
            yield from _each(lambda b: run_join(node, b, build, inner),
                             self.stream(node.left, routes[0]) if left is None else left)
            self.ctx.note(f"streamed join {node.kind}: the right stream fit the limit ({batch_bytes(build)} B)")
            return
        yield from self._grace(node, self.stream(node.left, routes[0]) if left is None else left, right)

    def _marked(self, node: P.Join, left: Batch, pushed: list) -> Batch:
        """A semi / anti join whose left side fits and whose right side streams: each right chunk's
        matches (keys, then the residual) mark the left rows they meet; the marked rows (semi) or
        the others (anti) come out when the stream ends, with the right side filtered by the left's
        keys on its way in. Why: TPC-H q21's EXISTS and NOT EXISTS over lineitem (600 M rows at
        SF100) for a few million left rows built hash tables over the whole lineitem side."""
        marks = torch.zeros(left.n, dtype=torch.bool, device=left.device)
        if left.n:
            # the pairs of an inner join with the chunk probing the left rows (a column of their positions)
            pairs = dataclasses.replace(node, kind="inner", left=node.right, right=node.left,
                                        left_keys=node.right_keys, right_keys=node.left_keys, physical=None,
                                        heavy_keys=(), note="")
            need = set().union(*(e.cids() for e in node.left_keys + node.right_keys))
            need |= node.residual.cids() if node.residual is not None else set()
            rows = Batch({**{k: c for k, c in left.cols.items() if k in need},
                          _ROW: Column(torch.arange(left.n, device=left.device), None, T.INT64)}, left.n, left.device)
            plan = RF.filter_plan(node, "left") if self.ctx.runtime_filters else None
            extra = [RF.make(node, plan, left)] if plan is not None else []
            inner = quiet(self.ctx)
            for b in self.stream(node.right, pushed + extra):
                chunk = Batch({k: c for k, c in b.cols.items() if k in need}, b.n, b.device)
                del b
                marks[run_join(pairs, chunk, rows, inner).cols[_ROW].values] = True
                del chunk
        self.ctx.note(f"streamed join {node.kind}: right chunks mark the resident left side's rows ({left.n})")
        self.ctx.count("marked_joins", 1)
        return left.take(torch.nonzero(marks if node.kind == "semi" else ~marks).squeeze(1))

    def _grace(self, node: P.Join, left, right) -> Iterator[Batch]:
        run = self._grace_run()
        try:
            yield from grace_join(node, left, right, self.ctx, run, fanout_bits(self._estimate(node.right), self.limit))
        finally:
            run.store.close()
        run.report(self.ctx, f"grace hash join {node.kind}")

    def _topk(self, node: P.TopK, chunks) -> Batch:
        """ORDER BY ... LIMIT over a stream: each chunk's first offset + limit rows, then the top
        of those (chunks come in row order, so ties resolve as the stable sort of all rows would)."""
        each = dataclasses.replace(node, limit=node.offset + node.limit, offset=0)
        inner = quiet(self.ctx)
        candidates = [run_topk(each, b, inner) for b in chunks]
        self.ctx.note(f"out of core: top-{each.limit} of each of {len(candidates)} chunks, then of those")
        return run_topk(node, concat(candidates), inner)

    def _sort(self, node: P.Sort, chunks) -> Batch:
        chunks, fits = self._buffer(chunks)
        if fits:
            return run_sort(node, concat(chunks))
        store = self._grace_run().store
        counts: dict = {}
        try:
            out = external_sort(node, chunks, self.limit, store, counts)
        finally:
            store.close()
        s = store.stats
        self.ctx.note(f"out of core: external merge sort, {counts.get('runs', 0)} sorted runs, "
                      f"{counts.get('merge_steps', 0)} merge steps; spilled {s.host_bytes} B to host, "
                      f"{s.disk_bytes} B to disk")
        self.ctx.count("sort_runs", counts.get("runs", 0))
        self.ctx.count("spill_host_bytes", s.host_bytes)
        self.ctx.count("spill_disk_bytes", s.disk_bytes)
        return out

    def _two_step(self, node: P.Aggregate, chunks, estimate: int) -> Batch:
        """Each chunk aggregated on its own, then the partials (``partial_aggregate``)."""
        steps = two_step(node)
        inner = quiet(self.ctx)
        counts = {"chunks": 0, "groups": 0}

        def partial(b: Batch) -> Batch:
            p = run_aggregate(steps.partial, b, inner)
            counts["chunks"] += 1
            counts["groups"] += p.n
            return p
        if node.keys:
            out = self._aggregate(steps.final, _each(partial, chunks), estimate)
        else:
            out = run_aggregate(steps.final, concat(list(_each(partial, chunks))), inner)
        self.ctx.count("partial_chunks", counts["chunks"])
        self.ctx.note(f"out of core: two-step aggregation, {counts['chunks']} chunks aggregated on their own "
                      f"into {counts['groups']} partial groups, then combined")
        return steps.finish(out)

    def _aggregate(self, node: P.Aggregate, chunks, estimate: int) -> Batch:
        chunks, fits = self._buffer(chunks)
        if fits:  # what reached the aggregation fits: no partitions
            self.ctx.note("out of core: the aggregation's input stream fit the limit; aggregated in memory")
            return run_aggregate(node, concat(chunks), quiet(self.ctx))
        run = self._grace_run()
        try:
            out = concat(grace_aggregate(node, chunks, self.ctx, run, fanout_bits(estimate, self.limit)))
        finally:
            run.store.close()
        run.report(self.ctx, "grace hash aggregate")
        return out

    # -- helpers -----------------------------------------------------------------------------------
    def _buffer(self, chunks, limit: int | None = None):
        """(chunks, fits): the stream's batches held on the device while they total at most
        ``limit`` (default: the memory limit); ``fits`` when the stream ended within it (a list),
        else the held batches chained before the rest of the stream."""
        limit = self.limit if limit is None else limit
        held, size = [], 0
        it = iter(chunks)
        for b in it:
            held.append(b)
            size += batch_bytes(b)
            if size > limit:
                return itertools.chain(held, it), False
        return held, True

    def _grace_run(self) -> GraceRun:
        host = self.ctx.spill_host_limit if self.ctx.spill_host_limit is not None else default_host_limit()
        return GraceRun(self.limit, SpillStore(host, self.ctx.spill_dir))

    def _estimate(self, node: P.Node) -> int:
        """Bytes a subtree's output may take: its scans' selected columns (an upper bound for the
        filters and projections over them; a join: both sides)."""
        if isinstance(node, P.Scan):
            table = self.ex.tables.get(node.table)
            return chunked_scan.scan_bytes(table, node) if table is not None else 0
        return sum(self._estimate(c) for c in node.inputs())

    def _resident(self, node: P.Node, pushed: list) -> Batch:
        """``node`` run by the executor, its profiler notes kept out of the consumer's."""
        notes, metrics = self.ctx.notes, self.ctx.metrics
        try:
            with self._frame():
                return self.ex.run(node, pushed)
        finally:
            self.ctx.notes, self.ctx.metrics = notes, metrics

    # -- EXPLAIN ANALYZE for streamed operators ------------------------------------------------------
    # A streamed operator's work happens in pieces, inside its consumer's: each ``next()`` of its
    # stream is timed with the nested ones (its inputs') subtracted, its notes and metrics are kept
    # apart, and its totals become its own row of the profile when the consumer is done.
    def _measured(self, node: P.Node, fn) -> Batch:
        prof = self.ex.profiler
        if prof is None:
            return fn()
        nested = []
        with self._frame(nested):
            out = prof.measure(node, fn, 0, self.ctx)
        prof.exclude(node, nested[0])
        self._flush()
        return out

    def _timed(self, node: P.Node, it: Iterator[Batch]) -> Iterator[Batch]:
        if self.ex.profiler is None:
            yield from it
            return
        acc = self._accounts.setdefault(id(node), _Account(node))
        while True:
            notes, metrics = self.ctx.notes, self.ctx.metrics
            self.ctx.notes, self.ctx.metrics = acc.notes, acc.metrics
            nested = []
            try:
                with self._frame(nested) as start:
                    try:
                        b = next(it)
                    except StopIteration:
                        return
            finally:
                self.ctx.notes, self.ctx.metrics = notes, metrics
                acc.ms += self._elapsed_ms(start) - nested[0] if nested else 0.0
            acc.rows += b.n
            acc.bytes_out += batch_bytes(b)
            box = [b]
            del b
            yield box.pop()  # held by the consumer only: not by this frame while it waits

    @contextlib.contextmanager
    def _frame(self, nested: list | None = None):
        """Times a block; its time counts as nested time of the enclosing frame. ``nested`` gets
        the time of the frames inside this one (ms)."""
        self._sync()
        start = time.perf_counter()
        self._frames.append(0.0)
        try:
            yield start
        finally:
            self._sync()
            inner = self._frames.pop()
            if nested is not None:
                nested.append(inner)
            if self._frames:
                self._frames[-1] += self._elapsed_ms(start)

    def _elapsed_ms(self, start: float) -> float:
        return (time.perf_counter() - start) * 1e3

    def _sync(self) -> None:
        if self.ex.profiler is not None and self.ex.device.type == "cuda":
            torch.cuda.synchronize(self.ex.device)

    def _flush(self) -> None:
        prof = self.ex.profiler
        if prof is None:
            return
        for a in self._accounts.values():
            prof.record(a.node, a.ms, a.rows, a.bytes_out, a.notes, a.metrics)
        self._accounts.clear()


@dataclass
class _Account:
    node: P.Node
    ms: float = 0.0
    rows: int = 0
    bytes_out: int = 0
    notes: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
