"""LIST and STRUCT columns (sql/nested.py), UNNEST (plan.Unnest) and schemas (sql/schemas.py),
and the other constructs DuckDB's sqllogictest files needed (fill, BY NAME, row comparisons, ...),
each answer compared with DuckDB's on the same data."""
import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql

SETUP = [
    "CREATE TABLE t(a INTEGER, l INTEGER[], s STRUCT(x INTEGER, y VARCHAR))",
    "INSERT INTO t VALUES (1, [1, 2, 3], {'x': 1, 'y': 'a'}), (2, [], {'x': 2, 'y': NULL}), "
    "(3, NULL, NULL), (4, [4, NULL], {'x': NULL, 'y': 'b'}), (5, [1, 2, 3], {'x': 1, 'y': 'a'})",
    "CREATE TABLE u(l INTEGER[])",
    "INSERT INTO u VALUES ([4, NULL]), ([9]), ([1, 2, 3])",  # other distinct lists: other codes
    "CREATE TABLE w(s STRUCT(k TINYINT, j BOOLEAN, d DECIMAL(4, 1)[]))",
    "INSERT INTO w VALUES ({'k': 2, 'j': 1, 'd': [1, 2.5]}), ({'k': NULL, 'j': 0, 'd': NULL}), (NULL)",  # cast per field
]


@pytest.fixture(scope="module")
def cons():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in SETUP:
        ours.sql(s)
        ref.execute(s)
    return ours, ref


QUERIES = [
    "SELECT a, l, s FROM t ORDER BY a",
    "SELECT [1, 2, 3] AS l, {'a': 1, 'b': 'x'} AS s, [[1], [2, NULL]] AS ll, [1.5, 2] AS d",
    "SELECT a, l[1], l[-1], l[3], l[0], len(l), array_length(l), s.x, s['y'], t.s.y FROM t ORDER BY a",
    "SELECT l, count(*) FROM t GROUP BY l ORDER BY l",  # equal lists group together, in DuckDB's order
    "SELECT DISTINCT s FROM t ORDER BY s",
    "SELECT a FROM t WHERE l = [1, 2, 3] ORDER BY a",
    "SELECT a, UNNEST(l) AS u FROM t ORDER BY a, u",  # rows multiply; NULL and empty lists give none
    "SELECT a, UNNEST(l) AS u, UNNEST([a, a + 1]) AS v FROM t ORDER BY a, u, v",  # zipped, padded
    "SELECT t.a, u.l FROM t JOIN u ON t.l = u.l ORDER BY t.a",  # keys of two dictionaries
    "SELECT l FROM t INTERSECT SELECT l FROM u ORDER BY l",
    "SELECT a, [1] || [2], [1] || NULL, list_concat([1], NULL, [2, 3]), l || [9], l || l FROM t ORDER BY a",
    "SELECT a, CAST(l AS VARCHAR), s::VARCHAR, l::VARCHAR || '!' FROM t ORDER BY a",  # DuckDB's text
    "SELECT a % 2 AS g, list(a), array_agg(l) FROM t GROUP BY g ORDER BY g",  # the list aggregate
    "SELECT list(a) FROM t WHERE a > 10",  # no rows: NULL
    "SELECT a, 2 = ANY(l), 9 > ANY(l), NULL = ANY(l) FROM t ORDER BY a",  # SQL's three values
    "SELECT ARRAY(SELECT a FROM t WHERE a > 2 ORDER BY a DESC), ARRAY(SELECT 1 WHERE false)",
    "WITH RECURSIVE r(l) AS (SELECT [1] UNION SELECT l || [len(l) + 1] FROM r WHERE len(l) < 3) SELECT * FROM r ORDER BY l",
    "SELECT l::BIGINT[], l::DOUBLE[] FROM t ORDER BY a",
    "SELECT s FROM w ORDER BY s",
    "SELECT UNNEST(s), a FROM t ORDER BY a",  # a STRUCT's fields as columns
    "SELECT a, l[2:3], l[:2], l[2:], l[-2:], l[0:a], l[a:-1], [1, 2, 3, 4, 5][2:-2], [1, 2][4:2] FROM t ORDER BY a",
    "SELECT [{'a': 42}, {'b': 84}], CASE WHEN a > 2 THEN l ELSE [0.5] END, coalesce(s, {'z': 1}) FROM t ORDER BY a",
    "SELECT {'a': 'x'} AS c UNION ALL BY NAME SELECT {'b': 'y'} AS c UNION ALL SELECT {'a': 'z', 'b': 'w'} ORDER BY c",
    "SELECT sum(u) FROM (SELECT UNNEST(l) AS u FROM t)",
    "SELECT * FROM UNNEST([5, 6, NULL]) AS x(u) ORDER BY u",
    "SELECT (SELECT UNNEST([])), (SELECT UNNEST([7]))",
    "SELECT list_value(a, a * 2), struct_pack(k := a, v := l) FROM t ORDER BY a",
    r"SELECT regexp_extract_all('a1 b22 c', '(\w)(\d+)?', ['c', 'd']), regexp_extract_all('a1 b22', '\d+')",
    r"SELECT regexp_extract('x=1 y=2', '(\w)=(\d)', ['k', 'v']), regexp_extract_all('abab', '[[:lower:]]b', 0)",
]


@pytest.mark.parametrize("query", QUERIES)
def test_nested_values_equal_duckdb(cons, query):
    ours, ref = cons
    assert ours.sql(query).fetchall() == [tuple(r) for r in ref.execute(query).fetchall()], query


def test_nested_arrow_round_trip():
    data = pa.table({"l": pa.array([[1, 2], None, [], [3, None]], pa.list_(pa.int64())),
                     "s": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": 1, "b": "x"}],
                                   pa.struct([("a", pa.int64()), ("b", pa.string())]))})
    con = sql.connect(device="cpu")
    con.register("n", data)
    assert con.sql("SELECT l, s FROM n").to_arrow().equals(data)


@pytest.mark.parametrize("bad", [
    "SELECT regexp_extract_all('abc', '(a)(b)', ['g1', 'g2', 'g3'])",  # more names than groups
    "SELECT regexp_extract_all('abc', '(a)', ['x', 'X'])",  # duplicate names
    "SELECT regexp_extract('abc', '(a)', [])",
    "SELECT [1, 2] = 1",
    "SELECT {'a': 1}.b",
    "SELECT UNNEST(1)",
    "SELECT concat([1], 'hello')",
    "SELECT [1] || 'x'",
    "SELECT -[1]",
    "SELECT abs([1])",
    "SELECT CAST([1] AS INTEGER)",
    "SELECT concat_ws(',', [1, 2])",
    "SELECT list_concat([1, 2], ['3', '4'])",
])
def test_nested_errors(bad):
    with pytest.raises(sql.SqlError):
        sql.connect(device="cpu").sql(bad).fetchall()


def test_schemas_match_duckdb():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE SCHEMA s1", "CREATE SCHEMA IF NOT EXISTS s1", "CREATE TABLE s1.t(v INTEGER)",
              "CREATE TABLE t(v INTEGER)", "INSERT INTO s1.t VALUES (1), (2)", "INSERT INTO main.t VALUES (3)"]:
        ours.sql(s)
        ref.execute(s)
    for q in ["SELECT v FROM s1.t ORDER BY v", "SELECT v FROM main.t", "SELECT s1.t.v, main.t.v FROM s1.t, main.t ORDER BY 1"]:
        assert ours.sql(q).fetchall() == ref.execute(q).fetchall(), q
    with pytest.raises(sql.SqlError):
        ours.sql("CREATE TABLE nope.t(v INTEGER)")
    with pytest.raises(sql.SqlError):
        ours.sql("DROP SCHEMA s1")  # holds a table: needs CASCADE
    ours.sql("DROP SCHEMA s1 CASCADE")
    with pytest.raises(sql.SqlError):
        ours.sql("SELECT * FROM s1.t")
    assert ours.sql("SELECT v FROM t").fetchall() == [(3,)]


FILL_ROWS = ("(VALUES (1, 1, NULL, 5, 1.0), (1, 2, 10, 1, NULL), (1, 3, NULL, 3, 2.5), (1, 5, 20, 2, NULL), "
             "(1, 6, NULL, NULL, NULL), (1, 7, NULL, 9, 4.0), (2, 1, NULL, 1, NULL), (2, 2, 7, 2, 1.5), "
             "(2, 3, NULL, 3, NULL), (3, 1, NULL, 1, NULL)) t(p, i, v, k, d)")


@pytest.mark.parametrize("call", [
    "fill(v) OVER (PARTITION BY p ORDER BY i)",  # interpolated (truncated), extrapolated (rounded), copied
    "fill(v ORDER BY k) OVER (PARTITION BY p ORDER BY i)",  # by a key of its own; a NULL key stays NULL
    "fill(d) OVER (PARTITION BY p ORDER BY i)",  # DECIMAL(2,1)
    "fill(d::DOUBLE ORDER BY k) OVER (ORDER BY i, p)",
])
def test_window_fill_equals_duckdb(call):
    q = f"SELECT p, i, {call} AS f FROM {FILL_ROWS} ORDER BY p, i"
    assert sql.connect(device="cpu").sql(q).fetchall() == duckdb.connect().execute(q).fetchall(), q


@pytest.mark.parametrize("query", [
    "SELECT x, y FROM t1 UNION BY NAME SELECT y, z FROM t2 ORDER BY y, x",
    "SELECT x FROM t1 UNION ALL BY NAME SELECT x FROM t1 ORDER BY x",
    "SELECT t1.x FROM t1 UNION SELECT z FROM t2 ORDER BY t2.z",  # a qualified name of either side's column
    "SELECT x FROM t1 UNION SELECT y FROM t2 ORDER BY t1.x DESC",
    "SELECT x, y FROM t1 UNION SELECT * FROM t2 UNION SELECT y, x FROM t1 a ORDER BY t1.x DESC, t2.z",  # nested, SELECT *
    "SELECT x % 2, y FROM t1 UNION SELECT y % 2 AS k, z FROM t2 ORDER BY x % 2, y",  # a side's item text
    "SELECT COLUMNS(* REPLACE (x + 1 AS x)) FROM t1 ORDER BY x",
    "SELECT * EXCLUDE (t1.y, t2.y) FROM t1 JOIN t2 USING (y) ORDER BY x",  # t2.y: merged away by USING
])
def test_set_operations_by_name_equal_duckdb(query):
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE TABLE t1(x INTEGER, y INTEGER)", "INSERT INTO t1 VALUES (1, 1), (3, 3)",
              "CREATE TABLE t2(y INTEGER, z INTEGER)", "INSERT INTO t2 VALUES (2, 2), (4, 4)"]:
        ours.sql(s)
        ref.execute(s)
    assert ours.sql(query).fetchall() == ref.execute(query).fetchall(), query


@pytest.mark.parametrize("query", [
    "SELECT (1, 2) <> ANY (SELECT * FROM (VALUES (1, NULL::INT), (1, 2)) t(x, y))",  # NULL: unknown
    "SELECT (NULL::INT, 3) <> ANY (SELECT * FROM (VALUES (1, 2)) t(x, y))",  # 3 <> 2: true
    "SELECT (1, 2) = ALL (SELECT * FROM (VALUES (1, 2), (1, 3)) t(x, y)), (1, 2) = ANY (SELECT 1, 2 WHERE false)",
    "SELECT a, (a, 1) = (1, a), (a, 2) <> (2, NULL) FROM (VALUES (1), (2), (NULL)) v(a) ORDER BY a",
    "SELECT * FROM (VALUES (3), ('42'), (NULL)) v(x) ORDER BY x",  # a string literal read as the column's type
    "SELECT * FROM (VALUES (DATE '1992-01-01'), ('1992-01-02')) v(x) ORDER BY x",
    "SELECT NULL IN ('a', 'b'), NULL NOT IN (1, 2)",
    "SELECT a, CASE WHEN a THEN 1 ELSE 0 END, CASE WHEN NULL THEN 1 ELSE 2 END, CASE WHEN 1 THEN 3 END, "
    "bool_or(NULL) OVER () FROM (VALUES (0), (2), (NULL)) v(a) ORDER BY a",
])
def test_row_comparisons_and_boolean_conditions_equal_duckdb(query):
    """Row values, and CASE conditions DuckDB reads as booleans (an integer, NULL)."""
    assert sql.connect(device="cpu").sql(query).fetchall() == duckdb.connect().execute(query).fetchall(), query


def test_trim_characters_from_a_column_equal_duckdb():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE TABLE tt(a VARCHAR, b VARCHAR)",
              "INSERT INTO tt VALUES ('hello', 'ho'), ('xxhixx', 'x'), (NULL, ' '), ('', NULL), ('ab', '')"]:
        ours.sql(s)
        ref.execute(s)
    q = "SELECT LTRIM(a, b), RTRIM(a, b), TRIM(a, b) FROM tt ORDER BY a, b"
    assert ours.sql(q).fetchall() == ref.execute(q).fetchall()


def test_string_functions_the_peer_files_use_equal_duckdb():
    q = ("SELECT substring_grapheme(s, -4, 4), substring_grapheme(s, 5), substring_grapheme(s, 0, -4) "
         "FROM (VALUES ('twoñthree₡four🦆end'), ('abc')) v(s) ORDER BY s")
    assert sql.connect(device="cpu").sql(q).fetchall() == duckdb.connect().execute(q).fetchall()
    with pytest.raises(sql.NotSupportedError):  # a cluster of two code points: refused, not cut
        sql.connect(device="cpu").sql("SELECT substring_grapheme('e\u0301x', 1, 1)").fetchall()


def test_exact_float_sums_equal_duckdb():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE TABLE dd(n DOUBLE, g INTEGER)",
              "INSERT INTO dd VALUES (9007199254740992, 1), (1, 1), (1, 1), (NULL, 2), (0.1, 3), (0.2, 3)"]:
        ours.sql(s)
        ref.execute(s)
    q = "SELECT g, fsum(n), kahan_sum(n), sumKahan(n), favg(n), sum(n) FROM dd GROUP BY g ORDER BY g"
    assert ours.sql(q).fetchall() == ref.execute(q).fetchall()  # 2^53 + 1 + 1: fsum keeps both ones


def test_covariances_equal_duckdb():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE TABLE cv(x INTEGER, y DOUBLE, g INTEGER)",
              "INSERT INTO cv VALUES (1, 2.5, 1), (2, NULL, 1), (3, 7.0, 1), (NULL, 1, 1), (4, 4, 2), (5, 1, 3), (6, 3, 3)"]:
        ours.sql(s)
        ref.execute(s)
    q = "SELECT g, covar_pop(x, y), covar_samp(y, x) FROM cv GROUP BY g ORDER BY g"  # one row: samp NULL
    assert ours.sql(q).fetchall() == ref.execute(q).fetchall()
    q = "SELECT covar_pop(x, y) OVER (PARTITION BY g) FROM cv ORDER BY g, x"
    assert ours.sql(q).fetchall() == ref.execute(q).fetchall()


def test_string_column_casts_equal_duckdb():
    ours, ref = sql.connect(device="cpu"), duckdb.connect()
    for s in ["CREATE TABLE sc(a VARCHAR)", "INSERT INTO sc VALUES ('2023-01-05'), (' 42 '), (NULL), ('x'), ('1.5')"]:
        ours.sql(s)
        ref.execute(s)
    for q in ["SELECT a::DATE FROM sc WHERE a LIKE '2023%'",  # 'x' is in the column, not in these rows
              "SELECT a::INTEGER, a::BIGINT, a::DOUBLE FROM sc WHERE a = ' 42 '",
              "SELECT a::DOUBLE FROM sc WHERE a <> 'x' AND a NOT LIKE '2023%' ORDER BY 1"]:
        assert ours.sql(q).fetchall() == ref.execute(q).fetchall(), q
    with pytest.raises(sql.SqlError):
        ours.sql("SELECT a::INTEGER FROM sc").fetchall()  # 'x': DuckDB's conversion error


def test_schema_tables_persist(tmp_path):
    con = sql.connect(database=str(tmp_path / "db"))
    con.sql("CREATE SCHEMA s")
    con.sql("CREATE TABLE s.t(a INTEGER)")
    con.sql("INSERT INTO s.t VALUES (1)")
    again = sql.connect(database=str(tmp_path / "db"))
    assert again.sql("SELECT a FROM s.t").fetchall() == [(1,)]
    again.sql("CREATE TABLE s.u(b INTEGER)")  # the schema of a table read back exists
