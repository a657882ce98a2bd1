"""DPccp (Moerkotte & Neumann, VLDB 2006): exact dynamic programming over the connected subgraphs
of the query graph; bushy trees; no cross products inside a connected component.

Every csg-cmp pair (S1, S2) is generated once: S1 a connected set, S2 a connected set disjoint
from S1, adjacent to it, and not reaching below S1's smallest relation (which rules out the mirror
pair). Pairs are costed in order of |S1 u S2|, so both halves already have their best tree. The
pair count is the work: ~n^3/6 for a chain, n * 2^(n-2) for a star, 3^n/2 for a clique;
``max_pairs`` (and ``deadline``, a ``time.perf_counter`` value) bound it, past which
``BudgetExceeded`` tells the caller to fall back to the greedy enumerator.

The connected subgraphs are counted against the same budget while they are enumerated: every
connected set of two or more relations is the union of at least one csg-cmp pair (split off a leaf
of a spanning tree), so more csgs than ``max_pairs`` plus the relations means more pairs too. A
dense graph is refused after ``max_pairs`` steps instead of after listing its 2^n subgraphs
(TPC-DS q64: 190,000 recursive steps, 0.2 s, for a budget of 10,000 pairs).
"""
from __future__ import annotations

import time

from opforge.sql.planner.join_tree import JoinPlan, Planning

DEFAULT_MAX_PAIRS = 10000  # as DuckDB: past it, the greedy enumerator


class BudgetExceeded(Exception):
    """The exact enumeration would exceed its pair or time budget."""


def _subsets(mask: int):
    """Every non-empty subset of ``mask``."""
    s = mask
    while s:
        yield s
        s = (s - 1) & mask


def _low_index(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


def csg_cmp_pairs(planning: Planning, component: int, max_pairs: int | None = None,
                  deadline: float | None = None) -> list[tuple[int, int]]:
    """All csg-cmp pairs of the subgraph ``component`` (a bitmask)."""
    graph = planning.graph
    pairs: list[tuple[int, int]] = []
    csg_limit = None if max_pairs is None else max_pairs + component.bit_count()
    csg_count = 0
    adjacency = graph.adjacency
    reach: dict[int, int] = {}  # set -> its relations' neighbours (itself included): grown a subset at a time

    def reach_of(mask: int) -> int:
        out = 0
        while mask:
            low = mask & -mask
            out |= adjacency[low.bit_length() - 1]
            mask ^= low
        return out

    def neighbors(s: int) -> int:
        r = reach.get(s)
        if r is None:
            r = reach[s] = reach_of(s)
        return r & component & ~s

    def emit(s1: int, s2: int) -> None:
        pairs.append((s1, s2))
        if max_pairs is not None and len(pairs) > max_pairs:
            raise BudgetExceeded(f"more than {max_pairs} csg-cmp pairs")
        if deadline is not None and len(pairs) % 1024 == 0 and time.perf_counter() > deadline:
            raise BudgetExceeded("time budget spent")

    def csg_rec(s: int, x: int, out: list[int], limit: int | None) -> None:
        """Appends the connected supersets of ``s`` avoiding ``x``; more than ``limit`` of them
        in ``out`` exceeds the budget."""
        n = neighbors(s) & ~x
        for sub in _subsets(n):  # checked per subset: a node with 20 neighbours has 2^20
            out.append(s | sub)
            if limit is not None and len(out) > limit:
                raise BudgetExceeded(f"more than {max_pairs} csg-cmp pairs")
        grown = reach[s]
        for sub in _subsets(n):
            reach[s | sub] = grown | reach_of(sub)
            csg_rec(s | sub, x | n, out, limit)

    def cmp_of(s1: int) -> None:
        below = (1 << (_low_index(s1) + 1)) - 1  # B_min(S1): relations up to S1's smallest
        x = below | s1
        n = neighbors(s1) & ~x
        for i in reversed(range(n.bit_length())):
            if not n >> i & 1:
                continue
            emit(s1, 1 << i)
            grown: list[int] = []  # each one becomes a pair: more than the budget has left exceeds it
            csg_rec(1 << i, x | (((1 << (i + 1)) - 1) & n), grown,
                    None if max_pairs is None else max_pairs - len(pairs))
            for s2 in grown:
                emit(s1, s2)

    for i in reversed(range(component.bit_length())):
        if not component >> i & 1:
            continue
        start = 1 << i
        csgs = [start]
        csg_rec(start, ((1 << (i + 1)) - 1) | ~component, csgs,
                None if csg_limit is None else csg_limit - csg_count)
        csg_count += len(csgs)
        for s1 in csgs:
            cmp_of(s1)
    return pairs


def best_plan(planning: Planning, max_pairs: int | None = DEFAULT_MAX_PAIRS,
              deadline: float | None = None) -> JoinPlan:
    """The cheapest bushy tree under the planning's cost model; disconnected components are
    planned apart and joined by cross products (``Planning.cross_components``)."""
    graph = planning.graph
    components = graph.components()
    pairs = []
    for comp in components:
        pairs.extend(csg_cmp_pairs(planning, comp, max_pairs, deadline))
        if max_pairs is not None and len(pairs) > max_pairs:
            raise BudgetExceeded(f"more than {max_pairs} csg-cmp pairs")
    best: dict[int, JoinPlan] = {1 << i: planning.leaf(i) for i in range(graph.size)}
    pairs.sort(key=lambda p: (p[0] | p[1]).bit_count())
    for s1, s2 in pairs:
        candidate = planning.join(best[s1], best[s2])
        current = best.get(s1 | s2)
        if current is None or candidate.cost < current.cost:
            best[s1 | s2] = candidate
    return planning.cross_components([best[c] for c in components])
