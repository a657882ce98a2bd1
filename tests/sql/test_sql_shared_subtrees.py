"""Shared subtrees (``planner/shared_subtrees.py``): a CTE read several times and the block under a
ROLLUP run once and their result is reused under each copy's column ids (TPC-DS q14's shape);
answers equal DuckDB's, and subtrees that differ (another filter, another constant, a volatile or
outer reference) are not taken for one another."""
import numpy as np
import pyarrow as pa
import pytest

from opforge.sql.planner.shared_subtrees import plan_reuse
from sql_reference import SqlCheck

ROWS = 4000


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(11)
    sales = pa.table({"s_item": pa.array(rng.integers(0, 300, ROWS), pa.int64()),
                      "s_day": pa.array(rng.integers(0, 60, ROWS), pa.int32()),
                      "s_qty": pa.array(rng.integers(1, 20, ROWS), pa.int64()),
                      "s_price": pa.array(rng.integers(1, 500, ROWS) / 4.0, pa.float64())})
    other = pa.table({"o_item": pa.array(rng.integers(0, 300, ROWS // 2), pa.int64()),
                      "o_day": pa.array(rng.integers(0, 60, ROWS // 2), pa.int32()),
                      "o_qty": pa.array(rng.integers(1, 20, ROWS // 2), pa.int64())})
    item = pa.table({"i_item": pa.array(np.arange(300), pa.int64()),
                     "i_brand": pa.array(np.arange(300) % 17, pa.int64()),
                     "i_class": pa.array(np.arange(300) % 5, pa.int64())})
    days = pa.table({"d_day": pa.array(np.arange(60), pa.int32()), "d_month": pa.array(np.arange(60) // 30, pa.int32())})
    return SqlCheck({"sales": sales, "other": other, "item": item, "days": days})


CROSS_ITEMS = """WITH hot AS (
  SELECT i_brand, i_class FROM sales JOIN item ON s_item = i_item JOIN days ON s_day = d_day WHERE d_month = 0
  INTERSECT
  SELECT i_brand, i_class FROM other JOIN item ON o_item = i_item JOIN days ON o_day = d_day WHERE d_month = 0),
cross_items AS (SELECT i_item AS ci FROM item JOIN hot USING (i_brand, i_class))
"""

Q14_SHAPE = CROSS_ITEMS + """
SELECT channel, i_brand, i_class, sum(v) AS v, sum(n) AS n FROM (
  SELECT 'a' AS channel, i_brand, i_class, sum(s_qty * s_price) AS v, count(*) AS n
  FROM sales JOIN item ON s_item = i_item WHERE s_item IN (SELECT ci FROM cross_items) AND s_day >= 30
  GROUP BY i_brand, i_class
  UNION ALL
  SELECT 'b' AS channel, i_brand, i_class, sum(o_qty * 1.5) AS v, count(*) AS n
  FROM other JOIN item ON o_item = i_item WHERE o_item IN (SELECT ci FROM cross_items) AND o_day >= 30
  GROUP BY i_brand, i_class) y
GROUP BY ROLLUP (channel, i_brand, i_class)
ORDER BY channel NULLS FIRST, i_brand NULLS FIRST, i_class NULLS FIRST"""


def _reused(con, q) -> int:
    return sum("identical subtree" in " ".join(s.notes) for s in con.sql(q).analyze().stats)


def test_cte_read_twice_under_rollup_runs_once_and_matches_duckdb(check):
    out = check(Q14_SHAPE, ordered=True)
    assert out.num_rows > 10
    reuse = plan_reuse(check.con.sql(Q14_SHAPE).plan)
    assert reuse.uses  # the ROLLUP's block (4 grouping sets) and cross_items (2 channels) are shared
    assert sum(reuse.uses.values()) >= 3 + 1
    assert _reused(check.con, Q14_SHAPE) == sum(reuse.uses.values())


def test_copies_that_differ_are_not_shared(check):
    # the two sides differ only in a constant: no shared subtree, and the answer counts both
    q = ("SELECT (SELECT count(*) FROM sales JOIN item ON s_item = i_item WHERE i_class = 1) AS a, "
         "(SELECT count(*) FROM sales JOIN item ON s_item = i_item WHERE i_class = 2) AS b")
    check(q)
    q = ("SELECT x.i_brand, x.n, y.n AS m FROM "
         "(SELECT i_brand, count(*) AS n FROM sales JOIN item ON s_item = i_item WHERE s_qty > 5 GROUP BY i_brand) x JOIN "
         "(SELECT i_brand, count(*) AS n FROM sales JOIN item ON s_item = i_item WHERE s_qty > 6 GROUP BY i_brand) y "
         "USING (i_brand)")
    check(q)
    assert not plan_reuse(check.con.sql(q).plan).uses


def test_self_join_of_a_cte_reuses_it_with_each_copys_columns(check):
    q = ("WITH t AS (SELECT i_brand, d_month, sum(s_qty) AS q FROM sales JOIN item ON s_item = i_item "
         "JOIN days ON s_day = d_day GROUP BY i_brand, d_month) "
         "SELECT a.i_brand, a.q AS q0, b.q AS q1 FROM t a JOIN t b ON a.i_brand = b.i_brand "
         "WHERE a.d_month = 0 AND b.d_month = 1 ORDER BY 1")
    check(q, ordered=True)
    q2 = ("WITH t AS (SELECT i_brand, sum(s_qty) AS q, count(*) AS n FROM sales JOIN item ON s_item = i_item "
          "GROUP BY i_brand) SELECT a.i_brand, a.q, b.q AS q1 FROM t a JOIN t b ON a.i_brand = b.i_brand + 1 ORDER BY 1")
    check(q2, ordered=True)
    assert _reused(check.con, q2) == 1


def test_correlated_copies_are_not_shared(check):
    q = ("SELECT i_item, (SELECT count(*) FROM sales s JOIN days ON s_day = d_day WHERE s.s_item = i.i_item) AS a, "
         "(SELECT count(*) FROM sales s JOIN days ON s_day = d_day WHERE s.s_item = i.i_item AND d_month = 1) AS b "
         "FROM item i ORDER BY i_item")
    check(q, ordered=True)


def test_join_tree_under_each_grouping_set_runs_once(check):
    # TPC-DS q18's shape: the grouping sets' blocks are join trees no runtime filter reaches
    q = ("SELECT i_brand, i_class, sum(s_qty * i_class) AS q, count(*) AS n FROM sales JOIN item ON s_item = i_item "
         "JOIN days ON s_day = d_day WHERE i_brand < 10 AND i_class < 4 AND d_month = 1 "
         "GROUP BY ROLLUP (i_brand, i_class) ORDER BY 1 NULLS FIRST, 2 NULLS FIRST")
    check(q, ordered=True)
    assert _reused(check.con, q) == 2
    # the grand total needs no i_brand (the filter above kept it): each copy keeps the
    # columns any copy needs, so the three stay alike (TPC-DS q27, q18)
    q = ("SELECT i_brand, i_class, sum(s_qty * i_class) AS v, count(*) AS n FROM sales JOIN item ON s_item = i_item "
         "JOIN days ON s_day = d_day WHERE d_month = 1 GROUP BY ROLLUP (i_brand, i_class) "
         "ORDER BY 1 NULLS FIRST, 2 NULLS FIRST")
    check(q, ordered=True)
    assert _reused(check.con, q) == 2


def test_join_tree_copies_under_a_join_keep_their_runtime_filters(check):
    q = ("WITH t AS (SELECT s_item, s_qty FROM sales JOIN days ON s_day = d_day WHERE d_month = 1) "
         "SELECT count(*) AS n, sum(a.s_qty) AS q FROM t a JOIN t b ON a.s_item = b.s_item + 1")
    check(q)
    assert _reused(check.con, q) == 0
