"""Overlap bench: does the overlapped GEMM hide its collective?

For each shape of :data:`SHAPES`, on every rank of a torchrun group, one run
measures

- ``compute``: the GEMM alone (this rank's full product, one call),
- ``comm``: the collective alone (all-gather of the shard / reduce-scatter of
  the partial product),
- ``sequential``: the collective, then the GEMM (or the GEMM, then the
  collective), nothing overlapped,
- ``overlapped``: :func:`~opforge.distributed.all_gather_matmul` /
  :func:`~opforge.distributed.matmul_reduce_scatter` for each chunk count of the grid
  (on CUDA also with dispatch's GEMM, and each chunk count replayed as a CUDA graph),

and reports ``efficiency = (sequential - overlapped) / min(comm, compute)``
(1: the shorter of the two is fully hidden), ``speedup = sequential /
overlapped`` and ``overlapped / max(comm, compute)`` (1: nothing left but the
longer one). Each time is the median of ``repeats`` runs, every run started
together on all ranks (a barrier, then CUDA events on the GPU, a wall clock
on the CPU), and the slowest rank's median counts. The overlapped result is
checked against the sequential one and against the same chunks run without
overlap (which must be identical). Shapes are chosen so comm and compute are
within about 2x of each other on two H200s over NVLink, plus one
compute-bound control; they take any group size (M is a multiple of 8 ranks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from opforge.distributed import group as G
from opforge.distributed import symmetric
from opforge.distributed.collectives import all_gather_single, reduce_scatter_single
from opforge.distributed.overlap import (
    OVERLAP_MATMUL_VARIANT, all_gather_matmul, chunk_matmul, default_chunks, matmul_reduce_scatter, resolve_variant,
)

SCHEMA_VERSION = 1
# (M, K, N): all_gather_matmul gathers [M/p, K] shards against w [K, N];
# matmul_reduce_scatter multiplies [M, K/p] by [K/p, N] and scatters [M, N].
SHAPES = {
    "all_gather_matmul": [(8192, 8192, 1024), (16384, 8192, 1024), (16384, 4096, 2048), (16384, 8192, 4096)],
    "matmul_reduce_scatter": [(8192, 2048, 8192), (16384, 2048, 8192), (16384, 4096, 4096), (16384, 8192, 4096)],
}
QUICK_SHAPES = {"all_gather_matmul": [(256, 128, 64), (512, 256, 32)],
                "matmul_reduce_scatter": [(256, 64, 128), (512, 128, 64)]}
CHUNK_GRID = (None, 2, 4, 8)
WARM_S = 0.2


def _barrier(device: torch.device, group=None) -> None:
    t = torch.zeros(1, device=device)
    dist.all_reduce(t, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device: torch.device, *, warmup: int, repeats: int, group=None) -> float:
    """The slowest rank's median milliseconds of ``fn``; every run starts together on all ranks.

    Warm-up runs ``warmup`` calls and then keeps calling for :data:`WARM_S` seconds: the GPU
    idles while the host makes a shape's inputs, its clocks drop, and a few sub-millisecond
    calls do not bring them back (the first figure measured then read slow)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        _barrier(device, group)
        t0 = time.perf_counter()
        fn()
        _barrier(device, group)
        calls = torch.tensor([min(1000, int(WARM_S / max(time.perf_counter() - t0, 1e-6)))], device=device)
        dist.all_reduce(calls, op=dist.ReduceOp.MAX, group=group)  # every rank makes the same collectives
        for _ in range(int(calls.item())):
            fn()
    times = []
    for _ in range(repeats):
        _barrier(device, group)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst.item())


def run_name(run: dict) -> str:
    """A chunk run's short name: chunks, GEMM variant, then copy_engine and graph when used."""
    return (f"chunks={run['chunks']},{run['matmul_variant']}" + (",copy_engine" if run["transport"] == "copy_engine"
                                                                  else "") + (",graph" if run["graph"] else ""))


def _matmul_variant(a: torch.Tensor, b: torch.Tensor) -> str:
    """The kernel that runs a chunk's GEMM (what dispatch picks; ``torch.matmul`` off CUDA)."""
    if a.device.type != "cuda":
        return "torch.matmul"
    from opforge.ops.matmul import make_epilogue
    from opforge.runtime.dispatch import explain

    return explain("matmul", a, b, None, None, make_epilogue(a)).variant.name


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.double().abs().max().item() or 1.0
    return (got.double() - ref.double()).abs().max().item() / scale


def _case(op: str, shape, dtype, device, world: int, rank: int, group, warmup: int, repeats: int) -> dict:
    M, K, N = shape
    g = torch.Generator(device="cpu").manual_seed(rank)
    es = torch.tensor([], dtype=dtype).element_size()
    if op == "all_gather_matmul":
        m = M // world
        x = (torch.randn(m, K, generator=g) * 0.5).to(dtype).to(device)
        w = (torch.randn(K, N, generator=torch.Generator().manual_seed(99)) / K ** 0.5).to(dtype).to(device)
        full = torch.empty(M, K, dtype=dtype, device=device)

        def comm():
            all_gather_single(full, x, group=group)

        def compute():
            return chunk_matmul(full, w)

        def sequential():
            comm()
            return compute()

        def overlapped(c, overlap=True, variant="auto", graph=False, transport="nccl"):
            return all_gather_matmul(x, w, group=group, chunks=c, overlap=overlap, matmul_variant=variant,
                                     graph=graph, transport=transport)

        def async_tp():
            return torch.ops.symm_mem.fused_all_gather_matmul(x, [w], gather_dim=0, group_name=symmetric.group_name(group))[1][0]

        rows, comm_bytes = m, (world - 1) * m * K * es  # received per rank
        chunk_of = lambda c: (full[: world * (m // c)], w)  # noqa: E731  a chunk's GEMM operands
    else:
        kp = K // world
        x = (torch.randn(M, kp, generator=g) * 0.5).to(dtype).to(device)
        w = (torch.randn(kp, N, generator=g) / K ** 0.5).to(dtype).to(device)
        partial = torch.empty(M, N, dtype=dtype, device=device)
        out = torch.empty(M // world, N, dtype=dtype, device=device)

        def comm():
            reduce_scatter_single(out, partial, group=group)

        def compute():
            return chunk_matmul(x, w)

        def sequential():
            reduce_scatter_single(out, compute(), group=group)
            return out

        def overlapped(c, overlap=True, variant="auto", graph=False, transport="nccl"):
            return matmul_reduce_scatter(x, w, group=group, chunks=c, overlap=overlap, matmul_variant=variant,
                                         graph=graph, transport=transport)

        def async_tp():
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w, "sum", scatter_dim=0, group_name=symmetric.group_name(group))

        rows, comm_bytes = M // world, (world - 1) * (M // world) * N * es  # sent per rank
        chunk_of = lambda c: (x.view(world, M // world, kp)[:, : (M // world) // c], w)  # noqa: E731

    t = {"compute": time_ms(compute, device, warmup=warmup, repeats=repeats, group=group),
         "comm": time_ms(comm, device, warmup=warmup, repeats=repeats, group=group),
         "sequential": time_ms(sequential, device, warmup=warmup, repeats=repeats, group=group)}
    if device.type == "cuda":  # the GEMM alone in the kernel the overlapped chunks use
        a, b = (full, w) if op == "all_gather_matmul" else (x, w)
        t["compute_overlap_variant"] = time_ms(lambda: chunk_matmul(a, b, OVERLAP_MATMUL_VARIANT), device,
                                               warmup=warmup, repeats=repeats, group=group)
    ref = sequential().clone()
    runs = []

    def measure(chunks: int, variant: str | None, default: bool, graph: bool = False, transport: str = "nccl") -> None:
        run = lambda: overlapped(chunks, variant=variant, graph=graph, transport=transport)  # noqa: E731
        ms = time_ms(run, device, warmup=warmup, repeats=repeats, group=group)
        got = run()
        plain = overlapped(chunks, overlap=False, variant=variant, transport=transport)
        flag = torch.tensor([1.0 if torch.equal(got, plain) else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        err = torch.tensor([_rel_err(got, ref)], dtype=torch.float64, device=device)
        dist.all_reduce(err, op=dist.ReduceOp.MAX, group=group)
        ran = resolve_variant("opforge.distributed.bench", variant, device) or _matmul_variant(*chunk_of(chunks))
        runs.append({"chunks": chunks, "default": default, "graph": graph, "transport": transport,
                     "matmul_variant": ran, "matmul_variant_arg": variant, "overlapped_ms": ms,
                     "identical_to_unoverlapped": bool(flag.item() == 1.0), "max_rel_err": float(err.item()),
                     "efficiency": (t["sequential"] - ms) / min(t["comm"], t["compute"]),
                     "speedup": t["sequential"] / ms, "ratio_to_max": ms / max(t["comm"], t["compute"])})

    for c in CHUNK_GRID:
        chunks = default_chunks(rows, world, N) if c is None else c
        if not any(r["chunks"] == chunks for r in runs):
            measure(chunks, "auto", c is None)
    peers = {}
    if device.type == "cuda":  # the same pipeline with dispatch's own GEMM choice (persistent kernels too)
        measure(min(runs, key=lambda r: r["overlapped_ms"])["chunks"], None, False)
        grid = sorted({r["chunks"] for r in runs})
        ce = symmetric.unavailable_reason(group) is None
        for c in grid:  # each chunk count replayed as a CUDA graph, and over the copy engines
            measure(c, "auto", False, graph=True)
            if ce:
                measure(c, "auto", False, transport="copy_engine")
                measure(c, "auto", False, graph=True, transport="copy_engine")
        if ce:  # PyTorch's own async-TP op on the same operands
            try:
                from torch.distributed._symmetric_memory import enable_symm_mem_for_group

                enable_symm_mem_for_group(symmetric.group_name(group))
                ms = time_ms(async_tp, device, warmup=warmup, repeats=repeats, group=group)
                err = _rel_err(async_tp(), ref)
                peers["torch_async_tp"] = {"median_ms": ms, "max_rel_err": err}
            except Exception as e:  # noqa: BLE001  a peer that cannot run is recorded, not fatal
                peers["torch_async_tp"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    best = min(runs, key=lambda r: r["overlapped_ms"])
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    return {
        "op": f"opforge.distributed.{op}",
        "variant": run_name(best),
        "shape": list(shape),
        "dtype": str(dtype).replace("torch.", ""), "world_size": world,
        "flops": 2 * M * K * N // world, "comm_bytes": comm_bytes,
        "compute_ms": t["compute"], "comm_ms": t["comm"], "sequential_ms": t["sequential"],
        "compute_overlap_variant_ms": t.get("compute_overlap_variant"),
        "median_ms": best["overlapped_ms"], "tflops": 2 * M * K * N / world / best["overlapped_ms"] / 1e9,
        "comm_compute_ratio": t["comm"] / t["compute"],
        "efficiency": best["efficiency"], "speedup": best["speedup"], "ratio_to_max": best["ratio_to_max"],
        "max_rel_err": best["max_rel_err"],
        "correct": all(r["identical_to_unoverlapped"] and r["max_rel_err"] <= tol for r in runs),
        "peers": {"sequential": {"median_ms": t["sequential"], "ratio": t["sequential"] / best["overlapped_ms"]},
                  **{k: dict(v, ratio=v["median_ms"] / best["overlapped_ms"]) if "median_ms" in v else v
                     for k, v in peers.items()}},
        "chunk_runs": runs,
    }


def run(*, quick: bool = False, dtype: torch.dtype | None = None, warmup: int = 3, repeats: int = 10,
        group=None, ops: list[str] | None = None, checkpoint: str | None = None, log=print) -> dict:
    """Bench every shape on the current group (after :func:`opforge.distributed.init`); the result dict
    (the same on every rank). ``checkpoint``: rank 0 rewrites the JSON there after each shape."""
    from opforge.runtime import device as devmod

    device = G.device(group)
    world, rank = G.world_size(group), G.rank(group)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    info, vers = devmod.device_info(device), devmod.versions()
    result = {
        "schema_version": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%d"),
        "gpu": info.name, "driver": vers["driver"], "torch": vers["torch"], "triton": vers["triton"],
        "opforge": vers["opforge"], "backend": G.backend(group), "world_size": world, "quick": quick,
        "cpu_figures": device.type != "cuda", "warmup": warmup, "repeats": repeats,
        "method": "median of repeats, each started after a barrier; slowest rank's median; CUDA events on GPU",
        "entries": [],
    }
    shapes = QUICK_SHAPES if quick else SHAPES
    for op in ops or list(shapes):
        if op not in shapes:
            raise ValueError(f"opforge.distributed.bench: unknown op {op!r}; choose from {list(shapes)}")
        for shape in shapes[op]:
            if shape[0] % world or (op == "matmul_reduce_scatter" and shape[1] % world):
                raise ValueError(f"opforge.distributed.bench: shape {shape} does not split over {world} ranks")
            e = _case(op, shape, dtype, device, world, rank, group, warmup, repeats)
            result["entries"].append(e)
            if rank == 0:
                log(f"{op:24s} {str(tuple(shape)):22s} compute {e['compute_ms']:8.3f} ms  comm {e['comm_ms']:8.3f} ms"
                    f"  seq {e['sequential_ms']:8.3f} ms  overlapped {e['median_ms']:8.3f} ms ({e['variant']})"
                    f"  eff {e['efficiency']:5.2f}  x{e['speedup']:4.2f}  /max {e['ratio_to_max']:4.2f}"
                    f"  {'ok' if e['correct'] else 'WRONG'}")
                if checkpoint:
                    write_json(result, checkpoint)
    return result


def write_json(result: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m opforge.distributed.bench [--quick] [--json PATH]``."""
    p = argparse.ArgumentParser(prog="opforge.distributed.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes (CPU smoke runs)")
    p.add_argument("--json", dest="json_path", help="rank 0 writes the results here")
    p.add_argument("--op", action="append", choices=list(SHAPES), help="only these ops (repeatable)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default: bf16 on GPUs, fp32 on CPUs")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backend", choices=list(G.BACKENDS), help="default: nccl with GPUs, else gloo")
    args = p.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, None: None}[args.dtype]
    G.init(args.backend)
    try:
        result = run(quick=args.quick, dtype=dtype, warmup=args.warmup, repeats=args.repeats, ops=args.op,
                     checkpoint=args.json_path)
        if G.rank() == 0 and args.json_path:
            write_json(result, args.json_path)
            print(f"wrote {args.json_path}")
        return 0 if all(e["correct"] for e in result["entries"]) else 1
    finally:
        G.destroy()


if __name__ == "__main__":
    sys.exit(main())
