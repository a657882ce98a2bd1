"""``benchmarks/sql_out_of_core.py`` in slices, as the device calls run it at SF100: DuckDB's answers
cached by one call, opforge checked against them by another (in its worker process), a rerun
skipping what is done, and the summary merging the calls' rows (CPU, SF 0.01: no timing claim)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "sql_out_of_core.py"


def _bench(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(BENCH.parents[1] / "src"),
               OPFORGE_INTERPRET="0", TRITON_INTERPRET="0")  # a plain CPU run, as on a machine without a GPU
    return subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, env=env, timeout=300)


def test_split_calls_compose_into_one_summary(tpch_paths, tmp_path, capsys):
    root = tmp_path / "tpch"  # the session's files without DuckDB's answers (other tests cache them)
    shutil.copytree(tpch_paths["region"].parent, root / "sf0.01", ignore=shutil.ignore_patterns("answers"))
    out = tmp_path / "rows.jsonl"
    common = ["--sf", "0.01", "--device", "cpu", "--budget", "256KiB", "--repeats", "1", "--root", str(root),
              "--out", str(out)]
    duck = _bench(*common, "--duckdb-only", "--queries", "6,14")
    assert duck.returncode == 0, duck.stdout + duck.stderr
    ours = _bench(*common, "--skip-duckdb", "--queries", "6,14,1")
    assert ours.returncode == 0, ours.stdout + ours.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["query"], r["answer"]) for r in rows][:2] == [(6, "duckdb only"), (14, "duckdb only")]
    by_query = {r["query"]: r["answer"] for r in rows[2:]}
    assert by_query[6] == by_query[14] == "ok" and by_query[1].startswith("unchecked"), by_query

    again = _bench(*common, "--skip-duckdb", "--queries", "6,14")  # done: nothing runs, nothing appended
    assert again.returncode == 0 and "skipped" in again.stdout and "appended 0 rows" in again.stdout, again.stdout
    assert len(out.read_text().splitlines()) == len(rows)

    spec = importlib.util.spec_from_file_location("sql_out_of_core_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.summary(out, [6, 14], 0.01) == 0
    printed = capsys.readouterr().out
    assert "total over 2 correct queries" in printed and "2 of 2 queries correct" in printed
    assert bench.summary(out, [1, 6, 14], 0.01) == 1  # q01 has opforge's run but no DuckDB answer
