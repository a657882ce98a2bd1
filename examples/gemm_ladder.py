"""GEMM ladder: from one output row at a time to tensor cores, profiled.

    python examples/gemm_ladder.py [--out DIR] [--ncu] [--size 4096]

Four real kernels computing ``C = A @ B`` (the source brief's GEMM and Tensor
Core articles, as Triton expresses them). What climbs from rung to rung is
the arithmetic intensity a program sees: the FLOPs it does per byte it loads
from global memory (L2 or HBM).

1. ``naive``: a program owns one row segment of ``C`` (``BN`` outputs) and
   walks K one element at a time: one element of A (broadcast) and ``BN`` of
   B per step, 2 FLOPs per element of B loaded: about 0.5 FLOP/byte in fp32.
2. ``tiled 16x16``: a program owns a 16 x 16 tile of C and walks K in
   16-wide slabs of A and B, loaded once and used 16 times each: a tile of
   ``BM x BN`` does ``2 * BM * BN * BK`` FLOPs per ``(BM + BN) * BK``
   elements, 4 FLOP/byte in fp32. Exact fp32 (``input_precision="ieee"``):
   the products run on the CUDA cores and Triton stages the slabs through
   shared memory into the layout each thread reads (the compiled resources
   show the shared memory).
3. ``register tiled 64x64``: the same with 64 x 64 tiles: each thread holds a
   32-output block of C in registers and reuses every loaded value across
   it: 16 FLOP/byte, still on the CUDA cores.
4. ``tensor cores``: 128 x 128 tiles of fp16 inputs through ``tl.dot`` (wgmma
   on Hopper, mma elsewhere), fp32 accumulation, 3-stage pipelined loads:
   64 FLOP/byte, and each instruction multiplies whole tiles.

The inputs are the same matrices for every rung: values rounded to fp16, so
the fp16 rung multiplies exactly what the fp32 rungs do; the output is fp32.
FLOPs: ``2 * M * N * K``; bytes: A and B read once, C written once (the
bench's rule), so every rung sits at the same counted intensity on the
roofline and the distance to the ceiling is what the tiling buys; with
``--ncu`` the DRAM bytes show the traffic each rung really causes. Without
CUDA every kernel runs under the Triton interpreter on small, odd sizes.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@triton.jit
def gemm_naive_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BN: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    jm = j < N
    acc = tl.zeros([BN], dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(a_ptr + i * K + k)  # one element of A's row, broadcast to the program
        b = tl.load(b_ptr + k * N + j, mask=jm, other=0.0)
        acc += a * b
    tl.store(c_ptr + i * N + j, acc, mask=jm)


@triton.jit
def gemm_tiled_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      PRECISION: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * K + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None].to(tl.int64) * N + rn[None, :],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _operands(m: int, n: int, k: int, device: str, dtype):
    """A [m, k] and B [k, n] with fp16-representable values (the same matrices for every rung)."""
    g = torch.Generator(device="cpu").manual_seed(m * 131 + n * 7 + k)
    a = torch.randn(m, k, generator=g).half()
    b = torch.randn(k, n, generator=g).half()
    return a.to(dtype).to(device), b.to(dtype).to(device)


def _built(a, b, c, run, launches):
    from opforge.profile.compare import Built

    m, k = a.shape
    n = b.shape[1]
    nbytes = float(a.numel() * a.element_size() + b.numel() * b.element_size() + c.numel() * 4)
    return Built(run, launches, lambda: c, a.double() @ b.double(), nbytes, flops=2.0 * m * n * k, tolerance=1e-4)


def build_naive(device: str, m: int, n: int, k: int, block: int = 256, warps: int = 4):
    a, b = _operands(m, n, k, device, torch.float32)
    c = torch.empty(m, n, device=device)
    grid = (m, triton.cdiv(n, block))
    kw = {"BN": block, "num_warps": warps}

    def run():
        gemm_naive_kernel[grid](a, b, c, m, n, k, **kw)

    return _built(a, b, c, run, [(gemm_naive_kernel, (a, b, c, m, n, k), kw)])


def build_tiled(device: str, m: int, n: int, k: int, tile: int = 16, bk: int = 16, warps: int = 4,
                stages: int = 2, fp16: bool = False):
    a, b = _operands(m, n, k, device, torch.float16 if fp16 else torch.float32)
    c = torch.empty(m, n, device=device)
    grid = (triton.cdiv(m, tile), triton.cdiv(n, tile))
    kw = {"BM": tile, "BN": tile, "BK": bk, "PRECISION": "tf32" if fp16 else "ieee", "num_warps": warps,
          "num_stages": stages}

    def run():
        gemm_tiled_kernel[grid](a, b, c, m, n, k, **kw)

    return _built(a, b, c, run, [(gemm_tiled_kernel, (a, b, c, m, n, k), kw)])


def steps(m: int, n: int, k: int):
    from opforge.profile.compare import Step

    size = {"m": m, "n": n, "k": k}
    return [
        Step("naive", "a row segment of C, K one element at a time: ~0.5 FLOP per byte loaded",
             "gemm_ladder:build_naive", size),
        Step("tiled 16x16", "16x16 tiles, K in 16-wide slabs staged through shared memory: 4 FLOP/byte",
             "gemm_ladder:build_tiled", {**size, "tile": 16, "bk": 16, "warps": 4}),
        Step("register tiled 64x64", "64x64 tiles, 32 outputs a thread held in registers: 16 FLOP/byte",
             "gemm_ladder:build_tiled", {**size, "tile": 64, "bk": 16, "warps": 4}),
        Step("tensor cores", "fp16 128x128 tiles through tl.dot (wgmma/mma), 3 stages: 64 FLOP/byte",
             "gemm_ladder:build_tiled", {**size, "tile": 128, "bk": 32, "warps": 8, "stages": 3, "fp16": True}),
    ]


def run(out: str | None = None, ncu: bool = False, size: int | None = None, device=None, console=None,
        resources: bool = True) -> dict:
    """The ladder's report (written to ``out`` when given)."""
    from opforge.profile.compare import run_ladder

    on_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu"
    m = n = k = size or (4096 if on_gpu else 40)
    if not on_gpu:  # odd sizes, not multiples of any tile: every mask is exercised
        n, k = m + 8, m - 3
    return run_ladder("gemm_ladder", f"GEMM ladder: {m}x{n}x{k}, fp32 out", steps(m, n, k), out=out,
                      console=console, device=device, ncu=ncu, resources=resources, sys_path=[HERE],
                      notes=["bytes counted: A and B read once, C written once (fp32); FLOPs 2*M*N*K",
                             "rungs 1-3 read fp32 A and B, the tensor-core rung fp16 (the same values)"])


def main(argv=None) -> int:
    from opforge.profile.compare import ladder_main

    return ladder_main(run, "gemm_ladder", __doc__.split("\n\n")[0],
                       "M = N = K (default 4096 on CUDA, 40 on CPU)", argv)


if __name__ == "__main__":
    from opforge.profile.compare import main_as_module

    main_as_module(__file__)
