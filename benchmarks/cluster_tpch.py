"""TPC-H on an opforge cluster (Ray workers, data over NCCL / Gloo) against the single-process engine.

    python benchmarks/cluster_tpch.py --sf 10 [--workers N] [--queries 1,3,6,12,14|all] [--warmup 1]
                                      [--repeats 3] [--budget-s 480] [--device cuda|cpu] [--out PATH]

Starts a local Ray instance and ``--workers`` worker actors (default: one per GPU; NCCL allows one
rank per GPU, so one H200 takes one worker), registers the TPC-H tables on the cluster (orders /
lineitem partitioned on the order key, customer / part on theirs, the rest by row ranges, two
replicas per region where there are two workers), and on the same host a single-process
connection over the same files. Both sides are warmed alike: each query runs ``--warmup`` times
untimed on the single process, then on the cluster (kernels compiled, shapes tuned in each
process), then ``--repeats`` timed runs on each; the median counts. The distributed answer is
checked against the single-process one (``tpch/compare.py``). Prints a line per phase and per query:

    q01  single 12.3 ms  cluster 45.6 ms  overhead x3.71  rows 4  exchanges 2 (1.2 MB)  equal  [37 s]

Each query's row is appended to ``<out>.partial.jsonl`` as it finishes (a run cut short by the
device call's limit keeps them); ``--budget-s`` starts no query once the run's time plus the last
query's would pass it, so the run ends (JSON written, cluster stopped) inside one call. Writes
``benchmarks/results/cluster-tpch-<device>-sf<sf>-w<workers>-<date>.json``. The overhead is the
distributed path's cost where nothing needs distributing (Ray calls, the plan shipped to the
workers, exchanges, the result gathered through Ray).
"""
from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from bench_rows import RowLog  # noqa: E402

from opforge import sql  # noqa: E402
from opforge.sql.tpch import compare, data, queries  # noqa: E402

KEYS = {"orders": "o_orderkey", "lineitem": "l_orderkey", "customer": "c_custkey", "part": "p_partkey",
        "partsupp": "ps_partkey", "supplier": "s_suppkey"}


def _timed(fn, warmup: int, repeats: int) -> tuple[float, object]:
    """Median ms of ``repeats`` runs after ``warmup`` untimed ones; the last answer."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def parse_queries(text: str) -> list[int]:
    if text == "all":
        return list(queries.NUMBERS)
    numbers = [int(q.strip().lower().lstrip("q")) for q in text.split(",") if q.strip()]
    bad = [n for n in numbers if n not in queries.NUMBERS]
    if bad:
        raise SystemExit(f"cluster_tpch: no TPC-H query {bad} (1..22)")
    return numbers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--queries", default="1,3,6,12,14", help="comma-separated numbers, or all")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per query and side")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per query and side (median)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="start no query once the elapsed time plus the last query's would pass this")
    ap.add_argument("--device", default=None)
    ap.add_argument("--root", default=None, help="where TPC-H data is generated (cached)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.repeats < 1:
        raise SystemExit("cluster_tpch: --warmup must be >= 0 and --repeats >= 1")
    numbers = parse_queries(args.queries)

    import torch

    import opforge.cluster as C

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    day = dt.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "results" / f"cluster-tpch-{device}-sf{args.sf:g}-w{args.workers or 'auto'}-{day}.json"
    log = RowLog(out, args.budget_s)
    say = log.say
    paths = data.generate(args.sf, args.root)
    say(f"TPC-H SF{args.sf:g} data ready")
    t0 = time.perf_counter()
    cluster = C.start(workers=args.workers, backend=None if device == "cuda" else "gloo")
    started_s = time.perf_counter() - t0
    say(f"cluster: {cluster.size} workers ({cluster.backend}; computing on {', '.join(cluster.devices)}), "
        f"started in {started_s:.1f} s")
    single = sql.connect(device=device)
    dist = sql.connect(device=device, cluster=cluster)
    t0 = time.perf_counter()
    for name, p in paths.items():
        single.register(name, str(p))
    single_load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for name, p in paths.items():
        dist.register(name, str(p), partition_by=KEYS.get(name))
    load_s = time.perf_counter() - t0
    say(f"tables registered: single process {single_load_s:.1f} s, cluster {load_s:.1f} s "
        f"({len(cluster.regions)} regions)")
    try:
        for n in numbers:
            if not log.start(queries.name(n)):
                continue
            text = queries.query(n)
            single_ms, ref = _timed(lambda: single.sql(text).to_arrow(), args.warmup, args.repeats)
            dist_ms, ours = _timed(lambda: dist.sql(text).to_arrow(), args.warmup, args.repeats)
            keys = compare.order_keys(text)
            diffs = compare.compare(ours, ref, ordered=keys is not None, order_by=keys)
            ex = [e for w in cluster.last_query["workers"] for e in w["exchanges"]]
            moved = sum(e["bytes_sent"] for e in ex)
            entry = {"query": queries.name(n), "single_ms": single_ms, "cluster_ms": dist_ms,
                     "overhead": dist_ms / single_ms, "rows": ours.num_rows, "exchanges": len(ex),
                     "bytes_exchanged": moved, "equal": not diffs,
                     "per_worker_ms": [w["ms"] for w in cluster.last_query["workers"]]}
            log.add(entry)
            say(f"{queries.name(n)}  single {single_ms:.1f} ms  cluster {dist_ms:.1f} ms  overhead x"
                f"{dist_ms / single_ms:.2f}  rows {ours.num_rows}  exchanges {len(ex)} ({moved / 1e6:.1f} MB)  "
                f"{'equal' if not diffs else 'DIFFERS: ' + diffs[0]}")
    finally:
        cluster.stop()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    return log.finish({"schema_version": 1, "date": day, "gpu": gpu, "device": device,
                       "torch": torch.__version__, "sf": args.sf, "workers": cluster.size, "backend": cluster.backend,
                       "warmup": args.warmup, "repeats": args.repeats, "start_s": started_s, "load_s": load_s,
                       "single_load_s": single_load_s})


if __name__ == "__main__":
    sys.exit(main())
