"""UNION / INTERSECT / EXCEPT [ALL] below the binder: the column types the two sides meet at, and
INTERSECT / EXCEPT as plans over the existing operators (a tagged UNION ALL, a grouping, a filter)."""
from __future__ import annotations

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Func, Lit, Ref, and_, cmp
from opforge.sql.errors import SqlError
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


def align_by_name(binder, left: P.Node, right: P.Node) -> tuple[P.Node, P.Node]:
    """UNION BY NAME: both sides projected onto every column name of either (case-insensitive; the
    left side's names first, then the right's new ones), NULL where a side lacks the name."""
    names: dict[str, str] = {}
    for o in left.outputs + right.outputs:
        names.setdefault(o.name.lower(), o.name)
    for side in (left, right):
        seen = [o.name.lower() for o in side.outputs]
        if len(set(seen)) != len(seen):
            raise SqlError(f"UNION BY NAME: the column name {next(n for n in seen if seen.count(n) > 1)!r} "
                           "appears twice on one side")

    def project(side: P.Node, other: P.Node) -> P.Node:
        mine = {o.name.lower(): o for o in side.outputs}
        theirs = {o.name.lower(): o for o in other.outputs}
        exprs = []
        for key, name in names.items():
            o = mine.get(key)
            if o is not None:
                exprs.append((binder.new_col(name, o.type), Ref(o.cid, o.type, o.name)))
            else:
                t = theirs[key].type
                exprs.append((binder.new_col(name, t), Lit(None, t)))
        return P.Project(side, exprs)
    return project(left, right), project(right, left)


def output_relations(q, side: list, outputs: list, scope) -> list:
    """Scope columns that let ORDER BY after a set operation name an output by the table column it
    reads (``ORDER BY t1.x`` for a select item ``t1.x`` / ``x`` of FROM t1): for each select item that
    is a plain column reference; for a side that is a set operation itself, the names its own ORDER
    BY could use. ``side``: that side's output columns; ``outputs``: the set operation's, by position."""
    from sqlglot import exp

    from opforge.sql.frontend.scope import ScopeCol

    if isinstance(q, exp.SetOperation):
        at = {o.cid: i for i, o in enumerate(side)}
        return [ScopeCol(c.relation, c.name, outputs[at[c.cid]].cid, outputs[at[c.cid]].type, hidden=True)
                for c in scope.cols if c.hidden and c.relation and c.cid in at]
    if not isinstance(q, exp.Select):
        return []
    if len(q.expressions) == 1 and type(q.expressions[0]) is exp.Star and not any(q.expressions[0].args.values()):
        shown = [c for c in scope.cols if not c.hidden]  # SELECT *: the FROM columns in order
        if len(shown) == len(outputs):
            return [ScopeCol(c.relation, c.name, o.cid, o.type, hidden=True) for c, o in zip(shown, outputs) if c.relation]
        return []
    if len(q.expressions) != len(outputs):
        return []
    out = []
    for item, o in zip(q.expressions, outputs):
        if not isinstance(item, exp.Column) or isinstance(item.this, exp.Star):
            continue
        hits = scope._find(item.name, item.table or None)
        if len(hits) == 1 and hits[0].relation:
            out.append(ScopeCol(hits[0].relation, item.name, o.cid, o.type, hidden=True))  # qualified only
    return out


def branch_item_positions(q, text) -> dict[str, int]:
    """The select items of every SELECT side of the set operation ``q`` (nested ones too, without
    their aliases) by their text -> output position; a text at two positions is left out."""
    from sqlglot import exp

    found: dict[str, set[int]] = {}

    def walk(node):
        if isinstance(node, exp.SetOperation):
            walk(node.this)
            walk(node.expression)
        elif isinstance(node, exp.Select):
            for i, item in enumerate(node.expressions):
                e = item.this if isinstance(item, exp.Alias) else item
                found.setdefault(text(e), set()).add(i)
        elif isinstance(node, exp.Subquery):
            walk(node.this)
    walk(q)
    return {t: next(iter(p)) for t, p in found.items() if len(p) == 1}
