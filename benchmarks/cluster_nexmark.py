"""Nexmark q5 / q7 on an opforge cluster (Ray workers, records over NCCL / Gloo) against the
single-process stream engine.

    python benchmarks/cluster_nexmark.py [--events 8388608] [--workers 2] [--queries q5,q7]
                                         [--batch-size 1048576] [--watermarks batch|record]
                                         [--warmup-events N] [--repeats 1] [--budget-s 480]
                                         [--device cuda|cpu] [--checkpoint-ms 0] [--out PATH]

Starts a local Ray instance with ``--workers`` worker actors. NCCL takes one rank per GPU, so when
there are more workers than GPUs (one H200: any ``--workers`` > 1) the workers form a Gloo group
and share the GPU (Ray is told not to hide it from them: ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_
DEVICES``); records then cross workers through host memory. The job runs at parallelism
``2 * workers`` (two key-group regions per worker) on the cluster and, for comparison, at the same
parallelism in one process on the same device. Both sides are warmed alike: each query runs once
untimed on ``--warmup-events`` events (default: ``--events``, the timed run's own batch shapes, so
no kernel of the timed run compiles or tunes on either side) in the single process and on the
cluster, then ``--repeats`` timed runs on each (the median counts). The answers must be equal (as
multisets of records). Prints a line per phase and per query:

    q5  single 3.21 M ev/s  cluster 1.02 M ev/s  overhead x3.15  (2 workers, gloo, cuda; 4 subtasks;
        210.4 MB between workers; 4914 records out)  equal

Each query's row is appended to ``<out>.partial.jsonl`` as it finishes; ``--budget-s`` starts no
query once the run's time plus the last query's would pass it (one device call holds the run).
Writes ``benchmarks/results/cluster-nexmark-<device>-w<workers>-<date>.json``. The overhead
is the cost of the distributed path: a Ray call per round per worker, records encoded to Arrow
and moved through the group at every keyed edge, and the sinks' output handed back at the
checkpoints.
"""
from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from bench_rows import RowLog  # noqa: E402

from opforge.cluster.stream_job import ClusterStreamJob  # noqa: E402
from opforge.stream import StreamExecutionEnvironment  # noqa: E402
from opforge.stream.coordinator import MissingUidWarning  # noqa: E402
from opforge.stream.nexmark import QUERIES, NexmarkConfig  # noqa: E402


def _run(query: str, config: NexmarkConfig, args, device: str, parallelism: int, checkpoint_ms: int,
         cluster=None) -> tuple[float, list, object, ClusterStreamJob | None]:
    env = StreamExecutionEnvironment(device=device, parallelism=parallelism, batch_size=args.batch_size,
                                     watermark_granularity=args.watermarks, cluster=cluster)
    if checkpoint_ms:
        env.enable_checkpointing(checkpoint_ms, tempfile.mkdtemp(prefix="opf_nexmark_chk_"))
    sink = QUERIES[query](env, config).collect()
    name = f"nexmark {query}"
    job = None if cluster is None else ClusterStreamJob(env, env._take_graph(name), name)
    t0 = time.perf_counter()
    result = env.execute(name) if job is None else job.run()
    seconds = time.perf_counter() - t0
    return seconds, sorted(map(repr, sink.records())), result, job


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=8 << 20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--queries", default="q5,q7")
    ap.add_argument("--batch-size", type=int, default=1 << 20)
    ap.add_argument("--watermarks", choices=("batch", "record"), default="batch",
                    help="watermark granularity (record: Flink's output at any batch size, much slower)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--checkpoint-ms", type=int, default=0, help="checkpoint interval (0: only the final one)")
    ap.add_argument("--warmup-events", type=int, default=None,
                    help="events of the untimed run per query and side (default: --events; 0: none)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per query and side (median)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="start no query once the elapsed time plus the last query's would pass this")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.queries.split(",") if s.strip()]
    unknown = [q for q in names if q not in QUERIES]
    if unknown:
        raise SystemExit(f"cluster_nexmark: unknown queries {unknown} (known: {', '.join(QUERIES)})")
    if args.repeats < 1:
        raise SystemExit("cluster_nexmark: --repeats must be >= 1")
    warnings.simplefilter("ignore", MissingUidWarning)  # the queries' operators have no uids: one job, no restore

    import torch

    import opforge.cluster as C

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    env_vars = {"OPFORGE_INTERPRET": "0"}
    day = dt.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "results" / f"cluster-nexmark-{device}-w{args.workers}-{day}.json"
    log = RowLog(out, args.budget_s)
    say = log.say
    # on CUDA the cluster picks the group: more workers than GPUs share them over Gloo (cluster.start)
    cluster = C.start(workers=args.workers, backend=None if device == "cuda" else "gloo", env=env_vars)
    started_s = time.perf_counter() - log.begin
    parallelism = cluster.regions_per_table
    why = " (more workers than GPUs: Gloo, records through host memory)" if device == "cuda" and cluster.backend == "gloo" \
        else ""
    say(f"cluster: {cluster.size} workers, group {cluster.backend}{why}, job device {device}, started in "
        f"{started_s:.1f} s; jobs at parallelism {parallelism}, {args.watermarks} watermarks")
    config = NexmarkConfig(events=args.events, events_per_second=max(args.events // 100, 1000))
    warm_events = args.events if args.warmup_events is None else args.warmup_events
    warm = NexmarkConfig(events=warm_events, events_per_second=max(warm_events // 100, 1000))
    try:
        for q in names:
            if not log.start(q):
                continue
            if warm_events:
                for cl in (None, cluster):  # the same untimed run on each side: compiles, tunes, imports
                    _run(q, warm, args, device, parallelism, 0, cl)
                say(f"{q}  warmed on {warm_events} events, both sides")
            single, dist = ([_run(q, config, args, device, parallelism, args.checkpoint_ms, cl)
                             for _ in range(args.repeats)] for cl in (None, cluster))
            single_s, dist_s = statistics.median(r[0] for r in single), statistics.median(r[0] for r in dist)
            _, ref, single_res, _ = single[-1]
            _, ours, dist_res, job = dist[-1]
            events = single_res.source_records
            entry = {"query": q, "events": events, "single_s": single_s, "cluster_s": dist_s,
                     "single_events_per_s": events / single_s, "cluster_events_per_s": dist_res.source_records / dist_s,
                     "overhead": dist_s / single_s, "repeats": args.repeats, "warmup_events": warm_events,
                     "checkpoints": len(dist_res.checkpoints),
                     "bytes_exchanged": job.exchanged["bytes"], "records_exchanged": job.exchanged["records"],
                     "output_records": len(ours), "equal": ours == ref and dist_res.source_records == events}
            log.add(entry)
            say(f"{q}  single {entry['single_events_per_s'] / 1e6:.2f} M ev/s  cluster "
                f"{entry['cluster_events_per_s'] / 1e6:.2f} M ev/s  overhead x{entry['overhead']:.2f}  "
                f"({cluster.size} workers, {cluster.backend}, {device}; {parallelism} subtasks; "
                f"{job.exchanged['bytes'] / 1e6:.1f} MB between workers; {len(ours)} records out)  "
                f"{'equal' if entry['equal'] else 'DIFFERS'}")
    finally:
        cluster.stop()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    return log.finish({"schema_version": 1, "date": day, "gpu": gpu, "device": device,
                       "torch": torch.__version__, "workers": cluster.size, "backend": cluster.backend,
                       "parallelism": parallelism, "batch_size": args.batch_size,
                       "watermark_granularity": args.watermarks, "checkpoint_ms": args.checkpoint_ms,
                       "warmup_events": warm_events, "repeats": args.repeats, "start_s": started_s})


if __name__ == "__main__":
    sys.exit(main())
