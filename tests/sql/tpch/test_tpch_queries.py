"""The 22 TPC-H texts: they parse with sqlglot, carry the spec's validation parameters
and order their results as the spec says."""

import pytest
import sqlglot
from sqlglot import exp

from opforge.sql.tpch import compare, queries

# Validation (qualification) parameters of TPC-H spec section 2.4, one or more fragments per query.
VALIDATION = {
    1: ["interval '90' day", "date '1998-12-01'"],
    2: ["p_size = 15", "'%BRASS'", "r_name = 'EUROPE'", "limit 100"],
    3: ["'BUILDING'", "date '1995-03-15'", "limit 10"],
    4: ["date '1993-07-01'", "interval '3' month"],
    5: ["'ASIA'", "date '1994-01-01'", "interval '1' year"],
    6: ["date '1994-01-01'", "0.06 - 0.01", "0.06 + 0.01", "l_quantity < 24"],
    7: ["'FRANCE'", "'GERMANY'"],
    8: ["'BRAZIL'", "'AMERICA'", "'ECONOMY ANODIZED STEEL'"],
    9: ["'%green%'"],
    10: ["date '1993-10-01'", "limit 20"],
    11: ["'GERMANY'", "0.0001"],
    12: ["('MAIL', 'SHIP')", "date '1994-01-01'"],
    13: ["'%special%requests%'"],
    14: ["date '1995-09-01'", "interval '1' month"],
    15: ["date '1996-01-01'", "interval '3' month"],
    16: ["'Brand#45'", "'MEDIUM POLISHED%'", "(49, 14, 23, 45, 19, 3, 36, 9)"],
    17: ["'Brand#23'", "'MED BOX'"],
    18: ["> 300", "limit 100"],
    19: ["'Brand#12'", "'Brand#23'", "'Brand#34'", "l_quantity >= 1 ", "l_quantity >= 10 ", "l_quantity >= 20 "],
    20: ["'forest%'", "date '1994-01-01'", "'CANADA'"],
    21: ["'SAUDI ARABIA'", "limit 100"],
    22: ["('13', '31', '23', '29', '30', '18', '17')"],
}

# The spec's ORDER BY of each query as output column names (None: no ORDER BY).
ORDER_BY = {
    1: ["l_returnflag", "l_linestatus"], 2: ["s_acctbal", "n_name", "s_name", "p_partkey"],
    3: ["revenue", "o_orderdate"], 4: ["o_orderpriority"], 5: ["revenue"], 6: None,
    7: ["supp_nation", "cust_nation", "l_year"], 8: ["o_year"], 9: ["nation", "o_year"], 10: ["revenue"],
    11: ["value"], 12: ["l_shipmode"], 13: ["custdist", "c_count"], 14: None, 15: ["s_suppkey"],
    16: ["supplier_cnt", "p_brand", "p_type", "p_size"], 17: None, 18: ["o_totalprice", "o_orderdate"], 19: None,
    20: ["s_name"], 21: ["numwait", "s_name"], 22: ["cntrycode"],
}


def test_there_are_22_queries():
    assert queries.NUMBERS == tuple(range(1, 23))
    assert len(queries.queries()) == 22


@pytest.mark.parametrize("n", queries.NUMBERS, ids=queries.name)
def test_query_parses_as_one_select_with_duckdb_dialect(n):
    statements = sqlglot.parse(queries.query(n), read="duckdb")
    assert len(statements) == 1 and isinstance(statements[0], exp.Select)


@pytest.mark.parametrize("n", queries.NUMBERS, ids=queries.name)
def test_query_has_the_spec_validation_parameters(n):
    text = " ".join(queries.query(n).split())
    for fragment in VALIDATION[n]:
        assert " ".join(fragment.split()) in text + " ", (n, fragment)


@pytest.mark.parametrize("n", queries.NUMBERS, ids=queries.name)
def test_order_keys_are_the_spec_order_by(n):
    assert compare.order_keys(queries.query(n)) == ORDER_BY[n]


@pytest.mark.parametrize("bad", [0, 23, "1", 1.0, True])
def test_bad_query_number_names_the_argument(bad):
    with pytest.raises(ValueError, match="n must be an integer in 1..22"):
        queries.query(bad)


def test_order_keys_by_position_and_expression():
    assert compare.order_keys("select a, b + 1 as c from t order by 2, a") == ["c", "a"]
    # an unaliased expression is found by position or by expression alike; its output name is
    # each engine's own, so it ends the named keys (positions still name it)
    by_expr, by_pos = ("select a, sum(b) from t group by a order by sum(b) desc",
                       "select a, sum(b) from t group by a order by 2")
    assert compare.order_positions(by_expr) == compare.order_positions(by_pos) == [1]
    assert compare.order_keys(by_expr) == compare.order_keys(by_pos) == []
    # an ORDER BY on a column that is not selected ends the usable keys
    assert compare.order_keys("select a from t order by z, a") == []
