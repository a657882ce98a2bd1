"""The engine's vertical slice on real TPC-H data (SF 0.01 from tpchgen-cli): single-table Q1/Q6 and the
join queries Q3/Q5/Q10, equal to DuckDB on the same tables, with DuckDB's result types."""
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from sql_reference import SqlCheck

TABLES = ["lineitem", "orders", "customer", "nation", "region", "supplier", "part", "partsupp"]


def _tpchgen() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    return here if os.path.exists(here) else shutil.which("tpchgen-cli")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    exe = _tpchgen()
    if exe is None:
        pytest.skip("tpchgen-cli is not installed")
    out = tmp_path_factory.mktemp("tpch001")
    subprocess.run([exe, "parquet", "-s", "0.01", f"--output-dir={out}"], check=True, capture_output=True)
    return SqlCheck({t: pq.read_table(out / f"{t}.parquet") for t in TABLES})


@pytest.mark.parametrize("n", [1, 3, 5, 6, 10])
def test_tpch_query_matches_duckdb(check, n):
    from opforge.sql.tpch.queries import query
    out = check(query(n), ordered=True)
    assert out.num_rows > 0


def test_q1_plan_pushes_filter_and_prunes(check):
    from opforge.sql.tpch.queries import query
    text = check.con.sql(query(1)).explain()
    scan = [line for line in text.splitlines() if "Scan lineitem" in line][0]
    assert "filter=" in scan and "l_comment" not in scan
