"""UNION / INTERSECT / EXCEPT [ALL] below the binder: the column types the two sides meet at, and
INTERSECT / EXCEPT as plans over the existing operators (a tagged UNION ALL, a grouping, a filter)."""
from __future__ import annotations

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Func, Lit, Ref, and_, cmp
from opforge.sql.frontend.expressions import _common


def set_type(a: T.SqlType, b: T.SqlType, what: str) -> T.SqlType:
    """The type of a UNION / INTERSECT / EXCEPT column: as DuckDB, a string and a value of another
    type meet as VARCHAR; otherwise their common type."""
    if (a.kind == "STRING") != (b.kind == "STRING"):
        return T.STRING
    return _common([a, b], what)


def as_strings(binder, node: P.Node, types: list[T.SqlType]) -> P.Node:
    """``node`` with the columns that are to be strings (``types``) but are not cast to VARCHAR."""
    if all(o.type.kind == "STRING" or t.kind != "STRING" for o, t in zip(node.outputs, types)):
        return node
    exprs = []
    for o, t in zip(node.outputs, types):
        ref = Ref(o.cid, o.type, o.name)
        cast = t.kind == "STRING" and o.type.kind != "STRING"
        exprs.append((binder.new_col(o.name, t if cast else o.type), Func("to_string", [ref], t) if cast else ref))
    return P.Project(node, exprs)


def intersect_except(binder, left: P.Node, right: P.Node, outs: list[P.OutCol], intersect: bool,
                     every: bool) -> P.Node:
    """INTERSECT / EXCEPT as a grouping of both sides' rows, each tagged with its side (0 left,
    1 right): a group (NULLs equal, as set operations compare) is kept when both sides have it
    (INTERSECT) or only the left one (EXCEPT). With ALL, each row is numbered among its
    duplicates on its side (row_number over the partition of all its columns) and the number is
    part of the group: the k-th copy of a row pairs with the other side's k-th copy."""
    sides = []
    for tag, side in enumerate((left, right)):
        refs = [Ref(o.cid, o.type, o.name) for o in side.outputs]
        exprs = [(binder.new_col(o.name, o.type), r) for o, r in zip(side.outputs, refs)]
        if every:
            rn = binder.new_col("rn", T.INT64)
            side = P.WindowFunctions(side, refs, [], [(rn, P.WindowCall("row_number", [], T.INT64))])
            exprs.append((binder.new_col("rn", T.INT64), Ref(rn.cid, rn.type, rn.name)))
        exprs.append((binder.new_col("side", T.INT32), Lit(tag, T.INT32)))
        sides.append(P.Project(side, exprs))
    both = P.Union(sides, [binder.new_col(o.name, o.type) for o in sides[0].outputs], all=True)
    cols = [Ref(o.cid, o.type, o.name) for o in both.outputs]
    keys = [(binder.new_col(r.name, r.type), r) for r in cols[:-1]]
    lo, hi = binder.new_col("lo", T.INT32), binder.new_col("hi", T.INT32)
    grouped = P.Aggregate(both, keys, [(lo, P.AggCall("min", cols[-1], T.INT32)),
                                       (hi, P.AggCall("max", cols[-1], T.INT32))])
    lo_ref, hi_ref = Ref(lo.cid, lo.type, lo.name), Ref(hi.cid, hi.type, hi.name)
    if intersect:
        keep = and_([cmp("=", lo_ref, Lit(0, T.INT32)), cmp("=", hi_ref, Lit(1, T.INT32))])
    else:
        keep = cmp("=", hi_ref, Lit(0, T.INT32))
    return P.Project(P.Filter(grouped, keep), [(o, Ref(k.cid, k.type, k.name)) for o, (k, _) in zip(outs, keys)])
