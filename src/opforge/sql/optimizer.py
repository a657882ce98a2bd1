"""Rule-based rewrites on the logical plan: constant folding, predicate pushdown (into scans, through
projections, into join sides and join keys), projection pruning; then, with the join planner on,
the rewrites DuckDB also makes and the join order optimizer (``sql/planner``), which replaces each
tree of inner joins by the best one it finds (the binder's FROM order, connected relations first,
is kept with ``join_reordering="none"``):

* a correlated aggregate subquery over the outer query's own rows becomes a window
  (``planner/subquery_windows.py``);
* a decorrelated subquery's aggregate receives the outer key set as a semi join (``_key_sets``);
* before join ordering, selective semi and anti joins sink onto the relation whose rows they
  filter (``_sink_semi``); after it, each settles where the plan's estimated C_out is least
  (``_settle_semi``);
* aggregates are computed partly below joins that cannot duplicate rows
  (``planner/eager_aggregation.py``), and group on the keys that determine the others
  (``planner/dependencies.py``)."""
from __future__ import annotations

import dataclasses
import itertools

from opforge.sql import plan as P
from opforge.sql.expr import Expr, Func, Lit, Ref, and_, conjuncts, fold_constants, is_const, split_equi, substitute
from opforge.sql.planner.dependencies import group_on_determinants
from opforge.sql.planner.eager_aggregation import eager_aggregate
from opforge.sql.planner.join_order import _with_inputs, replace_subtree
from opforge.sql.planner.shared_subtrees import SHARE_MARKS, shapes
from opforge.sql.planner.subquery_windows import windowed_subqueries


_cids, _refs = P.output_cids, P.expr_cids

SEMI_SINK_MAX_SELECTIVITY = 0.5
SEMI_SETTLE_ROUNDS = 4


def optimize(node: P.Node, device, join_order=None) -> P.Node:
    """``join_order``: a ``planner.join_order.JoinOrderOptimizer`` (None: keep the binder's order)."""
    node = _fold(node, device)
    node = _push(node, [])
    node = _prune_plan(node, {o.cid for o in node.outputs})
    node = _topk(node)
    if join_order is None or getattr(join_order, "mode", "auto") == "none":
        return node if join_order is None else join_order.optimize(node)
    from opforge.sql.planner.cardinality import Estimator

    node = windowed_subqueries(node, join_order.stats)
    est = Estimator(node, join_order.stats)  # each pass's estimator shares the last one's estimates
    node = _key_sets(node, est, itertools.count(_max_cid(node) + 1))
    est = Estimator(node, join_order.stats, est)
    node = join_order.optimize(_sink_semi(node, est), est)
    for _ in range(SEMI_SETTLE_ROUNDS):  # a move can make another one pay: again until none does
        moves: list = []
        est = Estimator(node, join_order.stats, est)
        node = _settle_semi(node, est, moves)
        if not moves:
            break
    node = eager_aggregate(node, Estimator(node, join_order.stats, est), itertools.count(_max_cid(node) + 1))
    return group_on_determinants(node, join_order.stats)


# ------------------------------------------------------------------------ key sets into aggregates
KEY_SET_MAX_FRACTION = 0.5


def _key_sets(node: P.Node, est, new_cids) -> P.Node:
    """A join whose right input groups by the join key (a decorrelated subquery: one row per key)
    needs those groups only for the keys its left input has. When the left key is a base table's
    column, a semi join against a copy of that table's scan (its filters too: a superset of the
    left's keys) goes below the aggregate, so the subquery's joins see only those keys. DuckDB's
    delim join does the same with the outer query's distinct keys (TPC-H q2: the minimum supply
    cost of ~40 parts, not of all 200,000). Applied when the scan is estimated at most
    ``KEY_SET_MAX_FRACTION`` of the groups; ``_sink_semi`` then moves the semi join down onto the
    relation it reduces. NULL keys never match the join, so dropping them changes nothing."""
    node = _with_inputs(node, [_key_sets(c, est, new_cids) for c in node.inputs()])
    if not (isinstance(node, P.Join) and node.kind in ("inner", "left") and len(node.left_keys) == 1):
        return node
    lk, rk = node.left_keys[0], node.right_keys[0]
    if not (isinstance(lk, Ref) and isinstance(rk, Ref)):
        return node
    scan = _scan_with(node.left, lk.cid)
    found = _grouped_by(node.right, rk.cid)
    if scan is None or found is None:
        return node
    agg, key = found
    if est.rows(scan) > KEY_SET_MAX_FRACTION * est.rows(agg):
        return node
    cols = [o for o in scan.outputs if o.cid in {lk.cid} | _refs(scan.filters)]  # the key, the filters' columns
    fresh = {o.cid: next(new_cids) for o in cols}
    outs = [P.OutCol(fresh[o.cid], o.name, o.type) for o in cols]
    refs = {o.cid: Ref(fresh[o.cid], o.type, o.name) for o in cols}
    copy = P.Scan(scan.table, outs, [substitute(f, refs) for f in scan.filters])
    semi = P.Join(agg.child, copy, "semi", [key], [refs[lk.cid]])
    return dataclasses.replace(node, right=replace_subtree(node.right, agg, P.Aggregate(semi, agg.keys, agg.aggs)))


def _scan_with(node: P.Node, cid: int) -> P.Scan | None:
    """The scan that outputs column ``cid`` (cids are unique: it is where the column comes from)."""
    if isinstance(node, P.Scan):
        return node if cid in _cids(node) else None
    for c in node.inputs():
        hit = _scan_with(c, cid)
        if hit is not None:
            return hit
    return None


def _grouped_by(node: P.Node, cid: int):
    """(aggregate, its child's key expression) when column ``cid`` of ``node`` is a grouping key of
    an aggregate below renaming projections and filters (a HAVING), else None."""
    if isinstance(node, P.Project):
        e = next((e for o, e in node.exprs if o.cid == cid), None)
        return _grouped_by(node.child, e.cid) if isinstance(e, Ref) else None
    if isinstance(node, P.Filter):
        return _grouped_by(node.child, cid)
    if isinstance(node, P.Aggregate):
        e = next((e for o, e in node.keys if o.cid == cid), None)
        return (node, e) if isinstance(e, Ref) else None
    return None


def _max_cid(node: P.Node) -> int:
    return max([o.cid for o in node.outputs] + [_max_cid(c) for c in node.inputs()] + [-1])


# ------------------------------------------------------------------------------------ semi joins
def _sink_semi(node: P.Node, est) -> P.Node:
    """Each semi / anti join whose left-side columns (keys, residual) all come from one input of
    an inner join below it is moved onto that input, recursively (through Filters too), when it
    is selective (keeps at most ``SEMI_SINK_MAX_SELECTIVITY`` of its rows) and its right side is
    estimated smaller than that input (``est``: a ``planner.cardinality.Estimator``; a large right
    side is cheaper to probe with the join's fewer rows). It only drops rows of that
    input by the input's own columns, so the answer is unchanged; the rows it drops are not joined
    first."""
    if isinstance(node, P.Join) and node.kind in ("semi", "anti"):
        need = (_refs(node.left_keys) | _refs([node.residual])) & _cids(node.left)
        target = _target(node.left, need)
        selective = est.rows(node) <= SEMI_SINK_MAX_SELECTIVITY * est.rows(node.left)
        if target is not node.left and selective and est.rows(node.right) < est.rows(target):
            left, right = _sink_semi(node.left, est), _sink_semi(node.right, est)
            return _place(dataclasses.replace(node, left=left, right=right), left, need)
    return _with_inputs(node, [_sink_semi(c, est) for c in node.inputs()])


def _target(node: P.Node, need: set[int]) -> P.Node:
    """The input a semi join over ``node`` reading columns ``need`` would sink onto."""
    if isinstance(node, P.Join) and node.kind in ("inner", "cross") and need:
        if need <= _cids(node.left):
            return _target(node.left, need)
        if need <= _cids(node.right):
            return _target(node.right, need)
    if isinstance(node, P.Filter) and need <= _cids(node.child):
        return _target(node.child, need)
    return node


def _place(semi: P.Join, target: P.Node, need: set[int]) -> P.Node:
    if isinstance(target, P.Join) and target.kind in ("inner", "cross") and need:
        if need <= _cids(target.left):
            return dataclasses.replace(target, left=_place(semi, target.left, need))
        if need <= _cids(target.right):
            return dataclasses.replace(target, right=_place(semi, target.right, need))
    if isinstance(target, P.Filter) and need <= _cids(target.child):
        return P.Filter(_place(semi, target.child, need), target.predicate)
    return dataclasses.replace(semi, left=target)


def _settle_semi(node: P.Node, est, moves: list) -> P.Node:
    """After join ordering: each semi / anti join goes, among the subtrees below it that hold its
    left-side columns (down through inner joins, filters and other semi / anti joins), above the
    one where the plan's estimated C_out (the sum of every join's output rows) is least. TPC-H
    q21: the EXISTS / NOT EXISTS over lineitem filter the Saudi suppliers' late lines before the
    join with orders, as DuckDB places them, instead of after it."""
    node = _with_inputs(node, [_settle_semi(c, est, moves) for c in node.inputs()])
    if not (isinstance(node, P.Join) and node.kind in ("semi", "anti")):
        return node
    need = (_refs(node.left_keys) | _refs([node.residual])) & _cids(node.left)
    best, least = node, _c_out(node, est)
    for spot in list(_spots(node.left, need))[1:]:
        moved = replace_subtree(node.left, spot, dataclasses.replace(node, left=spot))
        cost = _c_out(moved, est)
        if cost < least * (1 - 1e-9):
            best, least = moved, cost
    if best is not node:
        moves.append(best)
    return best


def _spots(node: P.Node, need: set[int]):
    """``node`` and the subtrees below it that output every column of ``need``, top down."""
    yield node
    if isinstance(node, P.Join) and node.kind in ("inner", "cross"):
        for side in (node.left, node.right):
            if need <= _cids(side):
                yield from _spots(side, need)
    elif isinstance(node, P.Join) and node.kind in ("semi", "anti"):
        yield from _spots(node.left, need)
    elif isinstance(node, P.Filter) and need <= _cids(node.child):
        yield from _spots(node.child, need)


def _c_out(node: P.Node, est) -> float:
    """Estimated sum of the output rows of every join in ``node``."""
    own = est.rows(node) if isinstance(node, P.Join) else 0.0
    return own + sum(_c_out(c, est) for c in node.inputs())


# ---------------------------------------------------------------------------------------------- top-k
def _topk(node: P.Node) -> P.Node:
    """Limit(k) over Sort, directly or through a row-wise Project, becomes TopK(k) (under the
    Project, which then evaluates k rows only): the same rows, in the same order."""
    if isinstance(node, P.Limit) and isinstance(node.child, P.Sort) and node.limit is not None:
        return P.TopK(_topk(node.child.child), node.child.keys, node.limit, node.offset)
    if isinstance(node, P.Limit) and isinstance(node.child, P.Project) and isinstance(node.child.child, P.Sort) \
            and node.limit is not None:
        sort = node.child.child
        return P.Project(P.TopK(_topk(sort.child), sort.keys, node.limit, node.offset), node.child.exprs)
    if isinstance(node, P.Join):
        return P.Join(_topk(node.left), _topk(node.right), node.kind, node.left_keys, node.right_keys,
                      node.residual, node.null_aware)
    if isinstance(node, P.Union):
        return P.Union([_topk(c) for c in node.children], node.outputs, node.all)
    if isinstance(node, P.Filter):
        return P.Filter(_topk(node.child), node.predicate)
    if isinstance(node, P.Project):
        return P.Project(_topk(node.child), node.exprs)
    if isinstance(node, P.Aggregate):
        return P.Aggregate(_topk(node.child), node.keys, node.aggs)
    if isinstance(node, P.Sort):
        return P.Sort(_topk(node.child), node.keys)
    if isinstance(node, P.Limit):
        return P.Limit(_topk(node.child), node.limit, node.offset)
    if isinstance(node, P.Distinct):
        return P.Distinct(_topk(node.child))
    if isinstance(node, (P.WindowFunctions, P.Unnest)):
        return dataclasses.replace(node, child=_topk(node.child))
    return node


# ------------------------------------------------------------------------------------------ folding
CONSTANTS_MAX = 4096
_constants: dict[tuple, tuple[object, object]] = {}  # (constant expression, device) -> folded (value, type)


def _fold_expr(e: Expr, device) -> Expr:
    """``fold_constants``, with the value of each constant subtree memoized across queries: it is
    a pure function of its literals, and evaluating one costs up to a millisecond (a DATE +
    INTERVAL runs date arithmetic on the device), on every planning of the query."""
    if not isinstance(e, Func):
        return e
    if not is_const(e):  # folds to the same Func over folded arguments: it reads a column
        return Func(e.name, [_fold_expr(a, device) for a in e.args], e.type, e.extra)
    try:
        key = (_constant_key(e), str(device))
        hit = _constants.get(key)
    except TypeError:  # an unhashable literal or function argument: fold it every time
        return fold_constants(e, device)
    if hit is not None:
        return Lit(*hit)
    out = fold_constants(e, device)
    if isinstance(out, Lit):  # a constant string function stays a Func: folded every time
        if len(_constants) >= CONSTANTS_MAX:
            _constants.clear()
        _constants[key] = (out.value, out.type)
    return out


def _constant_key(e: Expr) -> tuple:
    """A constant expression's structure; literals by Python type and ``repr`` (0.0 and -0.0, or
    1 and True, fold differently)."""
    if isinstance(e, Lit):
        return type(e.value), repr(e.value), e.type
    return e.name, e.extra, e.type, tuple(_constant_key(a) for a in e.args)


def _fold(node, device):
    f = lambda e: _fold_expr(e, device)  # noqa: E731
    if isinstance(node, P.Filter):
        pred = f(node.predicate)
        child = _fold(node.child, device)
        if isinstance(pred, Lit) and pred.value is True:
            return child
        return P.Filter(child, pred)
    if isinstance(node, P.Project):
        return P.Project(_fold(node.child, device), [(o, f(e)) for o, e in node.exprs])
    if isinstance(node, P.Aggregate):
        aggs = [(o, P.AggCall(c.func, None if c.arg is None else f(c.arg), c.type)) for o, c in node.aggs]
        return P.Aggregate(_fold(node.child, device), [(o, f(e)) for o, e in node.keys], aggs)
    if isinstance(node, P.Join):
        return P.Join(_fold(node.left, device), _fold(node.right, device), node.kind,
                      [f(e) for e in node.left_keys], [f(e) for e in node.right_keys],
                      None if node.residual is None else f(node.residual), node.null_aware)
    if isinstance(node, P.Sort):
        return P.Sort(_fold(node.child, device), [(f(e), d, n) for e, d, n in node.keys])
    if isinstance(node, P.Limit):
        return P.Limit(_fold(node.child, device), node.limit, node.offset)
    if isinstance(node, P.Distinct):
        return P.Distinct(_fold(node.child, device))
    if isinstance(node, P.Union):
        return P.Union([_fold(c, device) for c in node.children], node.outputs, node.all)
    if isinstance(node, P.Scan):
        return P.Scan(node.table, node.outputs, [f(e) for e in node.filters])
    if isinstance(node, P.WindowFunctions):
        return dataclasses.replace(node, child=_fold(node.child, device))
    if isinstance(node, P.Unnest):
        return dataclasses.replace(node, child=_fold(node.child, device), lists=[(o, f(e)) for o, e in node.lists])
    return node


# ----------------------------------------------------------------------------------------- pushdown
def _wrap(node, preds):
    return P.Filter(node, and_(preds)) if preds else node


def _push(node: P.Node, preds: list[Expr]) -> P.Node:
    if isinstance(node, P.Filter):
        return _push(node.child, preds + conjuncts(node.predicate))
    if isinstance(node, P.Scan):
        mine = [p for p in preds if p.cids() <= _cids(node)]
        rest = [p for p in preds if p not in mine]
        return _wrap(P.Scan(node.table, node.outputs, node.filters + mine), rest)
    if isinstance(node, P.Project):
        mapping = {o.cid: e for o, e in node.exprs}
        down = [substitute(p, mapping) for p in preds if p.cids() <= set(mapping)]
        stay = [p for p in preds if not p.cids() <= set(mapping)]
        return _wrap(P.Project(_push(node.child, down), node.exprs), stay)
    if isinstance(node, P.Join):
        lc, rc = _cids(node.left), _cids(node.right)
        kind = node.kind
        to_left = [p for p in preds if p.cids() <= lc and kind in ("inner", "cross", "left", "semi", "anti")]
        to_right = [p for p in preds if p.cids() <= rc and p not in to_left and kind in ("inner", "cross", "right")]
        stay = [p for p in preds if p not in to_left and p not in to_right]
        lk, rk = list(node.left_keys), list(node.right_keys)
        residual = conjuncts(node.residual)
        if kind in ("inner", "cross"):
            elk, erk, eresidual = split_equi(stay, lc, rc)
            lk, rk, residual = lk + elk, rk + erk, residual + eresidual
            stay = []
            # a residual over one side only of an inner join filters that side
            to_left += [p for p in residual if p.cids() <= lc]
            to_right += [p for p in residual if p.cids() <= rc and p.cids() - lc]
            residual = [p for p in residual if not (p.cids() <= lc or p.cids() <= rc)]
            kind = "inner" if (lk or residual) else "cross"
        elif kind in ("semi", "anti"):
            # conjuncts of the subquery side only belong below it
            to_right = [p for p in residual if p.cids() <= rc]
            residual = [p for p in residual if not p.cids() <= rc]
        elif kind == "left":
            to_right = [p for p in residual if p.cids() <= rc]
            residual = [p for p in residual if not p.cids() <= rc]
        j = P.Join(_push(node.left, to_left), _push(node.right, to_right), kind, lk, rk,
                   and_(residual) if residual else None, node.null_aware)
        return _wrap(j, stay)
    if isinstance(node, P.Aggregate):
        keymap = {o.cid: e for o, e in node.keys}
        down = [substitute(p, keymap) for p in preds if p.cids() and p.cids() <= set(keymap)]
        stay = [p for p in preds if not (p.cids() and p.cids() <= set(keymap))]
        return _wrap(P.Aggregate(_push(node.child, down), node.keys, node.aggs), stay)
    if isinstance(node, P.Sort):
        return P.Sort(_push(node.child, preds), node.keys)
    if isinstance(node, P.Distinct):
        return P.Distinct(_push(node.child, preds))
    if isinstance(node, P.Limit):
        return _wrap(P.Limit(_push(node.child, []), node.limit, node.offset), preds)
    if isinstance(node, P.Unnest):  # a predicate over the child's columns keeps or drops whole rows
        down = [p for p in preds if p.cids() <= _cids(node.child)]
        return _wrap(dataclasses.replace(node, child=_push(node.child, down)), [p for p in preds if p not in down])
    if isinstance(node, P.WindowFunctions):
        # a predicate over partition keys only keeps or drops whole partitions: the windows of the
        # partitions kept are the same, so it filters below them
        keys = {e.cid for e in node.partition if isinstance(e, Ref)}
        down = [p for p in preds if p.cids() and p.cids() <= keys]
        stay = [p for p in preds if p not in down]
        return _wrap(dataclasses.replace(node, child=_push(node.child, down)), stay)
    if isinstance(node, P.Union):
        return _push_union(node, preds)
    return _wrap(node, preds)


def _push_union(node: P.Union, preds: list[Expr]) -> P.Node:
    """A predicate over a UNION [ALL]'s columns keeps or drops each row by its values, so it filters
    every input, read from the input's column at the same position (a UNION dedupes whole rows:
    the rows it keeps are the same). Only over columns whose type each input shares: a comparison
    was bound for its operands' types (TPC-DS q75: each year's copy of the all_sales CTE reads
    that year's sales only)."""
    at = {o.cid: i for i, o in enumerate(node.outputs)}
    same = {o.cid for i, o in enumerate(node.outputs) if all(c.outputs[i].type == o.type for c in node.children)}
    down = [p for p in preds if p.cids() <= same]
    children = []
    for c in node.children:
        refs = {cid: Ref(c.outputs[i].cid, c.outputs[i].type, c.outputs[i].name) for cid, i in at.items()}
        children.append(_push(c, [substitute(p, refs) for p in down]))
    return _wrap(P.Union(children, node.outputs, node.all), [p for p in preds if p not in down])


# ------------------------------------------------------------------------------------------ pruning
def _prune_plan(node: P.Node, need: set[int]) -> P.Node:
    """Projection pruning, twice: copies of one subtree (equal up to column ids: the block the
    binder binds once per grouping set of a ROLLUP, a CTE read twice) keep the columns any copy
    needs, so they stay alike and the executor computes them once (``planner/shared_subtrees.py``;
    TPC-DS q27: the grand total needs no ``i_item_id``, the other grouping sets do). The first pass
    learns which output positions each shape is asked for; the second prunes to their union. Where
    the first pass met no join, aggregate, union, distinct or window shape twice, no subtree is
    shared (``SHARE_MARKS``): the first pass's plan is the answer (88 of TPC-DS's 123 plans)."""
    asked: dict[int, set[int]] = {}
    met_twice: list[int] = []
    shape_of = shapes(node)
    pruned = _prune(node, need, (shape_of, asked, met_twice))
    return _prune(node, need, (shape_of, asked, met_twice)) if met_twice else pruned


def _prune(node: P.Node, need: set[int], copies: tuple[dict, dict, list]) -> P.Node:
    shape_of, asked, met_twice = copies
    shape = shape_of.get(id(node))
    if shape is not None:
        if shape in asked and not met_twice and isinstance(node, SHARE_MARKS):
            met_twice.append(shape)
        positions = asked.setdefault(shape, set())
        positions |= {i for i, o in enumerate(node.outputs) if o.cid in need}
        need = need | {node.outputs[i].cid for i in positions}
    if isinstance(node, P.Scan):
        keep = need | _refs(node.filters)
        outs = [o for o in node.outputs if o.cid in keep] or node.outputs[:1]
        return P.Scan(node.table, outs, node.filters)
    if isinstance(node, P.Filter):
        return P.Filter(_prune(node.child, need | node.predicate.cids(), copies), node.predicate)
    if isinstance(node, P.Project):
        exprs = [(o, e) for o, e in node.exprs if o.cid in need]
        return P.Project(_prune(node.child, _refs(e for _, e in exprs), copies), exprs)
    if isinstance(node, P.Aggregate):
        aggs = [(o, c) for o, c in node.aggs if o.cid in need]
        child_need = _refs(e for _, e in node.keys) | _refs(c.arg for _, c in aggs)
        return P.Aggregate(_prune(node.child, child_need, copies), node.keys, aggs)
    if isinstance(node, P.Window):
        aggs = [(o, c) for o, c in node.aggs if o.cid in need]
        child_need = (need & _cids(node.child)) | _refs(node.partition) | _refs(c.arg for _, c in aggs)
        return P.Window(_prune(node.child, child_need, copies), node.partition, aggs)
    if isinstance(node, P.Unnest):  # every list stays: it decides the rows even when its column is unused
        child_need = (need & _cids(node.child)) | _refs(e for _, e in node.lists)
        return dataclasses.replace(node, child=_prune(node.child, child_need, copies))
    if isinstance(node, P.WindowFunctions):
        calls = [(o, c) for o, c in node.calls if o.cid in need]
        if not calls:
            return _prune(node.child, need & _cids(node.child), copies)
        child_need = (need & _cids(node.child)) | _refs(node.partition) | _refs(e for e, _, _ in node.order) \
            | _refs(a for _, c in calls for a in c.exprs())
        return dataclasses.replace(node, child=_prune(node.child, child_need, copies), calls=calls)
    if isinstance(node, P.Join):
        n = need | _refs(node.left_keys) | _refs(node.right_keys) | _refs([node.residual])
        left, right = _prune(node.left, n & _cids(node.left), copies), _prune(node.right, n & _cids(node.right), copies)
        return P.Join(left, right, node.kind, node.left_keys, node.right_keys, node.residual, node.null_aware)
    if isinstance(node, P.Sort):
        return P.Sort(_prune(node.child, need | _refs(e for e, _, _ in node.keys), copies), node.keys)
    if isinstance(node, P.Limit):
        return P.Limit(_prune(node.child, need, copies), node.limit, node.offset)
    if isinstance(node, P.Distinct):
        return P.Distinct(_prune(node.child, _cids(node.child), copies))
    if isinstance(node, P.Union):
        return P.Union([_prune(c, _cids(c), copies) for c in node.children], node.outputs, node.all)
    return node
