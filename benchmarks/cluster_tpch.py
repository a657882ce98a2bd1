"""TPC-H on an opforge cluster (Ray workers, data over NCCL / Gloo) against the single-process engine.

    python benchmarks/cluster_tpch.py --sf 10 [--workers N] [--queries 1,3,6,12,14|all] [--repeats 3]
                                      [--device cuda|cpu] [--out PATH]

Starts a local Ray instance and ``--workers`` worker actors (default: one per GPU; NCCL allows one
rank per GPU, so one H200 takes one worker), registers the TPC-H tables on the cluster (orders /
lineitem partitioned on the order key, customer / part on theirs, the rest by row ranges, two
replicas per region where there are two workers), and on the same host a single-process
connection over the same files. Each query runs warm ``--repeats`` times on both; the distributed
answer is checked against the single-process one (``tpch/compare.py``). Prints one line per query:

    q01  single 12.3 ms  cluster 45.6 ms  overhead x3.71  rows 4  exchanges 2 (1.2 MB)  equal

and writes ``benchmarks/results/cluster-tpch-<device>-sf<sf>-w<workers>-<date>.json``. The
overhead is the distributed path's cost where nothing needs distributing (Ray calls, the plan
shipped to the workers, exchanges, the result gathered through Ray).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from opforge import sql  # noqa: E402
from opforge.sql.tpch import compare, data, queries  # noqa: E402

KEYS = {"orders": "o_orderkey", "lineitem": "l_orderkey", "customer": "c_custkey", "part": "p_partkey",
        "partsupp": "ps_partkey", "supplier": "s_suppkey"}


def _timed(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--queries", default="1,3,6,12,14")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--root", default=None, help="where TPC-H data is generated (cached)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch

    import opforge.cluster as C

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = data.generate(args.sf, args.root)
    numbers = list(queries.NUMBERS) if args.queries == "all" else [
        int(q.strip().lstrip("q")) for q in args.queries.split(",") if q.strip()]
    t0 = time.perf_counter()
    cluster = C.start(workers=args.workers, backend=None if device == "cuda" else "gloo")
    started_s = time.perf_counter() - t0
    single = sql.connect(device=device)
    dist = sql.connect(device=device, cluster=cluster)
    t0 = time.perf_counter()
    for name, p in paths.items():
        single.register(name, str(p))
        dist.register(name, str(p), partition_by=KEYS.get(name))
    load_s = time.perf_counter() - t0
    print(f"cluster: {cluster.size} workers ({cluster.backend}), started in {started_s:.1f} s, tables placed in "
          f"{load_s:.1f} s; {len(cluster.regions)} regions", flush=True)
    entries = []
    for n in numbers:
        text = queries.query(n)
        single_ms, ref = _timed(lambda: single.sql(text).to_arrow(), args.repeats)
        dist_ms, ours = _timed(lambda: dist.sql(text).to_arrow(), args.repeats)
        keys = compare.order_keys(text)
        diffs = compare.compare(ours, ref, ordered=keys is not None, order_by=keys)
        ex = [e for w in cluster.last_query["workers"] for e in w["exchanges"]]
        moved = sum(e["bytes_sent"] for e in ex)
        entries.append({"query": queries.name(n), "single_ms": single_ms, "cluster_ms": dist_ms,
                        "overhead": dist_ms / single_ms, "rows": ours.num_rows, "exchanges": len(ex),
                        "bytes_exchanged": moved, "equal": not diffs,
                        "per_worker_ms": [w["ms"] for w in cluster.last_query["workers"]]})
        print(f"{queries.name(n)}  single {single_ms:.1f} ms  cluster {dist_ms:.1f} ms  overhead x"
              f"{dist_ms / single_ms:.2f}  rows {ours.num_rows}  exchanges {len(ex)} ({moved / 1e6:.1f} MB)  "
              f"{'equal' if not diffs else 'DIFFERS: ' + diffs[0]}", flush=True)
    cluster.stop()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    result = {"schema_version": 1, "date": dt.date.today().isoformat(), "gpu": gpu, "device": device,
              "torch": torch.__version__, "sf": args.sf, "workers": cluster.size, "backend": cluster.backend,
              "start_s": started_s, "load_s": load_s, "entries": entries}
    out = Path(args.out) if args.out else HERE / "results" / (
        f"cluster-tpch-{device}-sf{args.sf:g}-w{cluster.size}-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0 if all(e["equal"] for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
