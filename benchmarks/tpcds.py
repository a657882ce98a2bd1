"""TPC-DS on opforge's SQL engine against DuckDB on the same host.

    python benchmarks/tpcds.py --sf 10 --device cuda [--repeats 3] [--queries 1,3,q07] [--out PATH]

Generates (once, cached) TPC-DS at the scale factor with DuckDB's tpcds extension (in
``.venv-tpcds``: ``make .venv-tpcds``), loads it into an ``opforge.sql`` connection and an
in-memory DuckDB, runs the 99 queries warm on both, times each end to end, checks every opforge
answer against DuckDB's and writes ``benchmarks/results/tpcds-<device>-sf<sf>-<date>.json`` (the
TPC-H benchmark's format, ``"benchmark": "tpcds"``) and prints the per-query table.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from tpch import report, run_arguments  # noqa: E402

from opforge.sql.tpcds import data, runner  # noqa: E402


def parse_queries(text: str | None) -> tuple[int, ...]:
    if not text:
        return runner.NUMBERS
    numbers = tuple(int(q.strip().lower().lstrip("q")) for q in text.split(",") if q.strip())
    bad = [n for n in numbers if n not in runner.NUMBERS]
    if bad:
        raise SystemExit(f"tpcds: queries are 1..99, got {bad}")
    return numbers


def main(argv: list[str] | None = None) -> dict:
    parser = run_arguments(__doc__, "tpcds", 99)
    args = parser.parse_args(argv)
    numbers = parse_queries(args.queries)

    import opforge.sql as sql

    day = dt.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / "results" / f"tpcds-{args.device.replace(':', '')}-sf{args.sf:g}-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.jsonl")
    partial.unlink(missing_ok=True)

    def on_query(record):
        status = "ok" if record.match else ("error: " + record.error if record.error else "WRONG: " + "; ".join(record.diffs))
        ours, theirs = record.opforge_median_ms, record.duckdb_median_ms
        print(f"{record.query} rows={record.rows} opforge={ours and round(ours, 2)} ms duckdb={theirs and round(theirs, 2)} ms "
              f"{status[:300]}", flush=True)
        with partial.open("a") as f:  # a run cut short by a time limit keeps the queries it finished
            f.write(json.dumps(record.to_json()) + "\n")

    data.generate(args.sf, args.data_dir)
    result = runner.run_tpcds(sql.connect(device=args.device), args.sf, root=args.data_dir, numbers=numbers,
                              repeats=args.repeats, warmup=args.warmup, duckdb_threads=args.duckdb_threads,
                              on_query=on_query)
    doc = report(result, args, "tpcds")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    t = doc["total"]
    print(f"TPC-DS SF{args.sf:g} on {args.device}: {t['queries_matching']}/{len(numbers)} match DuckDB, "
          f"{t['queries_run']} ran on both; over those: opforge {t['opforge_ms']:.1f} ms, DuckDB {t['duckdb_ms']:.1f} ms, "
          f"speedup {t['speedup'] and round(t['speedup'], 2)}; wrote {out}")
    return doc


if __name__ == "__main__":
    main()
