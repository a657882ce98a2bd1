"""``python -m opforge.sql.fuzz --queries 2000 --seed 1``: a fuzz run; exit status 1 on any
mismatch or crash, each printed with its query and both answers."""

from __future__ import annotations

import argparse
import sys
import time

from opforge.sql.fuzz.differ import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.sql.fuzz", description=__doc__)
    parser.add_argument("--queries", type=int, default=500, help="how many queries (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="query i is made from (seed, i)")
    parser.add_argument("--device", default="cpu", help="opforge device (default cpu)")
    parser.add_argument("--data-dir", default=None, help="TPC-H cache root (default $OPFORGE_CACHE_DIR/tpch)")
    parser.add_argument("--show", action="append", default=[], choices=["refused", "invalid", "match"],
                        help="also print these outcomes (mismatches and crashes are always printed)")
    args = parser.parse_args(argv)

    from opforge.sql.tpch import data

    started = time.perf_counter()

    def show(outcome):
        if outcome.kind in ("mismatch", "crash") or outcome.kind in args.show:
            print(outcome.report(), flush=True)

    summary = run(data.generate(0.01, args.data_dir), args.queries, args.seed, device=args.device, on_outcome=show)
    counts = summary.counts
    print(f"{args.queries} queries (seed {args.seed}) in {time.perf_counter() - started:.1f} s: "
          + ", ".join(f"{k} {counts[k]}" for k in ("match", "mismatch", "crash", "refused", "invalid")))
    for reason, n in summary.refusal_reasons().most_common(12):
        print(f"  refused {n:4d}: {reason}")
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
