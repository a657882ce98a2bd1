"""Nexmark on the stream engine: throughput and event-to-output latency of
q0, q1, q2, q3, q4, q5, q7, q8 (``opforge.stream.nexmark``).

    python benchmarks/stream_nexmark.py [--events 1000000] [--device cuda|cpu] [--batch-size 65536]
                                        [--queries q0,q5,...] [--feeds device,host] [--json PATH]
                                        [--watermark-granularity record|batch]
                                        [--peers bytewax] [--bytewax-python PATH] [--bytewax-batch 10000]

Large runs: ``--events 16000000 --batch-size 4194304`` (a batch is generated
whole on the device; a host feed holds all its Arrow batches in memory).

Two feeds per query, the same events:
* ``device``: the generator makes each micro-batch in device memory (cuda when
  present, else cpu) as the job polls it; generation is part of the job.
* ``host``: the events are made beforehand as Arrow record batches in host
  memory and fed through an ``ArrowSource`` (Python/Arrow in, a host-to-device
  copy per batch), the way events from outside the process arrive.

Each (query, feed) runs once whole to warm up (dispatch tunes the shape buckets the job meets), then once
timed: the steady state of a long-running job.
``seconds`` is the job's net runtime; ``events_per_s`` = Nexmark events
(persons + auctions + bids of the generator's sequence) / seconds.
Latency: a plain (non-transactional) sink notes when each output batch
arrives; an output with event time ``t`` is charged from the moment the first
source batch reaching event time ``t`` was polled (the earliest any input
could have led to it; outputs timed past the input are charged from its end)
— for windows this includes waiting for the watermark. The latencies are
sampled, so that the sink does not bound a query that emits one output per
input (q1: copying every timestamp to the host costs more than the query):
of a batch of ``n > 1024`` outputs the sink copies every ``ceil(n / 1024)``-th
timestamp (at most ``LATENCY_SAMPLE`` = 1024), each standing for
``(n - 1) / samples`` outputs, and the batch's oldest timestamp (its worst latency,
weight 1), taken on the device; smaller batches are copied whole. So ``max``
is exact, and p50 / p99 are weighted percentiles (inverted CDF) of the
sample: exact percentiles of every output when no batch has more than 1024.
Per batch: ``batches`` (source batches polled), ``ms_per_batch`` (net runtime /
batches) and ``host_cpu_ms_per_batch`` (the process's CPU time / batches: on a
GPU, the host's share of a batch — Python, launches and sync waits, which spin
— and on a CPU device the whole work).

Peers (``--peers bytewax``): the same events through Bytewax (0.21), for
``q1`` (a stateless map) and ``tumble_count`` (a keyed tumbling-window count, the
first step of q5 with tumbling windows; also an opforge job here), in a
subprocess that runs this file with ``--bytewax-python`` (default: this
interpreter if it imports bytewax) — Bytewax needs neither torch nor the GPU:
the parent writes the bids as raw int64 columns, the child reads them with
the standard library, feeds them as Python tuples (``TestingSource``, batches
of ``--bytewax-batch``), an event clock with the same bounded out-of-orderness
and a frozen system clock (so windows close as Flink's would, never by
wall time). Each peer entry carries its result counts and a checksum, and
``peers`` in the opforge entry of the same job the ratio; the run fails
if the counts differ. ``--peers cpu`` (for a GPU ``--device``) runs every
job on opforge's CPU path too, its events generated in host memory, and
fails if it emits a different number of records. ``--peer-events N`` runs
the peers on the first ``N`` events only (Bytewax takes about 10 s per
million; a large run's ``--events`` would take it hours): opforge then runs
those ``N`` events too, as the check of Bytewax's counts (the CPU path's
count is not checked then), and each ratio compares the events/s of
opforge's full run with the peer's (both rates are per event, the batch
sizes stay as given).

``--blocking-sync``: the host sleeps in its waits for the GPU instead of spinning
(``blocking_sync``), so ``host_cpu_ms_per_batch`` is the host's own work per batch;
the JSON's ``blocking_sync`` says whether it took effect.

Latency at a given load (``--paced 0.5``): after the timed run, the same job
runs again with its sources released at that fraction of the throughput just
measured. A shared ``Pacer`` holds each source batch until the wall clock
reaches its place in the event sequence: event time runs at
``events_per_second`` events per second of event time, so a batch reaching
event time ``t`` is released ``(t - t0) * events_per_second / rate`` after the
first batch. An event is charged from the moment the paced sequence reaches
its time, so its latency includes waiting for its batch to fill. Entries with
``"load": 0.5`` carry that run's latency.

Exactly-once (``--exactly-once-ms 50``): the job also runs with checkpoints
every that many ms into the transactional ``FileSink`` (Parquet part files, or
Arrow IPC with ``--sink-format arrow``; two-phase commit). An output's latency
then runs to the commit that makes its file visible (the checkpoint's
completion), so it is bounded by the interval plus a batch, unless writing the
files takes longer: entries with ``"sink": "exactly_once"`` report it beside
the plain sink's, with the interval and the checkpoints completed.

JSON (``--json``): ``{schema_version, benchmark, date, device, gpu, torch, events,
batch_size, entries: [{query, feed, events, input_records, output_records,
seconds, events_per_s, batches, ms_per_batch, host_cpu_ms_per_batch,
latency_ms: {p50, p99, max}, sink, load, [checkpoint_interval_ms, sink_format, checkpoints, result,
peers: {bytewax | cpu: {events_per_s, events, ratio}}]}], [peer_entries]}``
(``sink``: "plain" or "exactly_once"; ``load``: null for a run at full speed,
else the fraction it was paced at; latency values are null for a run without
output).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

TUMBLE_MS = 10_000
CHECK_MOD = 2**61 - 1


def _checksum(triples) -> tuple[int, int, int]:
    """``(results, sum of counts, checksum)`` of ``(key, window_start, count)``."""
    n = total = check = 0
    for key, start, count in triples:
        n += 1
        total += count
        check = (check + (key * 1_000_003 + start // 1000) * count) % CHECK_MOD
    return n, total, check


def bytewax_worker(argv) -> None:
    """The child: ``--bytewax-worker DATA_PREFIX JOB EVENTS BATCH OOO_MS``; prints one JSON line.
    Standard library and bytewax only (no torch, no numpy)."""
    from array import array
    from datetime import datetime, timedelta, timezone

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower, count_window
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import TestingSource, run_main

    prefix, job, events, batch, ooo = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    cols = {}
    for name in ("auction", "price", "date_time"):
        a = array("q")
        with open(f"{prefix}.{name}.i64", "rb") as f:
            a.frombytes(f.read())
        cols[name] = a
    items = list(zip(cols["auction"], cols["price"], cols["date_time"]))
    out: list = []

    class _Part(StatelessSinkPartition):
        def write_batch(self, batch_items):
            out.extend(batch_items) if job == "tumble_count" else out.append(len(batch_items))

    class _Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return _Part()

    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    flow = Dataflow(f"nexmark_{job}")
    bids = op.input("bids", flow, TestingSource(items, batch_size=batch))
    if job == "q1":
        res = op.map("to_euros", bids, lambda b: (b[0], b[1] * 0.908, b[2]))
    elif job == "tumble_count":
        frozen = epoch  # a frozen system clock: the watermark is max event time - out-of-orderness
        clock = EventClock(lambda b: epoch + timedelta(milliseconds=b[2]), timedelta(milliseconds=ooo),
                           now_getter=lambda: frozen, to_system_utc=lambda t: None)
        win = count_window("count", bids, clock, TumblingWindower(timedelta(milliseconds=TUMBLE_MS), epoch),
                           lambda b: str(b[0]))  # keys by auction itself
        res = win.down
    else:
        raise SystemExit(f"bytewax worker: unknown job {job!r}")
    op.output("out", res, _Sink())
    t0 = time.perf_counter()
    run_main(flow)
    seconds = time.perf_counter() - t0
    if job == "tumble_count":
        n, total, check = _checksum((int(k), wid * TUMBLE_MS, c) for k, (wid, c) in out)
    else:
        n, total, check = sum(out), sum(out), 0
    print(json.dumps({"seconds": seconds, "input_records": len(items), "events": events,
                      "result": {"results": n, "total": total, "checksum": check}}))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--bytewax-worker":
    bytewax_worker(sys.argv[2:])
    sys.exit(0)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from opforge.stream import Aggregations, StreamExecutionEnvironment, TumblingEventTimeWindows  # noqa: E402
from opforge.stream.nexmark import QUERIES, NexmarkConfig, bids, generate, stream  # noqa: E402
from opforge.stream.file_sink import FileSink  # noqa: E402
from opforge.stream.sinks import Sink  # noqa: E402
from opforge.stream.sources import Source  # noqa: E402

SCHEMA_VERSION = 2
DEFAULT_QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")
PEER_JOBS = ("q1", "tumble_count")


def tumble_count(env, config: NexmarkConfig, source=stream):
    """Bids per auction and tumbling 10 s window (q5's first step with
    tumbling windows): the job Bytewax runs as ``count_window``."""
    return bids(env, config, source).key_by("auction").window(TumblingEventTimeWindows.of(TUMBLE_MS)) \
        .aggregate(Aggregations(with_window=True, num=("count",)))


JOBS = {**QUERIES, "tumble_count": tumble_count}


class IngestLog:
    """When each polled source batch arrived and how far in event time its
    source had got (a running maximum, per source). With a ``Pacer``, an event
    arrives when the paced sequence reaches its time, before its batch is
    released: a batch's events wait for the batch to fill, as they would in
    front of a micro-batching engine."""

    def __init__(self, pacer: "Pacer | None" = None):
        self.per_source: dict[str, tuple[list, list]] = {}
        self.pacer = pacer

    def note(self, name: str, max_ts: int | None) -> None:
        walls, marks = self.per_source.setdefault(name, ([], []))
        prev = marks[-1] if marks else -(2**62)
        walls.append(time.perf_counter())
        marks.append(prev if max_ts is None else max(prev, max_ts))

    def end(self, name: str) -> None:
        """The source's input ended: its final watermark releases every later event time."""
        walls, marks = self.per_source.setdefault(name, ([], []))
        walls.append(time.perf_counter())
        marks.append(np.inf)

    def first_reach(self, ts: np.ndarray) -> np.ndarray:
        """Per event time: the earliest wall time at which some source had read
        it (or had ended: outputs timed past the input, such as a window that
        closes after the last event, are released by the end of the input)."""
        best = np.full(ts.shape, np.inf)
        for walls, marks in self.per_source.values():
            idx = np.searchsorted(np.asarray(marks, dtype=np.float64), ts, side="left")
            w = np.append(np.asarray(walls), np.inf)
            best = np.minimum(best, w[idx])
        if self.pacer is not None and self.pacer.t0 is not None:
            best = np.minimum(best, self.pacer.arrival(ts))
        return best


class Pacer:
    """Releases source batches at ``rate`` events per second of wall time: a
    batch reaching event time ``t`` (ms) waits until ``(t - t0) *
    events_per_second / 1000 / rate`` seconds after the first batch (``t0``),
    whichever source polls it. Event time holds ``events_per_second`` events a
    second, so this is the event sequence replayed at ``rate``."""

    def __init__(self, rate: float, events_per_second: int):
        if rate <= 0:
            raise ValueError(f"Pacer: rate must be > 0 events/s, got {rate}")
        self.seconds_per_ms = events_per_second / 1000 / rate
        self.t0 = self.start = None

    def arrival(self, ts: np.ndarray) -> np.ndarray:
        """The wall time at which the paced sequence reaches event time ``ts``."""
        return self.start + (ts - self.t0) * self.seconds_per_ms

    def wait(self, max_ts: int | None) -> None:
        if max_ts is None:
            return
        if self.t0 is None:
            self.t0, self.start = max_ts, time.perf_counter()
            return
        delay = self.start + (max_ts - self.t0) * self.seconds_per_ms - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class _Logged(Source):
    def __init__(self, inner: Source, log: IngestLog, name: str, pacer: Pacer | None = None):
        self.inner, self.log, self.name, self.pacer = inner, log, name, pacer
        self.max_parallelism = inner.max_parallelism

    def splits(self, parallelism, batch_size, device):
        def logged(split):
            for item in split:
                max_ts = _max_date_time(item)
                if self.pacer is not None:
                    self.pacer.wait(max_ts)
                self.log.note(self.name, max_ts)
                yield item
            self.log.end(self.name)

        return [logged(s) for s in self.inner.splits(parallelism, batch_size, device)]


def _max_date_time(item) -> int | None:
    if hasattr(item, "num_rows"):  # Arrow
        import pyarrow.compute as pc

        return None if item.num_rows == 0 else int(pc.max(item.column("date_time")).as_py())
    col = item.columns["date_time"]
    return None if col.numel() == 0 else int(col.max())


LATENCY_SAMPLE = 1024


def latency_sample(ts: torch.Tensor, limit: int = LATENCY_SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """``(timestamps, weights)``: the batch's event times to charge, as a
    strided sample on the device (every ``ceil(n / limit)``-th, each weighing
    ``(n - 1) / samples``) plus the oldest (weight 1), so the weights add up to
    ``n``; all of them, weight 1, when ``n <= limit``. One small copy to the
    host (which waits for the device)."""
    n = ts.shape[0]
    if n <= limit:
        return ts.cpu().numpy(), np.ones(n)
    strided = ts[::-(-n // limit)]
    m = strided.shape[0]
    sample = torch.cat([strided, ts.min().reshape(1)]).cpu().numpy()
    return sample, np.append(np.full(m, (n - 1) / m), 1.0)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of values standing for ``weights`` records each
    (inverted CDF: the smallest value whose cumulative weight reaches q%)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q / 100 * cum[-1], side="left"))
    return float(values[order][min(i, len(values) - 1)])


class _Arrivals:
    """When outputs became visible, with a sample of their event times
    (``latency_sample``), and the latency summary over them."""

    def __init__(self):
        self.arrivals: list = []  # (wall time, sampled event times, their weights)
        self.records = 0

    def latencies_ms(self, log: IngestLog) -> tuple[np.ndarray, np.ndarray]:
        """(latencies of the sampled outputs, the outputs each stands for)."""
        if not self.arrivals:
            return np.empty(0), np.empty(0)
        lat = np.concatenate([(wall - log.first_reach(ts)) * 1000 for wall, ts, _ in self.arrivals])
        weights = np.concatenate([w for _, _, w in self.arrivals])
        finite = np.isfinite(lat)
        return lat[finite], weights[finite]

    def latency_summary(self, log: IngestLog) -> dict:
        lat, weights = self.latencies_ms(log)
        if not len(lat):
            return {"p50": None, "p99": None, "max": None}
        return {"p50": round(weighted_percentile(lat, weights, 50), 3),
                "p99": round(weighted_percentile(lat, weights, 99), 3), "max": round(float(lat.max()), 3)}


class LatencySink(_Arrivals, Sink):
    """Notes each output batch's arrival with a sample of its event times
    (``latency_sample``: a plain, non-transactional sink); with ``keep``
    also the window results (key, window_start, num) for the peer comparison."""

    def __init__(self, keep: bool = False):
        super().__init__()
        self.keep = keep
        self.kept: list = []

    def write(self, batch, subtask):
        ts, weights = latency_sample(batch.timestamps)  # waits for the device
        self.arrivals.append((time.perf_counter(), ts, weights))
        self.records += batch.timestamps.shape[0]
        if self.keep:
            self.kept.append(tuple(batch[c].cpu() for c in ("key", "window_start", "num")))

    def result(self) -> dict:
        if not self.keep:
            return {"results": self.records, "total": self.records, "checksum": 0}
        triples = ((int(k), int(w), int(c)) for ks, ws, cs in self.kept
                   for k, w, c in zip(ks.tolist(), ws.tolist(), cs.tolist()))
        n, total, check = _checksum(triples)
        return {"results": n, "total": total, "checksum": check}



class CommitLatencySink(_Arrivals, FileSink):
    """The exactly-once ``FileSink`` (Parquet), noting when outputs become
    visible: a batch's sample waits with its part file through the pre-commit
    (``snapshot_state``) and arrives when the checkpoint completes
    (``notify_checkpoint_complete``), or at the end of the input (``finish``)."""

    def __init__(self, path, format: str = "parquet"):
        _Arrivals.__init__(self)
        FileSink.__init__(self, path, format)
        self.open_samples: dict = {}  # subtask -> samples written since its last pre-commit
        self.pending_samples: dict = {}  # (subtask, checkpoint id) -> samples of that pending file

    def write(self, batch, subtask):
        super().write(batch, subtask)
        if len(batch):
            self.open_samples.setdefault(subtask, []).append(latency_sample(batch.timestamps))
            self.records += len(batch)

    def snapshot_state(self, subtask: int, checkpoint_id: int) -> dict:
        state = super().snapshot_state(subtask, checkpoint_id)
        self.pending_samples[(subtask, checkpoint_id)] = self.open_samples.pop(subtask, [])
        return state

    def notify_checkpoint_complete(self, subtask: int, checkpoint_id: int) -> None:
        super().notify_checkpoint_complete(subtask, checkpoint_id)
        now = time.perf_counter()
        for key in sorted(k for k in self.pending_samples if k[0] == subtask and k[1] <= checkpoint_id):
            self.arrivals += [(now, ts, w) for ts, w in self.pending_samples.pop(key)]

    def finish(self) -> None:
        super().finish()
        now = time.perf_counter()
        for subtask in sorted(self.open_samples):
            self.arrivals += [(now, ts, w) for ts, w in self.open_samples.pop(subtask)]


def host_batches(config: NexmarkConfig, kind: str, batch_size: int) -> list:
    """The ``kind`` events as Arrow record batches in host memory."""
    out = []
    for s in range(0, config.events, batch_size):
        out.append(generate(config, kind, s, min(s + batch_size, config.events), "cpu").to_arrow())
    return out


def _sources(feed: str, config: NexmarkConfig, batch_size: int, log: IngestLog, pacer: Pacer | None = None):
    host = {}

    def source(env, cfg, kind):
        if feed == "device":
            s = stream(env, cfg, kind)
        else:
            if kind not in host:
                host[kind] = host_batches(cfg, kind, batch_size)
            s = env.from_arrow(host[kind], cfg.watermark_strategy())
        t = s.transformation
        t.params["source"] = _Logged(t.params["source"], log, f"{kind}#{t.id}", pacer)
        return s

    return source


# ``--watermark-granularity``: "record" (the engine's default: the output does
# not depend on the batch size) or "batch" (the watermark moves between
# batches only); the JSON records which one ran
WATERMARK_GRANULARITY = "record"


def run_one(query: str, feed: str, config: NexmarkConfig, device, batch_size: int, keep: bool = False,
            rate: float | None = None, exactly_once_ms: int | None = None, workdir=None,
            sink_format: str = "parquet") -> dict:
    """One timed run. ``rate``: sources paced at that many events/s (``Pacer``);
    ``exactly_once_ms``: checkpoints at that interval into ``CommitLatencySink``
    files (``sink_format``) under ``workdir``."""
    pacer = Pacer(rate, config.events_per_second) if rate else None
    log = IngestLog(pacer)
    env = StreamExecutionEnvironment(device=device, batch_size=batch_size,
                                     watermark_granularity=WATERMARK_GRANULARITY)
    if exactly_once_ms:
        env.enable_checkpointing(exactly_once_ms, str(Path(workdir) / "checkpoints"))
        sink = CommitLatencySink(Path(workdir) / "out", sink_format)
    else:
        sink = LatencySink(keep=keep and query == "tumble_count")
    JOBS[query](env, config, source=_sources(feed, config, batch_size, log, pacer)).sink_to(sink)
    cpu0 = time.process_time()
    result = env.execute(f"nexmark {query} ({feed})")
    cpu_ms = (time.process_time() - cpu0) * 1000
    seconds = result.get_net_runtime() / 1000
    inputs = sum(m.records_out for name, m in result.metrics.items()
                 if name.startswith(("Nexmark", "Arrow Source")))
    batches = max(sum(len(walls) - 1 for walls, _ in log.per_source.values()), 1)  # less each end mark
    out = {"query": query, "feed": feed, "events": config.events, "input_records": inputs,
           "output_records": sink.records, "seconds": round(seconds, 6),
           "events_per_s": round(config.events / seconds, 1) if seconds > 0 else None,
           "batches": batches, "ms_per_batch": round(seconds * 1000 / batches, 4),
           "host_cpu_ms_per_batch": round(cpu_ms / batches, 4),
           "latency_ms": sink.latency_summary(log),
           "sink": "exactly_once" if exactly_once_ms else "plain", "load": None}
    if exactly_once_ms:
        out["checkpoint_interval_ms"], out["sink_format"] = exactly_once_ms, sink_format
        out["checkpoints"] = len(result.checkpoints)
    if keep:
        out["result"] = sink.result()
    return out


def bytewax_python(explicit: str | None) -> str | None:
    """The interpreter that runs the Bytewax peer: ``explicit``, else this one
    when it imports bytewax, else None (the peer is skipped)."""
    if explicit:
        return explicit
    import importlib.util

    return sys.executable if importlib.util.find_spec("bytewax") is not None else None


def run_bytewax(job: str, config: NexmarkConfig, python: str, batch: int, workdir: str) -> dict:
    """The Bytewax peer of ``job`` on the same bids, in a subprocess (see the module doc)."""
    import subprocess

    b = generate(config, "bid", 0, config.events, "cpu")
    prefix = str(Path(workdir) / "bids")
    for name in ("auction", "price", "date_time"):
        b[name].to(torch.int64).numpy().astype("<i8").tofile(f"{prefix}.{name}.i64")
    cmd = [python, str(Path(__file__).resolve()), "--bytewax-worker", prefix, job, str(config.events), str(batch),
           str(config.max_out_of_orderness_ms)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bytewax peer {job} failed ({done.returncode}): {done.stderr[-2000:]}")
    res = json.loads(done.stdout.strip().splitlines()[-1])
    seconds = res["seconds"]
    return {"peer": "bytewax", "query": job, "events": config.events, "input_records": res["input_records"],
            "batch_size": batch, "seconds": round(seconds, 6),
            "events_per_s": round(config.events / seconds, 1) if seconds > 0 else None, "result": res["result"]}


def run_cpu_peer(query: str, config: NexmarkConfig, batch_size: int) -> dict:
    """The same job on opforge's CPU path (events generated in host memory, every operator on the CPU's
    torch), as a peer entry."""
    c = run_one(query, "device", config, torch.device("cpu"), batch_size)
    return {"peer": "cpu", "query": query, "events": config.events, "input_records": c["input_records"],
            "batch_size": batch_size, "seconds": c["seconds"], "events_per_s": c["events_per_s"],
            "output_records": c["output_records"]}


def _attach_peer(entry: dict, peer: dict, config: NexmarkConfig) -> None:
    """The peer's rate and ``ratio`` (the entry's events/s over the peer's) in ``entry["peers"]``."""
    ratio = round(entry["events_per_s"] / peer["events_per_s"], 3) if entry["events_per_s"] and peer["events_per_s"] \
        else None
    entry.setdefault("peers", {})[peer["peer"]] = {"events_per_s": peer["events_per_s"], "events": config.events,
                                                  "ratio": ratio}


def _log_entry(log, e: dict) -> None:
    lat = e["latency_ms"]
    how = "" if e["sink"] == "plain" else f" exactly-once ({e['sink_format']})"
    how += "" if e["load"] is None else f" at {e['load']:g} load"
    log(f"{e['query']:>3} {e['feed']:>6}{how}: {e['events_per_s'] or 0:>14,.0f} events/s  "
        f"{e['output_records']:>9,} out  {e['ms_per_batch']:>9.3f} ms/batch ({e['host_cpu_ms_per_batch']:.3f} host CPU)  "
        f"p99 {lat['p99'] if lat['p99'] is not None else '-':>9} ms")


def blocking_sync() -> bool:
    """Make the host sleep, not spin, while it waits for the GPU (``cudaSetDeviceFlags(
    cudaDeviceScheduleBlockingSync)``, before CUDA starts in this process). Why: a spinning wait is
    counted as host CPU, so ``host_cpu_ms_per_batch`` then reads as the batch's wall time whatever
    the host really did; with blocking waits it is the host's own work (Python, launches). True when
    the flag took effect."""
    import ctypes

    if not torch.cuda.is_available() or torch.cuda.is_initialized():
        return False
    try:
        cudart = ctypes.CDLL("libcudart.so.12")
    except OSError:
        return False
    return cudart.cudaSetDeviceFlags(ctypes.c_uint(4)) == 0  # cudaDeviceScheduleBlockingSync


def run(events: int, device, batch_size: int, queries=DEFAULT_QUERIES, feeds=("device", "host"),
        warmup: bool = True, log=print, peers=(), bytewax_py: str | None = None, bytewax_batch: int = 10_000,
        paced: float | None = None, exactly_once_ms: int | None = None, peer_events: int | None = None,
        sink_format: str = "parquet") -> dict:
    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)
    # warm-up: the whole job once, so that the timed run's ops meet only shape buckets that dispatch has
    # already tuned: state grows into new buckets late in a run (a tenth of the events as warm-up left
    # one batch of 32 tuning for 0.1-0.5 s in q5's timed run; benchmarks/stream_profile.py shows it)
    peer_config = config if not peer_events or peer_events >= events else \
        NexmarkConfig(events=peer_events, events_per_second=10_000, max_out_of_orderness_ms=500)
    py = bytewax_python(bytewax_py) if "bytewax" in peers else None
    if "bytewax" in peers and py is None:
        log("bytewax: not importable here and no --bytewax-python given: peer skipped")
    entries, peer_entries = [], []
    for q in queries:
        if q not in JOBS:
            raise ValueError(f"stream_nexmark: unknown query {q!r}; one of {sorted(JOBS)}")
        peer = py is not None and q in PEER_JOBS
        for feed in feeds:
            if warmup:
                run_one(q, feed, config, device, batch_size)
            e = run_one(q, feed, config, device, batch_size, keep=peer and peer_config is config)
            _log_entry(log, e)
            entries.append(e)
            if paced and e["events_per_s"]:  # the same job at a fraction of the throughput just measured
                p = run_one(q, feed, config, device, batch_size, rate=paced * e["events_per_s"])
                p["load"] = paced
                _log_entry(log, p)
                entries.append(p)
            if exactly_once_ms:
                import tempfile

                with tempfile.TemporaryDirectory(prefix="nexmark-exactly-once-") as tmp:
                    x = run_one(q, feed, config, device, batch_size, exactly_once_ms=exactly_once_ms, workdir=tmp,
                                sink_format=sink_format)
                _log_entry(log, x)
                entries.append(x)
        timed = [e for e in entries if e["query"] == q and e["load"] is None and e["sink"] == "plain"]
        if peer:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="nexmark-bytewax-") as tmp:
                pe = run_bytewax(q, peer_config, py, bytewax_batch, tmp)
            peer_entries.append(pe)
            log(f"{q:>3} bytewax: {pe['events_per_s'] or 0:>14,.0f} events/s  {pe['result']['results']:>9,} out")
            for e in timed:
                check = e.get("result") or run_one(q, e["feed"], peer_config, device, batch_size, keep=True)["result"]
                if check != pe["result"]:
                    raise RuntimeError(f"stream_nexmark: {q} ({e['feed']}) gives {check}, bytewax {pe['result']}")
                _attach_peer(e, pe, peer_config)
        if "cpu" in peers:
            pc = run_cpu_peer(q, peer_config, batch_size)
            peer_entries.append(pc)
            log(f"{q:>3}    cpu: {pc['events_per_s'] or 0:>14,.0f} events/s  {pc['output_records']:>9,} out")
            for e in timed:
                if peer_config is config and e["output_records"] != pc["output_records"]:
                    raise RuntimeError(f"stream_nexmark: {q} ({e['feed']}) emits {e['output_records']} records, "
                                       f"its CPU path {pc['output_records']}")
                _attach_peer(e, pc, peer_config)
    gpu = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None
    out = {"schema_version": SCHEMA_VERSION, "benchmark": "stream_nexmark",
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": str(device),
           "gpu": gpu, "torch": torch.__version__, "events": events, "batch_size": batch_size,
           "entries": entries}
    if peer_entries:
        out["peer_entries"] = peer_entries
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--queries", default=",".join(DEFAULT_QUERIES))
    ap.add_argument("--feeds", default="device,host")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--blocking-sync", action="store_true",
                    help="the host sleeps while waiting for the GPU (host CPU then excludes spinning)")
    ap.add_argument("--peers", default="", help="bytewax: also run q1 / tumble_count on Bytewax; cpu: every "
                                                "job on opforge's CPU path too (for a GPU device)")
    ap.add_argument("--bytewax-python", help="a Python with bytewax (default: this one, if it has it)")
    ap.add_argument("--bytewax-batch", type=int, default=10_000)
    ap.add_argument("--peer-events", type=int, help="run the peers on the first N events only")
    ap.add_argument("--paced", type=float, help="also run each job paced at this fraction of its throughput")
    ap.add_argument("--exactly-once-ms", type=int, help="also run each job with checkpoints at this interval "
                                                        "into the exactly-once file sink")
    ap.add_argument("--watermark-granularity", default="record", choices=("record", "batch"),
                    help="record: each record sees the watermark of the records before it (default); "
                         "batch: the watermark moves between micro-batches only")
    ap.add_argument("--sink-format", default="parquet", choices=("parquet", "arrow", "csv", "json"),
                    help="the exactly-once sink's file format")
    args = ap.parse_args(argv)
    if args.paced is not None and not 0 < args.paced <= 1:
        ap.error(f"--paced: a fraction in (0, 1], got {args.paced}")
    if args.exactly_once_ms is not None and args.exactly_once_ms <= 0:
        ap.error(f"--exactly-once-ms: a positive interval, got {args.exactly_once_ms}")
    feeds = tuple(f for f in args.feeds.split(",") if f)
    global WATERMARK_GRANULARITY
    WATERMARK_GRANULARITY = args.watermark_granularity
    blocking = blocking_sync() if args.blocking_sync else False
    for f in feeds:
        if f not in ("device", "host"):
            ap.error(f"--feeds: device or host, got {f!r}")
    for p in (p for p in args.peers.split(",") if p):
        if p not in ("bytewax", "cpu"):
            ap.error(f"--peers: bytewax or cpu, got {p!r}")
    result = run(args.events, torch.device(args.device), args.batch_size,
                 tuple(q for q in args.queries.split(",") if q), feeds, warmup=not args.no_warmup,
                 peers=tuple(p for p in args.peers.split(",") if p), bytewax_py=args.bytewax_python,
                 bytewax_batch=args.bytewax_batch, paced=args.paced, exactly_once_ms=args.exactly_once_ms,
                 peer_events=args.peer_events, sink_format=args.sink_format)
    result["blocking_sync"] = blocking
    result["watermark_granularity"] = WATERMARK_GRANULARITY
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json_path}")
    return result


if __name__ == "__main__":
    main()
