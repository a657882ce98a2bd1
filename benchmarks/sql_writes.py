"""Write throughput of SQL as a database (issue 28's goal): ``CREATE TABLE AS SELECT`` of TPC-H
lineitem into a database folder and ``COPY ... TO`` Parquet, opforge against DuckDB on one host.

    python benchmarks/sql_writes.py [--sf 10] [--device cuda] [--reps 3] [--budget 40] [--phases] [--root DIR] [--out PATH]

For each operation, the best of ``--reps`` runs (fewer when a side's runs pass ``--budget`` seconds;
each run is printed as it ends), each on a fresh connection and a fresh target:

* ``ctas``: opforge ``CREATE TABLE li AS SELECT * FROM lineitem`` (lineitem registered from the
  Parquet file) into ``opforge.connect(database=...)``: the query, the Parquet data files written and
  fsynced, the catalog committed. The query only reads columns, so it is answered from the file by
  Arrow's reader without the device (``sql/host_scan.py``); ``--phases`` times the device path's
  steps, which a write of a computed result takes. DuckDB: the same statement
  over ``read_parquet`` into a database file, then ``CHECKPOINT`` (its data durable in the file, as
  opforge's commit makes it).
* ``copy``: ``COPY (SELECT * FROM lineitem) TO 'x.parquet' (FORMAT parquet)`` on both (opforge:
  written aside, fsynced, renamed).

``rows_per_s`` / ``duckdb_rows_per_s``: lineitem rows over the seconds; ``ratio``: opforge's rate
over DuckDB's (goal >= 1). TPC-H data: ``sql/tpch/data.py`` (tpchgen-cli), cached under ``--root``.

JSON to ``--out`` (default ``benchmarks/results/sql-writes-<device>-sf<sf>-<date>.json``):
``{schema_version, benchmark, date, device, gpu, torch, duckdb, pyarrow, cpu_count, scale_factor, rows,
parquet_bytes, entries: [{op, seconds, duckdb_seconds, reps, duckdb_reps, rows_per_s, duckdb_rows_per_s,
ratio}]}``; with ``--phases`` also ``phases: {first_touch_s, to_arrow_s, encode_s, fsync_rename_s,
first_touch_by_column_s}``: one opforge COPY's steps timed apart (where the host time goes).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

SCHEMA_VERSION = 1


def _best(run, reps: int, budget: float, label: str) -> tuple[float, int]:
    """The best of up to ``reps`` runs, and how many ran: no new run starts once ``budget`` seconds
    have gone (the first always runs), so a slow side cannot hold the device for minutes. Each run
    is printed as it ends."""
    times, start = [], time.perf_counter()
    while len(times) < reps and (not times or time.perf_counter() - start < budget):
        times.append(run())
        print(f"  {label} run {len(times)}: {times[-1]:.2f} s", flush=True)
    return min(times), len(times)


def _opforge_ctas(path: str, device: str, work: Path) -> float:
    import opforge.sql as sql
    folder = work / "op-db"
    shutil.rmtree(folder, ignore_errors=True)
    con = sql.connect(device=device, database=str(folder))
    con.register("lineitem", path)
    t0 = time.perf_counter()
    con.sql("CREATE TABLE li AS SELECT * FROM lineitem")
    seconds = time.perf_counter() - t0
    assert con.database.tables["li"].rows == con.sql("SELECT count(*) FROM lineitem").fetchall()[0][0]
    con.close()
    return seconds


def _opforge_copy(path: str, device: str, work: Path) -> float:
    import opforge.sql as sql
    target = work / "op-copy.parquet"
    con = sql.connect(device=device)
    con.register("lineitem", path)
    t0 = time.perf_counter()
    con.sql(f"COPY (SELECT * FROM lineitem) TO '{target}' (FORMAT parquet)")
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


def _opforge_phases(path: str, device: str, work: Path) -> dict:
    """The steps of one opforge COPY timed apart, run one by one as the statement runs them: each
    column's first touch (read, to the device, back as Arrow: ``SELECT col``), the whole result as
    Arrow again (columns cached), the Parquet encode (``parquet_write.write``), the fsync and rename."""
    import pyarrow.parquet as pq

    import opforge.sql as sql
    from opforge.runtime import durable_files
    from opforge.sql import parquet_write

    con = sql.connect(device=device)
    con.register("lineitem", path)
    first_touch = {}
    for name in pq.read_schema(path).names:
        t0 = time.perf_counter()
        con.sql(f'SELECT "{name}" FROM lineitem').to_arrow(dictionary=True)
        first_touch[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = con.sql("SELECT * FROM lineitem").to_arrow(dictionary=True)
    t1 = time.perf_counter()
    target = str(work / "op-phases.parquet")
    tmp = durable_files.temp_name(target)
    parquet_write.write(data, tmp)
    t2 = time.perf_counter()
    durable_files.fsync_file(tmp)
    os.replace(tmp, target)
    durable_files.fsync_dir(str(work))
    t3 = time.perf_counter()
    os.unlink(target)
    con.close()
    return {"first_touch_s": sum(first_touch.values()), "to_arrow_s": t1 - t0, "encode_s": t2 - t1,
            "fsync_rename_s": t3 - t2, "first_touch_by_column_s": first_touch}


def _duckdb_ctas(path: str, work: Path) -> float:
    import duckdb
    db = work / "duck.db"
    for f in (db, Path(str(db) + ".wal")):
        f.unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE li AS SELECT * FROM read_parquet('{path}')")
    con.execute("CHECKPOINT")
    seconds = time.perf_counter() - t0
    con.close()
    return seconds


def _duckdb_copy(path: str, work: Path) -> float:
    import duckdb
    target = work / "duck-copy.parquet"
    con = duckdb.connect()
    t0 = time.perf_counter()
    con.execute(f"COPY (SELECT * FROM read_parquet('{path}')) TO '{target}' (FORMAT parquet)")
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=40,
                    help="seconds after which no further rep of one side starts (default 40)")
    ap.add_argument("--root", default=None, help="TPC-H data cache folder (sql/tpch/data.py's default)")
    ap.add_argument("--work", default=None, help="folder for the written data (default: a temporary one)")
    ap.add_argument("--phases", action="store_true",
                    help="also time one opforge COPY's steps apart (an extra run): the 'phases' entry")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import duckdb
    import pyarrow
    import pyarrow.parquet as pq
    import torch

    from opforge.sql.tpch import data

    path = str(data.generate(args.sf, args.root)["lineitem"])
    meta = pq.ParquetFile(path).metadata
    work = Path(args.work or tempfile.mkdtemp(prefix="sql-writes-"))
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and args.device.startswith("cuda")
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "sql_writes", "date": dt.date.today().isoformat(),
              "device": args.device, "gpu": torch.cuda.get_device_name() if cuda else None,
              "torch": torch.__version__, "duckdb": duckdb.__version__, "pyarrow": pyarrow.__version__,
              "cpu_count": os.cpu_count(), "scale_factor": args.sf, "rows": meta.num_rows,
              "parquet_bytes": os.path.getsize(path), "entries": []}
    out = Path(args.out or HERE / "results" / f"sql-writes-{args.device.split(':')[0]}-sf{data.sf_label(args.sf)}-"
                                              f"{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for op, mine, theirs in (("ctas", _opforge_ctas, _duckdb_ctas), ("copy", _opforge_copy, _duckdb_copy)):
            seconds, reps = _best(lambda: mine(path, args.device, work), args.reps, args.budget, f"{op} opforge")
            duck_seconds, duck_reps = _best(lambda: theirs(path, work), args.reps, args.budget, f"{op} DuckDB")
            result["entries"].append({"op": op, "seconds": seconds, "duckdb_seconds": duck_seconds,
                                      "reps": reps, "duckdb_reps": duck_reps, "rows_per_s": meta.num_rows / seconds,
                                      "duckdb_rows_per_s": meta.num_rows / duck_seconds,
                                      "ratio": duck_seconds / seconds})
            print(f"{op}: opforge {seconds:.2f} s, DuckDB {duck_seconds:.2f} s, ratio {duck_seconds / seconds:.2f}",
                  flush=True)
            out.write_text(json.dumps(result, indent=1) + "\n")  # each part kept as it ends
        if args.phases:
            result["phases"] = _opforge_phases(path, args.device, work)
            print("phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in result["phases"].items()
                                          if isinstance(v, float)), flush=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
