"""Eager aggregation (Yan & Larson): an aggregate whose arguments all come from one input S of the
joins below it, where every join between S and the aggregate meets at most one row on the other side
(its key there is unique), is computed in two steps: a partial aggregate of S grouped by the columns
of S used above it (the final keys, join keys, predicates), then the joins on the fewer rows, then
the final aggregate combining the partials (sums of sums and counts, min of mins). Each row of S
meets the same other rows as its partial group, so the groups and values are those of the one-step
aggregate. Applied where the partial aggregate is estimated to shrink S. TPC-H q13: orders counted
per customer before the outer join (150,000 rows out at SF 1 instead of 1.5M); q18, q10: lineitem
summed per order before the joins, as DuckDB plans them."""
from __future__ import annotations

from opforge.sql import plan as P
from opforge.sql.expr import Func, Lit, Ref, value_with
from opforge.sql.planner.join_order import _with_inputs, replace_subtree

_cids, _refs = P.output_cids, P.expr_cids

EAGER_FUNCS = {"sum": "sum", "count": "sum", "count_star": "sum", "min": "min", "max": "max"}  # partial -> final
# the partial aggregate must cut S to this share of its rows (estimated): it costs a pass over S, and
# pays in the joins above and in a final aggregate over fewer, often wide (TPC-H q10: 7 keys) rows
EAGER_MAX_FRACTION = 0.8


def eager_aggregate(node: P.Node, est, new_cids) -> P.Node:
    """Every aggregate of ``node`` in two steps where the module docstring's rule allows
    (``est``: a ``cardinality.Estimator``; ``new_cids``: fresh column ids)."""
    node = _with_inputs(node, [eager_aggregate(c, est, new_cids) for c in node.inputs()])
    if not isinstance(node, P.Aggregate) or not node.keys or not node.aggs \
            or any(a.func not in EAGER_FUNCS for _, a in node.aggs):
        return node
    args = _refs([a.arg for _, a in node.aggs if a.arg is not None])
    if not args:
        return node
    best = None
    for site, above, outer in _partial_sites(node.child, args, _refs([e for _, e in node.keys]), node.aggs,
                                             est.tables):
        keys = [o for o in site.outputs if o.cid in above]
        ratio = est.rows(P.Aggregate(site, [(o, Ref(o.cid, o.type, o.name)) for o in keys], [])) / \
            max(1.0, est.rows(site))
        if ratio <= EAGER_MAX_FRACTION and (best is None or ratio <= best[0]):
            best = (ratio, site, keys, outer)
    if best is None:
        return node
    _, site, keys, outer = best
    partials = [(P.OutCol(next(new_cids), f"partial_{o.name}", a.type), a) for o, a in node.aggs]
    pre = P.Aggregate(site, [(o, Ref(o.cid, o.type, o.name)) for o in keys], partials)
    finals, fixes = [], []
    for (o, a), (po, _) in zip(node.aggs, partials):
        combined = P.AggCall(EAGER_FUNCS[a.func], Ref(po.cid, po.type, po.name), a.type)
        if outer and a.func == "count":  # a customer with no orders: the partial is NULL, the count 0
            mid = P.OutCol(next(new_cids), o.name, o.type)
            finals.append((mid, combined))
            fixes.append((o, Func("coalesce", [Ref(mid.cid, mid.type, mid.name), Lit(0, o.type)], o.type)))
        else:
            finals.append((o, combined))
            fixes.append((o, Ref(o.cid, o.type, o.name)))
    top = P.Aggregate(replace_subtree(node.child, site, pre), node.keys, finals)
    if all(isinstance(e, Ref) and e.cid == o.cid for o, e in fixes):
        return top
    return P.Project(top, [(o, Ref(o.cid, o.type, o.name)) for o, _ in node.keys] + fixes)


def _partial_sites(node: P.Node, args: set[int], used: set[int], aggs, tables):
    """Each input S below ``node``, top down, that holds ``args`` and whose rows each meet at most
    one row of every other input between S and ``node``: (S, columns of S used above it, whether
    S is on the NULL-supplying side of an outer join). ``used``: the columns the aggregate groups
    by; every column read above S becomes a grouping key of the partial aggregate (an argument
    too: grouped by its value, its partial is still exact)."""
    outer, cur = False, node
    while True:
        step = _below(cur, args, aggs, tables)
        if step is None:
            return
        cur, reads, null_side = step
        used = used | reads  # grouping keys of the partial: a column read above keeps its values
        outer = outer or null_side
        yield cur, used & _cids(cur), outer


def _below(node: P.Node, args: set[int], aggs, tables):
    """The input of ``node`` one step down towards ``args`` that a partial aggregate may replace:
    (input, columns ``node`` reads from it, whether the input is NULL-supplying), or None."""
    if isinstance(node, P.Filter) and args <= _cids(node.child):
        return node.child, _refs([node.predicate]), False
    if not isinstance(node, P.Join):
        return None
    reads = _refs(list(node.left_keys) + list(node.right_keys) + [node.residual])
    if node.kind in ("semi", "anti") and args <= _cids(node.left):
        return node.left, reads, False
    if node.kind not in ("inner", "left") or not node.left_keys:
        return None
    if args <= _cids(node.left) and is_unique(node.right, node.right_keys, tables):
        return node.left, reads, False
    if args <= _cids(node.right) and is_unique(node.left, node.left_keys, tables):
        if node.kind == "left" and not all(_null_on_padding(a) for _, a in aggs):
            return None  # the padded row of an unmatched left row would count, its partial is NULL
        return node.right, reads, node.kind == "left"
    return None


def _null_on_padding(a: P.AggCall) -> bool:
    """Whether the aggregate ignores the row the outer join pads with NULLs: its argument is NULL
    when every column it reads is. Then the final aggregate, which sees a NULL partial for that
    row, agrees (a count's NULL becomes 0). count(*) counts the padded row; sum(coalesce(x, 0))
    adds its 0 (issue 24: NULL instead of 0 for a nation without suppliers)."""
    if a.arg is None:
        return False
    out = value_with(a.arg, {})
    return out is not None and out.value is None


def is_unique(node: P.Node, keys, tables) -> bool:
    """Whether ``keys`` (column refs) hold each value on at most one row of ``node``."""
    cids = {k.cid for k in keys if isinstance(k, Ref)}
    if len(cids) != len(keys):
        return False
    if isinstance(node, P.Scan):
        return any(c in cids for c in unique_columns(node, tables))
    if isinstance(node, (P.Filter, P.Limit, P.TopK)) or (isinstance(node, P.Join) and node.kind in ("semi", "anti")):
        return is_unique(node.inputs()[0], keys, tables)
    if isinstance(node, P.Aggregate):
        return {o.cid for o, _ in node.keys} <= cids
    if isinstance(node, P.Join) and node.kind == "inner" and node.left_keys:
        mine = [k for k in keys if k.cid in _cids(node.left)]
        theirs = [k for k in keys if k.cid in _cids(node.right)]
        # a side's unique key stays unique when each of its rows meets at most one row of the other
        if mine and not theirs:
            return is_unique(node.left, mine, tables) and is_unique(node.right, node.right_keys, tables)
        if theirs and not mine:
            return is_unique(node.right, theirs, tables) and is_unique(node.left, node.left_keys, tables)
    return False


def unique_columns(scan: P.Scan, tables) -> set[int]:
    """Columns of a scan that are keys of its table (``ColumnStats.unique``)."""
    table = tables.get(scan.table)
    if table is None:
        return set()
    out = set()
    for o in scan.outputs:
        st = table.columns.get(o.name)
        if st is not None and st.unique:
            out.add(o.cid)
    return out
