"""Distributed equi-join, broadcast vs partitioned, on real ranks (issue 9: the planner's rule).

    torchrun --nproc-per-node 2 benchmarks/dist_join.py [--quick] [--json PATH]

NCCL on GPUs (each rank on cuda:LOCAL_RANK), Gloo on CPUs. Every rank generates its own rows on
its device from ``seed`` and its rank (nothing crosses the host): a probe (fact) side of P rows
per rank (50M on GPUs; 200k with --quick or on CPUs) with uniform foreign keys, against build
(dimension) sides of unique keys whose total is ``FRACTIONS`` x the probe total (a thousandth to
twice the probe side), plus one Zipf(1.2)-skewed probe case.

For each shape both methods of ``sql/physical/dist_join.py`` run once (warm-up, also the
checked run), then ``repeats`` times: each run starts after a barrier (and a CUDA sync), is timed
with ``time.perf_counter`` around the whole collective join up to a CUDA sync, and the slowest
rank's time counts (all_reduce MAX); the median over runs is reported. Partitioned runs include
the heavy-key sample (``sample_heavy_keys``, the product's skew handling).

Check: the union of the ranks' pairs against a single-process ``hash_pairs`` over the whole
tables, which rank 0 regenerates from the same seeds: pair count and a sum of 32-bit pair
hashes, all-reduced over the ranks. On big sizes only the pairs of a 1-in-k sample of probe row
ids are compared (``--check-sample``), so the reference stays cheap.

``planner_pick`` is ``choose_distribution(build bytes, probe bytes, world, "auto")`` on the bytes
that move (key + row id, 16 B a row); ``faster_method`` the measured winner. Rank 0 prints a table
and writes the JSON (default ``benchmarks/results/<h200|gpu|cpu>x<world>-<date>-dist-join.json``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import opforge.distributed as D  # noqa: E402
from opforge.distributed import group as G  # noqa: E402
from opforge.sql.physical.context import DEFAULT_SKEW_THRESHOLD  # noqa: E402
from opforge.sql.physical.dist_join import broadcast_join, partitioned_join, sample_heavy_keys  # noqa: E402
from opforge.sql.physical.join import hash_pairs  # noqa: E402
from opforge.sql.planner.distribution import choose_distribution, network_bytes  # noqa: E402

SCHEMA_VERSION = 1
FRACTIONS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.0)  # build rows total / probe rows total
ZIPF = (1.2, 0.1)  # the skewed case: exponent, build fraction
GPU_PROBE_ROWS = 50_000_000  # per rank
QUICK_PROBE_ROWS = 200_000
GPU_CHECK_SAMPLE = 16  # big sizes: check the pairs of 1 in 16 probe row ids
ROW_BYTES = 16  # key + row id, int64 each
METHODS = ("broadcast", "partitioned")
_GOLDEN = -7046029254386353131
_MIX = -4658895280553007687


def default_path() -> str:
    kind = "h200" if torch.cuda.is_available() and "H200" in torch.cuda.get_device_name() else (
        "gpu" if torch.cuda.is_available() else "cpu")
    ranks = os.environ.get("WORLD_SIZE", "1")
    return str(HERE / "results" / f"{kind}x{ranks}-{dt.date.today():%Y-%m-%d}-dist-join.json")


# ------------------------------------------------------------------------------------------- data
def cases() -> list[dict]:
    out = [{"case": "uniform", "fraction": f} for f in FRACTIONS]
    out.append({"case": f"zipf{ZIPF[0]}", "fraction": ZIPF[1], "zipf": ZIPF[0]})
    return out


def _gen(device, seed: int, case: int, rank: int, side: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(((seed * 1009 + case) * 1013 + rank) * 2 + side)
    return g


def build_rows(c: dict, ci: int, rank: int, per: int, device, seed: int):
    """Rank ``rank``'s build rows: unique keys ``rank*per + perm(per)``, global row ids."""
    g = _gen(device, seed, ci, rank, 0)
    keys = rank * per + torch.randperm(per, generator=g, device=device)
    return keys, rank * per + torch.arange(per, device=device)


def zipf_cdf(n: int, s: float, device) -> torch.Tensor:
    w = torch.arange(1, n + 1, dtype=torch.float64, device=device).pow_(-s)
    cdf = torch.cumsum(w, 0)
    return cdf / cdf[-1]


def probe_rows(c: dict, ci: int, rank: int, per: int, build_total: int, device, seed: int, cdf=None):
    """Rank ``rank``'s probe rows: keys uniform over the build keys (or Zipf: key 0 the most
    common), global row ids."""
    g = _gen(device, seed, ci, rank, 1)
    if "zipf" in c:
        u = torch.rand(per, generator=g, dtype=torch.float64, device=device)
        keys = torch.searchsorted(cdf, u).clamp_(max=build_total - 1)
    else:
        keys = torch.randint(0, build_total, (per,), generator=g, device=device)
    return keys, rank * per + torch.arange(per, device=device)


# ------------------------------------------------------------------------------------------ check
def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x * _GOLDEN
    x = x ^ (x >> 31)
    x = x * _MIX
    return x ^ (x >> 29)


def sampled(prow: torch.Tensor, k: int) -> torch.Tensor:
    """Probe row ids in the 1-in-``k`` check sample."""
    return ((_mix(prow + 12345) >> 16) & 0x7FFFFFFF) % k == 0


def digest(pairs: torch.Tensor, k: int) -> torch.Tensor:
    """[pair count, sum of 32-bit pair hashes] of the pairs whose probe row is sampled (int64)."""
    if k > 1:
        pairs = pairs[sampled(pairs[:, 0], k)]
    h = _mix(_mix(pairs[:, 0]) ^ pairs[:, 1]) & 0xFFFFFFFF
    return torch.stack([torch.tensor(len(pairs), device=pairs.device), h.sum()])


def reference(c, ci, world, ppr, bpr, device, seed, k, cdf) -> torch.Tensor:
    """Rank 0 alone: the digest of the single-process join of the whole (regenerated) tables;
    the sampled probe rows build, each rank's build rows probe, one at a time."""
    sk, srow = [], []
    for r in range(world):
        pk, prow = probe_rows(c, ci, r, ppr, bpr * world, device, seed, cdf)
        if k > 1:
            keep = sampled(prow, k)
            pk, prow = pk[keep], prow[keep]
        sk.append(pk)
        srow.append(prow)
    sk, srow = torch.cat(sk), torch.cat(srow)
    total = torch.zeros(2, dtype=torch.int64, device=device)
    for r in range(world):
        bk, brow = build_rows(c, ci, r, bpr, device, seed)
        si, bi = hash_pairs(sk, bk)
        total += digest(torch.stack([srow[si], brow[bi]], 1), 1)
        del bk, brow, si, bi
    return total


# ----------------------------------------------------------------------------------------- timing
def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device) -> None:
    _sync(device)
    t = torch.zeros(1, device=device)
    dist.all_reduce(t)
    _sync(device)


def timed(fn, device, repeats: int) -> list[float]:
    """Each run's milliseconds on the slowest rank (runs started together after a barrier)."""
    times = []
    for _ in range(repeats):
        _barrier(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        del out
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


# ------------------------------------------------------------------------------------------- main
def run(*, quick: bool = False, probe_rows_per_rank: int | None = None, repeats: int = 5, warmup: int = 1,
        check_sample: int | None = None, seed: int = 0, log=print) -> dict:
    from opforge.runtime import device as devmod

    device = G.device()
    world, rank = G.world_size(), G.rank()
    small = quick or device.type != "cuda"
    ppr = probe_rows_per_rank or (QUICK_PROBE_ROWS if small else GPU_PROBE_ROWS)
    k = check_sample or (1 if small else GPU_CHECK_SAMPLE)
    info, vers = devmod.device_info(device), devmod.versions()
    result = {
        "schema_version": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%d"), "device": info.name,
        "backend": G.backend(), "world_size": world, "torch": vers["torch"], "triton": vers.get("triton"),
        "opforge": vers["opforge"], "quick": quick, "cpu_figures": device.type != "cuda",
        "probe_rows_per_rank": ppr, "repeats": repeats, "warmup": warmup, "seed": seed,
        "skew_threshold": DEFAULT_SKEW_THRESHOLD, "check_sample_1_in": k,
        "method": "perf_counter around the whole collective join (barrier + CUDA sync before, CUDA sync after); "
                  "per run the slowest rank (all_reduce MAX); median over runs",
        "rows": [],
    }
    for ci, c in enumerate(cases()):
        bpr = max(1, round(ppr * c["fraction"]))
        btot, ptot = bpr * world, ppr * world
        cdf = zipf_cdf(btot, c["zipf"], device) if "zipf" in c else None
        bk, brow = build_rows(c, ci, rank, bpr, device, seed)
        pk, prow = probe_rows(c, ci, rank, ppr, btot, device, seed, cdf)
        ref = torch.zeros(2, dtype=torch.int64, device=device)
        if rank == 0:
            ref = reference(c, ci, world, ppr, bpr, device, seed, k, cdf)
        D.broadcast(ref, 0)
        ref = ref.tolist()
        del cdf
        choice = choose_distribution(btot * ROW_BYTES, ptot * ROW_BYTES, world, "auto")
        fns = {
            "broadcast": lambda: broadcast_join(pk, prow, bk, brow),
            "partitioned": lambda: partitioned_join(pk, prow, bk, brow,
                                                    heavy=sample_heavy_keys(pk, DEFAULT_SKEW_THRESHOLD)),
        }
        shape_rows = []
        for method in METHODS:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            pairs, stats = fns[method]()  # the warm-up run, also the checked one
            for _ in range(warmup - 1):
                del pairs
                pairs, stats = fns[method]()
            sums = torch.cat([digest(pairs, k), torch.tensor([len(pairs), stats["bytes_sent"], stats["load"]],
                                                             device=device)])
            loads = torch.tensor([stats["load"]], dtype=torch.int64, device=device)
            del pairs
            dist.all_reduce(sums)
            dist.all_reduce(loads, op=dist.ReduceOp.MAX)
            count, checksum, npairs, moved, load_sum = sums.tolist()
            if device.type == "cuda":  # the timed runs' peak (the warm-up may autotune)
                torch.cuda.reset_peak_memory_stats(device)
            runs = timed(fns[method], device, repeats)
            ms = statistics.median(runs)
            peak = None
            if device.type == "cuda":
                p = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.float64, device=device)
                dist.all_reduce(p, op=dist.ReduceOp.MAX)
                peak = p.item() / 2**30
            shape_rows.append({
                "case": c["case"], "build_fraction": c["fraction"], "build_rows": btot, "probe_rows": ptot,
                "build_rows_per_rank": bpr, "probe_rows_per_rank": ppr, "method": method,
                "median_ms": ms, "runs_ms": runs, "tuples_per_s": (btot + ptot) / (ms / 1e3),
                "pairs": npairs, "bytes_moved": moved,
                "bytes_moved_planner": network_bytes(method, btot * ROW_BYTES, ptot * ROW_BYTES, world),
                "max_rank_load_rows": loads.item(), "mean_rank_load_rows": load_sum / world,
                "heavy_keys": stats["heavy_keys"], "peak_mem_gib": peak,
                "planner_pick": choice.method, "planner_reason": choice.reason,
                "checks": {"pair_count": count == ref[0], "checksum": checksum == ref[1]},
                "check_pairs": ref[0],
            })
        faster = min(shape_rows, key=lambda r: r["median_ms"])
        slower = max(shape_rows, key=lambda r: r["median_ms"])
        for r in shape_rows:
            r["faster_method"] = faster["method"]
            r["planner_right"] = choice.method == faster["method"]
            r["speedup_of_faster"] = slower["median_ms"] / faster["median_ms"]
        result["rows"] += shape_rows
        del bk, brow, pk, prow
        if rank == 0:
            for r in shape_rows:
                log(f"{r['case']:9s} build {btot:>11,d} probe {ptot:>11,d} {r['method']:11s} {r['median_ms']:10.2f} ms"
                    f"  planner {choice.method:11s} faster {faster['method']:11s}"
                    f"  {'ok' if all(r['checks'].values()) else 'WRONG'}")
    shapes = result["rows"][::len(METHODS)]
    result["summary"] = {"shapes": len(shapes), "planner_right": sum(r["planner_right"] for r in shapes),
                         "all_checks": all(all(r["checks"].values()) for r in result["rows"])}
    return result


def table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"distributed join, {result['world_size']} x {result['device']} ({result['backend']}), "
                    f"{result['probe_rows_per_rank']:,} probe rows per rank; check 1 in "
                    f"{result['check_sample_1_in']} probe rows")
    for col in ("case", "build rows", "probe rows", "method", "median ms", "M tuples/s", "MB moved",
                "max load", "pairs", "planner", "faster", "x", "check"):
        t.add_column(col, justify="left" if col in ("case", "method", "planner", "faster", "check") else "right")
    for r in result["rows"]:
        pick = r["planner_pick"] + ("" if r["planner_right"] else " (!)")
        t.add_row(r["case"], f"{r['build_rows']:,}", f"{r['probe_rows']:,}", r["method"], f"{r['median_ms']:.2f}",
                  f"{r['tuples_per_s'] / 1e6:.1f}", f"{r['bytes_moved'] / 1e6:.1f}", f"{r['max_rank_load_rows']:,}",
                  f"{r['pairs']:,}", pick, r["faster_method"], f"{r['speedup_of_faster']:.2f}",
                  "ok" if all(r["checks"].values()) else "WRONG")
    Console(width=200).print(t)
    s = result["summary"]
    print(f"planner picked the faster method on {s['planner_right']} of {s['shapes']} shapes; "
          f"checks {'all ok' if s['all_checks'] else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/dist_join.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_PROBE_ROWS:,} probe rows per rank (CPU smoke runs)")
    p.add_argument("--json", dest="json_path", help="rank 0 writes the results here (default: benchmarks/results/)")
    p.add_argument("--probe-rows", type=int, help="probe rows per rank (overrides the default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--check-sample", type=int, help="check the pairs of 1 in N probe row ids "
                                                    f"(default 1 on CPUs / --quick, {GPU_CHECK_SAMPLE} on GPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=list(G.BACKENDS), help="default: nccl with GPUs, else gloo")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.repeats < 1:
        p.error("--warmup and --repeats must be >= 1")
    G.init(args.backend)
    try:
        if G.world_size() < 2:
            raise SystemExit("benchmarks/dist_join.py: run under torchrun with --nproc-per-node >= 2")
        result = run(quick=args.quick, probe_rows_per_rank=args.probe_rows, repeats=args.repeats,
                     warmup=args.warmup, check_sample=args.check_sample, seed=args.seed,
                     log=lambda *a: print(*a, flush=True))
        if G.rank() == 0:
            table(result)
            path = args.json_path or default_path()
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(result, indent=1) + "\n")
            print(f"wrote {path}")
        return 0 if result["summary"]["all_checks"] else 1
    finally:
        G.destroy()


if __name__ == "__main__":
    sys.exit(main())
