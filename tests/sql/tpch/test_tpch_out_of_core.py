"""Issue 28's out-of-core path on TPC-H SF 0.01: a 1 MiB device limit makes lineitem / orders scans
read in chunks, joins stream chunks against resident sides or run as grace joins, and
aggregations run in two steps or partition and spill; the answers equal DuckDB's. Four queries cover the paths (all 22
pass at 512 KiB; CI time keeps the list short): q1 (chunked scan, each chunk aggregated, then the partials), q4
(a semi join whose lineitem chunks mark the resident orders), q14 (lineitem chunks probing the resident part
table), q21 (EXISTS and NOT EXISTS with a residual, each marking its left rows from lineitem
chunks). The grace semi / anti joins are in ``tests/sql/test_sql_out_of_core.py``."""

import pytest

from opforge import sql
from opforge.sql.tpch import compare, queries

CASES = {1: ("partial_chunks", "scan_chunks"), 4: ("marked_joins", "scan_chunks"), 14: ("scan_chunks",),
         21: ("marked_joins", "scan_chunks")}


@pytest.fixture(scope="module")
def con(tpch_paths):
    connection = sql.connect("cpu", memory_limit="1MiB")
    for name, path in tpch_paths.items():
        connection.register(name, str(path))
    return connection


@pytest.mark.parametrize("n", sorted(CASES), ids=queries.name)
def test_tpch_out_of_core_matches_duckdb(con, tpch_answers, n):
    text = queries.query(n)
    prof = con.sql(text).analyze()
    metrics = {}
    for s in prof.stats:
        for k, v in s.metrics.items():
            metrics[k] = metrics.get(k, 0) + v
    for name in CASES[n]:
        assert metrics.get(name, 0) > 0, (name, metrics)
    ours = con.sql(text).to_arrow()
    keys = compare.order_keys(text)
    diffs = compare.compare(ours, tpch_answers[n], ordered=keys is not None, order_by=keys)
    assert not diffs, f"{queries.name(n)} out of core differs from DuckDB:\n" + "\n".join(diffs)
