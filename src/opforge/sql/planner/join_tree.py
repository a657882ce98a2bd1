"""Join trees as the enumerators build them, and ``Planning``: what the enumerators share (the query
graph, the cardinality of each relation set, the cost model) and the one way to join two trees.

A tree's cost is the sum of its joins' costs; a join's cost depends only on its two inputs' sets
(their estimated rows, widths and key facts), so the best tree for a set is built from the best
trees of its two halves: the optimal-substructure property that dynamic programming needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opforge.sql.planner import join_graph as G


@dataclass(eq=False)
class JoinPlan:
    mask: int  # the relations it joins
    rows: float  # estimated output rows
    width: float  # bytes per output row
    cost: float  # total of its joins under the cost model
    left: "JoinPlan | None" = None
    right: "JoinPlan | None" = None
    choice: object = None  # the cost model's physical choice for the top join (None for C_out)
    sorted_cids: frozenset = frozenset()  # leaf: columns in ascending order without NULLs
    dense_ranges: dict = field(default_factory=dict)  # leaf: unique dense int columns -> range

    @property
    def is_leaf(self) -> bool:
        return self.left is None

    def shape(self):
        """The tree as nested pairs of relation indices (tests, EXPLAIN)."""
        if self.is_leaf:
            return G.bits(self.mask)[0]
        return (self.left.shape(), self.right.shape())

    def joins(self) -> list["JoinPlan"]:
        """Every join node of the tree, bottom-up."""
        if self.is_leaf:
            return []
        return self.left.joins() + self.right.joins() + [self]


class Planning:
    """Leaves and joins of one query graph under one cost model."""

    def __init__(self, graph: G.JoinGraph, cardinality, model, widths: list[float],
                 sorted_cids: list[frozenset] | None = None, dense_ranges: list[dict] | None = None):
        self.graph, self.cardinality, self.model = graph, cardinality, model
        self.widths = widths
        n = graph.size
        self.sorted_cids = sorted_cids or [frozenset()] * n
        self.dense_ranges = dense_ranges or [{}] * n
        self.joins_costed = 0

    def leaf(self, i: int) -> JoinPlan:
        return JoinPlan(1 << i, self.cardinality.rows(1 << i), self.widths[i], 0.0,
                        sorted_cids=self.sorted_cids[i], dense_ranges=self.dense_ranges[i])

    def join(self, a: JoinPlan, b: JoinPlan) -> JoinPlan:
        mask = a.mask | b.mask
        rows = self.cardinality.rows(mask)
        keys, _ = self.graph.join_conditions(a.mask, b.mask)
        cost, choice = self.model.join(a, b, rows, keys)
        self.joins_costed += 1
        return JoinPlan(mask, rows, a.width + b.width, a.cost + b.cost + cost, a, b, choice)

    def cross_components(self, plans: list[JoinPlan]) -> JoinPlan:
        """Disconnected graphs: the components' best trees joined by cross products, smallest
        first (each cross product multiplies, so the small ones go first)."""
        plans = sorted(plans, key=lambda p: p.rows)
        out = plans[0]
        for p in plans[1:]:
            out = self.join(out, p)
        return out
