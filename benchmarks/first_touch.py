"""First touch of data at transfer speed (issue 23, item 5): SQL's lazy register and a column's first
read from Parquet against DuckDB's scan of the same column, and host-fed Nexmark.

    python benchmarks/first_touch.py [--sf 10] [--device cuda] [--columns l_orderkey,l_quantity,...]
                                     [--events 67108864] [--batch-size 8388608] [--skip-stream] [--out PATH]

* ``register``: in a fresh process, ``opforge.sql.connect()`` plus ``register()`` of the 8 TPC-H
  tables (Parquet from tpchgen-cli, ``sql/tpch/data.py``); ``import_s`` apart. Goal: <= 0.1 s.
* ``columns``: in another fresh process (CUDA and the staging buffers started first on ``region``),
  each lineitem column's first touch (``table.column(name)``, device synchronized): ``seconds`` and
  ``gbps`` = the column's device bytes / seconds; then DuckDB (its default threads, a fresh
  in-memory connection per column) scans the same column of the same file —
  ``SELECT sum(col)`` for numbers, ``sum(hash(col))`` for strings and dates, so every value is read —
  and ``duckdb_gbps`` is the same bytes over its time; ``ratio`` = opforge's GB/s / DuckDB's
  (goal >= 1). The Parquet files sit in the page cache for both (the first touch decodes, it does not
  wait on the disk).
* ``stream``: ``benchmarks/stream_nexmark.py`` in fresh processes: host-fed q1, q5, q7 (Arrow record
  batches from host memory through pinned staging; goals q1 >= 500 M events/s, q5 and q7 >= 200 M)
  and device-fed q5 with ``--blocking-sync`` (goal: ``host_cpu_ms_per_batch`` <= ``ms_per_batch``'s
  GPU share: the host sleeps while waiting, so its CPU time is its own work).

JSON to ``--out`` (default ``benchmarks/results/first-touch-<device>-sf<sf>-<date>.json``):
``{schema_version, benchmark, date, device, gpu, torch, duckdb, cpu_count, scale_factor, register:
{import_s, connect_register_s}, columns: [{column, rows, bytes, parquet_bytes, seconds, gbps,
duckdb_seconds, duckdb_gbps, ratio}], total: {bytes, seconds, gbps, duckdb_seconds, duckdb_gbps},
stream: {host: <stream_nexmark JSON>, device_q5: <stream_nexmark JSON>}}``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

SCHEMA_VERSION = 1
COLUMNS = ("l_orderkey", "l_partkey", "l_quantity", "l_extendedprice", "l_discount", "l_shipdate",
           "l_returnflag", "l_shipmode")


def _child(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (cold: nothing imported, nothing cached); it prints JSON."""
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"first_touch: child failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


REGISTER = """
import json, sys, time
t0 = time.perf_counter()
import opforge.sql as sql
t1 = time.perf_counter()
con = sql.connect({device!r})
for name, path in {paths!r}.items():
    con.register(name, path)
t2 = time.perf_counter()
assert all(not con._tables[n].loaded_columns() for n in {paths!r}), "register loaded a column"
print(json.dumps({{"import_s": t1 - t0, "connect_register_s": t2 - t1}}))
"""

TOUCH = """
import json, time, torch
import pyarrow.parquet as pq
import opforge.sql as sql
device = {device!r}
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
con = sql.connect(device)
con.register("region", {region!r})
con.sql("SELECT count(*) FROM region WHERE r_name <> 'x' AND r_regionkey >= 0").fetchall()  # CUDA, staging up
sync()
con.register("lineitem", {path!r})
table = con._tables["lineitem"]
meta = pq.ParquetFile({path!r}).metadata
out = []
for name in {columns!r}:
    i = meta.schema.to_arrow_schema().names.index(name)
    parquet_bytes = sum(meta.row_group(g).column(i).total_compressed_size for g in range(meta.num_row_groups))
    t0 = time.perf_counter()
    col = table.column(name)
    sync()
    seconds = time.perf_counter() - t0
    nbytes = col.values.numel() * col.values.element_size()
    if col.valid is not None:
        nbytes += col.valid.numel()
    out.append({{"column": name, "rows": len(col), "bytes": nbytes, "parquet_bytes": parquet_bytes,
                "seconds": seconds}})
print(json.dumps(out))
"""

DUCKDB = """
import json, time, duckdb
out = []
for name, numeric in {columns!r}:
    con = duckdb.connect()
    expr = f"sum({{name}})" if numeric else f"sum(hash({{name}}))"
    t0 = time.perf_counter()
    con.sql(f"SELECT {{expr}} FROM read_parquet('{path}')").fetchall()
    out.append(time.perf_counter() - t0)
    con.close()
print(json.dumps(out))
"""


def columns_entry(path: str, region: str, device: str, columns) -> tuple[list, dict]:
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(path).schema_arrow
    numeric = [(c, schema.field(c).type.id in _SUMMABLE) for c in columns]
    ours = _child(TOUCH.format(device=device, region=region, path=path, columns=list(columns)))
    theirs = _child(DUCKDB.format(columns=numeric, path=path))
    for e, d in zip(ours, theirs):
        e["gbps"] = round(e["bytes"] / e["seconds"] / 1e9, 3)
        e["duckdb_seconds"] = d
        e["duckdb_gbps"] = round(e["bytes"] / d / 1e9, 3)
        e["ratio"] = round(e["gbps"] / e["duckdb_gbps"], 3)
    total_bytes = sum(e["bytes"] for e in ours)
    ts, td = sum(e["seconds"] for e in ours), sum(e["duckdb_seconds"] for e in ours)
    total = {"bytes": total_bytes, "seconds": ts, "gbps": round(total_bytes / ts / 1e9, 3), "duckdb_seconds": td,
             "duckdb_gbps": round(total_bytes / td / 1e9, 3), "ratio": round(td / ts, 3)}
    return ours, total


def _summable():
    import pyarrow as pa

    return {pa.int32().id, pa.int64().id, pa.float64().id, pa.decimal128(15, 2).id}


_SUMMABLE = _summable()


def stream_entries(device: str, events: int, batch_size: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="first-touch-") as tmp:
        runs = {"host": ["--queries", "q1,q5,q7", "--feeds", "host"],
                "device_q5": ["--queries", "q5", "--feeds", "device", "--blocking-sync"]}
        for key, extra in runs.items():
            path = Path(tmp) / f"{key}.json"
            cmd = [sys.executable, str(HERE / "stream_nexmark.py"), "--device", device, "--events", str(events),
                   "--batch-size", str(batch_size), "--json", str(path), *extra]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"first_touch: {' '.join(cmd)} failed: {done.stderr[-3000:]}")
            print(done.stdout.strip())
            out[key] = json.loads(path.read_text())
    return out


def main(argv=None) -> dict:
    import duckdb
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--events", type=int, default=64 << 20)
    ap.add_argument("--batch-size", type=int, default=8 << 20)
    ap.add_argument("--skip-stream", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    from opforge.sql.tpch import data

    paths = {name: str(p) for name, p in data.generate(args.sf).items()}
    register = _child(REGISTER.format(device=args.device, paths=paths))
    print(f"connect + register of {len(paths)} tables: {register['connect_register_s'] * 1e3:.1f} ms "
          f"(import {register['import_s']:.2f} s)")
    columns, total = columns_entry(paths["lineitem"], paths["region"], args.device,
                                   [c for c in args.columns.split(",") if c])
    for e in columns:
        print(f"{e['column']:>16}: {e['seconds'] * 1e3:8.1f} ms {e['gbps']:7.2f} GB/s   duckdb "
              f"{e['duckdb_seconds'] * 1e3:8.1f} ms {e['duckdb_gbps']:7.2f} GB/s   ratio {e['ratio']:.2f}")
    print(f"{'all':>16}: {total['gbps']:.2f} GB/s, duckdb {total['duckdb_gbps']:.2f} GB/s, ratio {total['ratio']:.2f}")
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "first_touch",
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "duckdb": duckdb.__version__, "cpu_count": os.cpu_count(),
              "scale_factor": args.sf, "register": register, "columns": columns, "total": total}
    if not args.skip_stream:
        result["stream"] = stream_entries(args.device, args.events, args.batch_size)
    out = args.out or str(HERE / "results" / f"first-touch-{args.device.split(':')[0]}-{data.sf_label(args.sf)}-"
                                             f"{dt.date.today().isoformat()}.json")
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
