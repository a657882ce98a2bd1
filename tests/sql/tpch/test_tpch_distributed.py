"""The simulated multi-worker mode on TPC-H (SF 0.01): every equi-join runs broadcast or
partitioned over 3 workers (``connect(workers=3, join_distribution=...)``) and all 22 queries
still equal DuckDB's answers; co-partitioned inputs (tables registered with ``partition_key`` on
the join key) skip the shuffle."""
import re

import pytest

from opforge import sql
from opforge.sql.tpch import compare, queries

PARTITION_KEYS = {"orders": "o_orderkey", "lineitem": "l_orderkey", "part": "p_partkey", "partsupp": "ps_partkey"}


def _connect(tpch_paths, keys=None, **options):
    con = sql.connect(device="cpu", workers=3, **options)
    for name, path in tpch_paths.items():
        con.register(name, str(path), partition_key=(keys or {}).get(name))
    return con


@pytest.fixture(scope="module")
def cons(tpch_paths):
    return {
        "auto": _connect(tpch_paths),
        "broadcast": _connect(tpch_paths, join_distribution="broadcast"),
        # co-partitioned tables, and a low skew threshold: TPC-H's 25 nation keys are all "heavy"
        "partitioned": _connect(tpch_paths, PARTITION_KEYS, join_distribution="partitioned", skew_threshold=0.02),
    }


@pytest.mark.parametrize("mode", ["auto", "broadcast", "partitioned"])
@pytest.mark.parametrize("n", queries.NUMBERS, ids=queries.name)
def test_distributed_tpch_matches_duckdb(cons, tpch_answers, n, mode):
    text = queries.query(n)
    ours = cons[mode].sql(text).to_arrow()
    keys = compare.order_keys(text)
    diffs = compare.compare(ours, tpch_answers[n], ordered=keys is not None, order_by=keys)
    assert not diffs, f"{queries.name(n)} ({mode}) differs from DuckDB:\n" + "\n".join(diffs)


def _joins(con, n):
    return [s for s in con.sql(queries.query(n)).analyze().stats if s.describe.startswith("Join")]


def test_copartitioned_join_moves_nothing_and_others_shuffle(cons):
    joins = _joins(cons["partitioned"], 12)  # orders JOIN lineitem ON o_orderkey = l_orderkey
    [j] = joins
    assert j.metrics["distribution"] == "partitioned" and j.metrics["bytes_moved"] == 0
    assert "co-partitioned: no shuffle" in " ".join(j.notes)
    plain = _joins(cons["auto"], 12)[0]
    assert plain.metrics["bytes_moved"] > 0  # same join, inputs spread by row ranges


def test_broadcast_and_auto_choices(cons):
    for j in _joins(cons["broadcast"], 5):
        assert j.metrics["distribution"] == "broadcast" and "join_distribution=broadcast" in " ".join(j.notes)
    # auto takes the method of lower estimated time on each join (planner/distribution.py)
    for j in _joins(cons["auto"], 5):
        m = re.search(r"est\. ([\d.e+-]+) ms broadcast vs ([\d.e+-]+) ms partitioned", " ".join(j.notes))
        assert m, j.notes
        assert j.metrics["distribution"] == ("broadcast" if float(m[1]) <= float(m[2]) else "partitioned")
    assert "planned distribution" in cons["auto"].sql(queries.query(5)).explain()
