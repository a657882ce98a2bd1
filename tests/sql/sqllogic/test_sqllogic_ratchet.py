"""DuckDB's sqllogictest files as a peer suite with a ratchet: the records passed must not drop below
``ratchet.json``. The files live outside the repository (``shared/peer-tests/duckdb-sqllogictest``,
see its SOURCE.md; $OPFORGE_PEER_TESTS overrides the place): where they are absent, as on a clean
clone, the test skips and says so. The runner runs in a subprocess (its per-file timeout uses
SIGALRM, which pytest-timeout also uses) and writes the per-file report to
``sqllogic-report.json`` in pytest's temporary folder."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import runner  # noqa: E402
from records import parse_file  # noqa: E402

RATCHET = os.path.join(HERE, "ratchet.json")
UPDATE = ("PYTHONPATH=src python tests/sql/sqllogic/runner.py --json /tmp/sqllogic.json, "
          "then put its passed count in tests/sql/sqllogic/ratchet.json")

needs_peer_files = pytest.mark.skipif(
    runner.PEER_DIR is None or not os.path.isdir(runner.PEER_DIR),
    reason="DuckDB's sqllogictest files are not here: they live in shared/peer-tests/duckdb-sqllogictest "
           "next to the checkout (not in the repository); set OPFORGE_PEER_TESTS to their folder")


def test_values_compare_as_sqllogictest_does():
    assert runner.values_match("1.0", "1")
    assert runner.values_match("0.3333333333333333", "0.333333")
    assert not runner.values_match("0.34", "0.3")
    assert runner.values_match("true", "1") and not runner.values_match("false", "1")
    assert runner.values_match("false", "False") and not runner.values_match("1", "abc")
    assert not runner.values_match("NULL", "0")
    assert runner.value_text("") == "(empty)" and runner.value_text(None) == "NULL"


def test_records_parse_loops_and_skips(tmp_path):
    f = tmp_path / "t.test"
    f.write_text("statement ok\nCREATE TABLE t(i INTEGER)\n\nloop i 0 2\n\nstatement ok\nINSERT INTO t VALUES ({i})\n\n"
                 "endloop\n\nonlyif duckdb\nquery I\nSELECT 1\n----\n1\n\n"
                 "query I rowsort\nSELECT i FROM t\n----\n0\n1\n")
    recs = parse_file(str(f))
    assert [r.sql for r in recs[1:3]] == ["INSERT INTO t VALUES (0)", "INSERT INTO t VALUES (1)"]
    assert recs[3].skip == "onlyif duckdb" and recs[4].sort == "rowsort" and recs[4].results == ["0", "1"]
    res = runner.run_file(str(f), timeout=None)
    assert (res["total"], res["passed"]) == (5, 4)


@needs_peer_files
def test_peer_suite_does_not_regress(tmp_path):
    report = tmp_path / "sqllogic-report.json"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "runner.py"), "--json", str(report),
                           "--dir", runner.PEER_DIR], capture_output=True, text=True, timeout=540,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(report.read_text())["summary"]
    with open(RATCHET) as f:
        ratchet = json.load(f)
    print(proc.stdout[-3000:])
    assert summary["records"] == ratchet["records"], "the peer files changed: re-record the ratchet: " + UPDATE
    assert summary["passed"] >= ratchet["passed"], (
        f"sqllogictest: {summary['passed']} records pass, fewer than the {ratchet['passed']} recorded")
    if summary["passed"] > ratchet["passed"]:
        print(f"sqllogictest: {summary['passed']} records pass, more than the {ratchet['passed']} recorded: "
              f"raise the ratchet: {UPDATE}")
