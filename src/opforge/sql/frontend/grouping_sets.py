"""GROUP BY ROLLUP / CUBE / GROUPING SETS: the list of grouping sets a GROUP BY clause stands for
(the binder binds the select block once per set, the keys outside it NULL, and UNION ALLs them)."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql.errors import NotSupportedError


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
