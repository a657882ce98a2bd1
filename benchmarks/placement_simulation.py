"""Placement driver under the simulator: every case, PD's pass criteria.

    python benchmarks/placement_simulation.py [--seed N] [--case NAME ...] [--out PATH]

Runs each simulator case (``opforge.placement.simulator.cases``) with the
real driver on a simulated clock (1 tick = 1 simulated second), prints the
table (ticks to pass, operators by scheduler/checker, canceled and timed-out
shares, data moved against the least that had to move, reversed moves),
writes ``benchmarks/results/placement-sim.json`` and, for balance-region,
add-nodes and store-down, ``benchmarks/results/placement-<case>.png``
(per-store leader and region counts over time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from rich.console import Console

from opforge.placement.simulator import runner

HERE = os.path.dirname(os.path.abspath(__file__))
PLOTTED = ("balance-region", "add-nodes", "store-down")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case", action="append", help="only these cases (repeatable)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "placement-sim.json"))
    args = ap.parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    console = Console(width=220)
    names = args.case or runner.list_cases()
    results = []
    t0 = time.perf_counter()
    for name in names:
        plot = os.path.join(out_dir, f"placement-{name}.png") if name in PLOTTED else None
        r = runner.run_case(name, seed=args.seed, plot=plot)
        results.append(r)
        console.print(f"{name}: {'passed' if r.passed else 'FAILED'} "
                      f"{'at tick ' + str(r.ticks) if r.passed else ''} ({r.wall_s:.1f}s) - {r.message}")
    total = time.perf_counter() - t0
    console.print(runner.table(results))
    console.print(f"{sum(r.passed for r in results)}/{len(results)} cases passed in {total:.1f}s")
    doc = {
        "tool": "opforge placement simulator", "seed": args.seed, "python": sys.version.split()[0],
        "machine": platform.machine(), "cpus": os.cpu_count(), "wall_s": round(total, 2),
        "tick": "1 simulated second",
        "ideal_note": "ideal_mib is a lower bound on the data any schedule must copy to reach the end state the "
                      "run reached (see each case's ideal_doc); moved_mib counts finished snapshots",
        "cases": [r.to_json() for r in results],
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    console.print(f"wrote {args.out}" + "".join(
        f", {os.path.join(out_dir, f'placement-{n}.png')}" for n in names if n in PLOTTED))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
