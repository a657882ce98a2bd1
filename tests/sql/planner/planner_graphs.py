"""Random join graphs for the enumerator tests: chain, star, cycle, clique and snowflake shapes over
n synthetic tables, each relation a Scan with one key column per incident edge, statistics drawn
at random (rows log-uniform, distinct counts up to the rows), written as the logical plan the
binder would give (a tree of cross joins with every join predicate in the top join's residual).
The planner then reads the query graph back with ``join_graph.extract``, as it does for SQL."""
from __future__ import annotations

import itertools
import random

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Ref, and_, cmp
from opforge.sql.planner import join_graph as G
from opforge.sql.planner.cardinality import Estimator
from opforge.sql.planner.join_tree import Planning
from opforge.sql.planner.statistics import ColumnStats, TableStats

SHAPES = ("chain", "star", "cycle", "clique", "snowflake")


def edges(shape: str, n: int, rng: random.Random) -> list[tuple[int, int]]:
    if shape == "chain":
        return [(i, i + 1) for i in range(n - 1)]
    if shape == "star":
        return [(0, i) for i in range(1, n)]
    if shape == "cycle":
        return [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if n > 2 else [])
    if shape == "clique":
        return list(itertools.combinations(range(n), 2))
    if shape == "snowflake":  # a fact table, dimensions, and sub-dimensions hanging off them
        out, dims = [], []
        for i in range(1, n):
            if dims and rng.random() < 0.5:
                out.append((rng.choice(dims), i))
            else:
                out.append((0, i))
            dims.append(i)
        return out
    raise ValueError(shape)


def random_query(shape: str, n: int, seed: int, cut: tuple[int, int] | None = None):
    """(root plan, table statistics) of a random query of ``shape`` over ``n`` relations, without
    the edge ``cut`` (a disconnected graph)."""
    rng = random.Random(seed)
    es = [e for e in edges(shape, n, rng) if e != cut]
    rows = [float(int(10 ** rng.uniform(1, 6))) for _ in range(n)]
    cols: list[list[P.OutCol]] = [[] for _ in range(n)]
    stats: dict[str, TableStats] = {f"t{i}": TableStats(rows[i], {}) for i in range(n)}
    cid = itertools.count()
    preds = []
    for a, b in es:
        refs = []
        for r in (a, b):
            o = P.OutCol(next(cid), f"k{len(cols[r])}", T.INT64)
            cols[r].append(o)
            d = float(max(1, int(rows[r] * rng.uniform(0.05, 1.0))))
            stats[f"t{r}"].columns[o.name] = ColumnStats(int(rows[r]), 0, 0.0, d - 1, d, True)
            refs.append(Ref(o.cid, o.type, o.name))
        preds.append(cmp("=", *refs))
    for r in range(n):
        if not cols[r]:
            o = P.OutCol(next(cid), "k0", T.INT64)
            cols[r].append(o)
            stats[f"t{r}"].columns["k0"] = ColumnStats(int(rows[r]), 0, 0.0, rows[r] - 1, rows[r], True)
    scans = [P.Scan(f"t{i}", cols[i]) for i in range(n)]
    node = scans[0]
    for s in scans[1:-1]:
        node = P.Join(node, s, "cross", [], [])
    node = P.Join(node, scans[-1], "cross", [], [], and_(preds) if preds else None)
    return node, stats


def planning_for(root, stats, model) -> Planning:
    graph = G.extract(root)
    est = Estimator(root, stats)
    widths = [8.0 * len(r.node.outputs) for r in graph.relations]
    return Planning(graph, est.join_cardinality(graph), model, widths)


def brute_force_best(planning: Planning, cross_products: bool = False) -> float:
    """The cheapest tree's cost over every bushy tree (every split of every set into two halves,
    memoized by set: exact since a tree's cost is its halves' costs plus the top join's), without
    cross products unless ``cross_products``."""
    graph = planning.graph
    memo: dict[int, object] = {}

    def best(mask: int):
        if mask in memo:
            return memo[mask]
        if mask & (mask - 1) == 0:
            memo[mask] = planning.leaf(G.bits(mask)[0])
            return memo[mask]
        low = mask & -mask
        out = None
        sub = (mask - 1) & mask
        while sub:
            if sub & low:  # each unordered split once
                other = mask & ~sub
                ok = cross_products or (graph.is_connected(sub) and graph.is_connected(other)
                                        and graph.connected(sub, other))
                if ok:
                    cand = planning.join(best(sub), best(other))
                    if out is None or cand.cost < out.cost:
                        out = cand
            sub = (sub - 1) & mask
        memo[mask] = out
        return out

    return best(graph.all).cost


def all_trees(planning: Planning, mask: int):
    """Every bushy tree over ``mask`` without cross products (tiny graphs only)."""
    graph = planning.graph
    if mask & (mask - 1) == 0:
        yield planning.leaf(G.bits(mask)[0])
        return
    low = mask & -mask
    sub = (mask - 1) & mask
    while sub:
        other = mask & ~sub
        if sub & low and graph.is_connected(sub) and graph.is_connected(other) and graph.connected(sub, other):
            for a in all_trees(planning, sub):
                for b in all_trees(planning, other):
                    yield planning.join(a, b)
        sub = (sub - 1) & mask
