"""The executor runs the planner's physical join (algorithm and build side), the user's
``join_algorithm`` overrides it, and EXPLAIN ANALYZE says which rule chose what; the perfect-hash
(direct) join and the radix-partitioned hash join against DuckDB and the plain hash join."""
import re

import numpy as np
import pyarrow as pa

import pytest
import torch

import opforge.sql as sql
from opforge.sql.physical.joins.direct import direct_pairs
from opforge.sql.physical.joins.hash import hash_pairs
from sql_reference import SqlCheck


@pytest.fixture(scope="module")
def star():
    rng = np.random.default_rng(9)
    n = 20000
    fact = pa.table({"f_dim": pa.array(rng.integers(0, 3000, n), pa.int64()),
                     "f_sparse": pa.array(rng.integers(0, 500, n) * 1000, pa.int64()),
                     "f_v": pa.array(rng.integers(0, 100, n), pa.int32())})
    dim = pa.table({"d_key": pa.array(rng.permutation(3000), pa.int64()),  # unique, dense, unsorted
                    "d_grp": pa.array(rng.integers(0, 7, 3000), pa.int32())})
    sparse = pa.table({"s_key": pa.array(np.arange(500) * 1000, pa.int64()),  # unique, sparse
                       "s_w": pa.array(rng.integers(0, 5, 500), pa.int32())})
    return SqlCheck({"fact": fact, "dim": dim, "sparse": sparse})


def _join_notes(con, q):
    t = con.sql("EXPLAIN ANALYZE " + q).to_pandas()
    return [n for o, n in zip(t["operator"], t["notes"]) if o.strip().startswith("Join")]


Q_DIM = "SELECT d_grp, count(*) AS n, sum(f_v) AS s FROM fact JOIN dim ON f_dim = d_key GROUP BY d_grp"
Q_SPARSE = "SELECT s_w, count(*) AS n FROM fact JOIN sparse ON f_sparse = s_key GROUP BY s_w"


def test_planned_direct_join_runs_and_matches_duckdb(star):
    star(Q_DIM)
    plan = star.con.sql(Q_DIM).explain()
    assert "planned direct build=right: unique dense int keys, range 3000" in plan
    [notes] = _join_notes(star.con, Q_DIM)
    # the fact side arrives summed per key by eager aggregation (at most one row per dim key)
    probe = re.search(r"perfect-hash \(direct\) join, build=right: (\d+) x 3000 rows", notes)
    assert probe and 0 < int(probe.group(1)) <= 3000
    assert "rule: planner (physical_choice): direct build=right" in notes


def test_sparse_unique_keys_are_planned_as_hash_with_the_small_side_building(star):
    star(Q_SPARSE)
    [notes] = _join_notes(star.con, Q_SPARSE)
    assert "hash join, build=right: 20000 x 500 rows" in notes and "rule: planner (physical_choice): hash" in notes


@pytest.mark.parametrize("algo", ["hash", "merge", "nested_loop", "direct", "radix"])
def test_user_override_beats_the_planner(star, algo):
    con = sql.connect("cpu", join_algorithm=algo)
    for name in ("fact", "dim"):
        con.register(name, star.con._tables[name].to_arrow())
    q = Q_DIM.replace("FROM fact", "FROM (SELECT * FROM fact WHERE f_v < 2) f")  # ~400 x 3000 rows
    got = con.sql(q).to_arrow().sort_by("d_grp")
    assert got.equals(star.con.sql(q).to_arrow().sort_by("d_grp"))
    [notes] = _join_notes(con, q)
    assert f"rule: join_algorithm={algo} (user override)" in notes


def test_radix_join_uses_several_partitions(star):
    con = sql.connect("cpu", join_algorithm="radix")
    for name in ("fact", "dim"):
        con.register(name, star.con._tables[name].to_arrow())
    [notes] = _join_notes(con, Q_DIM)
    assert "radix-partitioned hash join (4 parts)" in notes and "radix-partitioned into 4 parts" in notes


def test_direct_pairs_equal_hash_pairs_and_refuse_duplicates():
    g = torch.Generator().manual_seed(3)
    build = torch.randperm(1000, generator=g)[:700] + 50
    probe = torch.randint(0, 1200, (5000,), generator=g)
    pvalid = torch.rand(5000, generator=g) > 0.1
    for how in ("inner", "left", "semi", "anti"):
        d = direct_pairs(build, probe, None, pvalid, how)
        h = hash_pairs(build, probe, None, pvalid, how)
        assert torch.equal(d[1], h[1]), how
        if how in ("inner", "left"):
            assert torch.equal(d[0], h[0]), how
    assert direct_pairs(torch.tensor([1, 2, 2]), probe) is None  # duplicates: not a perfect hash
    assert direct_pairs(torch.tensor([0, 10 ** 9]), probe) is None  # too sparse
    empty = direct_pairs(torch.zeros(0, dtype=torch.long), probe)
    assert empty[0].numel() == 0


def test_planned_nested_loop_with_wrong_estimate_hashes_instead():
    """A planned nested loop whose actual input is far larger than estimated runs as a hash join."""
    from opforge.sql.physical.context import ExecContext
    from opforge.sql.physical.join import pick_algorithm
    from opforge.sql.plan import Join
    from opforge.sql.planner.physical_choice import JoinChoice

    choice = JoinChoice("nested_loop", "right", False, 1.0, "tiny")
    node = Join(None, None, "inner", [object()], [object()], physical=choice)
    algo, build, rule = pick_algorithm(node, 10 ** 4, 10 ** 4, False, ExecContext())
    assert algo == "hash" and build == "right" and "hash instead" in rule
    assert pick_algorithm(node, 10, 10, False, ExecContext())[0] == "nested_loop"
    assert pick_algorithm(node, 10, 10, False, ExecContext(join_algorithm="merge"))[0] == "merge"


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="join_algorithm"):
        sql.connect("cpu", join_algorithm="perfect")
    with pytest.raises(ValueError, match="skew_threshold"):
        sql.connect("cpu", skew_threshold=1.5)
    with pytest.raises(ValueError, match="workers"):
        sql.connect("cpu", workers=0)
    with pytest.raises(ValueError, match="join_distribution"):
        sql.connect("cpu", join_distribution="shuffle")
    with pytest.raises(TypeError, match="runtime_filters"):
        sql.connect("cpu", runtime_filters="yes")
