"""Skewed joins: plain against skew-aware (issue 9) on Zipf keys, in two scenarios.

    python benchmarks/join_skew.py [--probe 2000000] [--build 100000] [--zipf 1.2] [--parts 8]
                                   [--threshold 0.05] [--device cuda|cpu] [--repeats 5] [--json [PATH]]

The probe side's keys follow Zipf(s) over the build side's key range (key 0 the most common:
~18 % of the rows at s = 1.2); the build side holds every key once plus a few extra rows for the
heaviest keys. Both contenders split the rows over ``--parts`` partitions by a hash of the key
(``opforge.sql.physical.skew.partitioned_pairs``: one ``opforge.hash_join`` per partition, the
pairs put back in order); the skew-aware one first finds the heavy keys (a sample above
``--threshold`` of the probe rows), deals their probe rows round-robin and replicates their build
rows to every partition. Reported per contender: median wall time (device synchronized), the
largest partition's rows (what a worker holding that partition must process and hold), and the
imbalance (largest / mean). Both contenders' pairs are checked equal to the unpartitioned join.

Scenario ``thread_blocks``: the build side's keys follow Zipf(s) (key 0 holds ~18 % of the build
rows), the probe keys are uniform over the key range, and one ``opforge.hash_join`` runs on the
whole device. The plain join writes each probe row's pairs in the row-parallel kernel (a program
of rows loops as often as its row with the most matches); the skew-aware one sends rows past
``opforge.kernels.hashing.HEAVY_ROW_PAIRS`` pairs to the output-parallel kernel. Both contenders'
pairs are checked equal to the sort-based join's.

``--json`` writes the record (to PATH, or stdout without one).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

SCHEMA_VERSION = 1


def make_inputs(n_probe: int, n_build: int, s: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(7)
    probe = (rng.zipf(s, n_probe) - 1) % n_build  # the tail folded onto the key range
    build = np.concatenate([np.arange(n_build), [0, 0, 1]])
    return torch.tensor(build, device=device), torch.tensor(probe, device=device)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, repeats: int) -> tuple[list[float], object]:
    """Wall times of ``repeats`` runs after one warm-up (device synchronized), and the last result."""
    times, out = [], None
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def thread_blocks(args, device) -> list[dict]:
    """The build-side skew scenario (see the module docstring)."""
    from opforge.kernels import hashing as K
    from opforge.ops import hashing
    from opforge.runtime.dispatch import force_variant

    rng = np.random.default_rng(11)
    build = torch.tensor((rng.zipf(args.zipf, args.build) - 1) % args.build, device=device)
    probe = torch.tensor(rng.integers(0, args.build, args.probe), device=device)
    with force_variant("hash_join", "torch_sort" if device.type == "cuda" else "reference"):
        want_b, want_p = hashing.hash_join(build, probe)
    entries, saved = [], K.HEAVY_ROW_PAIRS
    counts = torch.bincount(build, minlength=args.build)
    try:
        for variant, heavy in (("plain", None), ("skew_aware", saved or 32)):
            K.HEAVY_ROW_PAIRS = heavy
            with force_variant("hash_join", "triton_hash"):
                times, (bi, pi) = time_ms(lambda: hashing.hash_join(build, probe), device, args.repeats)
            if not (torch.equal(bi, want_b) and torch.equal(pi, want_p)):
                raise SystemExit(f"join_skew: thread_blocks {variant} pairs differ from the sort-based join")
            entries.append({"scenario": "thread_blocks", "variant": variant, "median_ms": statistics.median(times),
                            "times_ms": times, "heavy_row_pairs": heavy, "output_rows": int(len(pi)),
                            "max_build_rows_per_key": int(counts.max()),
                            "probe_rows_past_threshold": int((counts[probe] > (heavy or 0)).sum()) if heavy else 0})
    finally:
        K.HEAVY_ROW_PAIRS = saved
    return entries


def run(args) -> dict:
    from opforge.ops import hashing
    from opforge.sql.physical.skew import hash_dest, heavy_keys, partitioned_pairs

    device = torch.device(args.device)
    build, probe = make_inputs(args.probe, args.build, args.zipf, device)
    want_b, want_p = hashing.hash_join(build, probe)
    entries = []
    for variant in ("plain", "skew_aware"):
        times, report = [], None
        for i in range(args.repeats + 1):
            _sync(device)
            t0 = time.perf_counter()
            heavy = heavy_keys(probe, None, args.threshold) if variant == "skew_aware" else None
            bi, pi, report = partitioned_pairs(build, probe, None, None, hash_dest(build, args.parts),
                                               hash_dest(probe, args.parts), args.parts, "inner", heavy)
            _sync(device)
            if i:  # the first run warms up
                times.append((time.perf_counter() - t0) * 1e3)
        if not (torch.equal(bi, want_b) and torch.equal(pi, want_p)):
            raise SystemExit(f"join_skew: {variant} pairs differ from the unpartitioned join")
        mean = sum(report.loads) / len(report.loads)
        entries.append({
            "scenario": "partitions", "variant": variant, "median_ms": statistics.median(times), "times_ms": times,
            "max_partition_rows": max(report.loads), "mean_partition_rows": mean,
            "imbalance": max(report.loads) / mean, "heavy_keys": report.heavy[:16],
            "heavy_probe_rows": report.heavy_probe_rows, "replicated_build_rows": report.replicated_build_rows,
            "output_rows": int(len(pi)),
        })
    return {
        "schema_version": SCHEMA_VERSION, "benchmark": "join_skew",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "config": {"probe": args.probe, "build": args.build, "zipf": args.zipf, "parts": args.parts,
                   "threshold": args.threshold, "repeats": args.repeats},
        "entries": entries + (thread_blocks(args, device) if device.type == "cuda" or args.build <= 200_000 else []),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--probe", type=int, default=2_000_000)
    p.add_argument("--build", type=int, default=100_000)
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", nargs="?", const="-", default=None, help="write JSON (to PATH, or stdout)")
    args = p.parse_args(argv)
    if args.zipf <= 1.0:
        p.error("--zipf must be > 1 (numpy's Zipf)")
    record = run(args)
    if args.json is None:
        for e in record["entries"]:
            line = f"{e['scenario']:>13} {e['variant']:>10}: {e['median_ms']:9.2f} ms"
            if e["scenario"] == "partitions":
                line += (f"  largest partition {e['max_partition_rows']} rows (imbalance {e['imbalance']:.2f}), "
                         f"heavy keys {e['heavy_keys'][:5]}")
            else:
                line += f"  {e['output_rows']} pairs, {e['probe_rows_past_threshold']} probe rows output-parallel"
            print(line)
    elif args.json == "-":
        print(json.dumps(record, indent=1))
    else:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
