"""One worker failing alone on an opforge cluster: how fast the query's error comes back, and the
next query's answer (the check of ``Cluster._collect`` on NCCL, which CI's Gloo cannot run).

    python benchmarks/cluster_failure.py [--workers N] [--sf 1] [--query 3] [--device cuda|cpu] [--out PATH]

Starts a cluster (default: one worker per GPU, NCCL; Gloo on the CPU), registers TPC-H at ``--sf``,
runs ``--query`` once on the cluster and once in a single process (warm-up, and the reference
answer). Then for each worker ``i``: ``inject_failure(i)`` makes its next call raise while its
peers wait for it in the query's collectives; the error must name worker ``i`` and arrive within
``--limit-s``; the query is run again (the cluster recovers first) and must equal the
single-process answer. Prints one line per worker:

    worker 1  error in 0.41 s (RetryableError, names it)  next query 2.10 s (recovery included)  equal

and writes ``benchmarks/results/cluster-failure-<device>-w<workers>-<date>.json``. Exit status 1
when an error came late, did not name its worker, or an answer differed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from opforge import sql  # noqa: E402
from opforge.sql.tpch import compare, data, queries  # noqa: E402

from cluster_tpch import KEYS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--query", type=int, default=3, choices=queries.NUMBERS)
    ap.add_argument("--limit-s", type=float, default=10.0, help="the longest an error may take to come back")
    ap.add_argument("--device", default=None)
    ap.add_argument("--root", default=None, help="where TPC-H data is generated (cached)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch

    import opforge.cluster as C

    begin = time.perf_counter()

    def say(text: str) -> None:
        print(f"{text}  [{time.perf_counter() - begin:.0f} s]", flush=True)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = data.generate(args.sf, args.root)
    cluster = C.start(workers=args.workers, backend=None if device == "cuda" else "gloo")
    say(f"cluster: {cluster.size} workers ({cluster.backend})")
    single = sql.connect(device=device)
    dist = sql.connect(device=device, cluster=cluster)
    for name, p in paths.items():
        single.register(name, str(p))
        dist.register(name, str(p), partition_by=KEYS.get(name))
    text = queries.query(args.query)
    keys = compare.order_keys(text)
    ref = single.sql(text).to_arrow()
    dist.sql(text).to_arrow()  # warm-up: the failures' timings hold no first compile
    say(f"TPC-H SF{args.sf:g} placed, {queries.name(args.query)} warmed")
    entries = []
    try:
        for i in range(cluster.size):
            cluster.inject_failure(i, "failure injected by cluster_failure.py")
            t0 = time.perf_counter()
            try:
                dist.sql(text).to_arrow()
                error = None
            except Exception as e:  # what a user gets
                error = e
            error_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            diffs = compare.compare(dist.sql(text).to_arrow(), ref, ordered=keys is not None, order_by=keys)
            next_s = time.perf_counter() - t0
            named = error is not None and f"worker {i} " in str(error)
            entry = {"worker": i, "error": None if error is None else f"{type(error).__name__}: {error}",
                     "error_s": error_s, "names_worker": named, "next_query_s": next_s, "equal": not diffs,
                     "ok": named and error_s < args.limit_s and not diffs}
            entries.append(entry)
            say(f"worker {i}  error in {error_s:.2f} s ({type(error).__name__}, "
                f"{'names it' if named else 'DOES NOT NAME IT'})  next query {next_s:.2f} s (recovery included)  "
                f"{'equal' if not diffs else 'DIFFERS: ' + diffs[0]}")
    finally:
        cluster.stop()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    day = dt.date.today().isoformat()
    result = {"schema_version": 1, "date": day, "gpu": gpu, "device": device, "torch": torch.__version__,
              "sf": args.sf, "query": queries.name(args.query), "workers": cluster.size, "backend": cluster.backend,
              "limit_s": args.limit_s, "entries": entries}
    out = Path(args.out) if args.out else HERE / "results" / f"cluster-failure-{device}-w{cluster.size}-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    say(f"wrote {out}")
    return 0 if entries and all(e["ok"] for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
