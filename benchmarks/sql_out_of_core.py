"""TPC-H through the out-of-core path: opforge under a device memory limit against DuckDB on the same files.

    python benchmarks/sql_out_of_core.py --sf 10 --budget 2GiB --device cuda [--queries 1,3,9]
                                         [--repeats 2] [--duckdb memory|views] [--host-limit 32GiB]
                                         [--root DIR] [--out PATH]

Generates TPC-H at ``--sf`` with tpchgen-cli (``sql/tpch/data.py``, cached under ``--root``),
registers the Parquet files in an opforge connection with ``memory_limit=--budget`` (scans over the
limit read in chunks; joins and aggregations partition and spill, ``sql/outofcore``) and in DuckDB
(``--duckdb memory``: tables loaded into DuckDB's memory, as ``benchmarks/tpch.py`` does; ``views``:
views over the files), runs each query ``--repeats`` times on both, checks opforge's answer against
DuckDB's and prints one row per query: opforge's first (cold: Parquet decode into the host cache,
small tables to the device) and best later run in ms, DuckDB's best, DuckDB / opforge (best runs),
bytes spilled to host and to disk (one run), the device's peak allocated bytes during the query's
runs (cuda: cached columns and planner statistics included, to hold against the limit), and whether
the answers agree. Writes the rows as JSON to ``--out`` (default
``benchmarks/results/sql-out-of-core-<device>-sf<sf>-<date>.json``). Exit status 1 when an answer
differs or a query fails."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from opforge import sql  # noqa: E402
from opforge.sql.outofcore import spill  # noqa: E402
from opforge.sql.outofcore.sizes import format_size, parse_size  # noqa: E402
from opforge.sql.tpch import compare, data, queries, reference  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int | None:
    """Device bytes allocated at the peak since the last reset (tables' cached columns and the
    planner's statistics included: what the limit is measured against)."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.max_memory_allocated()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--budget", default="2GiB", help="device memory limit, e.g. 24GiB")
    ap.add_argument("--host-limit", default=None, help="pinned host memory for spills before disk")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--queries", default="", help="comma-separated query numbers (default: all 22)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--duckdb", choices=("memory", "views"), default="memory")
    ap.add_argument("--root", default=None, help="where the TPC-H Parquet files are cached")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    numbers = [int(q.strip().lstrip("qQ")) for q in args.queries.split(",") if q.strip()] or list(queries.NUMBERS)
    budget = parse_size(args.budget)

    started = time.perf_counter()
    paths = data.generate(args.sf, args.root)
    print(f"TPC-H SF{args.sf:g}: files ready in {time.perf_counter() - started:.1f} s", flush=True)
    duck, load_s = reference.connect(paths, materialize=args.duckdb == "memory")
    print(f"DuckDB tables ({args.duckdb}) ready in {load_s:.1f} s", flush=True)
    con = sql.connect(args.device, memory_limit=budget, spill_host_limit=args.host_limit)
    for name, path in paths.items():
        con.register(name, str(path))

    rows, failed = [], 0
    head = (f"{'query':>5} {'cold ms':>9} {'opforge ms':>11} {'duckdb ms':>10} {'ratio':>6} {'spill host':>11} "
            f"{'spill disk':>11} {'dev peak':>10}  answer")
    print(f"memory_limit {format_size(budget)} on {args.device}, best of {args.repeats}\n{head}", flush=True)
    for n in numbers:
        text = queries.query(n)
        host0, disk0 = spill.TOTALS.host_bytes, spill.TOTALS.disk_bytes
        error, times, ours = None, [], None
        _peak_reset(args.device)
        try:
            for _ in range(max(1, args.repeats)):
                _sync(args.device)
                t0 = time.perf_counter()
                ours = con.sql(text).to_arrow()
                _sync(args.device)
                times.append((time.perf_counter() - t0) * 1e3)
        except Exception as e:  # noqa: BLE001 - reported per query, the run goes on
            error = f"{type(e).__name__}: {e}"
        runs = len(times) or 1
        peak = _peak(args.device)
        duck_times = []
        for _ in range(max(1, args.repeats)):
            t0 = time.perf_counter()
            ref = reference.run(duck, text)
            duck_times.append((time.perf_counter() - t0) * 1e3)
        if error is None:
            keys = compare.order_keys(text)
            diffs = compare.compare(ours, ref, ordered=keys is not None, order_by=keys)
            answer = "ok" if not diffs else "DIFFERS: " + diffs[0][:100]
        else:
            answer = "ERROR " + error[:200]
        failed += answer != "ok"
        best = min(times[1:] or times) if times else float("nan")
        duck_ms = min(duck_times)
        row = {"query": n, "opforge_cold_ms": times[0] if times else None, "opforge_ms": best,
               "opforge_runs_ms": times, "duckdb_ms": duck_ms, "duckdb_runs_ms": duck_times,
               "ratio": duck_ms / best if times else None,
               "spill_host_bytes": (spill.TOTALS.host_bytes - host0) // runs,
               "spill_disk_bytes": (spill.TOTALS.disk_bytes - disk0) // runs, "device_peak_bytes": peak,
               "answer": answer}
        rows.append(row)
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        cold = f"{times[0]:9.1f}" if times else f"{'-':>9}"
        print(f"{'q%02d' % n:>5} {cold} {best:11.1f} {duck_ms:10.1f} {ratio:>6} "
              f"{format_size(row['spill_host_bytes']):>11} {format_size(row['spill_disk_bytes']):>11} "
              f"{format_size(peak) if peak is not None else '-':>10}  {answer}",
              flush=True)
    ok = [r for r in rows if r["answer"] == "ok"]
    total_ours, total_duck = sum(r["opforge_ms"] for r in ok), sum(r["duckdb_ms"] for r in ok)
    if ok:
        print(f"total over {len(ok)} correct queries: opforge {total_ours:.0f} ms, DuckDB {total_duck:.0f} ms, "
              f"DuckDB / opforge {total_duck / total_ours:.2f}")
    print(f"{len(rows) - failed} of {len(rows)} answers equal DuckDB's")
    out = Path(args.out) if args.out else HERE / "results" / (
        f"sql-out-of-core-{args.device.split(':')[0]}-sf{args.sf:g}-{dt.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sf": args.sf, "memory_limit": budget, "device": args.device,
                               "duckdb_tables": args.duckdb, "repeats": args.repeats, "queries": rows},
                              indent=2) + "\n")
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
