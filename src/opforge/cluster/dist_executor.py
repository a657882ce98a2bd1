"""One worker's part of a distributed SQL query: the single-process executor's operators, with the
exchanges between workers inserted where a plan node needs rows from other workers.

Every batch is either *partitioned* (each row on exactly one worker: what a scan of the regions a
worker leads gives) or *replicated* (every worker holds all rows). Each node keeps or changes that:

* scan: partitioned (the worker's leader regions; replicated on a cluster of one worker, which
  holds every row: nothing is exchanged); filter / project: as their input;
* co-location: a scan of a table hash-partitioned on a key knows its rows' *layout* (the region
  count and the worker leading each region); a join of two inputs laid out alike on their join
  keys (orders and lineitem on the order key, their regions led by the same workers), or an
  aggregate grouped on the layout's key, runs where the rows are: nothing moves. Rows shuffled
  by one key are laid out by it too, and a join whose one side's rows stay where they are (the
  other gathered) keeps that side's layout;
* join: semi / anti / left / cross joins see the whole right side (gathered: a NOT IN must see
  every NULL), right joins the whole left; an inner join gathers a small right side (broadcast,
  ``planner/distribution.py``'s rule over the global bytes), else both sides are shuffled by a hash
  of the keys (partitioned); full joins are always shuffled;
* aggregate: decomposable ones (sum, count, min, max, avg) aggregate each worker's rows first and
  move only the partials; then, as the others do with their input, grouped ones shuffle by the
  group keys (each group on one worker), global ones gather;
* sort, top-k, limit, distinct, window, union: gather, then run the same operator everywhere.

Every exchange is a fixed cost (``exchange.py``: two collectives, a host sync), which on small
batches is most of a query's time (issue #29), so exchanges are shared where they can be.

Runtime filters (``connect(runtime_filters=True)``): a join that makes one
(``physical/runtime_filter.filter_plan``) computes its build side first, merges every worker's
filter of it over the group (``global_filters.py``: one filter of the whole build side) and pushes
it into the probe side's scans, so rows that cannot match are dropped before they are shuffled.
A join that will run co-located uses the worker's own filter (every match of a row is on its
worker): nothing moves for it. A build side the join gathers anyway (a semi join's, an inner
join's under ``SMALL_BUILD_BYTES``) is gathered first and the filter made from its rows: no
exchange of its own. Skew (``skew_threshold``): a partitioned inner join finds either
side's heavy keys over the group and deals that side's rows of them round-robin, sending the other
side's rows of them to every worker (``skew_shuffle.py``).
Per-operator rows and bytes moved (and rows a runtime filter dropped) are kept in ``stats`` for
the driver's EXPLAIN ANALYZE-style report.
"""
from __future__ import annotations

import dataclasses
import time

import torch

import opforge.distributed as D
from opforge.distributed.collectives import exchange

from opforge.cluster import exchange as X
from opforge.cluster import global_filters, skew_shuffle
from opforge.sql import plan as P
from opforge.sql.expr import Batch, Ref
from opforge.sql.expr.evaluation import evaluate
from opforge.sql.executor import Executor
from opforge.sql.outofcore.grace import concat
from opforge.sql.outofcore.partial_aggregate import decomposable, two_step
from opforge.sql.physical import runtime_filter as RF
from opforge.sql.physical.cross_product import aggregate_cross_product, aggregates_without_pairs
from opforge.sql.planner.distribution import choose_distribution

PARTITIONED, REPLICATED = "partitioned", "replicated"
# An inner join's build side under this many bytes over all workers is gathered (broadcast) before
# its runtime filter is made: below it the two methods' byte costs differ by microseconds, less than
# the latency of the runtime filter's own exchange (and of the probe side's shuffle) that it saves.
SMALL_BUILD_BYTES = 1 << 20
GATHER_RIGHT = ("semi", "anti", "left", "cross")


class DistributedExecutor(Executor):
    """Runs a plan on this worker; ``group``: the cluster's process group (None: the default one)."""

    def __init__(self, tables: dict, device, ctx, world: int, group=None, layouts: dict | None = None):
        self.runtime_filters = ctx.runtime_filters  # made here, across workers, not by the base executor
        ctx.runtime_filters = False
        super().__init__(tables, device, ctx)
        self.world, self.group = world, group
        self.layouts = layouts or {}  # table -> (key column, layout signature)
        self.stats: list[dict] = []  # one per exchange: node, kind, rows in / out, bytes, ms

    # -- exchanges ----------------------------------------------------------------------------------
    def _exchange(self, node, kind: str, batch: Batch, move) -> Batch:
        t0 = time.perf_counter()
        out = move(batch)
        self._stat(node, kind, batch.n, out.n, X.batch_bytes(batch), t0)
        return out

    def _stat(self, node, kind: str, rows_in: int, rows_out: int, sent: int, t0: float) -> None:
        self.stats.append({"node": node.describe()[:80], "exchange": kind, "rows_in": rows_in, "rows_out": rows_out,
                           "bytes_sent": sent, "ms": (time.perf_counter() - t0) * 1e3})

    def _replicated(self, node, item: tuple[Batch, str]) -> Batch:
        batch, spread = item
        if spread == REPLICATED:
            return batch
        return self._exchange(node, "gather", batch, lambda b: X.gather_rows(b, self.group))

    def _by_keys(self, node, item: tuple[Batch, str], keys) -> Batch:
        batch, spread = item
        if spread == REPLICATED:
            batch = X.slice_rows(batch, self.group)
        dest = X.key_dest([evaluate(k, batch) for k in keys], self.world)
        out = self._exchange(node, "shuffle", batch, lambda b: X.shuffle_rows(b, dest, self.group))
        if len(keys) == 1 and isinstance(keys[0], Ref):
            _lay(out, frozenset([keys[0].cid]), f"shuffle/{self.world}")
        return out

    def _global_bytes(self, *batches: Batch) -> list[int]:
        """Each batch's bytes over all workers (one collective for all)."""
        table = exchange("opforge.cluster.join_distribution", "the join sides' bytes",
                         [X.batch_bytes(b) for b in batches], "", self.group)
        return table.sum(0).tolist()

    # -- the plan -----------------------------------------------------------------------------------
    def run_distributed(self, node: P.Node, pushed: list | None = None) -> tuple[Batch, str]:
        """``pushed``: runtime filters (``runtime_filter.Pushed``, each of the whole build side) the
        subtree's scans apply."""
        pushed = pushed or []
        if isinstance(node, P.Scan):
            t0 = time.perf_counter()
            out = self._operator(node, [], pushed)
            if any(p.cid in {o.cid for o in node.outputs} for p in pushed):
                self._stat(node, "runtime-filtered", self.tables[node.table].num_rows, out.n, 0, t0)
            key, sig = self.layouts.get(node.table, (None, None))
            _lay(out, frozenset(o.cid for o in node.outputs if o.name == key), sig)
            return out, PARTITIONED if self.world > 1 else REPLICATED  # one worker holds every row
        if isinstance(node, P.OneRow):
            return self._operator(node, [], []), REPLICATED
        if aggregates_without_pairs(node):
            join = node.child
            left = self._replicated(join, self.run_distributed(join.left))
            right = self._replicated(join, self.run_distributed(join.right))
            return aggregate_cross_product(node, left, right, self.ctx), REPLICATED
        routes = RF.route(node, pushed)
        if isinstance(node, P.Join):
            return self._join(node, *self._join_inputs(node, routes))
        items = [self.run_distributed(c, r) for c, r in zip(node.inputs(), routes)]
        if isinstance(node, (P.Filter, P.Project)):
            src = items[0][0]
            out = self._operator(node, [src])
            if isinstance(node, P.Filter):
                _lay(out, src.hash_keys, _layout(src))
            else:
                _lay(out, frozenset(o.cid for o, e in node.exprs if isinstance(e, Ref) and e.cid in src.hash_keys),
                     _layout(src))
            return out, items[0][1]
        if isinstance(node, P.Aggregate) and node.keys and items[0][1] == PARTITIONED:
            src = items[0][0]
            on = [o.cid for o, e in node.keys if isinstance(e, Ref) and e.cid in src.hash_keys]
            if on and _layout(src) is not None:  # groups never span workers: aggregate in place
                self.stats.append({"node": node.describe()[:80], "exchange": "none (co-located)", "rows_in": src.n,
                                   "rows_out": src.n, "bytes_sent": 0, "ms": 0.0})
                out = self._operator(node, [src])
                _lay(out, frozenset(on), _layout(src))
                return out, PARTITIONED
            if decomposable(node):
                return self._two_step(node, src), PARTITIONED
            part = self._by_keys(node, items[0], [e for _, e in node.keys])
            return self._operator(node, [part]), PARTITIONED
        if isinstance(node, P.Aggregate) and items[0][1] == PARTITIONED and decomposable(node):
            return self._two_step(node, items[0][0]), REPLICATED
        if isinstance(node, (P.TopK, P.Limit)) and node.limit is not None and items[0][1] == PARTITIONED:
            return self._operator(node, [self._replicated(node, (self._first_rows(node, items[0][0]), PARTITIONED))]), \
                REPLICATED
        inputs = [self._replicated(node, it) for it in items]
        return self._operator(node, inputs), REPLICATED

    def _first_rows(self, node: P.TopK | P.Limit, src: Batch) -> Batch:
        """A worker's first ``limit + offset`` rows of an ORDER BY ... LIMIT (or a LIMIT): only
        they can reach the answer, so only they are gathered (Spark's TakeOrderedAndProject). The
        same rows as the whole gather's: a row among the first ``k`` of the rows gathered in worker
        order (the sort is stable) is among the first ``k`` of its own worker's."""
        keep = dataclasses.replace(node, limit=node.limit + node.offset, offset=0)
        return self._operator(keep, [src])

    def _two_step(self, node: P.Aggregate, src: Batch) -> Batch:
        """A decomposable aggregation of partitioned rows in two steps (``partial_aggregate``):
        each worker aggregates its rows, and only the partials move (by the group keys, or to every
        worker for a global aggregate) to be combined: a worker's groups instead of its rows."""
        steps = two_step(node)
        partial = self._operator(steps.partial, [src])
        if node.keys:
            moved = self._by_keys(node, (partial, PARTITIONED), [e for _, e in steps.final.keys])
        else:
            moved = self._replicated(node, (partial, PARTITIONED))
        return steps.finish(self._operator(steps.final, [moved]))

    def _join_inputs(self, node: P.Join, routes) -> tuple[tuple, tuple]:
        """Both sides; with a runtime filter, the build side first and its filter (of every worker's
        build rows) pushed into the other side."""
        plan = RF.filter_plan(node) if self.runtime_filters else None
        if plan is None:
            return self.run_distributed(node.left, routes[0]), self.run_distributed(node.right, routes[1])
        if plan.source == "right":
            right = self.run_distributed(node.right, routes[1])
            local = self._colocated_with(node, node.left, node.left_keys[0], right[0], node.right_keys[0])
            if not local and not self._may_colocate(node, right[0]):
                right = self._gathered_early(node, right)
            left = self.run_distributed(node.left, routes[0] + [self._filter(node, plan, right, local)])
        else:
            left = self.run_distributed(node.left, routes[0])
            local = self._colocated_with(node, node.right, node.right_keys[0], left[0], node.left_keys[0])
            right = self.run_distributed(node.right, routes[1] + [self._filter(node, plan, left, local)])
        if local and not _colocated(node, left[0], right[0]):
            raise RuntimeError(f"opforge.cluster: a worker-local runtime filter was made for a join that did not "
                               f"run co-located ({node.describe()[:80]})")  # it would have dropped matches
        return left, right

    def _may_colocate(self, node: P.Join, right: Batch) -> bool:
        """Whether the join may run co-located once its left side is computed: the right side is
        laid out by its key, and the left key is a column of a scan laid out alike (rows that stay
        where they are keep that layout through filters and joins)."""
        if len(node.left_keys) != 1 or not isinstance(node.left_keys[0], Ref):
            return False
        rk, layout = node.right_keys[0], _layout(right)
        if not isinstance(rk, Ref) or rk.cid not in right.hash_keys or layout is None:
            return False
        return any(self.layouts.get(scan.table, (None, None)) == (o.name, layout)
                   for scan in _scans(node.left) for o in scan.outputs if o.cid == node.left_keys[0].cid)

    def _gathered_early(self, node: P.Join, right: tuple[Batch, str]) -> tuple[Batch, str]:
        """The build side gathered before its runtime filter is made, where the join gathers it
        anyway: a semi join always, an inner join when the whole build side is under
        ``SMALL_BUILD_BYTES`` (broadcast, unless ``join_distribution='partitioned'``). The filter is
        then made from the gathered rows, with no exchange of its own."""
        batch, spread = right
        if spread == REPLICATED or node.kind not in ("semi", "inner"):
            return right
        setting = self.ctx.join_distribution
        if node.kind == "semi" or setting == "broadcast":
            return self._replicated(node, right), REPLICATED
        if setting == "partitioned":
            return right
        t0 = time.perf_counter()
        out = X.gather_rows(batch, self.group, limit=SMALL_BUILD_BYTES)
        if out is None:  # a larger build side: the distribution is chosen once both sides are known
            self._stat(node, "size (not gathered)", batch.n, batch.n, 0, t0)
            return right
        self._stat(node, "gather (small build side)", batch.n, out.n, X.batch_bytes(batch), t0)
        return out, REPLICATED

    def _colocated_with(self, node: P.Join, other: P.Node, other_key, built: Batch, built_key) -> bool:
        """Will the join run co-located (``_colocated``) once ``other`` is computed? Known before it
        runs for a scan under filters and projections (what ``run_distributed`` lays out the same way)."""
        if len(node.left_keys) != 1 or not isinstance(other_key, Ref) or not isinstance(built_key, Ref):
            return False
        laid = _static_layout(other, self.layouts)
        return (laid is not None and other_key.cid in laid[0] and built_key.cid in built.hash_keys
                and _layout(built) is not None and _layout(built) == laid[1])

    def _filter(self, node: P.Join, plan, built: tuple[Batch, str], local: bool):
        """The runtime filter of the build side: this worker's rows when the join runs co-located
        (every match of a row is on its worker: nothing moves) or when they are all the rows
        (replicated), else every worker's."""
        built, spread = built
        if local or spread == REPLICATED:
            return RF.make(node, plan, built)
        t0 = time.perf_counter()
        src_keys, dst_keys = (node.right_keys, node.left_keys) if plan.source == "right" else \
            (node.left_keys, node.right_keys)
        col = evaluate(src_keys[plan.pair], built)
        f, sent = global_filters.build(col.values, col.valid, self.group)
        self._stat(node, "filter (all workers)", built.n, built.n, sent, t0)
        key = dst_keys[plan.pair]
        return RF.Pushed(key.cid, f, f"{f.describe()} from join on {key} = {src_keys[plan.pair]} (all workers)")

    def _join(self, node: P.Join, left, right) -> tuple[Batch, str]:
        (lb, ls), (rb, rs) = left, right
        if ls == REPLICATED and rs == REPLICATED:
            return self._operator(node, [lb, rb]), REPLICATED
        kind = node.kind if node.left_keys else "cross"
        if ls == rs == PARTITIONED and _colocated(node, lb, rb):
            self.stats.append({"node": node.describe()[:80], "exchange": "none (co-located)", "rows_in": lb.n + rb.n,
                               "rows_out": lb.n + rb.n, "bytes_sent": 0, "ms": 0.0})
            out = self._operator(node, [lb, rb])
            if kind == "inner":
                _lay(out, frozenset([node.left_keys[0].cid, node.right_keys[0].cid]), _layout(lb))
            elif kind in ("left", "semi", "anti"):
                _lay(out, lb.hash_keys, _layout(lb))
            return out, PARTITIONED
        # Below, one side's rows stay on their workers and meet the other side whole: the output
        # keeps the staying side's layout (a later join on its key runs co-located).
        if kind in GATHER_RIGHT or (kind == "inner" and ls == PARTITIONED and rs == REPLICATED):
            if ls == REPLICATED:  # the left side is split so each row is joined once
                return self._operator(node, [X.slice_rows(lb, self.group), rb]), PARTITIONED
            return _kept(self._operator(node, [lb, self._replicated(node, right)]), lb), PARTITIONED
        if kind in ("right", "inner") and ls == REPLICATED:
            return _kept(self._operator(node, [lb, rb]), rb), PARTITIONED
        if kind == "right":
            return _kept(self._operator(node, [self._replicated(node, left), rb]), rb), PARTITIONED
        if kind == "inner":
            build, probe = self._global_bytes(rb, lb)
            choice = choose_distribution(build, probe, self.world, self.ctx.join_distribution, False)
            if choice.method == "broadcast":
                return _kept(self._operator(node, [lb, self._replicated(node, right)]), lb), PARTITIONED
        if kind == "inner" and len(node.left_keys) == 1 and self.ctx.skew_threshold is not None:
            return self._skewed(node, left, right)
        return self._shuffled(node, left, right, lay=kind == "inner")

    def _skewed(self, node: P.Join, left, right) -> tuple[Batch, str]:
        """The partitioned inner join with a skewed side's heavy keys handled apart
        (``skew_shuffle.py``); the plain one when no key is heavy."""
        (lb, ls), (rb, rs) = left, right
        lb = X.slice_rows(lb, self.group) if ls == REPLICATED else lb
        rb = X.slice_rows(rb, self.group) if rs == REPLICATED else rb
        lbits = X.key_bits(evaluate(node.left_keys[0], lb))
        rbits = X.key_bits(evaluate(node.right_keys[0], rb))
        hl, hr = skew_shuffle.heavy_keys([lbits, rbits], self.ctx.skew_threshold, self.group)
        if hl.numel():
            lp, rp = self._deal(node, lb, lbits, hl), self._to_all(node, rb, rbits, hl)
        elif hr.numel():
            lp, rp = self._to_all(node, lb, lbits, hr), self._deal(node, rb, rbits, hr)
        else:
            return self._shuffled(node, (lb, PARTITIONED), (rb, PARTITIONED), lay=True)
        return self._operator(node, [lp, rp]), PARTITIONED  # heavy keys' rows are spread: no layout

    def _deal(self, node, batch: Batch, bits: torch.Tensor, heavy: torch.Tensor) -> Batch:
        """The skewed side: heavy keys' rows round-robin, the others by their key's hash."""
        t0 = time.perf_counter()
        dest, dealt = skew_shuffle.dealt_dest(bits, heavy, self.world, D.rank(self.group))
        out = X.shuffle_rows(batch, dest, self.group)
        self._stat(node, f"shuffle, {heavy.numel()} heavy keys: {dealt} rows dealt", batch.n, out.n,
                   X.batch_bytes(batch), t0)
        return out

    def _to_all(self, node, batch: Batch, bits: torch.Tensor, heavy: torch.Tensor) -> Batch:
        """The other side: heavy keys' rows to every worker, the others by their key's hash."""
        t0 = time.perf_counter()
        hot = torch.isin(bits, heavy)
        rest, shared = batch.take(torch.nonzero(~hot).flatten()), batch.take(torch.nonzero(hot).flatten())
        out = concat([X.shuffle_rows(rest, D.hash_partition([bits[~hot]], self.world), self.group),
                      X.gather_rows(shared, self.group)])
        self._stat(node, f"shuffle, heavy keys' {shared.n} rows to all", batch.n, out.n, X.batch_bytes(batch), t0)
        return out

    def _shuffled(self, node: P.Join, left, right, lay: bool) -> tuple[Batch, str]:
        """Both sides shuffled by a hash of the keys; ``lay``: the output is laid out by them (inner)."""
        lp = self._by_keys(node, left, node.left_keys)
        rp = self._by_keys(node, right, node.right_keys)
        out = self._operator(node, [lp, rp])
        if lay and len(node.left_keys) == 1 and lp.hash_keys and rp.hash_keys:
            _lay(out, lp.hash_keys | rp.hash_keys, _layout(lp))
        return out, PARTITIONED


def _lay(batch: Batch, keys: frozenset, layout: str | None) -> None:
    """Record that ``batch``'s rows sit on workers by the hash of column(s) ``keys`` under ``layout``."""
    if keys and layout is not None:
        batch.hash_keys, batch.layout = keys, layout


def _scans(node: P.Node):
    if isinstance(node, P.Scan):
        yield node
    for child in node.inputs():
        yield from _scans(child)


def _kept(out: Batch, staying: Batch) -> Batch:
    """``out`` laid out as ``staying``, whose rows it was made from where they were."""
    _lay(out, staying.hash_keys, _layout(staying))
    return out


def _static_layout(node: P.Node, layouts: dict) -> tuple[frozenset, str] | None:
    """(hash key cids, layout) of a scan under filters and projections, as ``run_distributed`` lays
    out its rows (None where it would not, or the node is of another kind)."""
    if isinstance(node, P.Scan):
        key, sig = layouts.get(node.table, (None, None))
        keys = frozenset(o.cid for o in node.outputs if o.name == key)
        return (keys, sig) if keys and sig is not None else None
    if isinstance(node, (P.Filter, P.Project)):
        below = _static_layout(node.child, layouts)
        if below is None or isinstance(node, P.Filter):
            return below
        keys = frozenset(o.cid for o, e in node.exprs if isinstance(e, Ref) and e.cid in below[0])
        return (keys, below[1]) if keys else None
    return None


def _layout(batch: Batch) -> str | None:
    return getattr(batch, "layout", None) if batch.hash_keys else None


def _colocated(node: P.Join, left: Batch, right: Batch) -> bool:
    """One key pair, each side laid out by its key under the same layout."""
    if len(node.left_keys) != 1:
        return False
    lk, rk = node.left_keys[0], node.right_keys[0]
    return (isinstance(lk, Ref) and isinstance(rk, Ref) and lk.cid in left.hash_keys and rk.cid in right.hash_keys
            and _layout(left) is not None and _layout(left) == _layout(right))
