"""UNNEST in the select list and in FROM (``plan.Unnest``, ``physical/unnest.py`` runs it)."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.tree import Lit
from opforge.sql.frontend.scope import Scope, ScopeCol

_RELATION = "__unnest"


def _own_unnests(q: exp.Select) -> list[exp.Explode]:
    """The UNNEST calls of ``q``'s select list, not those of its subqueries."""
    out = []
    for item in q.expressions:
        for e in item.find_all(exp.Explode):
            p = e.parent
            while p is not None and p is not q and not isinstance(p, (exp.Select, exp.Subquery)):
                p = p.parent
            if p is q:
                out.append(e)
    return out


def _list_expr(binder, scope: Scope, node: exp.Expression):
    from opforge.sql.frontend.expressions import ExprBinder

    x = ExprBinder(binder, scope).bind(node)
    if isinstance(x, Lit) and x.value is None and x.type.kind != "LIST":
        x = Lit(None, T.list_of(T.INT32))
    if x.type.kind != "LIST":
        raise SqlError(f"UNNEST: expected a list, got {x.type}: {node.sql(dialect='duckdb')}")
    return x


def select_unnests(binder, q: exp.Select, node: P.Node, scope: Scope) -> tuple[exp.Select, P.Node]:
    """``q`` with each select-list UNNEST(l) replaced by a column of an Unnest node over ``node``
    (the FROM and WHERE rows); GROUP BY / aggregates run after UNNEST in DuckDB: refused here."""
    if not _own_unnests(q):
        return q, node
    q = _struct_unnests(binder, q, scope)
    if not _own_unnests(q):
        return q, node
    if q.args.get("group") is not None or q.args.get("having") is not None:
        raise NotSupportedError("UNNEST in a select list with GROUP BY / HAVING")
    q = q.copy()
    lists = []
    for i, e in enumerate(_own_unnests(q)):
        if e.this is None or isinstance(e.this, exp.Explode):
            raise NotSupportedError(f"nested UNNEST: {e.sql(dialect='duckdb')}")
        x = _list_expr(binder, scope, e.this)
        name = f"__unnest{i}"
        o = binder.new_col("unnest", x.type.fields[0][1])
        lists.append((o, x))
        scope.cols.append(ScopeCol(_RELATION, name, o.cid, o.type, hidden=True))
        col = exp.column(name, table=_RELATION, quoted=True)
        if e.parent is not None and e.parent.parent is None and e in q.expressions:
            col = exp.alias_(col, "unnest", quoted=True)
        e.replace(col)
    return q, P.Unnest(node, lists)


def _struct_unnests(binder, q: exp.Select, scope: Scope) -> exp.Select:
    """A select item ``UNNEST(s)`` of a STRUCT ``s`` is its fields, one item each (no rows multiply)."""
    from opforge.sql.frontend.expressions import ExprBinder

    items, changed = [], False
    for item in q.expressions:
        e = item.this if isinstance(item, exp.Alias) else item
        if isinstance(e, exp.Explode) and e.this is not None:
            t = ExprBinder(binder, scope).bind(e.this).type
            if t.kind == "STRUCT":
                items += [exp.alias_(exp.Anonymous(this="struct_extract", expressions=[e.this.copy(), exp.Literal.string(n)]),
                                     n, quoted=True) for n, _ in t.fields]
                changed = True
                continue
        items.append(item)
    if not changed:
        return q
    q = q.copy()
    q.set("expressions", items)
    return q


def from_unnest(binder, t: exp.Unnest, alias: str) -> tuple[P.Node, list[ScopeCol]]:
    """``FROM UNNEST(l1, ...) AS t(u1, ...)``: the elements of constant lists (zipped), as rows."""
    lists = [_list_expr(binder, Scope(), e) for e in t.expressions]
    ta = t.args.get("alias")
    names = [c.name for c in ta.columns] if ta is not None and ta.columns else []
    if len(names) > len(lists):
        raise SqlError(f"UNNEST: {len(names)} column names given for {len(lists)} columns")
    names += ["unnest"] * (len(lists) - len(names))
    outs = [(binder.new_col(n, x.type.fields[0][1]), x) for n, x in zip(names, lists)]
    rel = ta.name if ta is not None and ta.name else (alias or "unnest")
    node = P.Unnest(P.OneRow(), outs)
    return node, [ScopeCol(rel, o.name, o.cid, o.type) for o, _ in outs]
