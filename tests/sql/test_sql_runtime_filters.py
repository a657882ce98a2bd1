"""Runtime filters in the probe-side scan and partition pruning: a star-schema query with selective
dimension filters reads far fewer fact rows with ``runtime_filters=True`` than without and gives
the same answer (and DuckDB's); scans of partitioned tables (lists of Arrow tables, Parquet row
groups) skip the partitions that filters and runtime filters exclude; filters go only where they
are legal (outer, anti, aggregate, projection cases against DuckDB)."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import opforge.sql as sql
from sql_reference import SqlCheck

DAYS, PARTS, ROWS = 20 * 365, 40, 120_000


def _tables():
    rng = np.random.default_rng(5)
    fact = pa.table({"f_date": pa.array(np.sort(rng.integers(0, DAYS, ROWS)), pa.int32()),  # clustered by date
                     "f_prod": pa.array(rng.integers(0, 2000, ROWS), pa.int64()),
                     "f_amount": pa.array(rng.integers(1, 1000, ROWS), pa.int64())})
    date = pa.table({"d_datekey": pa.array(np.arange(DAYS), pa.int32()),
                     "d_year": pa.array(2000 + np.arange(DAYS) // 365, pa.int32())})
    prod = pa.table({"p_key": pa.array(np.arange(2000), pa.int64()),
                     "p_cat": pa.array(np.arange(2000) % 50, pa.int32())})
    return fact, date, prod


def _parts(t, n):
    step = -(-t.num_rows // n)
    return [t.slice(i, step) for i in range(0, t.num_rows, step)]


@pytest.fixture(scope="module")
def check():
    fact, date, prod = _tables()
    c = SqlCheck({"fact": fact, "date": date, "prod": prod})
    c.con.register("fact", _parts(fact, PARTS))  # opforge: 40 partitions; DuckDB: one table
    return c


STAR = ("SELECT p_cat, count(*) AS n, sum(f_amount) AS s FROM fact JOIN date ON f_date = d_datekey "
        "JOIN prod ON f_prod = p_key WHERE d_year = 2003 AND p_cat < 5 GROUP BY p_cat")


def _fact_scan(con, q):
    [s] = [s for s in con.sql(q).analyze().stats if s.describe.startswith("Scan fact")]
    return s


def test_star_query_reads_ten_times_fewer_fact_rows_with_runtime_filters(check):
    on = check(STAR)
    off = sql.connect("cpu", runtime_filters=False)
    for name in ("date", "prod"):
        off.register(name, check.con._tables[name].to_arrow())
    off.register("fact", _parts(check.con._tables["fact"].to_arrow(), PARTS))
    assert off.sql(STAR).to_arrow().sort_by("p_cat").equals(on.sort_by("p_cat"))
    with_f, without = _fact_scan(check.con, STAR), _fact_scan(off, STAR)
    assert without.metrics["rows_read"] == ROWS and without.actual_rows == ROWS
    assert without.metrics["partitions_skipped"] == 0
    # the year's date keys skip whole partitions (min / max), the category's IN-list drops rows
    assert with_f.metrics["rows_read"] * 10 <= without.metrics["rows_read"], with_f.metrics
    assert with_f.actual_rows * 10 <= with_f.metrics["rows_read"]
    assert with_f.metrics["partitions_skipped"] >= PARTS - 4
    assert with_f.metrics["rows_skipped"] == ROWS - with_f.metrics["rows_read"]
    text = check.con.sql(STAR).explain(analyze=True)
    assert "by runtime filters); rows read" in text and "runtime filters dropped" in text
    assert "IN-list of 365 from join on f_date" in text and "IN-list of 200 from join on f_prod" in text


def test_bloom_filter_for_large_builds():
    """More than IN_LIST_MAX build keys: a blocked Bloom filter (no false negatives: same count)."""
    con = sql.connect("cpu")
    rng = np.random.default_rng(1)
    big = pa.table({"k": pa.array(rng.choice(10 ** 6, 5000, replace=False), pa.int64())})
    probe = pa.table({"pk": pa.array(rng.integers(0, 10 ** 6, 50_000), pa.int64())})
    con.register("big", big).register("probe", probe)
    text = con.sql("SELECT count(*) FROM probe JOIN big ON pk = k").explain(analyze=True)
    assert "blocked Bloom" in text
    got = con.sql("SELECT count(*) FROM probe JOIN big ON pk = k").fetchall()[0][0]
    assert got == int(np.isin(probe["pk"].to_numpy(), big["k"].to_numpy()).sum())


def test_filters_prune_partitions_of_arrow_and_parquet_tables(check, tmp_path):
    q = "SELECT count(*) AS n, sum(f_amount) AS s FROM fact WHERE f_date >= 400 AND f_date < 700"
    check(q)
    s = _fact_scan(check.con, q)
    assert s.metrics["partitions"] == PARTS and s.metrics["partitions_skipped"] >= PARTS - 3
    assert s.metrics["rows_read"] <= 3 * ROWS // PARTS
    path = tmp_path / "fact.parquet"
    pq.write_table(check.con._tables["fact"].to_arrow(), path, row_group_size=ROWS // 20)
    con = sql.connect("cpu")
    con.register("fact", str(path))
    assert con._tables["fact"].num_partitions == 20
    assert con.sql(q).fetchall() == check.con.sql(q).fetchall()
    p = _fact_scan(con, q)
    assert p.metrics["partitions"] == 20 and p.metrics["partitions_skipped"] >= 17
    assert "partitions: read" in " ".join(p.notes)


@pytest.mark.parametrize("q", [
    # the NULL-padded side of an outer join takes no filter; the preserved side only what is legal
    "SELECT d_year, count(*) AS n, count(d_datekey) AS m FROM fact LEFT JOIN "
    "(SELECT * FROM date WHERE d_year = 2003) d ON f_date = d_datekey GROUP BY d_year",
    "SELECT count(*) AS n, count(f_amount) AS m FROM fact RIGHT JOIN date ON f_date = d_datekey WHERE d_year = 2001",
    "SELECT count(*) AS n FROM fact FULL JOIN (SELECT * FROM date WHERE d_year = 2001) d ON f_date = d_datekey",
    # semi / anti / NOT IN
    "SELECT count(*) AS n, sum(f_amount) AS s FROM fact WHERE f_prod IN (SELECT p_key FROM prod WHERE p_cat = 3)",
    "SELECT count(*) AS n FROM fact WHERE f_prod NOT IN (SELECT p_key FROM prod WHERE p_cat > 2)",
    "SELECT count(*) AS n FROM fact WHERE NOT EXISTS (SELECT * FROM prod WHERE p_key = f_prod AND p_cat < 40)",
    # through an aggregate's group key, a projection, and not through an expression
    "SELECT g.f_prod, g.s FROM (SELECT f_prod, sum(f_amount) AS s FROM fact GROUP BY f_prod) g "
    "JOIN prod ON g.f_prod = p_key WHERE p_cat = 7",
    "SELECT x.k, x.a, d_year FROM (SELECT f_date AS k, f_amount AS a FROM fact) x JOIN date ON x.k = d_datekey "
    "WHERE d_year = 2019 AND x.a > 990",
    "SELECT count(*) AS n FROM (SELECT f_date + 1 AS k FROM fact) x JOIN date ON x.k = d_datekey WHERE d_year = 2005",
    # a LIMIT below the join keeps its rows
    "SELECT count(*) AS n FROM (SELECT * FROM fact ORDER BY f_amount DESC, f_prod, f_date LIMIT 500) f "
    "JOIN date ON f_date = d_datekey WHERE d_year = 2010",
    # filters across the key equality of an inner join below
    "SELECT p_cat, count(*) AS n FROM fact f1 JOIN prod ON f1.f_prod = p_key JOIN date ON f_date = d_datekey "
    "WHERE d_year = 2002 AND p_cat IN (1, 2) GROUP BY p_cat",
])
def test_runtime_filters_keep_the_answer(check, q):
    check(q)


@pytest.mark.parametrize("q", [
    # left join: the left side's keys filter the right side, through its aggregate's group key
    "SELECT p_key, s FROM prod LEFT JOIN (SELECT f_prod, sum(f_amount) AS s FROM fact GROUP BY f_prod) g "
    "ON p_key = g.f_prod WHERE p_cat = 7",
    # two key pairs: the filter tests the first usable one
    "SELECT p_key, g.s FROM (SELECT p_key, p_cat * 10 AS day FROM prod WHERE p_cat < 2) p LEFT JOIN "
    "(SELECT f_prod, f_date, sum(f_amount) AS s FROM fact GROUP BY f_prod, f_date) g ON p_key = g.f_prod AND day = g.f_date",
    # anti join (NOT EXISTS): the right side may drop rows no left row meets
    "SELECT count(*) AS n FROM prod WHERE p_cat = 3 AND NOT EXISTS (SELECT * FROM fact WHERE f_prod = p_key AND f_date < 300)",
])
def test_left_and_anti_joins_filter_their_right_side(check, q):
    check(q)
    [s] = [s for s in check.con.sql(q).analyze().stats if s.describe.startswith("Scan fact")]
    assert "from join on f_prod" in " ".join(s.notes)
    assert s.actual_rows * 10 <= s.metrics["rows_read"]  # p_cat picks 1 in 50 products


@pytest.mark.parametrize("q", [
    # UNION ALL of a table and itself, as TPC-DS q05 unions each channel's sales and returns
    "SELECT d_year, count(*) AS n, sum(a) AS s FROM (SELECT f_date AS k, f_amount AS a FROM fact UNION ALL "
    "SELECT f_date AS k, -f_amount AS a FROM fact WHERE f_prod < 100) u JOIN date ON u.k = d_datekey "
    "WHERE d_year = 2004 GROUP BY d_year",
    # UNION (distinct), the key at another position of each input
    "SELECT count(*) AS n, sum(a) AS s FROM (SELECT f_amount AS a, f_date AS k FROM fact UNION "
    "SELECT f_prod AS a, f_date AS k FROM fact) u JOIN date ON u.k = d_datekey WHERE d_year = 2004",
])
def test_filters_reach_each_input_of_a_union(check, q):
    check(q)
    scans = [s for s in check.con.sql(q).analyze().stats if s.describe.startswith("Scan fact")]
    assert len(scans) == 2
    for s in scans:
        assert "from join on" in " ".join(s.notes), s.notes
        assert s.actual_rows * 10 <= ROWS  # one year of 20


def test_not_in_leaves_its_right_side_whole(check):
    """NOT IN is null-aware: a NULL on the right empties the answer, so no filter may drop right rows."""
    q = "SELECT count(*) AS n FROM prod WHERE p_cat = 3 AND p_key NOT IN (SELECT f_prod FROM fact)"
    check(q)
    [s] = [s for s in check.con.sql(q).analyze().stats if s.describe.startswith("Scan fact")]
    assert "from join on" not in " ".join(s.notes) and s.actual_rows == ROWS


def test_partitioned_registration_and_ranges():
    a = pa.table({"k": pa.array([5, 1, None], pa.int64()), "s": pa.array(["x", "y", "z"])})
    b = pa.table({"k": pa.array([None, None], pa.int64()), "s": pa.array(["u", "v"])})
    con = sql.connect("cpu")
    con.register("t", [a, b.to_batches()[0], a])
    t = con._tables["t"]
    assert t.bounds == [0, 3, 5, 8] and t.num_partitions == 3
    lo, hi = t.partition_range("k")
    assert lo[0] == 1 and hi[0] == 5 and lo[1] > hi[1]  # all-NULL partition: an empty range
    assert con.sql("SELECT count(*) FROM t WHERE k >= 1").fetchall() == [(4,)]
    assert _fact_scan_named(con, "SELECT count(*) FROM t WHERE k >= 1", "t").metrics["partitions_skipped"] == 1
    with pytest.raises(sql.SqlError, match="schemas differ"):
        con.register("bad", [a, pa.table({"k": pa.array([1.5])})])
    with pytest.raises(sql.SqlError, match="partition_key"):
        con.register("bad", a, partition_key="nope")


def _fact_scan_named(con, q, table):
    [s] = [s for s in con.sql(q).analyze().stats if s.describe.startswith(f"Scan {table}")]
    return s
