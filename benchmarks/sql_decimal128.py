"""DECIMAL(38, s) (128-bit storage, ``sql/decimal128.py``) on opforge's SQL engine against DuckDB.

    python benchmarks/sql_decimal128.py --device cuda [--rows 10000000] [--groups 1000] [--repeats 5] [--out PATH]

One generated table: a key ``k`` with ``--groups`` values, ``w`` DECIMAL(38,2) holding values past
int64 (up to 10^30), ``n`` DECIMAL(18,2) (the int64 path, for comparison) and ``j`` DECIMAL(38,2)
join keys; a dimension table ``dim`` keyed on DECIMAL(30,2). Each query folds its answer into few
rows; it runs warm on both engines, timed end to end as ``benchmarks/tpch.py`` does, and opforge's
answer is checked against DuckDB's (so this is also the GPU check of the 128-bit kernels: shifts,
limb carries, ``torch.unique(dim=0)`` ranks). Prints one line per query and writes
``benchmarks/results/sql-decimal128-<device>-<date>.json`` (or ``--out``)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from sql_windows import query_arguments, run_against_duckdb  # noqa: E402

QUERIES = {
    "sum_wide": "SELECT sum(w) AS s, min(w) AS lo, max(w) AS hi, count(*) AS c FROM t",
    "sum_narrow": "SELECT sum(n) AS s, min(n) AS lo, max(n) AS hi, count(*) AS c FROM t",
    "group_sum_wide": "SELECT k, sum(w) AS s, max(w) AS m, avg(w) AS a FROM t GROUP BY k",
    "arith_filter_wide": "SELECT sum(w * 3 - n) AS s, count(*) AS c FROM t WHERE w > CAST(n AS DECIMAL(38, 2)) * 1000000",
    "group_by_wide_key": "SELECT count(*) AS groups, sum(c) AS rows FROM (SELECT j, count(*) AS c FROM t GROUP BY j)",
    "join_wide_key": "SELECT count(*) AS c, sum(dim.v) AS s FROM t JOIN dim ON t.j = dim.j",
    "top_wide": "SELECT w, k FROM t ORDER BY w DESC, k LIMIT 10",
    "cast_wide": "SELECT sum(CAST(w AS DOUBLE)) AS f, sum(CAST(n AS DECIMAL(38, 4))) AS d FROM t",
}


def tables(rows: int, groups: int):
    import numpy as np
    import pyarrow as pa
    import torch

    from opforge.sql import decimal128 as D

    rng = np.random.default_rng(0)

    def dec(high, low, precision):
        """decimal128(precision, 2) of the unscaled values high * 10^18 + low (int64 arrays), built
        from the 128-bit words (the same table goes to both engines)."""
        words, _ = D.mul(D.from_int64(torch.from_numpy(high)), D.full(10 ** 18, len(high), "cpu"))
        words, _ = D.add(words, D.from_int64(torch.from_numpy(low)))
        buf = pa.py_buffer(words.contiguous().numpy().tobytes())
        return pa.Array.from_buffers(pa.decimal128(precision, 2), len(high), [None, buf])
    zeros = np.zeros(rows, dtype=np.int64)
    t = pa.table({
        "k": pa.array(rng.integers(0, groups, rows).astype(np.int32)),
        "w": dec(rng.integers(-10 ** 12, 10 ** 12, rows), rng.integers(0, 10 ** 18, rows), 38),
        "n": dec(zeros, rng.integers(-10 ** 15, 10 ** 15, rows), 18),
        "j": dec(rng.integers(0, rows // 10 + 1, rows) * 10 ** 4, zeros, 38),
    })
    dim_keys = np.arange(0, rows // 10 + 1, 2, dtype=np.int64)
    dim = pa.table({"j": dec(dim_keys * 10 ** 4, np.zeros(len(dim_keys), dtype=np.int64), 30),
                    "v": pa.array(np.arange(len(dim_keys)), pa.int64())})
    return t, dim


def main(argv: list[str] | None = None) -> dict:
    import duckdb

    import opforge.sql as sql

    args, names = query_arguments(__doc__, QUERIES, "sql-decimal128", argv)
    t, dim = tables(args.rows, args.groups)
    con, duck = sql.connect(args.device), duckdb.connect()
    for c in (con, duck):
        c.register("t", t)
        c.register("dim", dim)
    return run_against_duckdb(con, duck, QUERIES, names, args, "sql-decimal128")


if __name__ == "__main__":
    main()
