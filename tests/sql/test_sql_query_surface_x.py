"""The SQL surface DuckDB users met refusals on (issue 24), each answer compared with DuckDB on
small NULL-bearing data: ILIKE / LIKE ... ESCAPE / patterns from columns and the string functions
evaluated per distinct argument tuple (``expr/string_calls.py``); WITH RECURSIVE
(``frontend/recursive_cte.py``); correlated scalar subqueries and EXISTS outside a WHERE conjunct
and IN / ANY / ALL (subquery) in any expression (``frontend/correlated.py``), with their NULL
semantics (no rows: count 0, other aggregates NULL, EXISTS and ANY false, ALL true; a NULL
correlated value matches nothing; three-valued IN). Constructs still refused raise an error
that names them."""
import pyarrow as pa
import pytest

from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.frontend import recursive_cte
from sql_reference import SqlCheck


@pytest.fixture(scope="module")
def check():
    words = pa.table({
        "id": pa.array([1, 2, 3, 4, 5, 6, 7, 8], pa.int32()),
        "s": pa.array(["Hello World", "a%c", None, "STRAßE", "under_score", "100% done", "", "über ALLES"]),
        "p": pa.array(["%world", "a$%C", "x", "%ss%", "under$_%", None, "", "Ü%"]),
        "n": pa.array([3, 2, 1, None, 12, 0, 4, 6], pa.int32()),
    })
    outer = pa.table({"i": pa.array([1, 2, 3, None, 3], pa.int32()), "g": pa.array([1, 1, 2, 2, None], pa.int32())})
    inner = pa.table({"k": pa.array([1, 1, 3, None, 4], pa.int32()), "v": pa.array([10, 20, 30, 40, None], pa.int32()),
                      "w": pa.array(["a", "b", "c", "n", None])})
    edges = pa.table({"src": pa.array([1, 2, 3, 3, 5], pa.int32()), "dst": pa.array([2, 3, 1, 4, 6], pa.int32())})
    return SqlCheck({"words": words, "outer_t": outer, "inner_t": inner, "edges": edges})


STRING_QUERIES = [
    "SELECT id, s ILIKE p, s NOT ILIKE p, s LIKE p FROM words",
    "SELECT id, s ILIKE '%world%', s ILIKE 'A$%C' ESCAPE '$', s LIKE 'under!_%' ESCAPE '!' FROM words",
    "SELECT id FROM words WHERE s ILIKE p ESCAPE '$'",
    "SELECT id, starts_with(s, 'a'), s ^@ 'H', ends_with(s, 'E'), contains(s, '%'), strpos(s, 'l') FROM words",
    "SELECT id, concat_ws('-', s, p, n), concat_ws(NULL, s), lpad(s, n, '*'), rpad(s, 6, '.') FROM words",
    "SELECT id, split_part(s, ' ', 2), left(s, 2), right(s, 3), replace(s, 'l', 'L'), reverse(s), ascii(s) FROM words",
    "SELECT id, regexp_matches(s, 'o.'), regexp_matches(s, 'hello', 'i'), regexp_full_match(s, '[a-z%]+') FROM words",
    "SELECT id, regexp_replace(s, '(l+)', '<\\1>'), regexp_replace(s, '[aeiou]', '_', 'g'), "
    "regexp_extract(s, '(\\w+) (\\w+)', 2), regexp_extract(s, '\\d+') FROM words",
    "SELECT id, regexp_escape(s), chr(65 + id) FROM words",
]


@pytest.mark.parametrize("q", STRING_QUERIES)
def test_string_functions_match_duckdb(check, q):
    check(q + " ORDER BY id", ordered=True)


def test_like_escape_errors_name_the_problem(check):
    with pytest.raises(SqlError, match="Invalid escape string"):
        check.con.sql("SELECT s ILIKE 'a' ESCAPE '$$' FROM words").fetchall()
    with pytest.raises(SqlError, match="must not end with escape character"):
        check.con.sql("SELECT s LIKE 'a$' ESCAPE '$' FROM words").fetchall()


RECURSIVE_QUERIES = [
    "WITH RECURSIVE t(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM t WHERE x < 6) SELECT x FROM t ORDER BY x",
    # a cycle: UNION stops once no new row appears; UNION ALL with a depth bound keeps duplicates
    "WITH RECURSIVE r(node) AS (SELECT 1 UNION SELECT dst FROM edges, r WHERE src = node) SELECT node FROM r ORDER BY node",
    "WITH RECURSIVE r(node, depth) AS (SELECT 1, 0 UNION ALL SELECT dst, depth + 1 FROM edges JOIN r ON src = node "
    "WHERE depth < 5) SELECT node, count(*) FROM r GROUP BY node ORDER BY node",
    "WITH RECURSIVE t(i, level) AS (SELECT * FROM (VALUES (NULL::INTEGER, 0), (NULL, 0), (1, 0)) "
    "UNION SELECT i, level + 1 FROM t WHERE level < 2) SELECT i, level FROM t ORDER BY i NULLS FIRST, level",
    "WITH RECURSIVE base AS (SELECT 2 AS b), t(x) AS (SELECT b FROM base UNION ALL SELECT x * b FROM t, base "
    "WHERE x < 100) SELECT x FROM t ORDER BY x",
]


@pytest.mark.parametrize("q", RECURSIVE_QUERIES)
def test_with_recursive_matches_duckdb(check, q):
    check(q, ordered=True)


def test_with_recursive_without_fixpoint_is_an_error(check, monkeypatch):
    monkeypatch.setattr(recursive_cte, "MAX_ITERATIONS", 20)
    with pytest.raises(SqlError, match="WITH RECURSIVE t: no fixpoint after 20 iterations"):
        check.con.sql("WITH RECURSIVE t(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM t) SELECT * FROM t").fetchall()


CORRELATED_QUERIES = [
    # scalar aggregates over no rows: count 0, sum NULL; NULL outer values match nothing
    "SELECT i, (SELECT count(*) FROM inner_t WHERE k = i), (SELECT sum(v) FROM inner_t WHERE k = i) FROM outer_t",
    "SELECT i, (SELECT count(v) FROM inner_t WHERE k > i), (SELECT min(w) FROM inner_t WHERE k <> i OR k IS NULL) "
    "FROM outer_t",
    "SELECT i, (SELECT i + 100), (SELECT coalesce(max(v), -1) FROM inner_t WHERE k = outer_t.i) FROM outer_t",
    "SELECT i, (SELECT v FROM inner_t WHERE k = i AND v > 15) FROM outer_t",
    "SELECT i, EXISTS (SELECT 1 FROM inner_t WHERE k = i), NOT EXISTS (SELECT * FROM inner_t WHERE k = i + 1) FROM outer_t",
    "SELECT i FROM outer_t WHERE g = 2 OR EXISTS (SELECT 1 FROM inner_t WHERE k = i AND v >= 20)",
    "SELECT g, count(*), (SELECT count(*) FROM inner_t WHERE k = g) FROM outer_t GROUP BY g",
    "SELECT g, sum(i) FROM outer_t GROUP BY g HAVING sum(i) > (SELECT count(*) FROM inner_t WHERE k = g)",
    "SELECT i, (SELECT count(DISTINCT w) FROM inner_t WHERE k IS NOT DISTINCT FROM i) FROM outer_t",
    "SELECT i, (SELECT max(k) FROM inner_t WHERE v > (SELECT min(v) FROM inner_t i2 WHERE i2.k = outer_t.i)) FROM outer_t",
    # IN / ANY / ALL with three-valued answers: NULL on either side, no rows
    "SELECT i, i IN (SELECT k FROM inner_t), i NOT IN (SELECT v / 10 FROM inner_t WHERE v < 35) FROM outer_t",
    "SELECT i, i = ANY (SELECT k FROM inner_t WHERE v = 10 * outer_t.i), g > ALL (SELECT k FROM inner_t WHERE k <> i) "
    "FROM outer_t",
    "SELECT i, i < ANY (SELECT i FROM outer_t), i >= ALL (SELECT i FROM outer_t o2 WHERE o2.i IS NOT NULL) FROM outer_t",
    "SELECT i FROM outer_t WHERE i NOT IN (SELECT k FROM inner_t WHERE v > 10 * outer_t.g)",
    # window functions and LIMIT / OFFSET per outer row
    "SELECT i, (SELECT row_number() OVER (ORDER BY v) FROM inner_t WHERE k = i AND v > 15), "
    "(SELECT sum(v) OVER (ORDER BY v) FROM inner_t WHERE v = 10 * i) FROM outer_t",
    "SELECT i, (SELECT v FROM inner_t WHERE k = i ORDER BY v DESC LIMIT 1), "
    "(SELECT w FROM inner_t WHERE k >= i ORDER BY v LIMIT 1 OFFSET 1), (SELECT max(v) FROM inner_t WHERE k < i LIMIT 3) "
    "FROM outer_t",
    # in ON: an inner join's as a WHERE; an outer join's joined onto the side it reads
    "SELECT i, k, v FROM outer_t LEFT JOIN inner_t ON k = i AND EXISTS (SELECT 1 FROM edges WHERE src = g)",
    "SELECT i, k, v FROM outer_t LEFT JOIN inner_t ON v > (SELECT count(*) FROM edges WHERE dst > k) * 10",
    "SELECT i, k FROM outer_t JOIN inner_t ON k <= i AND v >= (SELECT min(v) FROM inner_t i2 WHERE i2.k = i)",
    # a subquery in a group key and in an aggregate's argument
    "SELECT EXISTS (SELECT 1 FROM inner_t WHERE k = i) AS e, count(*), "
    "sum(CASE WHEN i IN (SELECT k FROM inner_t WHERE v > 15) THEN 1 ELSE 0 END) FROM outer_t GROUP BY e",
]


@pytest.mark.parametrize("q", CORRELATED_QUERIES)
def test_correlated_subqueries_outside_where_match_duckdb(check, q):
    check(q)


def test_correlated_subquery_refusals_name_the_construct(check):
    with pytest.raises(SqlError, match="More than one row returned by a subquery"):
        check.con.sql("SELECT i, (SELECT v FROM inner_t WHERE k = i) FROM outer_t").fetchall()
    with pytest.raises(NotSupportedError, match="subquery in a JOIN's ON clause that reads both sides"):
        check.con.sql("SELECT i FROM outer_t LEFT JOIN inner_t ON (SELECT count(*) FROM edges WHERE src = i AND dst = k) > 0").fetchall()
    with pytest.raises(NotSupportedError, match="correlated subquery that is a Union"):
        check.con.sql("SELECT (SELECT v FROM inner_t WHERE k = i UNION SELECT 1) FROM outer_t").fetchall()
    with pytest.raises(NotSupportedError, match="aggregate of outer columns"):
        check.con.sql("SELECT (SELECT sum(i) FROM inner_t) FROM outer_t GROUP BY i").fetchall()


def test_spread_and_boolean_aggregates_match_duckdb(check):
    # one value in a group: the sample statistics are NULL, the population ones 0; no values: NULL
    check("SELECT g, var_samp(v), var_pop(v), stddev(v), stddev_samp(v), stddev_pop(v), variance(v), bool_and(v > 15), "
          "bool_or(k IS NULL) FROM outer_t LEFT JOIN inner_t ON k = i GROUP BY g")
    with pytest.raises(NotSupportedError, match="window function stddev_pop"):
        check.con.sql("SELECT stddev_pop(v) OVER () FROM inner_t").fetchall()


def test_scalar_subquery_rows_setting(check):
    """SET scalar_subquery_error_on_multiple_rows = false: a scalar subquery with several rows
    gives one of them (the first in its order, uncorrelated) instead of the error."""
    con = check.con
    con.sql("SET scalar_subquery_error_on_multiple_rows = false")
    try:
        assert con.sql("SELECT (SELECT v FROM inner_t WHERE v IS NOT NULL ORDER BY v DESC)").fetchall() == [(40,)]
        got = con.sql("SELECT i, (SELECT v + 0 * k FROM inner_t WHERE k = i) FROM outer_t ORDER BY i").fetchall()
        assert got[0][0] == 1 and got[0][1] in (10, 20)
    finally:
        con.sql("RESET scalar_subquery_error_on_multiple_rows")
    with pytest.raises(SqlError, match="scalar subquery returned 5 rows"):
        con.sql("SELECT (SELECT v FROM inner_t)").fetchall()


@pytest.mark.parametrize("q", [
    "VALUES (1, 'a'), (NULL, 'b')",
    "SELECT id FROM words ORDER BY id LIMIT (SELECT count(*) FROM outer_t) - 2 OFFSET (SELECT min(k) FROM inner_t) + 1",
])
def test_values_statement_and_computed_limits_match_duckdb(check, q):
    check(q, ordered=True)


@pytest.mark.parametrize("q", [
    "SELECT id * 2 AS twice, twice + 1 AS more FROM words WHERE more > 8 ORDER BY id",  # aliases in WHERE, lateral
    "WITH c(x, y) AS (SELECT id, n FROM words) SELECT z, y FROM c t(z) ORDER BY z",  # a partial alias list on a CTE
])
def test_alias_binding_matches_duckdb(check, q):
    check(q, ordered=True)


def test_view_column_names_and_limit_refusal(check):
    con = check.con
    con.sql("CREATE VIEW named_pairs(x1, x2) AS VALUES (2, 1), (1, 1)")
    assert con.sql("SELECT x2, x1 FROM named_pairs ORDER BY x1").fetchall() == [(1, 1), (1, 2)]
    with pytest.raises(NotSupportedError, match="LIMIT must be an integer literal or a constant expression"):
        con.sql("SELECT id FROM words LIMIT n").fetchall()
