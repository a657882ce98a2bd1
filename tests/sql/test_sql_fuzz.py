"""The differential fuzzer in CI (issue 24): a seeded run of a few hundred random queries over the
NULL-bearing TPC-H slice, each answered by opforge.sql and DuckDB; any mismatch or crash fails with
the query and both answers. Longer runs: ``python -m opforge.sql.fuzz --queries 10000 --seed S``.
The run is inside the test (not a module fixture), so tests/sql/conftest.py's reference hash ops
apply to it."""

import os
from pathlib import Path

from opforge.sql import fuzz

QUERIES = 200
SEED = 0


def test_fuzz_seeded_run_equals_duckdb():
    from opforge.sql.tpch import data

    summary = fuzz.run(data.generate(0.01, Path(os.environ["OPFORGE_CACHE_DIR"]) / "tpch"), QUERIES, SEED)
    assert not summary.failures, "\n\n".join(o.report() for o in summary.failures)
    counts = summary.counts
    assert counts["invalid"] == 0, [o.report() for o in summary.outcomes if o.kind == "invalid"][:5]
    # refusals are allowed, but the run must compare answers for most queries to mean anything
    assert counts["match"] >= 0.75 * QUERIES, (counts, summary.refusal_reasons().most_common(5))
