"""Nexmark on the stream engine: throughput and event-to-output latency of
q0, q1, q2, q3, q4, q5, q7, q8 (``opforge.stream.nexmark``).

    python benchmarks/stream_nexmark.py [--events 1000000] [--device cuda|cpu] [--batch-size 65536]
                                        [--queries q0,q5,...] [--feeds device,host] [--json PATH]

Two feeds per query, the same events:
* ``device``: the generator makes each micro-batch in device memory (cuda when
  present, else cpu) as the job polls it; generation is part of the job.
* ``host``: the events are made beforehand as Arrow record batches in host
  memory and fed through an ``ArrowSource`` (Python/Arrow in, a host-to-device
  copy per batch), the way events from outside the process arrive.

Each (query, feed) runs once at 1/10 of the size to warm up, then once timed.
``seconds`` is the job's net runtime; ``events_per_s`` = Nexmark events
(persons + auctions + bids of the generator's sequence) / seconds.
Latency: a plain (non-transactional) sink notes when each output record
arrives; an output with event time ``t`` is charged from the moment the first
source batch reaching event time ``t`` was polled (the earliest any input
could have led to it; outputs timed past the input are charged from its end)
— for windows this includes waiting for the watermark.
JSON (``--json``): ``{schema_version, benchmark, date, device, gpu, torch, events,
batch_size, entries: [{query, feed, events, input_records, output_records,
seconds, events_per_s, latency_ms: {p50, p99, max}}]}`` (latency values are
null for a run without output).
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from opforge.stream import StreamExecutionEnvironment  # noqa: E402
from opforge.stream.nexmark import QUERIES, NexmarkConfig, generate, stream  # noqa: E402
from opforge.stream.sinks import Sink  # noqa: E402
from opforge.stream.sources import Source  # noqa: E402

SCHEMA_VERSION = 1
DEFAULT_QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")


class IngestLog:
    """When each polled source batch arrived and how far in event time its
    source had got (a running maximum, per source)."""

    def __init__(self):
        self.per_source: dict[str, tuple[list, list]] = {}

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
        return best


class _Logged(Source):
    def __init__(self, inner: Source, log: IngestLog, name: str):
        self.inner, self.log, self.name = inner, log, name
        self.max_parallelism = inner.max_parallelism

    def splits(self, parallelism, batch_size, device):
        def logged(split):
            for item in split:
                self.log.note(self.name, _max_date_time(item))
                yield item
            self.log.end(self.name)

        return [logged(s) for s in self.inner.splits(parallelism, batch_size, device)]


def _max_date_time(item) -> int | None:
    if hasattr(item, "num_rows"):  # Arrow
        import pyarrow.compute as pc

        return None if item.num_rows == 0 else int(pc.max(item.column("date_time")).as_py())
    col = item.columns["date_time"]
    return None if col.numel() == 0 else int(col.max())


class LatencySink(Sink):
    """Notes each output record's arrival (a plain, non-transactional sink)."""

    def __init__(self):
        self.arrivals: list = []  # (wall time, event times)
        self.records = 0

    def write(self, batch, subtask):
        ts = batch.timestamps.cpu().numpy()  # waits for the device
        self.arrivals.append((time.perf_counter(), ts))
        self.records += len(ts)

    def latencies_ms(self, log: IngestLog) -> np.ndarray:
        if not self.arrivals:
            return np.empty(0)
        out = [(wall - log.first_reach(ts)) * 1000 for wall, ts in self.arrivals]
        lat = np.concatenate(out)
        return lat[np.isfinite(lat)]


def host_batches(config: NexmarkConfig, kind: str, batch_size: int) -> list:
    """The ``kind`` events as Arrow record batches in host memory."""
    out = []
    for s in range(0, config.events, batch_size):
        out.append(generate(config, kind, s, min(s + batch_size, config.events), "cpu").to_arrow())
    return out


def _sources(feed: str, config: NexmarkConfig, batch_size: int, log: IngestLog):
    host = {}

    def source(env, cfg, kind):
        if feed == "device":
            s = stream(env, cfg, kind)
        else:
            if kind not in host:
                host[kind] = host_batches(cfg, kind, batch_size)
            s = env.from_arrow(host[kind], cfg.watermark_strategy())
        t = s.transformation
        t.params["source"] = _Logged(t.params["source"], log, f"{kind}#{t.id}")
        return s

    return source


def run_one(query: str, feed: str, config: NexmarkConfig, device, batch_size: int) -> dict:
    log = IngestLog()
    env = StreamExecutionEnvironment(device=device, batch_size=batch_size)
    sink = LatencySink()
    QUERIES[query](env, config, source=_sources(feed, config, batch_size, log)).sink_to(sink)
    result = env.execute(f"nexmark {query} ({feed})")
    seconds = result.get_net_runtime() / 1000
    inputs = sum(m.records_out for name, m in result.metrics.items()
                 if name.startswith(("Nexmark", "Arrow Source")))
    lat = sink.latencies_ms(log)
    pct = (lambda q: round(float(np.percentile(lat, q)), 3)) if len(lat) else (lambda q: None)
    return {"query": query, "feed": feed, "events": config.events, "input_records": inputs,
            "output_records": sink.records, "seconds": round(seconds, 6),
            "events_per_s": round(config.events / seconds, 1) if seconds > 0 else None,
            "latency_ms": {"p50": pct(50), "p99": pct(99), "max": round(float(lat.max()), 3) if len(lat) else None}}


def run(events: int, device, batch_size: int, queries=DEFAULT_QUERIES, feeds=("device", "host"),
        warmup: bool = True, log=print) -> dict:
    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)
    small = NexmarkConfig(events=max(events // 10, 1000), events_per_second=10_000, max_out_of_orderness_ms=500)
    entries = []
    for q in queries:
        if q not in QUERIES:
            raise ValueError(f"stream_nexmark: unknown query {q!r}; one of {sorted(QUERIES)}")
        for feed in feeds:
            if warmup:
                run_one(q, feed, small, device, batch_size)
            e = run_one(q, feed, config, device, batch_size)
            entries.append(e)
            lat = e["latency_ms"]
            log(f"{q:>3} {feed:>6}: {e['events_per_s'] or 0:>14,.0f} events/s  {e['output_records']:>9,} out  "
                f"p99 {lat['p99'] if lat['p99'] is not None else '-':>9} ms")
    gpu = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None
    return {"schema_version": SCHEMA_VERSION, "benchmark": "stream_nexmark",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": str(device),
            "gpu": gpu, "torch": torch.__version__, "events": events, "batch_size": batch_size,
            "entries": entries}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--queries", default=",".join(DEFAULT_QUERIES))
    ap.add_argument("--feeds", default="device,host")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    feeds = tuple(f for f in args.feeds.split(",") if f)
    for f in feeds:
        if f not in ("device", "host"):
            ap.error(f"--feeds: device or host, got {f!r}")
    result = run(args.events, torch.device(args.device), args.batch_size,
                 tuple(q for q in args.queries.split(",") if q), feeds, warmup=not args.no_warmup)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json_path}")
    return result


if __name__ == "__main__":
    main()
