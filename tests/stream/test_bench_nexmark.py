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
                          "events_per_s", "latency_ms"}
        assert e["events"] == events and e["seconds"] > 0
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
