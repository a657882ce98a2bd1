"""Where a TPC-H query's first run spends its time once the kernels are
compiled (after ``opforge warmup``): cProfile over the first run of each
query in a fresh process, the top functions by cumulative and own time.

    python benchmarks/first_run_profile.py --sf 1 --queries 1,2,13 --out /tmp/first-run.txt

Run it on a Triton cache that ``opforge warmup --engine sql`` has filled;
``warmup_first_run.py`` measures the first-minus-warm gap this explains.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--queries", default="1,2,13")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from opforge import sql
    from opforge.sql.tpch import data, queries

    con = sql.connect(device=args.device)
    for name, path in data.generate(args.sf, args.data_dir).items():
        con.register(name, str(path))
    report = io.StringIO()
    for n in [int(q) for q in args.queries.split(",")]:
        text = queries.query(n)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        con.sql(text).to_arrow()
        prof.disable()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        con.sql(text).to_arrow()
        warm = time.perf_counter() - t0
        report.write(f"==== {queries.name(n)}: first {first * 1e3:.1f} ms, warm {warm * 1e3:.1f} ms\n")
        for key in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
            report.write(s.getvalue())
    with open(args.out, "w") as f:
        f.write(report.getvalue())
    print(report.getvalue()[:3000])


if __name__ == "__main__":
    main()
