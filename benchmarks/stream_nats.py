"""JetStream -> opforge -> JetStream end to end, beside NATS alone (the ceiling).

    python benchmarks/stream_nats.py [--events 4000000] [--subtasks 1] [--batch 8192]
                                     [--format arrow|json] [--out json]

Starts a nats-server (JetStream, loopback, a temp dir), then measures in one run:
* ``publish``: the events published alone (async, acked), as ``--format`` messages;
* ``consume``: the same messages fetched and decoded alone (one pull consumer per subject);
* ``job``: ``NatsSource`` (``--subtasks`` source subtasks, a subject each) -> ``key_by`` ->
  rolling ``sum`` (columnar, on the device) -> exactly-once ``NatsSink``, checkpointing every second.
Prints events/s of each and the job's events/s per source subtask (the issue's goal:
>= 1 M events/s per source subtask with ``--format arrow``); ``--out json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "tests", "stream")]

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from nats_server import nats_server  # noqa: E402


def make_messages(events: int, batch: int, subjects: list[str], fmt: str, keys: int) -> list[tuple[str, bytes]]:
    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(0, keys, (events,), generator=gen)
    values = torch.randint(-100, 100, (events,), generator=gen)
    out = []
    for n, lo in enumerate(range(0, events, batch)):
        t = pa.table({"key": keys[lo:lo + batch].numpy(), "value": values[lo:lo + batch].numpy()})
        subject = subjects[n % len(subjects)]
        if fmt == "arrow":
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            out.append((subject, sink.getvalue().to_pybytes()))
        else:
            out.extend((subject, json.dumps(r, separators=(",", ":")).encode()) for r in t.to_pylist())
    return out


async def _publish(url, stream, subjects, msgs):
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=20000)
    await js.add_stream(name=stream, subjects=subjects, max_bytes=-1)
    t0 = time.perf_counter()
    futs = [await js.publish_async(s, m) for s, m in msgs]
    await asyncio.gather(*futs)
    dt = time.perf_counter() - t0
    await nc.close()
    return dt


async def _consume(url, stream, subjects, fmt, per_subject: dict):
    import nats
    from nats.js import api

    from opforge.stream.nats_connection import decode_payloads

    nc = await nats.connect(url)
    js = nc.jetstream()
    records = 0
    t0 = time.perf_counter()
    for s in subjects:
        sub = await js.pull_subscribe(s, stream=stream, config=api.ConsumerConfig(ack_policy=api.AckPolicy.NONE))
        got = 0
        while got < per_subject[s]:
            msgs = await sub.fetch(min(1024, per_subject[s] - got), timeout=5)
            got += len(msgs)
            out = decode_payloads([m.data for m in msgs], fmt)
            records += len(out) if isinstance(out, list) else out.num_rows
        await sub.unsubscribe()
    dt = time.perf_counter() - t0
    await nc.close()
    return dt, records


def run_job(url, stream, subjects, fmt, batch, ckpt, device):
    from opforge.stream import StreamExecutionEnvironment, WatermarkStrategy
    from opforge.stream.nats_sink import NatsSink
    from opforge.stream.nats_source import NatsSource

    env = StreamExecutionEnvironment(parallelism=len(subjects), batch_size=batch, device=device)
    env.enable_checkpointing(1000, ckpt)
    src = NatsSource(url, stream, subjects, format=fmt)
    env.from_source(src, WatermarkStrategy.no_watermarks(), "jetstream").key_by("key").sum("value") \
        .sink_to(NatsSink(url, "bench.out", format=fmt, id_prefix=stream))
    t0 = time.perf_counter()
    res = env.execute("nats bench")
    return time.perf_counter() - t0, res.source_records


def measure(events: int, subtasks: int, batch: int, fmt: str, keys: int, device: str) -> dict:
    """One run of the three measurements (module doc) on a fresh server; their figures."""
    subjects = [f"bench.in.{i}" for i in range(subtasks)]
    msgs = make_messages(events, batch, subjects, fmt, keys)
    per_subject = {s: sum(1 for m in msgs if m[0] == s) for s in subjects}
    with tempfile.TemporaryDirectory() as tmp, nats_server(os.path.join(tmp, "nats")) as url:
        async def out_stream():
            import nats
            nc = await nats.connect(url)
            await nc.jetstream().add_stream(name="BENCHOUT", subjects=["bench.out"], max_bytes=-1,
                                            duplicate_window=120.0)
            await nc.close()
        asyncio.run(out_stream())
        warm_subjects = [f"warm.in.{i}" for i in range(subtasks)]
        warm = make_messages(batch * 2, batch, warm_subjects, fmt, keys)
        asyncio.run(_publish(url, "WARM", warm_subjects, warm))
        run_job(url, "WARM", warm_subjects, fmt, batch, os.path.join(tmp, "warm-ckpt"),
                device)  # imports, kernel compiles, first connections
        pub_s = asyncio.run(_publish(url, "BENCH", subjects, msgs))
        con_s, consumed = asyncio.run(_consume(url, "BENCH", subjects, fmt, per_subject))
        job_s, job_records = run_job(url, "BENCH", subjects, fmt, batch, os.path.join(tmp, "ckpt"), device)
    return {"bench": "stream_nats", "date": time.strftime("%Y-%m-%d"), "device": device,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
            "events": events, "format": fmt, "batch": batch, "source_subtasks": subtasks,
            "publish_events_per_s": events / pub_s, "consume_events_per_s": consumed / con_s,
            "job_events_per_s": job_records / job_s,
            "job_events_per_s_per_source_subtask": job_records / job_s / subtasks,
            "job_records": job_records, "consumed_records": consumed}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/stream_nats.py", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=4_000_000)
    p.add_argument("--subtasks", type=int, default=1)
    p.add_argument("--batch", type=int, default=8192, help="records per Arrow message and per micro-batch")
    p.add_argument("--format", choices=["arrow", "json"], default="arrow")
    p.add_argument("--keys", type=int, default=1000, help="distinct keys of the rolling sum")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", choices=["text", "json"], default="text")
    a = p.parse_args(argv)
    res = measure(a.events, a.subtasks, a.batch, a.format, a.keys, a.device)
    if a.out == "json":
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:>38}: {v:,.0f}" if isinstance(v, float) else f"{k:>38}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
