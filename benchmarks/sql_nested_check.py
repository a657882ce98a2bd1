"""LIST / STRUCT / UNNEST / fill on a device, each answer compared with DuckDB's (the tests run them
on the CPU; this runs the same kinds of query where the codes, the UNNEST index arithmetic and the
fill neighbours live on the GPU).

    PYTHONPATH=src python benchmarks/sql_nested_check.py [--device cuda] [--rows 200000]

Prints one line per query (OK / DIFF with the first differing row, and the seconds it took) and
exits 1 when any differs."""
from __future__ import annotations

import argparse
import sys
import time

import duckdb
import numpy as np
import pyarrow as pa

import opforge.sql as sql

QUERIES = [
    "SELECT k % 7 AS g, count(*), count(DISTINCT l), min(l), max(s) FROM t GROUP BY g ORDER BY g",
    "SELECT sum(u), count(*) FROM (SELECT UNNEST(l) AS u FROM t)",
    "SELECT k, l[1], l[-1], len(l), s.a, l[2:3] FROM t ORDER BY k LIMIT 50",
    "SELECT k % 5 AS g, list(k % 3) FROM t WHERE k < 40 GROUP BY g ORDER BY g",
    "SELECT k, fill(v) OVER (PARTITION BY k % 4 ORDER BY k) FROM t ORDER BY k LIMIT 200",
    "SELECT a.k FROM t a JOIN t b ON a.l = b.l AND a.k = b.k ORDER BY a.k LIMIT 20",
]


def data(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    k = np.arange(rows)
    lens = rng.integers(0, 4, rows)
    lists = [list(map(int, rng.integers(0, 50, n))) if i % 11 else None for i, n in enumerate(lens)]
    structs = [{"a": int(x % 13), "b": f"w{x % 5}"} for x in k]
    v = np.where(rng.random(rows) < 0.3, np.nan, rng.random(rows) * 100)
    return pa.table({"k": pa.array(k, pa.int64()), "l": pa.array(lists, pa.list_(pa.int64())),
                     "s": pa.array(structs), "v": pa.array(v, from_pandas=True)})


def same(a, b) -> bool:
    """Rows equal, floats within 1e-9 relative (an interpolation may round in its last place)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args(argv)
    t = data(args.rows)
    ours = sql.connect(device=args.device)
    ours.register("t", t)
    ref = duckdb.connect()
    ref.register("t", t)
    bad = 0
    for q in QUERIES:
        t0 = time.perf_counter()
        got = ours.sql(q).fetchall()
        secs = time.perf_counter() - t0
        want = [tuple(r) for r in ref.execute(q).fetchall()]
        diff = next((i for i, (a, b) in enumerate(zip(got, want)) if not same(a, b)), None)
        if diff is None and len(got) != len(want):
            diff = min(len(got), len(want))
        bad += diff is not None
        print(f"{'OK  ' if diff is None else 'DIFF'} {secs:7.3f}s  {q}"
              + ("" if diff is None else f"\n      row {diff}: {got[diff:diff + 1]} vs {want[diff:diff + 1]}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
