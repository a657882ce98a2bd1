"""The benchmark runner and script, driven by a stand-in engine (DuckDB behind the opforge.sql
connection API) so that they are tested before the engine exists."""

import importlib.util
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from opforge.sql.tpch import runner

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "tpch.py"


def _load_script():
    """benchmarks/tpch.py as a fresh module (it is a script, not on the import path)."""
    spec = importlib.util.spec_from_file_location("tpch_benchmark_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


class _Result:
    def __init__(self, table):
        self.table = table

    def to_arrow(self):
        return self.table


class StandIn:
    """opforge.sql's API (register / sql(...).to_arrow()) over DuckDB, optionally sabotaged."""

    def __init__(self, sabotage=None):
        self.con = duckdb.connect()
        self.sabotage = sabotage or (lambda text, table: table)

    def register(self, name, path):
        self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")

    def sql(self, text):
        return _Result(self.sabotage(text, self.con.sql(text).to_arrow_table()))


def test_a_correct_engine_matches_on_all_22(tpch_root, tpch_paths):
    result = runner.run_tpch(StandIn(), 0.01, root=tpch_root, repeats=1, warmup=1)
    records = result["queries"]
    assert [r.query for r in records] == [f"q{n:02d}" for n in range(1, 23)]
    assert all(r.match and not r.diffs and r.error is None for r in records), [r.diffs for r in records]
    assert all(len(r.opforge_ms) == 1 and len(r.duckdb_ms) == 1 and r.speedup > 0 for r in records)
    # the stand-in answers inside sql(): its "planning" is the whole run, never more
    assert all(len(r.opforge_plan_ms) == 1 and 0 < r.opforge_plan_ms[0] <= r.opforge_ms[0] for r in records)
    assert result["total"]["queries_run"] == 22 and result["total"]["queries_matching"] == 22
    assert 0 < result["total"]["opforge_plan_ms"] <= result["total"]["opforge_ms"]
    assert result["load"]["opforge_s"] > 0 and result["load"]["duckdb_s"] > 0
    assert json.loads(json.dumps([r.to_json() for r in records]))[0]["query"] == "q01"


def test_wrong_answers_and_errors_are_recorded(tpch_root, tpch_paths):
    class NotSupportedError(ValueError):
        pass

    def sabotage(text, table):
        if "'%green%'" in text:  # Q9: drop a row
            return table.slice(0, table.num_rows - 1)
        if "'%BRASS'" in text:  # Q2: unsupported
            raise NotSupportedError("correlated scalar subquery")
        if "avg_qty" in text:  # Q1: avg in float32
            i = table.column_names.index("avg_qty")
            return table.set_column(i, "avg_qty", table.column(i).cast(pa.float32()))
        return table

    result = runner.run_tpch(StandIn(sabotage), 0.01, root=tpch_root, numbers=(1, 2, 6, 9), repeats=1, warmup=0)
    by = {r.query: r for r in result["queries"]}
    assert by["q01"].match is False and "type" in by["q01"].diffs[0]
    assert by["q02"].error == "NotSupportedError: correlated scalar subquery" and by["q02"].opforge_ms == []
    assert by["q02"].duckdb_ms and by["q02"].match is None
    assert by["q06"].match is True
    assert by["q09"].match is False and any("row count" in d for d in by["q09"].diffs)
    assert result["total"]["queries_run"] == 3 and result["total"]["queries_matching"] == 1


def test_time_query_counts_warmup_and_repeats():
    calls = []
    times, last = runner.time_query(lambda: calls.append(1) or len(calls), repeats=3, warmup=2)
    assert len(times) == 3 and len(calls) == 5 and last == 5 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        runner.time_query(lambda: None, repeats=0, warmup=0)


def test_benchmark_script_writes_json_and_chart(tpch_root, tpch_paths, tmp_path):
    script = _load_script()
    out = tmp_path / "tpch.json"
    argv = ["--sf", "0.01", "--device", "cpu", "--repeats", "1", "--queries", "1,q06", "--data-dir", str(tpch_root),
            "--out", str(out), "--duckdb-threads", "1"]
    script.main(argv, connect=lambda device: StandIn())
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["scale_factor"] == 0.01 and doc["device"] == "cpu"
    assert [q["query"] for q in doc["queries"]] == ["q01", "q06"] and all(q["match"] for q in doc["queries"])
    assert {"torch", "triton", "duckdb", "driver", "gpu", "load", "total"} <= set(doc)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="1..22"):
        script.parse_queries("0,1")


def test_benchmark_script_analyze_with_the_engine(tpch_root, tpch_paths, tmp_path):
    script = _load_script()
    out = tmp_path / "tpch.json"
    argv = ["--sf", "0.01", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--queries", "3", "--data-dir",
            str(tpch_root), "--out", str(out), "--duckdb-threads", "1", "--no-plot", "--analyze",
            "--memory-budget", "20000", "--join-algorithm", "hash"]
    script.main(argv)
    q = json.loads(out.read_text())["queries"][0]
    assert q["match"] and q["analyze_total_ms"] > 0
    ops = q["operators"]
    assert ops[0]["actual_rows"] == q["rows"] and any("radix-partitioned" in o["notes"] for o in ops)
    assert any("opforge::hash_join" in o["kernels"] for o in ops)
