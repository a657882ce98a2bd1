"""covar_pop / covar_samp of two arguments, rewritten right after parsing into sums and counts
(one-argument aggregates the engine has): over the rows where both arguments are non-NULL,
covar_pop = (Σxy - Σx·Σy/n) / n and covar_samp divides by n - 1 instead (NULL below 1 / 2 rows),
in DOUBLE as DuckDB returns them; as a window function, each sum and count over the same window."""
from __future__ import annotations

import sqlglot
from sqlglot import exp

_TEMPLATE = ("(SUM(__xy) - SUM(__x) * SUM(__y) / COUNT(__xy)) / "
             "CASE WHEN COUNT(__xy) > {less} THEN COUNT(__xy) - {less} END")


def covariances(tree: exp.Expression) -> exp.Expression:
    for node in list(tree.find_all(exp.CovarPop, exp.CovarSamp)):
        if node.args.get("expression") is None:
            continue
        less = 0 if isinstance(node, exp.CovarPop) else 1
        x, y = (exp.Cast(this=exp.Paren(this=e.copy()), to=exp.DataType.build("DOUBLE"))
                for e in (node.this, node.expression))
        both = exp.and_(exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())),
                        exp.Not(this=exp.Is(this=y.copy(), expression=exp.Null())))
        parts = {"__x": exp.If(this=both.copy(), true=x.copy()), "__y": exp.If(this=both.copy(), true=y.copy()),
                 "__xy": exp.Mul(this=x.copy(), expression=y.copy())}
        out = sqlglot.parse_one(_TEMPLATE.format(less=less), read="duckdb")
        for col in list(out.find_all(exp.Column)):
            if col.name in parts:
                col.replace(parts[col.name].copy())
        window = node.parent if isinstance(node.parent, exp.Window) and node.parent.this is node else None
        if window is not None:  # covar_pop(x, y) OVER w: each sum and count OVER w
            for agg in list(out.find_all(exp.Sum, exp.Count)):
                over = window.copy()
                over.set("this", agg.copy())
                agg.replace(over)
            window.replace(exp.Paren(this=out))
        else:
            node.replace(exp.Paren(this=out))
    return tree
