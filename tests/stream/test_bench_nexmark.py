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
                          "events_per_s", "batches", "ms_per_batch", "host_cpu_ms_per_batch", "latency_ms",
                          "sink", "load"}
        assert e["sink"] == "plain" and e["load"] is None
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


def test_peer_on_a_prefix_checks_opforge_at_the_peer_size(bench, monkeypatch):
    """``--peer-events``: the peer runs the first N events; opforge's counts at N are checked against it,
    and the ratio divides the full run's events/s by the peer's. The peer here is a plain-Python count
    (the module's Bytewax child needs bytewax); a wrong answer from it fails the run."""
    def python_peer(job, config, python, batch, workdir, wrong=False):
        bids = generate(config, "bid", 0, config.events, "cpu").records()
        counts = {}
        for b in bids:
            w = b["date_time"] - b["date_time"] % bench.TUMBLE_MS
            counts[(b["auction"], w)] = counts.get((b["auction"], w), 0) + 1
        result = bench._checksum((k, w, c + wrong) for (k, w), c in counts.items())
        return {"peer": "bytewax", "query": job, "events": config.events, "input_records": len(bids),
                "batch_size": batch, "seconds": 1.0, "events_per_s": float(config.events),
                "result": {"results": result[0], "total": result[1], "checksum": result[2]}}

    monkeypatch.setattr(bench, "bytewax_python", lambda explicit: "python")
    monkeypatch.setattr(bench, "run_bytewax", python_peer)
    args = ["--events", "6000", "--device", "cpu", "--batch-size", "1024", "--no-warmup", "--queries",
            "tumble_count", "--feeds", "device,host", "--peers", "bytewax", "--peer-events", "2500"]
    out = bench.main(args)
    assert [p["events"] for p in out["peer_entries"]] == [2500]
    for e in out["entries"]:
        assert "result" not in e  # the full run does not keep its rows: the check ran at 2500 events
        assert e["peers"]["bytewax"]["events"] == 2500
        assert e["peers"]["bytewax"]["ratio"] == pytest.approx(e["events_per_s"] / 2500, rel=1e-3)
    monkeypatch.setattr(bench, "run_bytewax", lambda *a: python_peer(*a, wrong=True))
    with pytest.raises(RuntimeError, match="tumble_count .device. gives"):
        bench.main(args)


def test_cpu_peer_runs_every_job_and_checks_its_output_count(bench, monkeypatch):
    out = bench.main(["--events", "3000", "--device", "cpu", "--batch-size", "700", "--no-warmup",
                      "--queries", "q2,q5", "--feeds", "device,host", "--peers", "cpu"])
    peers = {p["query"]: p for p in out["peer_entries"]}
    assert set(peers) == {"q2", "q5"} and all(p["peer"] == "cpu" for p in peers.values())
    for e in out["entries"]:
        assert e["output_records"] == peers[e["query"]]["output_records"]
        cpu = e["peers"]["cpu"]
        assert cpu["events"] == 3000 and cpu["ratio"] == pytest.approx(e["events_per_s"] / cpu["events_per_s"], rel=1e-3)
    real = bench.run_cpu_peer
    monkeypatch.setattr(bench, "run_cpu_peer", lambda *a: {**real(*a), "output_records": -1})
    with pytest.raises(RuntimeError, match="its CPU path -1"):
        bench.main(["--events", "2000", "--device", "cpu", "--batch-size", "700", "--no-warmup", "--queries", "q2",
                    "--feeds", "device", "--peers", "cpu"])


def test_latency_sample_keeps_the_oldest_event_and_weighs_the_rest(bench):
    import torch

    ts = torch.arange(10_000, 20_000)
    ts[4321] = 7  # the oldest, off the stride
    sample, weights = bench.latency_sample(ts)
    assert len(sample) == 1001 and 7 in sample  # every 10th of 10_000, and the oldest
    assert weights.sum() == pytest.approx(10_000)  # the oldest counts once
    small = torch.tensor([5, 3, 9])
    s, w = bench.latency_sample(small)
    assert s.tolist() == [5, 3, 9] and w.tolist() == [1, 1, 1]  # small batches whole


def test_sampled_latency_percentiles_match_the_full_computation(bench):
    """Synthetic arrivals: a source reaches event time t at wall t ms; batch b
    of 50_000 outputs (event times spread over 5 s, a long tail of old ones)
    arrives at wall (b + 6) s. The sink's sampled p50 / p99 equal the
    percentiles of all 1_000_000 latencies within the sampling, and max exactly."""
    import numpy as np
    import torch

    from opforge.stream.records import Batch, RecordSchema

    rng = np.random.default_rng(0)
    log = bench.IngestLog()
    marks = np.arange(0, 40_000, 10)
    log.per_source["s"] = ([float(m) / 1000 for m in marks], [int(m) for m in marks])
    sink = bench.LatencySink()
    every = []
    for b in range(20):
        ts = b * 1000 + rng.integers(0, 5000, 50_000)
        ts[rng.integers(0, 50_000, 200)] -= rng.integers(0, 3000, 200)  # the tail
        ts = np.maximum(ts, 0)
        sink.write(Batch({"x": torch.zeros(len(ts))}, torch.from_numpy(ts), RecordSchema("dict", ("x",))), 0)
        wall = float(b + 6)
        sink.arrivals[-1] = (wall,) + sink.arrivals[-1][1:]
        every.append((wall - log.first_reach(ts)) * 1000)
    every = np.concatenate(every)
    got = sink.latency_summary(log)
    assert sink.records == len(every)
    assert got["max"] == pytest.approx(every.max(), abs=1e-3)
    for q in (50, 99):
        assert got[f"p{q}"] == pytest.approx(np.percentile(every, q), abs=20), q  # 20 ms of a 9 s range


def test_paced_run_never_outruns_its_rate_and_charges_batch_filling(bench):
    """Sources paced at 100 K events/s: the run takes at least the paced time of its
    sequence (less the first batch, released at once), and an event waits for its
    batch to fill: the oldest event of a 2000-event batch waits ~20 ms."""
    config = NexmarkConfig(events=20_000, events_per_second=10_000, max_out_of_orderness_ms=0)
    rate = 100_000
    e = bench.run_one("q1", "device", config, "cpu", 2000, rate=rate)
    assert e["events_per_s"] <= rate * 1.15  # 10 batches, the first one free
    assert e["latency_ms"]["max"] >= 10


def test_exactly_once_sink_charges_outputs_to_their_commit(bench, tmp_path):
    """With checkpoints into the transactional sink, every output is committed exactly
    once, and an output's latency runs to the commit of its file, not to its write."""
    from opforge.stream.file_sink import read_committed
    from opforge.stream.records import Batch, RecordSchema
    import torch

    config = NexmarkConfig(events=6000, events_per_second=10_000, max_out_of_orderness_ms=0)
    plain = bench.run_one("q1", "device", config, "cpu", 700)
    e = bench.run_one("q1", "device", config, "cpu", 700, exactly_once_ms=1, workdir=tmp_path)
    assert e["sink"] == "exactly_once" and e["checkpoint_interval_ms"] == 1
    assert e["output_records"] == plain["output_records"] == read_committed(tmp_path / "out").num_rows
    assert 0 <= e["latency_ms"]["p50"] <= e["latency_ms"]["p99"] <= e["latency_ms"]["max"]

    sink = bench.CommitLatencySink(tmp_path / "unit")
    sink.open(0, 1)
    ts = torch.arange(5000, dtype=torch.int64)
    sink.write(Batch({"x": ts}, ts, RecordSchema("dict", ("x",))), 0)
    sink.snapshot_state(0, 1)
    assert sink.arrivals == []  # pre-committed: not visible yet
    sink.notify_checkpoint_complete(0, 1)
    [(wall, sample, weights)] = sink.arrivals
    assert sample.min() == 0 and weights.sum() == pytest.approx(5000)
