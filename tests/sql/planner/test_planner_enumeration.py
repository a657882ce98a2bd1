"""Join enumeration on random join graphs (chain, star, cycle, clique, snowflake; 2-15 relations):
DPccp finds the cost model's optimum (checked against brute force up to 7 relations, and against
the explicit list of every tree up to 5), greedy stays within a stated factor of it, and no plan
contains an avoidable cross product."""
import itertools
import random
import time

import pytest
from planner_graphs import SHAPES, all_trees, brute_force_best, planning_for, random_query

from opforge.sql.planner import dp, greedy
from opforge.sql.planner import join_graph as G
from opforge.sql.planner.cardinality import Estimator
from opforge.sql.planner.join_order import JoinOrderOptimizer
from opforge.sql.planner.physical_choice import COut, PhysicalCost

MODELS = {"gpu": PhysicalCost(), "c_out": COut()}

# Greedy Operator Ordering has no worst-case bound; this is the factor it keeps on these graphs.
GREEDY_FACTOR = 3.0


def _no_cross_products(plan, graph) -> bool:
    return all(graph.connected(j.left.mask, j.right.mask) for j in plan.joins())


def _relations(plan) -> list[int]:
    flat = []

    def walk(s):
        if isinstance(s, tuple):
            walk(s[0])
            walk(s[1])
        else:
            flat.append(s)
    walk(plan.shape())
    return flat


def _ccp_count_brute(graph) -> int:
    """Unordered pairs of disjoint, connected, adjacent relation sets."""
    n = graph.size
    count = 0
    for s1 in range(1, 1 << n):
        if not graph.is_connected(s1):
            continue
        rest = graph.all & ~s1
        s2 = rest
        while s2:
            if graph.is_connected(s2) and graph.connected(s1, s2):
                count += 1
            s2 = (s2 - 1) & rest
    return count // 2


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [2, 3, 5, 7])
def test_dpccp_emits_each_csg_cmp_pair_once(shape, n):
    planning = planning_for(*random_query(shape, n, seed=n), MODELS["c_out"])
    pairs = dp.csg_cmp_pairs(planning, planning.graph.all)
    unordered = {frozenset(p) for p in pairs}
    assert len(unordered) == len(pairs) == _ccp_count_brute(planning.graph)
    closed = {"chain": (n ** 3 - n) // 6, "star": (n - 1) * 2 ** (n - 2),
              "clique": (3 ** n - 2 ** (n + 1) + 1) // 2}
    if shape in closed:  # Moerkotte & Neumann's counts
        assert len(pairs) == closed[shape]


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_dpccp_finds_the_brute_force_optimum(model, shape, n):
    for seed in range(3):
        planning = planning_for(*random_query(shape, n, seed=100 * n + seed), MODELS[model])
        plan = dp.best_plan(planning, max_pairs=None)
        assert plan.cost == pytest.approx(brute_force_best(planning), rel=1e-9)
        assert sorted(_relations(plan)) == list(range(n))
        assert _no_cross_products(plan, planning.graph)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [3, 4, 5])
def test_dpccp_optimum_is_the_cheapest_of_every_tree(shape, n):
    planning = planning_for(*random_query(shape, n, seed=7 * n), MODELS["gpu"])
    cheapest = min(t.cost for t in all_trees(planning, planning.graph.all))
    assert dp.best_plan(planning).cost == pytest.approx(cheapest, rel=1e-9)


@pytest.mark.parametrize("shape,n", [(s, n) for s in SHAPES for n in (4, 6, 8, 10) if (s, n) != ("clique", 10)])
def test_greedy_within_factor_of_dp(shape, n):
    worst = 1.0
    for seed in range(4):
        planning = planning_for(*random_query(shape, n, seed=31 * n + seed), MODELS["gpu"])
        exact = dp.best_plan(planning, max_pairs=None).cost
        found = greedy.best_plan(planning)
        assert _no_cross_products(found, planning.graph)
        assert found.cost >= exact * (1 - 1e-9)  # the DP is the optimum
        worst = max(worst, found.cost / exact)
    assert worst <= GREEDY_FACTOR


@pytest.mark.parametrize("shape", ["chain", "cycle", "snowflake", "star"])
@pytest.mark.parametrize("n", [13, 15])
def test_large_graphs(shape, n):
    """Past the DP's default budget the greedy plan is used; where the exact DP is still affordable
    (sparse shapes) greedy stays within the factor; never a cross product."""
    planning = planning_for(*random_query(shape, n, seed=n), MODELS["gpu"])
    found = greedy.best_plan(planning)
    assert _no_cross_products(found, planning.graph)
    assert sorted(_relations(found)) == list(range(n))
    if shape in ("chain", "cycle"):
        exact = dp.best_plan(planning, max_pairs=None).cost
        assert exact <= found.cost <= GREEDY_FACTOR * exact
    if shape == "star":
        with pytest.raises(dp.BudgetExceeded):
            dp.best_plan(planning)  # n * 2^(n-2) pairs: over the default budget


def test_disconnected_graph_uses_exactly_the_needed_cross_products():
    planning = planning_for(*random_query("chain", 6, seed=3, cut=(2, 3)), MODELS["gpu"])
    graph = planning.graph
    assert [bin(c).count("1") for c in graph.components()] == [3, 3]
    for plan in (dp.best_plan(planning), greedy.best_plan(planning)):
        crosses = [j for j in plan.joins() if not graph.connected(j.left.mask, j.right.mask)]
        assert len(crosses) == 1 and sorted(_relations(plan)) == list(range(6))


def test_greedy_criteria_and_errors():
    planning = planning_for(*random_query("snowflake", 9, seed=5), MODELS["gpu"])
    plans = [greedy.goo(planning, c) for c in greedy.CRITERIA]
    assert greedy.best_plan(planning).cost == min(p.cost for p in plans)
    with pytest.raises(ValueError, match="criterion"):
        greedy.goo(planning, "fastest")


def test_dp_budget_counts_pairs():
    planning = planning_for(*random_query("clique", 9, seed=2), MODELS["c_out"])
    with pytest.raises(dp.BudgetExceeded, match="csg-cmp pairs"):
        dp.best_plan(planning, max_pairs=1000)
    assert dp.best_plan(planning, max_pairs=None).cost > 0


@pytest.mark.parametrize("shape", ["clique", "star", "snowflake"])
def test_dp_budget_refuses_exactly_past_the_pair_count(shape):
    """The csgs counted while they are enumerated refuse a graph no earlier than its pairs would."""
    planning = planning_for(*random_query(shape, 7, seed=4), MODELS["c_out"])
    count = len(dp.csg_cmp_pairs(planning, planning.graph.all))
    assert len(dp.csg_cmp_pairs(planning, planning.graph.all, max_pairs=count)) == count
    for budget in (count - 1, count // 4, 1):
        with pytest.raises(dp.BudgetExceeded, match="csg-cmp pairs"):
            dp.csg_cmp_pairs(planning, planning.graph.all, max_pairs=budget)


def test_dp_budget_refuses_a_dense_graph_without_listing_its_subgraphs():
    """A star of 22 around relation 0 has 2^21 connected subsets, all listed from relation 0 before
    its first pair: refused after about the budget's steps (TPC-DS q64's CTE)."""
    planning = planning_for(*random_query("star", 22, seed=1), MODELS["c_out"])
    started = time.perf_counter()
    with pytest.raises(dp.BudgetExceeded):
        dp.csg_cmp_pairs(planning, planning.graph.all, max_pairs=dp.DEFAULT_MAX_PAIRS)
    assert time.perf_counter() - started < 1.0  # listing them all took 7 s


def test_random_graph_shapes_are_what_they_say():
    rng = random.Random(0)
    from planner_graphs import edges
    assert len(edges("clique", 5, rng)) == 10 and len(edges("cycle", 5, rng)) == 5
    for shape in ("chain", "star", "snowflake"):
        es = edges(shape, 8, rng)
        assert len(es) == 7 and set(itertools.chain(*es)) == set(range(8))  # trees


def test_a_graph_refused_once_is_not_enumerated_again(monkeypatch):
    """One optimizer pass meets the same graph in each copy of a CTE (TPC-DS q64): DPccp's refusal
    depends only on the graph's edges, so a second copy goes to greedy without enumerating."""
    root, stats = random_query("star", 13, seed=13)
    optimizer = JoinOrderOptimizer(stats)
    optimizer.estimator = Estimator(root, stats)
    calls, enumerate_pairs = [], dp.csg_cmp_pairs
    monkeypatch.setattr(dp, "csg_cmp_pairs", lambda *a, **k: calls.append(1) or enumerate_pairs(*a, **k))
    first, rule = optimizer.choose(G.extract(root))
    again, rule_again = optimizer.choose(G.extract(root))
    assert calls == [1] and rule.startswith("greedy (GOO) over 13 relations: DPccp more than")
    assert rule_again == rule and again.cost == first.cost == greedy.best_plan(optimizer.planning(G.extract(root))).cost
    chain, chain_stats = random_query("chain", 13, seed=13)  # another graph of as many relations: enumerated
    optimizer.estimator = Estimator(chain, chain_stats)
    optimizer.stats = chain_stats
    assert optimizer.choose(G.extract(chain))[1].startswith("DPccp over 13 relations") and calls == [1, 1]
