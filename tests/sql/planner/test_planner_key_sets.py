"""A decorrelated scalar subquery (an aggregate grouped by the correlation key, joined back) gets
the outer query's key set as a semi join below its aggregate (``optimizer._key_sets``): its joins
see only the outer keys' rows, answers stay DuckDB's, and the rule stays out where the outer scan
is not selective."""
import duckdb
import numpy as np
import pyarrow as pa

import opforge.sql as sql

QUERY = """
SELECT p_key, s_cost FROM parts, supply
WHERE p_key = s_part AND p_size = {size}
  AND s_cost = (SELECT min(s2.s_cost) FROM supply s2, vendor WHERE s2.s_part = p_key AND s2.s_vendor = v_key
                AND v_region = 1)
ORDER BY p_key, s_cost
"""


def tables():
    rng = np.random.default_rng(5)
    parts = pa.table({"p_key": np.arange(2000), "p_size": rng.integers(0, 50, 2000)})
    supply = pa.table({"s_part": np.repeat(np.arange(2000), 4), "s_vendor": rng.integers(0, 100, 8000),
                       "s_cost": rng.integers(1, 1000, 8000)})
    vendor = pa.table({"v_key": np.arange(100), "v_region": rng.integers(0, 5, 100)})
    return {"parts": parts, "supply": supply, "vendor": vendor}


def connections():
    con, ref = sql.connect(device="cpu"), duckdb.connect()
    for name, t in tables().items():
        con.register(name, t)
        ref.register(name, t)
    return con, ref


def _aggregate_input(plan_text: str) -> str:
    lines = plan_text.splitlines()
    at = next(i for i, line in enumerate(lines) if "Aggregate keys=" in line)
    return "\n".join(lines[at:])


def test_selective_outer_keys_reach_the_subquery_and_answers_match():
    con, ref = connections()
    q = QUERY.format(size=7)
    below = _aggregate_input(con.sql(q).explain())
    assert "Join semi [s_part" in below and "Scan parts [p_key, p_size] filter=[(p_size" in below
    assert con.sql(q).fetchall() == ref.sql(q).fetchall()


def test_unselective_outer_scan_leaves_the_subquery_alone():
    con, ref = connections()
    q = QUERY.format(size=7).replace("AND p_size = 7", "AND p_size >= 0")
    assert "Join semi" not in _aggregate_input(con.sql(q).explain())
    assert con.sql(q).fetchall() == ref.sql(q).fetchall()
