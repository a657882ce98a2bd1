"""Row estimates for EXPLAIN: textbook heuristics over table sizes, no statistics.

Selectivity of a conjunct: ``=`` 0.1, ``<>`` 0.9, a range comparison 1/3, IS NULL 0.05, anything
else 0.5; conjuncts multiply. Equi-join: the larger input (each row of the larger side meets one
key of the smaller, the foreign-key case), times the residual's selectivity; a cross join the
product; semi 0.5 and anti 0.5 of the left side; outer joins at least the preserved side.
Aggregate: one row without keys, else 0.1 of the input (at least 1). Distinct 0.5; limits and
top-k cap the input; union sums."""
from __future__ import annotations

from opforge.sql import plan as P
from opforge.sql.expr import Func, conjuncts

_SEL = {"=": 0.1, "<>": 0.9, "<": 1 / 3, "<=": 1 / 3, ">": 1 / 3, ">=": 1 / 3, "is_null": 0.05}


def selectivity(pred) -> float:
    s = 1.0
    for c in conjuncts(pred):
        if isinstance(c, Func) and c.name == "cmp":
            s *= _SEL.get(c.extra, 0.5)
        elif isinstance(c, Func):
            s *= _SEL.get(c.name, 0.5)
        else:
            s *= 0.5
    return s


def estimate_rows(node: P.Node, tables: dict) -> int:
    """Estimated output rows of ``node`` (``tables``: name -> Table, for the base sizes)."""
    def est(n: P.Node) -> float:
        if isinstance(n, P.Scan):
            base = tables[n.table].num_rows if n.table in tables else 1000
            for f in n.filters:
                base *= selectivity(f)
            return base
        if isinstance(n, P.OneRow):
            return 1
        if isinstance(n, P.Filter):
            return est(n.child) * selectivity(n.predicate)
        if isinstance(n, P.Aggregate):
            return 1 if not n.keys else max(1.0, 0.1 * est(n.child))
        if isinstance(n, P.Join):
            l, r = est(n.left), est(n.right)
            res = selectivity(n.residual) if n.residual is not None else 1.0
            if n.kind in ("semi", "anti"):
                return 0.5 * l
            inner = (max(l, r) if n.left_keys else l * r) * res
            if n.kind == "left":
                return max(inner, l)
            if n.kind == "right":
                return max(inner, r)
            if n.kind == "full":
                return max(inner, l, r)
            return inner
        if isinstance(n, P.Limit):
            c = est(n.child)
            return c if n.limit is None else min(c, n.limit)
        if isinstance(n, P.TopK):
            return min(est(n.child), n.limit)
        if isinstance(n, P.Distinct):
            return 0.5 * est(n.child)
        if isinstance(n, P.Union):
            return sum(est(c) for c in n.children)
        if isinstance(n, (P.Project, P.Sort)):
            return est(n.child)
        ins = n.inputs()
        return est(ins[0]) if ins else 1
    return int(round(est(node)))
