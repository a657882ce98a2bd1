"""TPC-H through the out-of-core path: opforge under a device memory limit against DuckDB on the same files.

    python benchmarks/sql_out_of_core.py --sf 10 --budget 2GiB --device cuda [--queries 1,3,9]
                                         [--repeats 2] [--duckdb memory|views] [--host-limit 32GiB]
                                         [--query-limit 300] [--time-budget 560] [--redo]
                                         [--skip-duckdb | --duckdb-only | --generate-only | --summary]
                                         [--root DIR] [--out PATH] [--profile DIR [--profile-queries 1,13]]

Generates TPC-H at ``--sf`` with tpchgen-cli on all cores (``sql/tpch/data.py``, cached under
``--root``), registers the Parquet files in an opforge connection with ``memory_limit=--budget``
(scans over the limit read in chunks; joins and aggregations partition and spill, ``sql/outofcore``)
and in DuckDB (``--duckdb memory``: tables loaded into DuckDB's memory, as ``benchmarks/tpch.py``
does; ``views``: views over the files), runs each query ``--repeats`` times on both, checks opforge's
answer against DuckDB's and prints one row per query: opforge's first (cold: Parquet decode into the
host cache, small tables to the device) and best later run in ms, DuckDB's best, DuckDB / opforge
(best runs), bytes spilled to host and to disk (one run), the device's peak allocated bytes during
the query's runs against the limit (cuda: cached columns and planner statistics included; the row's
``device_base_bytes`` is what was allocated when the query started), and whether the answers agree.

Built for device calls too short for all of SF100 at once, each resumable:

* Each query's row is appended to ``--out`` (JSON lines, default
  ``benchmarks/results/sql-out-of-core-<device>-sf<sf>-<date>.jsonl``) as soon as it finishes; a
  rerun skips the queries ``--out`` already holds (opforge's at this limit and device; DuckDB's while
  its cached answer is still next to the data), ``--redo`` runs them again.
* ``--query-limit``: seconds one query may take per engine (its repeats together). DuckDB's is
  interrupted; opforge's queries run in a worker process, killed past the limit (a fresh one takes
  the next query): the row says TIMEOUT. ``--time-budget``: seconds for the whole call; no query
  starts with less than ``MIN_QUERY_S`` left, and one cut short by it is not recorded (the same
  command runs it next time).
* Generation is resumable too: a killed call keeps the tables it finished (``data.generate``).
* ``--generate-only``: make the data set (tpchgen-cli with every core), print where the time went.
* ``--duckdb-only``: DuckDB's runs; each answer is also cached next to the data
  (``tpch/reference.py``) so that a later opforge slice checks against it without DuckDB.
* ``--skip-duckdb``: opforge's runs only, checked against the cached DuckDB answers ("unchecked"
  when a query has none yet: not counted as done).
* ``--summary``: no runs; the rows appended so far to ``--out`` merged per query (the latest
  opforge row and the latest DuckDB row of each) with the totals of both engines.

SF100 on a device machine whose calls last 10 minutes (the data under an ignored ``out/``, kept while
the machine stays warm: the next call must follow within its idle release, 30 s, so run them from
the main session, not a helper; ``B="python3 benchmarks/sql_out_of_core.py --sf 100 --budget 24GiB
--device cuda --duckdb views --root out/tpch --out out/ooc-sf100.jsonl --time-budget 540"``):
``$B --duckdb-only --query-limit 200`` (generation, then DuckDB; repeated until it skips all 22), then
``$B --skip-duckdb --query-limit 240`` until it skips all 22, each call copying ``--out`` under
``$OUT``; ``$B --summary`` anywhere. DuckDB reads the files (``views``): its tables loaded into memory
made q09 and q10 spill more than the 30 GB the disk had left beside the data (2026-12-03). With
``OPFORGE_SQL_HOST_CACHE=64GiB`` (half of that machine's memory) the decoded lineitem columns of most
queries stay in opforge's host cache from one query to the next, as DuckDB's buffer manager keeps
what it read (up to 80 % of the memory by default).

Exit status 1 when an answer differs, a query fails or times out."""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

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


def _peak_reset(device: str) -> int | None:
    """Resets the device's peak; returns the bytes allocated now (what earlier queries left there:
    cached columns, dictionaries), so that a row's peak splits into those and the query's own."""
    if not device.startswith("cuda"):
        return None
    import torch

    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


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
    ap.add_argument("--query-limit", type=float, default=300.0,
                    help="seconds a query may take per engine (all its repeats), then it is stopped")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds this call may take (generation included): no query starts after it")
    ap.add_argument("--redo", action="store_true", help="run queries already in --out again")
    ap.add_argument("--root", default=None, help="where the TPC-H Parquet files are cached")
    ap.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="after its runs, profile one more run of each query into DIR/qNN.txt (EXPLAIN ANALYZE, "
                         "the device's kernels and copies, the host's functions)")
    ap.add_argument("--profile-queries", default="", help="the queries --profile profiles (default: all run)")
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


def _rows(path: Path) -> list[dict]:
    """The rows appended to ``path`` so far (a line cut short by a killed run is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _finished(path: Path, args, budget: int) -> tuple[set[int], set[int]]:
    """Queries already run at this scale factor: opforge's (at this limit on this device, with an
    answer checked, a failure or a time-out) and DuckDB's (whose answer is still cached next to the
    data: a fresh machine lost it with the data set)."""
    ours, duck = set(), set()
    for row in _rows(path):
        if row.get("sf") != args.sf:
            continue
        if ("opforge_runs_ms" in row and row.get("memory_limit") == budget and row.get("device") == args.device
                and not str(row.get("answer", "")).startswith("unchecked")):
            ours.add(row["query"])
        if row.get("duckdb_ms") is not None and row.get("duckdb_tables") == args.duckdb \
                and reference.cached_answer(row["query"], args.sf, args.root) is not None:
            duck.add(row["query"])
    return ours, duck


@contextlib.contextmanager
def _interrupted_after(con, seconds: float):
    """DuckDB's running query interrupted after ``seconds`` (it raises duckdb.InterruptException)."""
    timer = threading.Timer(seconds, con.interrupt)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _duckdb_query(duck, n: int, args, limit: float) -> dict:
    """DuckDB's runs of query ``n`` (its answer cached next to the data), stopped after ``limit`` s."""
    text = queries.query(n)
    try:
        with _interrupted_after(duck, limit):
            times, ref = _timed(lambda: reference.run(duck, text), args.repeats, "cpu")
    except Exception as e:  # noqa: BLE001 - reported per query, the run goes on
        return {"duckdb_error": f"TIMEOUT after {limit:.0f} s" if type(e).__name__ == "InterruptException"
                else f"{type(e).__name__}: {str(e)[:200]}"}
    reference.save_answer(n, args.sf, args.root, ref)
    return {"duckdb_ms": min(times), "duckdb_runs_ms": times}


def _opforge_query(con, n: int, args, budget: int) -> dict:
    """opforge's runs of query ``n``, checked against DuckDB's cached answer (in the worker)."""
    text = queries.query(n)
    ref = reference.cached_answer(n, args.sf, args.root)
    host0, disk0 = spill.TOTALS.host_bytes, spill.TOTALS.disk_bytes
    base = _peak_reset(args.device)
    ours, error, times = None, None, []
    try:
        times, ours = _timed(lambda: con.sql(text).to_arrow(), args.repeats, args.device)
    except Exception as e:  # noqa: BLE001 - reported per query, the run goes on
        error = f"{type(e).__name__}: {e}"
    runs = len(times) or 1
    peak = _peak(args.device)
    row = dict(opforge_cold_ms=times[0] if times else None, opforge_ms=_best(times), opforge_runs_ms=times,
               spill_host_bytes=(spill.TOTALS.host_bytes - host0) // runs,
               spill_disk_bytes=(spill.TOTALS.disk_bytes - disk0) // runs, device_peak_bytes=peak,
               device_base_bytes=base, peak_over_limit=None if peak is None else peak / budget)
    if args.profile and error is None and (not args.profile_queries or n in _numbers(args.profile_queries)):
        _profile(con, n, text, args.device, Path(args.profile))
    if error is not None:
        row["answer"] = "ERROR " + error[:200]
    elif ref is None:
        row["answer"] = "unchecked (no cached DuckDB answer: run --duckdb-only first)"
    else:
        keys = compare.order_keys(text)
        diffs = compare.compare(ours, ref, ordered=keys is not None, order_by=keys)
        row["answer"] = "ok" if not diffs else "DIFFERS: " + diffs[0][:100]
    return row


def _profile(con, n: int, text: str, device: str, folder: Path) -> None:
    """Where one warm run of query ``n`` spends its time, written to ``folder/qNN.txt``: the
    operators (EXPLAIN ANALYZE), the device's kernels and copies (torch.profiler) and the host's
    functions (cProfile, by cumulative time)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    parts = [con.sql(text).explain(analyze=True)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        con.sql(text).to_arrow()
        _sync(device)
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    parts.append(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))
    host = cProfile.Profile()
    host.enable()
    con.sql(text).to_arrow()
    _sync(device)
    host.disable()
    out = io.StringIO()
    pstats.Stats(host, stream=out).sort_stats("cumulative").print_stats(45)
    parts.append(out.getvalue())
    (folder / f"q{n:02d}.txt").write_text("\n\n".join(parts))


def _worker(pipe, args, budget: int, paths: dict) -> None:
    """The process opforge's queries run in: one connection for all of them (its host cache and
    device columns stay warm from query to query); killed when a query runs past its limit."""
    con = sql.connect(args.device, memory_limit=budget, spill_host_limit=args.host_limit)
    for name, path in paths.items():
        con.register(name, str(path))
    pipe.send("ready")  # the start (imports, CUDA) is not any query's time
    while (n := pipe.recv()) is not None:
        pipe.send(_opforge_query(con, n, args, budget))


MIN_QUERY_S = 20.0  # under this much of --time-budget left, no query starts
WORKER_START_S = 300.0


class _Opforge:
    """opforge's side in a worker process, so that a query past ``--query-limit`` is stopped (the
    process killed, a fresh one started for the next query) without losing the call."""

    def __init__(self, args, budget: int, paths: dict):
        self.spec, self.proc, self.pipe = (args, budget, paths), None, None

    def start(self) -> None:
        if self.proc is not None:
            return
        ctx = mp.get_context("spawn")  # CUDA in a fresh process
        self.pipe, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(theirs, *self.spec), daemon=True)
        self.proc.start()
        theirs.close()
        if not self.pipe.poll(WORKER_START_S) or self.pipe.recv() != "ready":
            raise RuntimeError(f"the opforge worker process did not start in {WORKER_START_S:g} s")

    def run(self, n: int, limit: Callable[[], float]) -> tuple[dict, float]:
        """Query ``n``'s row and the limit it ran under (``limit()``, asked once the worker is up)."""
        self.start()
        seconds = limit()
        self.pipe.send(n)
        if not self.pipe.poll(seconds):
            self.close(kill=True)
            return {"opforge_runs_ms": [], "answer": f"TIMEOUT after {seconds:.0f} s"}, seconds
        try:
            return self.pipe.recv(), seconds
        except EOFError:
            self.proc.join(5)
            code = self.proc.exitcode
            self.close(kill=True)
            return {"opforge_runs_ms": [], "answer": f"ERROR the worker process died (exit code {code})"}, seconds

    def close(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.pipe.send(None)
        self.proc.join(30)
        self.proc, self.pipe = None, None


def main(argv=None) -> int:
    args = _arguments(argv)
    numbers = _numbers(args.queries)
    budget = parse_size(args.budget)
    out = Path(args.out) if args.out else HERE / "results" / (
        f"sql-out-of-core-{args.device.split(':')[0]}-sf{args.sf:g}-{dt.date.today().isoformat()}.jsonl")
    if args.summary:
        return summary(out, numbers, args.sf)
    started = time.perf_counter()
    paths = data.generate(args.sf, args.root, threads=os.cpu_count())
    _print_generation(paths, time.perf_counter() - started)
    if args.generate_only:
        return 0
    ours_done, duck_done = (set(), set()) if args.redo else _finished(out, args, budget)
    todo = [n for n in numbers if (not args.skip_duckdb and n not in duck_done)
            or (not args.duckdb_only and n not in ours_done)]
    if len(todo) < len(numbers):
        print(f"already in {out} (skipped; --redo runs them again): "
              f"{', '.join('q%02d' % n for n in numbers if n not in todo)}", flush=True)
    duck = None
    if not args.skip_duckdb and any(n not in duck_done for n in todo):
        duck, load_s = reference.connect(paths, materialize=args.duckdb == "memory")
        print(f"DuckDB tables ({args.duckdb}) ready in {load_s:.1f} s", flush=True)
    ours = None if args.duckdb_only else _Opforge(args, budget, paths)

    rows, failed = [], 0
    head = (f"{'query':>5} {'cold ms':>9} {'opforge ms':>11} {'duckdb ms':>10} {'ratio':>6} {'spill host':>11} "
            f"{'spill disk':>11} {'dev peak':>10} {'/limit':>6}  answer")
    print(f"memory_limit {format_size(budget)} on {args.device}, best of {args.repeats}, at most "
          f"{args.query_limit:g} s a query per engine; rows appended to {out}\n{head}", flush=True)

    def limit() -> float:  # seconds the next engine's runs may take
        if args.time_budget is None:
            return args.query_limit
        return min(args.query_limit, args.time_budget - (time.perf_counter() - started))

    for n in todo:
        if limit() < min(MIN_QUERY_S, args.query_limit):
            print(f"--time-budget spent: stopped before q{n:02d}; the same command goes on from there", flush=True)
            break
        row = {"query": n, "sf": args.sf, "memory_limit": budget, "device": args.device,
               "duckdb_tables": None if duck is None else args.duckdb, "repeats": args.repeats,
               "query_limit_s": args.query_limit, "at": dt.datetime.now().isoformat(timespec="seconds")}
        cut = False  # a run stopped by --time-budget rather than by its own limit
        if duck is not None and n not in duck_done:
            seconds = limit()
            row.update(_duckdb_query(duck, n, args, seconds))
            cut = "TIMEOUT" in row.get("duckdb_error", "") and seconds < args.query_limit
        if ours is not None and n not in ours_done and not cut:
            got, seconds = ours.run(n, limit)
            row.update(got)
            cut = row["answer"].startswith("TIMEOUT") and seconds < args.query_limit
            failed += row["answer"] != "ok" and not row["answer"].startswith("unchecked") and not cut
        elif "answer" not in row:
            row["answer"] = "duckdb only"
        if cut:
            print(f"q{n:02d}: stopped by --time-budget, not by its own limit: not recorded; "
                  "the same command runs it again", flush=True)
            break
        if row.get("opforge_ms") and row.get("duckdb_ms"):
            row["ratio"] = row["duckdb_ms"] / row["opforge_ms"]
        _append(out, row)
        rows.append(row)
        _print_row(row)
    if ours is not None:
        ours.close()
    both = [r for r in rows if r["answer"] == "ok" and r.get("duckdb_ms") is not None]
    if both:
        ours_ms, duck_ms = sum(r["opforge_ms"] for r in both), sum(r["duckdb_ms"] for r in both)
        print(f"total over {len(both)} correct queries of this run: opforge {ours_ms:.0f} ms, DuckDB {duck_ms:.0f} ms, "
              f"DuckDB / opforge {duck_ms / ours_ms:.2f} (--summary merges every run's rows)")
    checked = [r for r in rows if "opforge_runs_ms" in r]
    if checked:
        print(f"{sum(r['answer'] == 'ok' for r in checked)} of {len(checked)} opforge answers equal DuckDB's")
    print(f"appended {len(rows)} rows to {out}")
    return 1 if failed else 0


def _print_generation(paths: dict, seconds: float) -> None:
    """The data set's readiness and, when this call made it, where the generation's time went."""
    manifest = data.read_manifest(next(iter(paths.values())).parent)
    print(f"TPC-H: files ready in {seconds:.1f} s ({os.cpu_count()} generator threads)", flush=True)
    made = {t: e for t, e in manifest["tables"].items() if "conform_s" in e} if seconds > 1 else {}
    if made:
        generator = {}  # tables generated by one tpchgen-cli call share its time
        for t, e in made.items():
            generator.setdefault(e["generate_s"], []).append(t)
        print(f"  made by this call in {manifest['seconds']:.1f} s; tpchgen-cli: "
              + ", ".join(f"{'+'.join(ts)} {s_:.1f} s" for s_, ts in generator.items())
              + "; conformed (overlapping the next generation): "
              + ", ".join(f"{t} {e['conform_s']:.1f} s" for t, e in made.items()), flush=True)


def _print_row(row: dict) -> None:
    peak, answer = row.get("device_peak_bytes"), row["answer"]
    if row.get("duckdb_error"):
        answer += f" (DuckDB: {row['duckdb_error']})"
    print(f"{'q%02d' % row['query']:>5} {_ms(row.get('opforge_cold_ms')):>9} {_ms(row.get('opforge_ms')):>11} "
          f"{_ms(row.get('duckdb_ms')):>10} {_num(row.get('ratio')):>6} {_size(row.get('spill_host_bytes')):>11} "
          f"{_size(row.get('spill_disk_bytes')):>11} {_size(peak):>10} {_num(row.get('peak_over_limit')):>6}  "
          f"{answer}", flush=True)


def summary(path: Path, numbers: list[int], sf: float) -> int:
    """The slices' rows merged: per query the latest opforge row and the latest DuckDB row."""
    ours, duck = {}, {}
    for row in _rows(path):
        if row.get("sf") != sf:
            continue
        if "opforge_runs_ms" in row:
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
        if answer.startswith("unchecked") and n in duck:  # DuckDB's answer came in a later slice
            answer += "; DuckDB ran later: run this query again with --skip-duckdb"
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
