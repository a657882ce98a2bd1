"""Greedy Operator Ordering (Fegaras, DEXA 1998): start from one tree per relation and repeatedly
join the two trees whose join is smallest, among pairs connected by a join predicate (a cross
product only when no connected pair is left). Bushy, O(n^3) joins costed, for graphs past the
exact enumerator's budget.

GOO's classic criterion is the join's output rows; the GPU cost of the join is a second
criterion (a small output built from two huge inputs can still be the wrong first step). Both
are run and the cheaper tree under the cost model is kept.
"""
from __future__ import annotations

from opforge.sql.planner.join_tree import JoinPlan, Planning

CRITERIA = ("rows", "cost")


def goo(planning: Planning, criterion: str = "rows") -> JoinPlan:
    """One greedy pass; ``criterion``: "rows" (the join's output) or "cost" (its own cost)."""
    if criterion not in CRITERIA:
        raise ValueError(f"greedy join order: criterion must be one of {CRITERIA}, got {criterion!r}")
    graph = planning.graph
    trees = [planning.leaf(i) for i in range(graph.size)]
    while len(trees) > 1:
        best = None
        for want_edge in (True, False):  # connected pairs first; cross products as a last resort
            for i in range(len(trees)):
                for j in range(i + 1, len(trees)):
                    a, b = trees[i], trees[j]
                    if graph.connected(a.mask, b.mask) != want_edge:
                        continue
                    joined = planning.join(a, b)
                    score = joined.rows if criterion == "rows" else joined.cost - a.cost - b.cost
                    key = (score, joined.cost)
                    if best is None or key < best[0]:
                        best = (key, i, j, joined)
            if best is not None:
                break
        _, i, j, joined = best
        trees = [t for k, t in enumerate(trees) if k not in (i, j)] + [joined]
    return trees[0]


def best_plan(planning: Planning) -> JoinPlan:
    """The cheaper of the greedy trees under both criteria."""
    return min((goo(planning, c) for c in CRITERIA), key=lambda p: p.cost)
