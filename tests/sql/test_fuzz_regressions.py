"""The differential fuzzer (``opforge.sql.fuzz``, issue 24) in CI: a seeded run of a few hundred
random queries over the fuzz tables (the NULL-bearing TPC-H slice), each answered by opforge.sql
and DuckDB, and every mismatch or crash a run found, as a fixed query. Longer runs:
``python -m opforge.sql.fuzz --queries 10000 --seed S``. Queries run inside the tests (the module
fixture only connects), so tests/sql/conftest.py's reference hash ops apply to them."""

import os
from pathlib import Path

import pytest

from opforge.sql.fuzz import Differ, grammar, tables

QUERIES = 150
SEED = 0


@pytest.fixture(scope="module")
def differ():
    from opforge.sql.tpch import data

    return Differ(tables.build(data.generate(0.01, Path(os.environ["OPFORGE_CACHE_DIR"]) / "tpch")))


def test_fuzz_seeded_run_equals_duckdb(differ):
    summary = differ.run(QUERIES, SEED)
    assert not summary.failures, "\n\n".join(o.report() for o in summary.failures)
    counts = summary.counts
    assert counts["invalid"] == 0, [o.report() for o in summary.outcomes if o.kind == "invalid"][:5]
    # refusals are allowed, but the run must compare answers for most queries to mean anything
    assert counts["match"] >= 0.75 * QUERIES, (counts, summary.refusal_reasons().most_common(5))


def _check(differ, sql: str, ordered: bool = False, columns: tuple[str, ...] = ()):
    outcome = differ.check(0, grammar.Query(sql, ordered, list(columns)))
    assert outcome.kind == "match", outcome.report()


def test_union_of_a_string_window_min_with_all_null_rows(differ):
    """Seed 2, query 632: min(varchar) OVER (...) gives NULL rows whose codes are past the
    dictionary; UNION re-codes both sides to one dictionary and indexed with those codes."""
    _check(differ, "SELECT (t0.s_nationkey IS NULL) AS c0, min(t0.s_name) OVER (ORDER BY t1.c_custkey DESC, "
                   "t1.c_mktsegment ASC) AS c1 FROM supplier t0 FULL JOIN customer t1 ON t0.s_nationkey = "
                   "t1.c_nationkey UNION SELECT (t0.s_nationkey IS NULL) AS c0, min(t0.s_name) OVER (ORDER BY "
                   "t1.c_custkey DESC, t1.c_mktsegment ASC) AS c1 FROM supplier t0 FULL JOIN customer t1 ON "
                   "t0.s_nationkey = t1.c_nationkey WHERE t0.s_suppkey > 1000")


@pytest.mark.parametrize("window", ["rank() OVER (ORDER BY sum(t0.n_nationkey))", "sum(sum(t0.n_nationkey)) OVER ()"])
def test_window_over_grouping_sets_equals_duckdb(differ, window):
    """Found beside the fuzzer (TPC-DS q70 / q86 have this shape): the select block of a GROUP BY
    ROLLUP was bound once per grouping set, so a window function saw one set's rows (rank 1 for
    the grand total; a sum over half the rows); then refused. Windows now run over the union of
    the sets."""
    sql = f"SELECT t0.n_regionkey AS c0, sum(t0.n_nationkey) AS c1, {window} AS c2 FROM nation t0 " \
          "GROUP BY ROLLUP (t0.n_regionkey)"
    outcome = differ.check(0, grammar.Query(sql, False, []))
    assert outcome.kind == "match", outcome.report()


def test_unaliased_count_star_is_named_as_duckdb_names_it(differ):
    """Found by the TPC-DS comparison (q38, q87, q96): DuckDB names an unaliased count(*)
    ``count_star()``; opforge named it ``COUNT(*)``."""
    sql = "SELECT count(*), t0.n_regionkey FROM nation t0 GROUP BY t0.n_regionkey"
    ours = differ.con.sql(sql).to_arrow().column_names
    assert ours == differ.duck.sql(sql).columns == ["count_star()", "n_regionkey"]
