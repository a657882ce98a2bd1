"""Window functions on opforge's SQL engine against DuckDB on the same host.

    python benchmarks/sql_windows.py --device cuda [--rows 10000000] [--groups 1000] [--repeats 5] [--out PATH]

One generated table (``id``, a partition key ``k`` with ``--groups`` values, an integer ``v`` with
ties, a double ``f`` with NULLs) is registered in both engines; each query computes window
functions over every row and folds them into one row (so the time is the windows', not the
transfer of the rows to the host). Each query runs warm on both, timed end to end (parse, plan,
execute, result to host) as ``benchmarks/tpch.py`` does, and opforge's answer is checked against
DuckDB's. Prints one line per query (medians and the ratio) and writes
``benchmarks/results/sql-windows-<device>-<date>.json`` (or ``--out``)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from opforge.sql.tpch import compare as cmp  # noqa: E402
from opforge.sql.tpch.runner import time_query  # noqa: E402

QUERIES = {
    "ranking": "SELECT sum(r) AS r, sum(d) AS d, sum(n) AS n FROM (SELECT rank() OVER (PARTITION BY k ORDER BY v) r, "
               "dense_rank() OVER (PARTITION BY k ORDER BY v DESC) d, row_number() OVER (ORDER BY v, id) n FROM t)",
    "running_sum": "SELECT sum(s) AS s FROM (SELECT sum(v) OVER (PARTITION BY k ORDER BY id) s FROM t)",
    "moving_avg": "SELECT sum(a) AS s FROM (SELECT avg(f) OVER (PARTITION BY k ORDER BY id "
                  "ROWS BETWEEN 10 PRECEDING AND 10 FOLLOWING) a FROM t)",
    "moving_max": "SELECT sum(m) AS s FROM (SELECT max(f) OVER (PARTITION BY k ORDER BY id "
                  "ROWS BETWEEN 100 PRECEDING AND CURRENT ROW) m FROM t)",
    "lag_lead": "SELECT sum(a) AS a, sum(b) AS b FROM (SELECT lag(v, 1, 0) OVER (PARTITION BY k ORDER BY id) a, "
                "lead(f, 3) OVER (PARTITION BY k ORDER BY id) b FROM t)",
    "range_frame": "SELECT sum(c) AS s FROM (SELECT count(*) OVER (PARTITION BY k ORDER BY v "
                   "RANGE BETWEEN 5 PRECEDING AND 5 FOLLOWING) c FROM t)",
    "partition_aggregate": "SELECT sum(v * a) AS s FROM (SELECT v, avg(v) OVER (PARTITION BY k) a FROM t)",
    "qualify_top3": "SELECT count(*) AS n, sum(v) AS s FROM (SELECT k, v FROM t "
                    "QUALIFY row_number() OVER (PARTITION BY k ORDER BY v DESC, id) <= 3)",
}


def table(rows: int, groups: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    return pa.table({
        "id": pa.array(np.arange(rows), pa.int64()),
        "k": pa.array(rng.integers(0, groups, rows).astype(np.int32)),
        "v": pa.array(rng.integers(0, 1000, rows), pa.int64()),
        "f": pa.array(rng.normal(0, 10, rows), mask=rng.random(rows) < 0.05),
    })


def _duckdb_table(rel):
    r = rel.arrow()  # a record batch reader in recent DuckDB: read it whole (the timed result to host)
    return r.read_all() if hasattr(r, "read_all") else r


def main(argv: list[str] | None = None) -> dict:
    import duckdb

    import opforge.sql as sql

    args, names = query_arguments(__doc__, QUERIES, "sql-windows", argv)
    t = table(args.rows, args.groups)
    con, duck = sql.connect(args.device), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    return run_against_duckdb(con, duck, QUERIES, names, args, "sql-windows")


def query_arguments(doc: str, queries: dict, benchmark: str, argv) -> tuple:
    """The command line of a query-set benchmark against DuckDB (this one, ``sql_decimal128.py``):
    the parsed arguments and the names of the queries to run."""
    import torch

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--queries", help="comma-separated names (default: all): " + ",".join(queries))
    ap.add_argument("--out", help=f"JSON path (default: benchmarks/results/{benchmark}-<device>-<date>.json)")
    args = ap.parse_args(argv)
    return args, args.queries.split(",") if args.queries else list(queries)


def run_against_duckdb(con, duck, queries: dict, names: list, args, benchmark: str) -> dict:
    """Each named query on opforge and DuckDB (median of ``args.repeats``), answers compared; prints a
    line per query and writes the JSON (``args.out`` or ``results/<benchmark>-<device>-<date>.json``).
    Shared with ``sql_decimal128.py``."""
    import duckdb
    import torch

    records = []
    for name in names:
        q = queries[name]
        ours_ms, ours = time_query(lambda: con.sql(q).to_arrow(), args.repeats, args.warmup)  # noqa: B023
        ref_ms, ref = time_query(lambda: _duckdb_table(duck.sql(q)), args.repeats, args.warmup)  # noqa: B023
        diffs = cmp.compare(ours, ref, ordered=False)
        rec = {"query": name, "sql": q, "opforge_ms": statistics.median(ours_ms),
               "duckdb_ms": statistics.median(ref_ms), "match": not diffs, "diffs": diffs[:5]}
        rec["speedup"] = rec["duckdb_ms"] / rec["opforge_ms"]
        records.append(rec)
        print(f"{name:20s} opforge {rec['opforge_ms']:9.2f} ms  duckdb {rec['duckdb_ms']:9.2f} ms  "
              f"x{rec['speedup']:6.2f}  {'ok' if rec['match'] else 'MISMATCH ' + '; '.join(diffs[:2])}")
    from opforge.runtime.device import versions

    doc = {"schema_version": 1, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "benchmark": benchmark, "device": args.device, "rows": args.rows, "groups": args.groups,
           "repeats": args.repeats, "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "",
           **{k: versions().get(k, "") for k in ("driver", "torch", "triton")}, "duckdb": duckdb.__version__,
           "queries": records}
    out = Path(args.out) if args.out else HERE / "results" / f"{benchmark}-{args.device}-{dt.date.today()}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}; {sum(r['match'] for r in records)} of {len(records)} match DuckDB")
    return doc


if __name__ == "__main__":
    main()
