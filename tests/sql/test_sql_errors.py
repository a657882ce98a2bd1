"""Bad queries fail with clear errors: syntax position, near names, NotSupportedError naming the construct."""
import pyarrow as pa
import pytest

import opforge.sql as sql


@pytest.fixture
def con():
    c = sql.connect("cpu")
    c.register("lineitem", pa.table({"l_quantity": [1, 2], "l_discount": [0.1, 0.2], "l_comment": ["a", "b"]}))
    return c


def test_syntax_error_names_position(con):
    with pytest.raises(sql.SqlError, match=r"syntax error at line 1, column \d+"):
        con.sql("SELECT l_quantity FROM lineitem WHERE (")


def test_unknown_table_lists_near_names(con):
    with pytest.raises(sql.SqlError, match="unknown table 'lineitm'.*lineitem"):
        con.sql("SELECT * FROM lineitm")


def test_unknown_column_lists_near_names(con):
    with pytest.raises(sql.SqlError, match="unknown column 'l_quantty'.*l_quantity"):
        con.sql("SELECT l_quantty FROM lineitem")
    with pytest.raises(sql.SqlError, match="unknown table 'x'"):
        con.sql("SELECT x.l_quantity FROM lineitem")


def test_ambiguous_column(con):
    with pytest.raises(sql.SqlError, match="ambiguous"):
        con.sql("SELECT l_quantity FROM lineitem a, lineitem b")


@pytest.mark.parametrize("q, construct", [
    ("SELECT median(l_quantity) OVER () FROM lineitem", "window function median"),
    ("WITH RECURSIVE r(x) AS (SELECT x FROM r UNION ALL SELECT 1) SELECT * FROM r", "RECURSIVE r: a reference to the CTE in its anchor"),
    ("SELECT l_comment[1:2] FROM lineitem", "slicing a value of type STRING"),
    ("SELECT CAST(l_comment AS BOOLEAN) FROM lineitem", "CAST"),
    ("INSERT INTO lineitem VALUES (1, 2, 'c')", "Insert"),
    ("SELECT * FROM lineitem POSITIONAL JOIN lineitem b", "POSITIONAL"),
    ("SELECT l_comment FROM lineitem GROUP BY GROUPING SETS (ROLLUP (l_comment))", "GROUPING SETS"),
    ("SELECT cume_dist(ORDER BY l_quantity) OVER () FROM lineitem", "arguments to window function cume_dist"),
    ("SELECT sum(l_quantity) OVER (ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING EXCLUDE TIES) FROM lineitem", "EXCLUDE"),
    ("SELECT l_comment FROM lineitem, LATERAL (SELECT 1)", "Lateral"),
    ("SELECT sum(DISTINCT l_quantity) FROM lineitem", "DISTINCT"),
    ("SELECT (SELECT DISTINCT b.l_quantity FROM lineitem b WHERE b.l_comment = a.l_comment LIMIT 1) FROM lineitem a", "SELECT DISTINCT ... LIMIT in a correlated subquery"),
    ("SELECT (SELECT b.l_quantity FROM lineitem b WHERE b.l_comment = a.l_comment UNION SELECT 1) FROM lineitem a", "correlated subquery that is a Union"),
])
def test_not_supported_names_the_construct(con, q, construct):
    with pytest.raises(sql.NotSupportedError, match=construct):
        con.sql(q).to_arrow()


def test_using_names_a_missing_column(con):
    with pytest.raises(sql.SqlError, match="USING: 'x' is not a column on the left side"):
        con.sql("SELECT * FROM lineitem JOIN lineitem b USING (x)")
    with pytest.raises(sql.SqlError, match="NATURAL JOIN: the two sides have no column name in common"):
        con.sql("SELECT * FROM lineitem NATURAL JOIN (SELECT 1 AS x) b")


def test_type_errors(con):
    with pytest.raises(sql.SqlError, match="compare|incompatible"):
        con.sql("SELECT * FROM lineitem WHERE l_comment > 3")
    with pytest.raises(sql.SqlError, match="boolean"):
        con.sql("SELECT * FROM lineitem WHERE l_quantity")
    with pytest.raises(sql.SqlError, match="sum"):
        con.sql("SELECT sum(l_comment) FROM lineitem")


def test_explain_shows_operators(con):
    text = con.sql("SELECT l_comment, sum(l_quantity) FROM lineitem WHERE l_discount > 0.15 GROUP BY l_comment").explain()
    assert "Aggregate" in text and "Scan lineitem" in text and "filter=" in text
