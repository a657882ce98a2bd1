"""The join order optimizer inside the SQL engine: same answers as DuckDB in every mode, a plan no
worse than the binder's FROM order under true cardinalities (C_out, measured by running it),
output columns in their original order, EXPLAIN showing the rule, estimates and physical choice."""
import duckdb
import numpy as np
import pandas as pd
import pytest

from opforge import sql
from opforge.sql import plan as P
from opforge.sql.executor import Executor
from opforge.sql.planner.join_order import JoinOrderOptimizer, check_mode

# a star schema whose FROM order starts with the fact table and its least selective dimension
QUERY = """
select d1.label, d3.label as l3, count(*) as n, sum(f.v) as s
from fact f, dim1 d1, dim2 d2, dim3 d3, sub s
where f.k1 = d1.k and f.k2 = d2.k and f.k3 = d3.k and d3.s = s.s
  and d2.flag = 'rare' and s.name = 'x'
group by d1.label, d3.label order by n desc, d1.label, l3
"""


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(4)
    n = 30000
    return {
        "fact": pd.DataFrame({"k1": rng.integers(0, 500, n), "k2": rng.integers(0, 300, n),
                              "k3": rng.integers(0, 100, n), "v": rng.integers(0, 10, n)}),
        "dim1": pd.DataFrame({"k": np.arange(500), "label": [f"a{i % 7}" for i in range(500)]}),
        "dim2": pd.DataFrame({"k": np.arange(300), "flag": np.where(np.arange(300) % 50 == 0, "rare", "common")}),
        "dim3": pd.DataFrame({"k": np.arange(100), "s": np.arange(100) % 10,
                              "label": [f"c{i % 3}" for i in range(100)]}),
        "sub": pd.DataFrame({"s": np.arange(10), "name": ["x" if i < 2 else "y" for i in range(10)]}),
    }


def _connect(data, **options):
    con = sql.connect(device="cpu", **options)
    for name, df in data.items():
        con.register(name, df)
    return con


def _true_c_out(con, node) -> int:
    """Sum of the actual output rows of every join of the plan (running each one)."""
    ex = Executor(con._tables, con.device, con._context())
    total = 0

    def walk(n):
        nonlocal total
        for c in n.inputs():
            walk(c)
        if isinstance(n, P.Join):
            total += ex.run(n).n
    walk(node)
    return total


@pytest.mark.parametrize("mode", ["auto", "greedy", "none"])
def test_every_mode_answers_as_duckdb(data, mode):
    con = _connect(data, join_reordering=mode)
    duck = duckdb.connect()
    for name, df in data.items():
        duck.register(name, df)
    ours = con.sql(QUERY).to_pandas()
    theirs = duck.execute(QUERY).df()
    pd.testing.assert_frame_equal(ours.reset_index(drop=True), theirs.reset_index(drop=True), check_dtype=False)


def test_reordered_plan_is_no_worse_than_the_from_order(data):
    auto, none = _connect(data, join_reordering="auto"), _connect(data, join_reordering="none")
    planned, binder = auto.sql(QUERY).plan, none.sql(QUERY).plan
    assert _true_c_out(auto, planned) <= _true_c_out(none, binder) / 5  # the FROM order joins the fact first
    text = auto.sql(QUERY).explain()
    assert "DPccp over 5 relations" in text and "est. rows=" in text and "planned " in text


def test_output_columns_keep_their_order(data):
    con = _connect(data)
    rel = con.sql("select * from fact f, dim2 d2, dim1 d1 where f.k1 = d1.k and f.k2 = d2.k and d2.flag = 'rare'")
    assert rel.columns == ["k1", "k2", "k3", "v", "k", "flag", "k", "label"]
    got = rel.to_pandas()
    duck = duckdb.connect()
    for name, df in data.items():
        duck.register(name, df)
    want = duck.execute("select * from fact f, dim2 d2, dim1 d1 where f.k1 = d1.k and f.k2 = d2.k "
                        "and d2.flag = 'rare'").df()
    key = list(range(8))
    g = got.set_axis(key, axis=1).sort_values(key).reset_index(drop=True)
    w = want.set_axis(key, axis=1).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)


def test_optimizer_pass_records_its_decisions(data):
    con = _connect(data, join_reordering="none")
    node = con.sql(QUERY).plan
    opt = JoinOrderOptimizer(con._stats, con._tables, "auto", max_pairs=3)
    opt.optimize(node)
    assert len(opt.decisions) == 1 and opt.decisions[0].relations == 5
    assert opt.decisions[0].rule.startswith("greedy (GOO) over 5 relations: DPccp more than 3")
    same = JoinOrderOptimizer(con._stats, con._tables, "none").optimize(node)
    assert same is node


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="join_reordering must be one of"):
        check_mode("fastest")
    with pytest.raises(ValueError, match="join_reordering"):
        sql.connect(device="cpu", join_reordering="dp")




def test_explain_reports_skewed_join_keys():
    rng = np.random.default_rng(5)
    events = pd.DataFrame({"user_id": rng.zipf(1.3, 20000) % 1000})
    con = sql.connect(device="cpu")
    con.register("events", events)
    con.register("users", pd.DataFrame({"user_id": np.arange(1000), "name": [f"u{i}" for i in range(1000)]}))
    con.register("even", pd.DataFrame({"user_id": rng.integers(0, 1000, 20000)}))
    text = con.sql("select count(*) from events e, users u where e.user_id = u.user_id").explain()
    shares = events["user_id"].value_counts(normalize=True)
    assert shares.iloc[0] > 0.1 and "skewed keys (> 10% of rows)" in text
    assert f"= {shares.index[0]} holds {shares.iloc[0]:.0%}" in text
    assert "skewed" not in con.sql("select count(*) from even e, users u where e.user_id = u.user_id").explain()
