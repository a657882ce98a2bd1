"""benchmarks/stream_nexmark.py runs on CPU at a small size and writes
consistent JSON (the benchmark itself is run on the device, not here)."""

import importlib.util
import json
from pathlib import Path

import pytest

from opforge.stream.nexmark import NexmarkConfig, generate

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_nexmark.py"
QUERIES = ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_stream_nexmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_and_its_json_is_consistent(bench, tmp_path):
    path = tmp_path / "nexmark.json"
    events = 3000
    out = bench.main(["--events", str(events), "--device", "cpu", "--batch-size", "700", "--no-warmup",
                      "--json", str(path)])
    assert json.loads(path.read_text()) == out
    assert {"schema_version", "benchmark", "date", "device", "gpu", "torch", "events", "batch_size",
            "entries"} <= set(out)
    assert out["device"] == "cpu" and out["gpu"] is None and out["events"] == events
    entries = {(e["query"], e["feed"]): e for e in out["entries"]}
    assert sorted(entries) == sorted((q, f) for q in QUERIES for f in ("device", "host"))
    config = NexmarkConfig(events=events)
    count = {k: len(generate(config, k, 0, events, "cpu")) for k in ("person", "auction", "bid")}
    reads = {"q3": count["person"] + count["auction"], "q8": count["person"] + count["auction"],
             "q4": count["auction"] + count["bid"]}
    for (q, feed), e in entries.items():
        assert set(e) == {"query", "feed", "events", "input_records", "output_records", "seconds",
                          "events_per_s", "batches", "ms_per_batch", "host_cpu_ms_per_batch", "latency_ms"}
        assert e["events"] == events and e["seconds"] > 0
        # one source batch per 700 events of each source the query reads
        per_source = -(-events // 700)
        assert e["batches"] == per_source * (2 if q in reads else 1), (q, feed)
        assert e["ms_per_batch"] == pytest.approx(e["seconds"] * 1000 / e["batches"], rel=1e-3, abs=1e-3)
        assert e["host_cpu_ms_per_batch"] > 0
        assert e["events_per_s"] == pytest.approx(events / e["seconds"], rel=1e-3)
        assert e["input_records"] == reads.get(q, count["bid"]), (q, feed)
        lat = e["latency_ms"]
        if e["output_records"]:
            assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]
        else:
            assert lat == {"p50": None, "p99": None, "max": None}
        # both feeds carry the same events: the same results
        other = entries[(q, "host" if feed == "device" else "device")]
        assert e["output_records"] == other["output_records"]
    assert entries[("q0", "device")]["output_records"] == count["bid"]
    assert entries[("q7", "host")]["output_records"] >= 1


def test_tumble_count_job_and_its_result_checksum(bench):
    """The opforge side of the Bytewax comparison: bids per auction and 10 s
    tumbling window, its (results, total, checksum) against plain Python."""
    events = 4000
    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)
    e = bench.run_one("tumble_count", "device", config, "cpu", 512, keep=True)
    bids = generate(config, "bid", 0, events, "cpu").records()
    counts = {}
    for b in bids:
        w = b["date_time"] - b["date_time"] % bench.TUMBLE_MS
        counts[(b["auction"], w)] = counts.get((b["auction"], w), 0) + 1
    want = bench._checksum((k, w, c) for (k, w), c in counts.items())
    assert (e["result"]["results"], e["result"]["total"], e["result"]["checksum"]) == want
    assert want[1] == len(bids) and e["output_records"] == want[0]


def test_bytewax_peer_gives_the_same_counts(bench, tmp_path):
    """Runs when ``OPFORGE_BYTEWAX_PYTHON`` names a Python with bytewax 0.21
    (e.g. a venv: ``python3.11 -m venv V && V/bin/pip install bytewax==0.21.1``):
    the run raises if Bytewax's counts differ from opforge's."""
    import os

    py = os.environ.get("OPFORGE_BYTEWAX_PYTHON") or bench.bytewax_python(None)
    if not py:
        pytest.skip("no Python with bytewax (set OPFORGE_BYTEWAX_PYTHON)")
    out = bench.main(["--events", "20000", "--device", "cpu", "--batch-size", "4096", "--no-warmup",
                      "--queries", "q1,tumble_count", "--feeds", "device", "--peers", "bytewax",
                      "--bytewax-python", py, "--bytewax-batch", "1000"])
    peers = {p["query"]: p for p in out["peer_entries"]}
    assert set(peers) == {"q1", "tumble_count"}
    for e in out["entries"]:
        assert e["result"] == peers[e["query"]]["result"]
        assert e["peers"]["bytewax"]["ratio"] > 0
    assert peers["tumble_count"]["result"]["total"] == peers["q1"]["result"]["results"]
