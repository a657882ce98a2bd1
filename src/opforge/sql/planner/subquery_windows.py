"""A decorrelated aggregate subquery that reads the outer query's own rows becomes a window over
them. ``outer LEFT JOIN (SELECT k, agg(x) FROM sub GROUP BY k) ON key = k``, where the subquery's
relations, filters and join predicates are the outer query's own, less relations joined only on
the key through a unique column of theirs, reads the same rows per key as the outer query does: the
aggregate becomes ``agg(x) OVER (PARTITION BY key)`` over the outer rows and the subquery's joins
are not run at all. TPC-H q2: the minimum supply cost per part over the outer query's European
suppliers, as DuckDB evaluates it; q17: the average quantity per part. Each outer row is itself one
of its key's subquery rows (the same predicates hold), so the left join always found its group
(a NULL key found none: its values are NULL, not the window's over the NULL partition); a
relation joined only on the key keeps or drops a key's rows together, so the window sees all of
them or none."""
from __future__ import annotations

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Func, Lit, Ref, substitute
from opforge.sql.planner.eager_aggregation import unique_columns
from opforge.sql.planner.join_order import _with_inputs

_cids = P.output_cids

WINDOW_FUNCS = ("sum", "count", "count_star", "min", "max", "avg")


def windowed_subqueries(node: P.Node, tables) -> P.Node:
    """Every such subquery of ``node`` as a window (``tables``: the statistics, for unique keys)."""
    node = _with_inputs(node, [windowed_subqueries(c, tables) for c in node.inputs()])
    if not (isinstance(node, P.Join) and node.kind == "left" and len(node.left_keys) == 1 and node.residual is None):
        return node
    proj, agg = (node.right, node.right.child) if isinstance(node.right, P.Project) else (None, node.right)
    if not (isinstance(agg, P.Aggregate) and len(agg.keys) == 1 and isinstance(agg.keys[0][1], Ref)
            and all(c.func in WINDOW_FUNCS for _, c in agg.aggs)):
        return node
    outer, sub = _flat_joins(node.left), _flat_joins(agg.child)
    if outer is None or sub is None:
        return node
    remap = _map_relations(sub, outer)
    if remap is None:
        return node
    key_ref = remap.get(agg.keys[0][1].cid)
    key = None if key_ref is None else key_ref.cid
    lk, rk = node.left_keys[0], node.right_keys[0]
    k_out = next((o for o, e in (proj.exprs if proj else []) if isinstance(e, Ref) and e.cid == agg.keys[0][0].cid),
                 agg.keys[0][0] if proj is None else None)
    if key is None or not isinstance(lk, Ref) or not isinstance(rk, Ref) or k_out is None or rk.cid != k_out.cid             or not _same_class(lk.cid, key, outer[1]) or not _extras_on_key(sub, outer, key, tables):
        return node
    if any(c.arg is not None and not c.arg.cids() <= set(remap) for _, c in agg.aggs):
        return node
    aggs = [(o, P.AggCall(c.func, None if c.arg is None else substitute(c.arg, remap), c.type))
            for o, c in agg.aggs]
    window = P.Window(node.left, [key_ref], aggs)
    if proj is None:  # the join's right columns, in order: the key, then the aggregates
        right = [(k_out, key_ref)] + [(o, _unless_null(key_ref, Ref(o.cid, o.type, o.name))) for o, _ in aggs]
    else:
        right = [(o, key_ref if o.cid == k_out.cid else _unless_null(key_ref, e)) for o, e in proj.exprs]
    return P.Project(window, [(o, Ref(o.cid, o.type, o.name)) for o in node.left.outputs] + right)


def _unless_null(key: Ref, e):
    """``e``, but NULL where ``key`` is NULL: the left join found no group for a NULL key (NULL =
    NULL is not true), so it padded the subquery's columns; the window's NULL partition holds rows."""
    return Func("case", [Func("is_null", [key], T.BOOL), Lit(None, e.type), e], e.type)


def _flat_joins(node: P.Node):
    """(scans, equi-join column pairs) of a tree of inner joins over scans, else None."""
    if isinstance(node, P.Scan):
        return [node], []
    if not (isinstance(node, P.Join) and node.kind == "inner" and node.residual is None and node.left_keys):
        return None
    left, right = _flat_joins(node.left), _flat_joins(node.right)
    if left is None or right is None or not all(isinstance(k, Ref) for k in node.left_keys + node.right_keys):
        return None
    pairs = [(a.cid, b.cid) for a, b in zip(node.left_keys, node.right_keys)]
    return left[0] + right[0], left[1] + right[1] + pairs


def _map_relations(sub, outer) -> dict[int, Ref] | None:
    """sub's column ids -> references to outer's same columns, when each sub scan has the one outer scan of its table with
    the same filters and columns, and sub's join predicates are exactly outer's among those scans."""
    (sscans, spairs), (oscans, opairs) = sub, outer
    by_table = {}
    for o in oscans:
        if o.table in by_table:
            return None  # a table twice: which copy is which is not decided here
        by_table[o.table] = o
    if len({s.table for s in sscans}) != len(sscans):
        return None
    remap: dict[int, Ref] = {}
    for s in sscans:
        o = by_table.get(s.table)
        if o is None:
            return None
        theirs = {c.name: c for c in o.outputs}
        for c in s.outputs:
            if c.name not in theirs:
                return None
            t = theirs[c.name]
            remap[c.cid] = Ref(t.cid, t.type, t.name)
        if sorted(str(substitute(f, remap)) for f in s.filters) != sorted(str(f) for f in o.filters):
            return None
    inside = {r.cid for r in remap.values()}
    want = {frozenset((remap[a].cid, remap[b].cid)) for a, b in spairs}
    have = {frozenset(p) for p in opairs if set(p) <= inside}
    return remap if want == have else None


def _same_class(a: int, b: int, pairs) -> bool:
    """Whether the join predicates ``pairs`` make columns ``a`` and ``b`` equal."""
    seen, todo = {a}, [a]
    while todo:
        x = todo.pop()
        for p, q in pairs:
            for u, v in ((p, q), (q, p)):
                if u == x and v not in seen:
                    seen.add(v)
                    todo.append(v)
    return b in seen


def _extras_on_key(sub, outer, key: int, tables) -> bool:
    """Every outer scan not in ``sub`` joins the rest only on columns equal to ``key``, through a
    column of its own that is unique (at most one of its rows per key value)."""
    sub_tables = {s.table for s in sub[0]}
    for scan in outer[0]:
        if scan.table in sub_tables:
            continue
        mine = _cids(scan)
        links = [(p, q) for p, q in outer[1] if (p in mine) != (q in mine)]
        if not links:
            return False
        uniq = unique_columns(scan, tables)
        for p, q in links:
            own, other = (p, q) if p in mine else (q, p)
            if own not in uniq or not _same_class(other, key, outer[1]):
                return False
    return True
