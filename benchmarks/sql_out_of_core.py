"""TPC-H through the out-of-core path: opforge under a device memory limit against DuckDB on the same files.

    python benchmarks/sql_out_of_core.py --sf 10 --budget 2GiB --device cuda [--queries 1,3,9]
                                         [--repeats 2] [--duckdb memory|views] [--host-limit 32GiB]
                                         [--skip-duckdb | --duckdb-only | --generate-only]
                                         [--root DIR] [--out PATH]

Generates TPC-H at ``--sf`` with tpchgen-cli on all cores (``sql/tpch/data.py``, cached under
``--root``), registers the Parquet files in an opforge connection with ``memory_limit=--budget``
(scans over the limit read in chunks; joins and aggregations partition and spill, ``sql/outofcore``)
and in DuckDB (``--duckdb memory``: tables loaded into DuckDB's memory, as ``benchmarks/tpch.py``
does; ``views``: views over the files), runs each query ``--repeats`` times on both, checks opforge's
answer against DuckDB's and prints one row per query: opforge's first (cold: Parquet decode into the
host cache, small tables to the device) and best later run in ms, DuckDB's best, DuckDB / opforge
(best runs), bytes spilled to host and to disk (one run), the device's peak allocated bytes during
the query's runs against the limit (cuda: cached columns and planner statistics included), and
whether the answers agree.

Slices, for a device call too short for all of SF100 at once (a killed run keeps its finished rows):

* ``--generate-only``: make the data set (tpchgen-cli with every core) and print the time, nothing else.
* ``--duckdb-only``: DuckDB's runs; each answer is also cached next to the data
  (``tpch/reference.py``) so that a later opforge slice checks against it without DuckDB.
* ``--skip-duckdb``: opforge's runs only, checked against the cached DuckDB answers ("unchecked"
  when a query has none yet).
* ``--summary``: no runs; the rows appended so far to ``--out`` merged per query (the latest
  opforge row and the latest DuckDB row of each) with the totals of both engines.

Each query's row is appended to ``--out`` (JSON lines, default
``benchmarks/results/sql-out-of-core-<device>-sf<sf>-<date>.jsonl``) as soon as it finishes.
Exit status 1 when an answer differs or a query fails."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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


def _arguments(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--budget", default="2GiB", help="device memory limit, e.g. 24GiB")
    ap.add_argument("--host-limit", default=None, help="pinned host memory for spills before disk")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--queries", default="", help="query numbers, e.g. 1,3,9 or 1-11 (default: all 22)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--duckdb", choices=("memory", "views"), default="memory")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--generate-only", action="store_true", help="make the data set, print the time, stop")
    only.add_argument("--duckdb-only", action="store_true", help="DuckDB's runs only (answers cached for later)")
    only.add_argument("--skip-duckdb", action="store_true", help="opforge only, checked against cached answers")
    only.add_argument("--summary", action="store_true", help="merge the rows of --out per query, print totals")
    ap.add_argument("--root", default=None, help="where the TPC-H Parquet files are cached")
    ap.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    return ap.parse_args(argv)


def _numbers(text: str) -> list[int]:
    """'1,3,9' or '1-11,13' (q01 and Q1 too) -> query numbers; empty: all 22."""
    out = []
    for part in (p.strip().replace("q", "").replace("Q", "") for p in text.split(",")):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            out += range(lo, hi + 1)
        elif part:
            out.append(int(part))
    unknown = [n for n in out if n not in queries.NUMBERS]
    if unknown:
        raise SystemExit(f"--queries: no TPC-H query {unknown}")
    return out or list(queries.NUMBERS)


def _timed(fn, repeats: int, device: str) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def _best(times: list[float]) -> float | None:
    """The best run after the first (cold) one, or the only run."""
    return min(times[1:] or times) if times else None


def _append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(argv=None) -> int:
    args = _arguments(argv)
    numbers = _numbers(args.queries)
    budget = parse_size(args.budget)
    out = Path(args.out) if args.out else HERE / "results" / (
        f"sql-out-of-core-{args.device.split(':')[0]}-sf{args.sf:g}-{dt.date.today().isoformat()}.jsonl")
    if args.summary:
        return summary(out, numbers)
    started = time.perf_counter()
    paths = data.generate(args.sf, args.root, threads=os.cpu_count())
    print(f"TPC-H SF{args.sf:g}: files ready in {time.perf_counter() - started:.1f} s "
          f"({os.cpu_count()} generator threads)", flush=True)
    if args.generate_only:
        return 0
    duck = None
    if not args.skip_duckdb:
        duck, load_s = reference.connect(paths, materialize=args.duckdb == "memory")
        print(f"DuckDB tables ({args.duckdb}) ready in {load_s:.1f} s", flush=True)
    con = None
    if not args.duckdb_only:
        con = sql.connect(args.device, memory_limit=budget, spill_host_limit=args.host_limit)
        for name, path in paths.items():
            con.register(name, str(path))

    rows, failed = [], 0
    head = (f"{'query':>5} {'cold ms':>9} {'opforge ms':>11} {'duckdb ms':>10} {'ratio':>6} {'spill host':>11} "
            f"{'spill disk':>11} {'dev peak':>10} {'/limit':>6}  answer")
    print(f"memory_limit {format_size(budget)} on {args.device}, best of {args.repeats}; rows appended to {out}\n"
          f"{head}", flush=True)
    for n in numbers:
        text = queries.query(n)
        row = {"query": n, "sf": args.sf, "memory_limit": budget, "device": args.device,
               "duckdb_tables": None if duck is None else args.duckdb, "repeats": args.repeats,
               "at": dt.datetime.now().isoformat(timespec="seconds")}
        ref, ours, error, times = None, None, None, []
        if duck is not None:
            duck_times, ref = _timed(lambda: reference.run(duck, text), args.repeats, "cpu")
            reference.save_answer(n, args.sf, args.root, ref)
            row.update(duckdb_ms=min(duck_times), duckdb_runs_ms=duck_times)
        else:
            ref = reference.cached_answer(n, args.sf, args.root)
        if con is not None:
            host0, disk0 = spill.TOTALS.host_bytes, spill.TOTALS.disk_bytes
            _peak_reset(args.device)
            try:
                times, ours = _timed(lambda: con.sql(text).to_arrow(), args.repeats, args.device)
            except Exception as e:  # noqa: BLE001 - reported per query, the run goes on
                error = f"{type(e).__name__}: {e}"
            runs = len(times) or 1
            peak = _peak(args.device)
            row.update(opforge_cold_ms=times[0] if times else None, opforge_ms=_best(times), opforge_runs_ms=times,
                       spill_host_bytes=(spill.TOTALS.host_bytes - host0) // runs,
                       spill_disk_bytes=(spill.TOTALS.disk_bytes - disk0) // runs, device_peak_bytes=peak,
                       peak_over_limit=None if peak is None else peak / budget)
            if error is not None:
                answer = "ERROR " + error[:200]
            elif ref is None:
                answer = "unchecked (no cached DuckDB answer: run --duckdb-only first)"
            else:
                keys = compare.order_keys(text)
                diffs = compare.compare(ours, ref, ordered=keys is not None, order_by=keys)
                answer = "ok" if not diffs else "DIFFERS: " + diffs[0][:100]
            failed += answer != "ok" and not answer.startswith("unchecked")
        else:
            answer = "duckdb only"
        best = row.get("opforge_ms")
        if best and row.get("duckdb_ms"):
            row["ratio"] = row["duckdb_ms"] / best
        row["answer"] = answer
        _append(out, row)
        rows.append(row)
        peak = row.get("device_peak_bytes")
        print(f"{'q%02d' % n:>5} {_ms(row.get('opforge_cold_ms')):>9} {_ms(best):>11} {_ms(row.get('duckdb_ms')):>10} "
              f"{_num(row.get('ratio')):>6} {_size(row.get('spill_host_bytes')):>11} "
              f"{_size(row.get('spill_disk_bytes')):>11} {_size(peak):>10} {_num(row.get('peak_over_limit')):>6}  "
              f"{answer}", flush=True)
    both = [r for r in rows if r["answer"] == "ok" and r.get("duckdb_ms") is not None]
    if both:
        ours_ms, duck_ms = sum(r["opforge_ms"] for r in both), sum(r["duckdb_ms"] for r in both)
        print(f"total over {len(both)} correct queries: opforge {ours_ms:.0f} ms, DuckDB {duck_ms:.0f} ms, "
              f"DuckDB / opforge {duck_ms / ours_ms:.2f}")
    if con is not None:
        print(f"{sum(r['answer'] == 'ok' for r in rows)} of {len(rows)} answers equal DuckDB's")
    print(f"appended {len(rows)} rows to {out}")
    return 1 if failed else 0


def summary(path: Path, numbers: list[int]) -> int:
    """The slices' rows merged: per query the latest opforge row and the latest DuckDB row."""
    ours, duck = {}, {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("opforge_ms") is not None or str(row.get("answer", "")).startswith("ERROR"):
            ours[row["query"]] = row
        if row.get("duckdb_ms") is not None:
            duck[row["query"]] = row
    print(f"{'query':>5} {'opforge ms':>11} {'duckdb ms':>10} {'ratio':>6} {'dev peak':>10} {'/limit':>6}  answer")
    total_ours = total_duck = 0.0
    ok = 0
    for n in numbers:
        o, d = ours.get(n, {}), duck.get(n, {})
        mine, theirs = o.get("opforge_ms"), d.get("duckdb_ms")
        answer = o.get("answer", "not run")
        ratio = theirs / mine if mine and theirs else None
        if answer == "ok" and theirs is not None:
            ok += 1
            total_ours += mine
            total_duck += theirs
        print(f"{'q%02d' % n:>5} {_ms(mine):>11} {_ms(theirs):>10} {_num(ratio):>6} "
              f"{_size(o.get('device_peak_bytes')):>10} {_num(o.get('peak_over_limit')):>6}  {answer}")
    if ok:
        print(f"total over {ok} correct queries: opforge {total_ours:.0f} ms, DuckDB {total_duck:.0f} ms, "
              f"DuckDB / opforge {total_duck / total_ours:.2f}")
    print(f"{ok} of {len(numbers)} queries correct with both timings")
    return 0 if ok == len(numbers) else 1


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _size(v) -> str:
    return "-" if v is None else format_size(v)


if __name__ == "__main__":
    sys.exit(main())
