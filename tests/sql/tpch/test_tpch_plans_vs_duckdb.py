"""opforge's join plans against DuckDB's on every multi-join TPC-H query (SF 0.01): DuckDB's join
tree and actual cardinalities are parsed from its JSON profile (``EXPLAIN (ANALYZE, FORMAT JSON)``),
opforge's from EXPLAIN ANALYZE (``sql/tpch/plans.py``), and C_out (sum of the inner-join results)
of opforge's plan must be no larger than DuckDB's. Run with ``-s`` for the table."""
import pytest

from opforge import sql
from opforge.sql.tpch import plans, queries, reference

# queries whose DuckDB plan has two or more join operators
MULTI_JOIN = [2, 3, 5, 7, 8, 9, 10, 11, 15, 16, 17, 18, 20, 21, 22]


@pytest.fixture(scope="module")
def engines(tpch_paths):
    con = sql.connect(device="cpu")
    for name, path in tpch_paths.items():
        con.register(name, str(path))
    duck, _ = reference.connect(tpch_paths, threads=1)
    yield con, duck
    duck.close()


_ROWS = {}


@pytest.mark.parametrize("n", MULTI_JOIN, ids=queries.name)
def test_opforge_c_out_no_worse_than_duckdb(engines, n):
    con, duck = engines
    [row] = plans.compare(con, duck, [n])
    _ROWS[n] = row
    assert len(row["duckdb_joins"]) >= 2  # the profile was parsed: a multi-join plan
    assert all(j["actual_rows"] >= 0 for j in row["duckdb_joins"])
    print(f"\n{row['query']}: C_out opforge {row['opforge_c_out']} vs DuckDB {row['duckdb_c_out']} "
          f"(all joins {row['opforge_c_out_all']} vs {row['duckdb_c_out_all']})")
    assert row["opforge_c_out"] <= row["duckdb_c_out"], row["query"]


def test_duckdb_profile_parse_matches_duckdb_answer(engines):
    """The parsed tree is DuckDB's own: q05's top join produces as many rows as the query's
    GROUP BY input, which DuckDB also reports by SQL."""
    con, duck = engines
    joins = plans.duckdb_joins(duck, queries.query(5))
    assert [j.kind for j in joins] == ["inner"] * 5 and joins[0].depth < joins[-1].depth
    q5_join_rows = duck.execute(
        "SELECT count(*) FROM customer, orders, lineitem, supplier, nation, region WHERE c_custkey = o_custkey "
        "AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey "
        "AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA' "
        "AND o_orderdate >= date '1994-01-01' AND o_orderdate < date '1995-01-01'").fetchone()[0]
    assert joins[0].actual_rows == q5_join_rows
    ours = plans.opforge_joins(con, queries.query(5))
    assert ours[0].actual_rows == q5_join_rows
