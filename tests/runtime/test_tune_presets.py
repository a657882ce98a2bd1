"""``opforge tune --preset sql`` / ``--preset stream`` at a tiny scale on the CPU
(the Triton kernels under the interpreter): the engines' own workloads run in
mode ``on``, the buckets they launch are tuned into the cache, and the same
workload afterwards, in the default mode, runs the tuned configs without
benchmarking anything (issue 23)."""

from __future__ import annotations

import pytest

from opforge import cli
from opforge.runtime import autotune, cache, dispatch, timing


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_AUTOTUNE", raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    dispatch.reset()
    return cache.autotune_cache()


def _no_benchmarking(monkeypatch):
    def fail(*a, **k):
        pytest.fail("benchmarked in the default mode")

    monkeypatch.setattr(autotune, "measure_configs", fail)
    monkeypatch.setattr(timing, "bench", fail)


def _tuned_decisions(op: str) -> list:
    return [d for d in dispatch._memo.values() if d.op.name == op and d.source == "tuned"]


def test_sql_preset_tunes_what_tpch_launches(fresh_cache, capsys, monkeypatch):
    from opforge.sql.tpch import data

    try:
        data.tpchgen_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert cli.main(["tune", "--preset", "sql", "--sf", "0.001", "--queries", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    entries = fresh_cache.entries()
    assert entries and {e.key.op for e in entries} >= {"opforge::segment_reduce"}
    assert f"sql: {len(entries)} entries tuned for" in out and "segment_reduce" in out
    assert autotune.mode() == "cached"  # the preset's mode did not leak

    import opforge.sql as sql
    from opforge.sql.tpch import queries, runner

    _no_benchmarking(monkeypatch)
    dispatch.reset()
    con = sql.connect("cpu")
    runner.register_tables(con, data.generate(0.001))
    assert con.sql(queries.query(6)).to_arrow().num_rows == 1
    assert _tuned_decisions("segment_reduce")  # the query ran the configs the preset tuned
    assert len(fresh_cache.entries()) == len(entries)


def test_stream_preset_tunes_what_nexmark_launches(fresh_cache, capsys, monkeypatch):
    argv = ["tune", "--preset", "stream", "--events", "3000", "--batch-size", "1000", "--queries", "q1",
            "--device", "cpu"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    entries = fresh_cache.entries()
    assert "opforge::nexmark_events" in {e.key.op for e in entries}
    assert f"stream: {len(entries)} entries tuned for" in out and "nexmark_events" in out

    _no_benchmarking(monkeypatch)
    dispatch.reset()
    assert cli.main(argv) == 0  # the buckets are tuned already: nothing is measured again
    assert "stream: 0 entries tuned" in capsys.readouterr().out


def test_stream_preset_names_an_unknown_query(fresh_cache, capsys):
    assert cli.main(["tune", "--preset", "stream", "--queries", "q99", "--device", "cpu"]) == 1
    assert "q99" in capsys.readouterr().err
