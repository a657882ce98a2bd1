"""GROUP BY ROLLUP / CUBE / GROUPING SETS: the list of grouping sets a GROUP BY clause stands for
(the binder binds the grouped block once per set, the keys outside it NULL, UNION ALLs them and
evaluates the select list, windows and ORDER BY once over the union), and GROUPING()."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql.errors import NotSupportedError, SqlError


def grouping_sets(group) -> list[list[exp.Expression]] | None:
    """The grouping sets of a GROUP BY with ROLLUP / CUBE / GROUPING SETS (None without them): the
    cross product of its terms' sets, a plain term being a set of one."""
    if group is None or not any(isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group.expressions):
        return None
    sets: list[list[exp.Expression]] = [[]]
    for g in group.expressions:
        if isinstance(g, exp.Rollup):
            options = [g.expressions[:i] for i in range(len(g.expressions), -1, -1)]
        elif isinstance(g, exp.Cube):
            n = len(g.expressions)
            options = [[e for i, e in enumerate(g.expressions) if mask >> i & 1] for mask in range((1 << n) - 1, -1, -1)]
        elif isinstance(g, exp.GroupingSets):
            options = []
            for item in g.expressions:
                if isinstance(item, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    raise NotSupportedError(f"GROUPING SETS nested in GROUPING SETS: {item.sql(dialect='duckdb')}")
                options.append(list(item.expressions) if isinstance(item, exp.Tuple)
                               else [item.this] if isinstance(item, exp.Paren) else [item])
        else:
            options = [[g]]
        sets = [s + o for s in sets for o in options]
    return sets


def grouping_value(call: exp.Grouping, inside: set[str], outside: set[str], text) -> int:
    """GROUPING(a, b, ...) in one grouping set: a bit per argument, the first the highest, 1 where
    the argument is a key left out of the set (its rows are the set's super-aggregates)."""
    bits = 0
    for arg in call.expressions:
        t = text(arg)
        if t not in inside and t not in outside:
            raise SqlError(f"GROUPING: {arg.sql(dialect='duckdb')} is not a GROUP BY key")
        bits = bits << 1 | (t in outside)
    return bits


def own_nodes(e: exp.Expression, kind):
    """The ``kind`` nodes of ``e`` outside its subqueries (those belong to their own blocks)."""
    for n in e.find_all(kind):
        p = n.parent
        while p is not None and p is not e.parent and not isinstance(p, (exp.Subquery, exp.Select)):
            p = p.parent
        if p is None or p is e.parent:
            yield n


def over_union(e: exp.Expression, column_of) -> exp.Expression:
    """``e`` with its grouped parts (keys, aggregates, GROUPING calls, subqueries: ``column_of(node)``
    names their column of the union of the grouping sets, else None) read from those columns. The
    function of an OVER clause is kept (``sum`` of ``sum(x) OVER ()``), its arguments are swapped."""
    def walk(n, window_function):
        if not window_function and isinstance(n, (exp.Condition, exp.Subquery)) and not isinstance(n, exp.Window):
            # a value, not a clause part (an ORDER BY term prints as its expression)
            name = column_of(n)
            if name is not None:
                return exp.column(name, quoted=True)
        for child in list(n.iter_expressions()):
            new = walk(child, isinstance(n, exp.Window) and child is n.this)
            if new is not child:
                child.replace(new)
        return n
    return walk(e.copy(), False)


def subquery_parts(e: exp.Expression):
    """The subqueries of ``e`` (with the IN or the ANY / ALL comparison they are the operand of),
    evaluated in the grouped block, once per grouping set: a correlated one reads the group keys
    as the FROM clause's columns (``w.g`` for a key written ``g``), which only the block has."""
    for n in own_nodes(e, (exp.Subquery, exp.Exists)):
        p = n.parent
        if isinstance(p, exp.In):
            yield p
        elif isinstance(p, (exp.Any, exp.All)) and p.parent is not None:
            yield p.parent
        else:
            yield n
