"""Why an overlapped tensor-parallel GEMM is slow: host issue time against GPU time, and the
kernel timeline of both streams (issue 7's diagnosis; the figures come from ``dist_overlap.py``).

    torchrun --nproc-per-node 2 benchmarks/dist_overlap_trace.py [--out DIR]

For each (op, shape, chunks, chunk GEMM variant) it reports, on rank 0, the host time to issue
one call (no sync; 20 calls back to back) next to the GPU time of one call (CUDA events): a call
whose host time exceeds its GPU time starves the GPU, and overlap cannot help. Then one call with
4 chunks runs under ``torch.profiler``: the CUDA kernels of rank 0 are printed in start order
(stream, start µs from the first kernel, duration µs, name) and the Chrome trace is written to
``--out``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from opforge.distributed import group as G  # noqa: E402
from opforge.distributed.overlap import all_gather_matmul, matmul_reduce_scatter  # noqa: E402

CASES = [("all_gather_matmul", (8192, 8192, 1024)), ("matmul_reduce_scatter", (8192, 2048, 8192))]


def operands(op, shape, world, device):
    M, K, N = shape
    g = torch.Generator(device="cpu").manual_seed(G.rank())
    if op == "all_gather_matmul":
        x = torch.randn(M // world, K, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(K, N, generator=g) / K ** 0.5).to(torch.bfloat16).to(device)
        return lambda c, v: all_gather_matmul(x, w, chunks=c, matmul_variant=v)
    x = torch.randn(M, K // world, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(K // world, N, generator=g) / K ** 0.5).to(torch.bfloat16).to(device)
    return lambda c, v: matmul_reduce_scatter(x, w, chunks=c, matmul_variant=v)


def host_and_gpu_ms(fn, device, calls: int = 20) -> tuple[float, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host = (time.perf_counter() - t0) * 1e3 / calls
    end.synchronize()
    return host, start.elapsed_time(end) / calls


def timeline(prof, limit: int = 80) -> list[str]:
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    if not kernels:
        return ["(no CUDA events recorded)"]
    t0 = kernels[0].time_range.start
    return [f"  stream {getattr(e, 'device_resource_id', '?'):>3}  +{e.time_range.start - t0:9.1f} us  "
            f"{e.time_range.elapsed_us():8.1f} us  {e.name[:90]}" for e in kernels[:limit]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp", help="directory for the Chrome traces")
    args = ap.parse_args()
    G.init()
    device, world, rank = G.device(), G.world_size(), G.rank()
    try:
        for op, shape in CASES:
            run = operands(op, shape, world, device)
            for chunks in (1, 2, 4):
                for variant in ("auto", None, "torch_eager"):
                    host, gpu = host_and_gpu_ms(lambda: run(chunks, variant), device)
                    if rank == 0:
                        print(f"{op:22s} {str(shape):20s} chunks={chunks} gemm={variant or 'dispatch':12s} "
                              f"host {host:7.3f} ms/call  gpu {gpu:7.3f} ms/call", flush=True)
            torch.cuda.synchronize(device)
            dist.barrier()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(2):
                    run(4, "auto")
                torch.cuda.synchronize(device)
            if rank == 0:
                path = Path(args.out) / f"trace-{op}.json"
                prof.export_chrome_trace(str(path))
                print(f"{op} chunks=4, rank 0 kernels (2 calls):")
                print("\n".join(timeline(prof)))
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
                print(f"wrote {path}", flush=True)
        return 0
    finally:
        G.destroy()


if __name__ == "__main__":
    sys.exit(main())
