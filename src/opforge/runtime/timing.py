"""Timing: CUDA events on the GPU, a wall clock on the CPU, median of repeats.

GPU timing flushes L2 before every repeat (through ``triton.testing.do_bench``,
which writes a 256 MB buffer between runs), so a kernel is not timed reading
inputs that the previous repeat left in cache. Tiny kernels are timed as CUDA
graph replays so launch gaps do not dominate.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from opforge.runtime.device import interpret_mode


def bench_gpu(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream, L2 flushed between runs."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def bench_graph(fn: Callable[[], object], replays: int = 50, inner: int = 20) -> float:
    """Median milliseconds of one ``fn`` call captured ``inner`` times in a CUDA graph.

    For launch-bound shapes: replaying a graph removes CPU launch cost from
    both sides of a comparison, leaving GPU time.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def bench_cpu(fn: Callable[[], object], repeats: int = 5, min_s: float = 0.0) -> float:
    """Median milliseconds of ``fn`` by the wall clock (CPU runs and the interpreter)."""
    fn()
    times = []
    t_end = time.perf_counter() + min_s
    while len(times) < repeats or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


HOST_BOUND_MS = 0.05


def bench(fn: Callable[[], object], device: torch.device, *, quick: bool = False) -> float:
    """Median milliseconds per call on whatever device runs ``fn``.

    On the GPU a stream of calls runs at the slower of two rates: the GPU
    executing them and the host launching them. For kernels shorter than
    ``HOST_BOUND_MS`` the host can be the slower one (Triton's Python launcher
    takes tens of µs), so we measure both and report the larger.
    """
    if device.type == "cuda":
        with torch.cuda.device(device):
            gpu_ms = bench_gpu(fn, warmup_ms=10 if quick else 25, rep_ms=30 if quick else 100)
            if gpu_ms < HOST_BOUND_MS:
                host_ms = host_overhead_us(fn, calls=400) / 1e3
                torch.cuda.synchronize()
                return max(gpu_ms, host_ms)
            return gpu_ms
    if interpret_mode():
        # under the Triton interpreter a time says nothing about the kernel (CPU smoke runs and
        # tests of the bench and the tuner), and each repeat costs the interpreter's seconds
        return bench_cpu(fn, repeats=1)
    return bench_cpu(fn, repeats=5 if quick else 9, min_s=0.02 if quick else 0.1)


def host_overhead_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Median CPU microseconds per call of ``fn`` (dispatch overhead), in batches."""
    for _ in range(50):
        fn()
    samples = []
    batch = max(1, calls // 20)
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / batch)
    return statistics.median(samples)
