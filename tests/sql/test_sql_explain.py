"""EXPLAIN (plan + estimated rows) and EXPLAIN ANALYZE (actual rows, time, bytes, GB/s, the registry
ops that ran) as SQL statements and through Relation.explain(analyze=True); and the SQL operators
running the Triton hash kernels (under the interpreter here) through dispatch."""
import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql
from opforge.sql.profile import SCHEMA
from sql_reference import SqlCheck


@pytest.fixture(scope="module")
def con():
    rng = np.random.default_rng(2)
    c = sql.connect("cpu")
    c.register("f", pa.table({"fk": pa.array(rng.integers(0, 20, 900), pa.int64()),
                              "fv": pa.array(rng.integers(0, 9, 900), pa.int32())}))
    c.register("d", pa.table({"dk": pa.array(np.arange(20), pa.int64()),
                              "dname": pa.array([f"d{i % 4}" for i in range(20)])}))
    return c


Q = "SELECT dname, count(*) AS n, sum(fv) AS s FROM f JOIN d ON fk = dk WHERE fv > 2 GROUP BY dname ORDER BY s DESC LIMIT 3"


def test_explain_statement_gives_plan_with_estimates(con):
    t = con.sql("EXPLAIN " + Q).to_arrow()
    assert t.column_names == ["operator", "est_rows"]
    ops = t.column("operator").to_pylist()
    assert any(o.strip().startswith("TopK 3") for o in ops)
    assert any("Join inner" in o for o in ops) and any("Scan f" in o for o in ops)
    est = dict(zip([o.strip().split(" ")[0] + o.strip().split(" ")[1] for o in ops], t.column("est_rows").to_pylist()))
    assert est["Scand"] == 20 and est["TopK3"] == 3
    text = con.sql(Q).explain()
    assert "(est. rows=" in text.splitlines()[0]


def test_explain_analyze_schema_rows_and_times(con):
    rel = con.sql("EXPLAIN ANALYZE " + Q)
    t = rel.to_arrow()
    assert t.schema.equals(SCHEMA)
    rows = t.to_pylist()
    ops = [r["operator"].strip() for r in rows]
    assert ops[0].startswith("Project") and any(o.startswith("TopK") for o in ops)
    # actual rows are exact: checked against running the pieces by hand
    truth = con.sql(Q).to_arrow().num_rows
    assert rows[0]["actual_rows"] == truth == 3
    by = {o.split(" ")[0] + (" " + o.split(" ")[1] if o.startswith("Scan") else ""): r for o, r in zip(ops, rows)}
    assert by["Scan d"]["actual_rows"] == 20
    assert by["Scan f"]["actual_rows"] == con.sql("SELECT count(*) FROM f WHERE fv > 2").fetchall()[0][0]
    # eager aggregation: f is counted and summed per fk below the join (d's key is unique), so the
    # join meets one row per fk, and the final aggregate combines the partials per dname
    aggs = [r for o, r in zip(ops, rows) if o.startswith("Aggregate")]
    assert len(aggs) == 2 and "partial_" in aggs[1]["operator"]
    assert aggs[1]["actual_rows"] == con.sql("SELECT count(DISTINCT fk) FROM f WHERE fv > 2").fetchall()[0][0]
    assert by["Join"]["actual_rows"] == con.sql(
        "SELECT count(DISTINCT fk) FROM f JOIN d ON fk = dk WHERE fv > 2").fetchall()[0][0]
    assert aggs[0]["actual_rows"] == 4
    for r in rows:
        assert r["time_ms"] > 0 and r["bytes_out"] >= 0 and r["bytes_in"] >= 0 and r["gbps"] >= 0
        assert r["pct_copy_bw"] is None  # CPU: GB/s only
    assert by["Scan f"]["bytes_in"] == 900 * (8 + 4)
    # d's keys are unique and dense: the planner chose a perfect-hash (direct) join, and it ran
    assert "perfect-hash (direct) join, build=right" in by["Join"]["notes"]
    assert "rule: planner (physical_choice): direct build=right" in by["Join"]["notes"]
    # four dname values: their dictionary codes span a tiny range, grouped without a hash table
    assert "groups by direct-address table" in by["Aggregate"]["notes"]
    assert "opforge::segment_reduce" in by["Aggregate"]["kernels"]
    assert "join" in by["Join"]["notes"]


def test_relation_explain_analyze_text(con):
    text = con.sql(Q).explain(analyze=True)
    lines = text.splitlines()
    assert lines[0].startswith("EXPLAIN ANALYZE on cpu: total")
    assert any("actual rows=3," in x for x in lines)
    assert any("groups by direct-address table" in x for x in lines)
    assert "GB/s" in text
    forced = sql.connect("cpu", join_algorithm="hash")  # the user's override beats the planner
    forced.register("f", con._tables["f"].to_arrow()).register("d", con._tables["d"].to_arrow())
    text = forced.sql(Q).explain(analyze=True)
    assert "ran opforge::hash_join -> " in text and "rule: join_algorithm=hash (user override)" in text
    assert con.sql("EXPLAIN ANALYZE " + Q).explain().startswith("EXPLAIN ANALYZE on cpu")


def test_explain_of_non_query_is_an_error(con):
    with pytest.raises(sql.SqlError, match="EXPLAIN"):
        con.sql("EXPLAIN CREATE VIEW v AS SELECT 1")


@pytest.mark.triton_kernels
def test_sql_operators_run_the_triton_hash_kernels():
    """Dispatch's own choice: under OPFORGE_INTERPRET=1 the Triton variants, answers as DuckDB."""
    rng = np.random.default_rng(4)
    n = 60
    a = pa.table({"ak": pa.array(rng.integers(0, 10, n), pa.int32(), mask=rng.random(n) < 0.2),
                  "ak2": pa.array(rng.integers(0, 2, n), pa.int64()), "av": pa.array(rng.integers(0, 9, n), pa.int64())})
    b = pa.table({"bk": pa.array(rng.integers(0, 12, n + 10), pa.int32(), mask=rng.random(n + 10) < 0.2),
                  "bk2": pa.array(rng.integers(0, 2, n + 10), pa.int64()), "bv": pa.array(rng.integers(0, 9, n + 10), pa.int64())})
    check = SqlCheck({"a": a, "b": b})
    check.con.join_algorithm = "hash"
    for q in ["SELECT * FROM a JOIN b ON ak = bk", "SELECT * FROM a LEFT JOIN b ON ak = bk AND ak2 = bk2",
              "SELECT * FROM a WHERE ak IN (SELECT bk FROM b)", "SELECT * FROM a ANTI JOIN b ON ak = bk",
              "SELECT ak, count(*), sum(av), min(av), max(bv) FROM a JOIN b ON ak2 = bk2 GROUP BY ak"]:
        check(q)
    # keys spread far apart (a range past 2 n + 64 Ki): the hash table groups them, not a direct-address table
    spread = "SELECT ak * 1000003 AS g, sum(av) FROM a JOIN b ON ak = bk GROUP BY g"
    check(spread)
    t = check.con.sql("EXPLAIN ANALYZE " + spread).to_pandas()
    kernels = " ".join(t["kernels"])
    assert "opforge::hash_join -> triton_hash" in kernels
    assert "opforge::group_by -> triton_hash" in kernels and "opforge::segment_reduce -> triton_private" in kernels  # few groups
    small = sql.connect("cpu", memory_budget=512, join_algorithm="hash")
    small.register("a", a).register("b", b)
    got = small.sql("SELECT * FROM a JOIN b ON ak = bk").to_arrow()
    assert got.equals(check.con.sql("SELECT * FROM a JOIN b ON ak = bk").to_arrow())
