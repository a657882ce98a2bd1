"""Cardinality estimates against the true counts (DuckDB on the same data): filters from the
statistics, joins from equivalence classes and distinct counts, q-error bounds per predicate kind."""
import datetime

import duckdb
import numpy as np
import pandas as pd
import pytest
from planner_graphs import random_query

from opforge import sql
from opforge.sql import plan as P
from opforge.sql.expr import Lit, Ref, cmp
from opforge.sql.frontend.parser import parse
from opforge.sql.planner import join_graph as G
from opforge.sql.planner.cardinality import Estimator, q_error
from opforge.sql.planner.join_order import replace_subtree
from opforge.sql.planner.statistics import table_stats


@pytest.fixture(scope="module")
def db():
    rng = np.random.default_rng(0)
    n = 20000
    fact = pd.DataFrame({
        "id": np.arange(n),
        "u": rng.integers(0, 1000, n),
        "z": rng.zipf(1.4, n) % 500,
        "d": [datetime.date(2020, 1, 1) + datetime.timedelta(days=int(x)) for x in rng.integers(0, 730, n)],
        "price": np.round(rng.uniform(0, 100, n), 2),
        "cat": rng.choice(["red", "green", "blue", "black"], n, p=[0.55, 0.25, 0.15, 0.05]),
        "maybe": np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 10, n)),
        "dim_id": rng.integers(0, 200, n),
    })
    dim = pd.DataFrame({"dim_id": np.arange(200), "region": rng.choice(["north", "south"], 200, p=[0.1, 0.9]),
                        "sub_id": rng.integers(0, 20, 200)})
    sub = pd.DataFrame({"sub_id": np.arange(20), "kind": ["k%d" % (i % 4) for i in range(20)]})
    tables = {"fact": fact, "dim": dim, "sub": sub}
    con = sql.connect(device="cpu")
    duck = duckdb.connect()
    for name, df in tables.items():
        con.register(name, df)
        duck.register(name, df)
    stats = {name: table_stats(con._tables[name]) for name in tables}
    return con, duck, stats


def _estimate(db, where: str, frm: str = "fact") -> tuple[float, int]:
    con, duck, stats = db
    text = f"select count(*) from {frm} where {where}"
    node = con.plan(parse(text))
    while not isinstance(node, (P.Scan, P.Join, P.Filter)):
        node = node.inputs()[0]
    est = Estimator(node, stats).rows(node)
    return est, duck.execute(text).fetchone()[0]


@pytest.mark.parametrize("where,bound", [
    ("u = 17", 2.0),  # 20 expected: the count itself varies by sqrt(20)
    ("u <> 17", 1.01),
    ("u < 250", 1.05),
    ("u between 100 and 199", 1.1),
    ("u >= 100 and u < 200 and u > 150", 1.1),
    ("d >= date '2020-03-01' and d < date '2020-06-01'", 1.1),
    ("price > 90.5", 1.1),
    ("cat = 'red'", 1.05),
    ("cat = 'black'", 1.1),
    ("cat = 'purple'", 1.0),  # not in the dictionary: no rows, estimated as <= 1
    ("cat < 'blue'", 1.1),
    ("cat in ('red', 'blue')", 1.05),
    ("z = 1", 1.05),  # the heaviest hitter, from the most-common values
    ("maybe is null", 1.05),
    ("maybe = 3", 1.5),
    ("u < 100 or cat = 'black'", 1.2),
    ("not (u < 500)", 1.05),
])
def test_filter_estimates(db, where, bound):
    est, actual = _estimate(db, where)
    assert q_error(est, actual) <= bound, (est, actual)


def test_join_estimates_use_distinct_counts(db):
    cases = [
        ("fact, dim", "fact.dim_id = dim.dim_id", 1.1),
        ("fact, dim", "fact.dim_id = dim.dim_id and dim.region = 'north'", 1.5),
        ("fact, dim, sub", "fact.dim_id = dim.dim_id and dim.sub_id = sub.sub_id and sub.kind = 'k1'", 1.5),
        ("fact, dim", "fact.u = dim.dim_id", 1.2),  # u spans 1000 values, dim_id 200: containment
    ]
    for frm, where, bound in cases:
        est, actual = _estimate(db, where, frm)
        assert q_error(est, actual) <= bound, (frm, where, est, actual)


def test_estimate_does_not_depend_on_the_from_order(db):
    con, _, stats = db
    ests = []
    for frm in ("fact, dim, sub", "sub, dim, fact", "dim, sub, fact"):
        node = con.plan(parse(f"select fact.id from {frm} where fact.dim_id = dim.dim_id and dim.sub_id = sub.sub_id"))
        while not G.is_inner_tree(node):
            node = node.inputs()[0]
        ests.append(Estimator(node, stats).rows(node))
    assert ests[0] == pytest.approx(ests[1]) == pytest.approx(ests[2])


def test_equivalence_classes_connect_transitively(db):
    con, _, stats = db
    node = con.plan(parse("select fact.id from fact, dim, sub where fact.dim_id = dim.dim_id "
                          "and dim.dim_id = sub.sub_id"))
    while not G.is_inner_tree(node):
        node = node.inputs()[0]
    graph = G.extract(node)
    assert len(graph.classes) == 1 and len(graph.classes[0]) == 3
    names = [r.node.table for r in graph.relations]
    f, s = names.index("fact"), names.index("sub")
    assert graph.connected(1 << f, 1 << s)  # fact-sub: implied by fact = dim = sub
    keys, _ = graph.join_conditions(1 << f, 1 << s)
    assert len(keys) == 1


def test_semi_join_and_aggregate_estimates(db):
    con, duck, stats = db
    for text in ("select count(*) from fact where dim_id in (select dim_id from dim where region = 'north')",
                 "select count(*) from (select cat, count(*) from fact group by cat)",
                 "select count(*) from (select distinct u from fact)"):
        node = con.plan(parse(text)).inputs()[0]
        while isinstance(node, P.Project):
            node = node.inputs()[0]
        if isinstance(node, P.Aggregate) and not node.keys:
            node = node.child
        while isinstance(node, P.Project):
            node = node.inputs()[0]
        est = Estimator(node, stats).rows(node)
        inner = text[len("select count(*) from "):]
        actual = duck.execute(f"select count(*) from {inner}" if inner.startswith("(") else text).fetchone()[0]
        assert q_error(est, actual) <= 2.0, (text, est, actual)


def test_q_error():
    assert q_error(10, 10) == 1 and q_error(5, 20) == 4 == q_error(20, 5) and q_error(0, 0) == 1


def test_an_or_across_relations_implies_filters_on_each(db):
    con, duck, stats = db
    where = ("fact.dim_id = dim.dim_id and ((dim.region = 'north' and fact.u < 10) "
             "or (dim.region = 'south' and fact.u > 990 and fact.z = 1))")
    node = con.plan(parse(f"select fact.id from fact, dim where {where}"))
    while not G.is_inner_tree(node):
        node = node.inputs()[0]
    graph = G.extract(node)
    local = {graph.relations[p.rels.bit_length() - 1].node.table: str(p.expr)
             for p in graph.predicates if p.rels & (p.rels - 1) == 0}
    if not local:  # the planner already moved them into the scans: read them there
        local = {r.node.table: " ".join(str(f) for f in r.node.filters) for r in graph.relations}
    assert "u#" in local["fact"] and " OR " in local["fact"] and "z#" not in local["fact"].split(" OR ")[0]
    assert "region#" in local["dim"] and " OR " in local["dim"]
    est, actual = _estimate(db, where, "fact, dim")
    assert q_error(est, actual) <= 1.5, (est, actual)


def test_an_estimator_shares_an_earlier_ones_estimates_of_kept_subtrees():
    """The optimizer's passes hand each estimator the last one's (``Estimator(..., earlier)``): every
    node of a rewritten plan, kept or new, is estimated as a fresh estimator would."""
    root, stats = random_query("snowflake", 6, seed=7)
    first = Estimator(root, stats)
    nodes = lambda n: [n] + [d for c in n.inputs() for d in nodes(c)]  # noqa: E731
    before = {id(n): first.rows(n) for n in nodes(root)}
    scan = next(n for n in nodes(root) if isinstance(n, P.Scan) and n.table == "t0")
    key = scan.outputs[0]
    narrowed = P.Filter(scan, cmp("<", Ref(key.cid, key.type, key.name), Lit(5, key.type)))
    rewritten = P.Aggregate(replace_subtree(root, scan, narrowed), [], [])
    shared, fresh = Estimator(rewritten, stats, first), Estimator(rewritten, stats)
    assert all(shared.rows(n) == fresh.rows(n) for n in nodes(rewritten))
    assert shared.rows(rewritten.child) < before[id(root)]  # the filter is seen, not the old estimate
    assert shared.rows(scan) == before[id(scan)]  # a kept node: the earlier estimate
