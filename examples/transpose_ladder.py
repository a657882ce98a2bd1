"""Transpose ladder: coalescing and shared memory, profiled.

    python examples/transpose_ladder.py [--out DIR] [--ncu] [--size 8192]

Three real kernels transposing an ``M x N`` fp32 matrix (``y[j, i] = x[i, j]``):

1. ``naive``: a program reads a segment of one row of ``x`` (adjacent threads,
   adjacent addresses: coalesced) and writes it down a column of ``y``:
   neighbouring threads write ``M * 4`` bytes apart, so every 4-byte store is
   its own 32-byte sector (ncu on the H200: 32 sectors per store request, against
   16 for the tiled kernels' coalesced 16-byte-per-thread stores; 12 % of copy
   bandwidth against 91-95 %).
2. ``tiled``: a program loads a ``32 x 32`` tile coalesced along rows,
   ``tl.trans`` turns it, and stores it coalesced along the rows of ``y``.
   Between the two register layouts Triton stages the tile through shared
   memory, the CUDA article's shared-memory transpose; Triton chooses the
   shared layout (swizzled, so that the column-wise reads do not all fall in
   one bank), which is the padding/swizzle step done by the compiler.
3. ``tiled_wide``: the same with a ``64 x 64`` tile and 8 warps: wider
   (128-bit) accesses per thread and fewer programs, a different shared-memory
   layout and conflict pattern, as ncu shows.

On CUDA four more steps are written in Gluon (``transpose_gluon.py``), with
every layout explicit, so ``opforge.layout`` predicts their shared-memory
wavefronts and bank conflicts and global sectors per request (shown in the
report; ``benchmarks/layout_ncu.py`` checks them against ncu): ``gluon naive``,
``gluon shared`` (an unpadded tile: 32-way conflicts on the transposed read),
``gluon padded`` and ``gluon swizzled`` (both conflict-free). Gluon has no
interpreter, so without CUDA they are left out (tests compile them for sm_90).

On CUDA the report (JSON, HTML, PNG in ``--out``) shows each step's achieved
bandwidth against the copy ceiling, occupancy, and with ``--ncu`` sectors per
request and shared-memory bank conflicts going the right way. Without CUDA
each kernel runs under the Triton interpreter on a small matrix and is
checked against ``x.t()``.
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
def transpose_naive_kernel(x_ptr, y_ptr, M, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    v = tl.load(x_ptr + row.to(tl.int64) * N + cols, mask=mask)
    tl.store(y_ptr + cols.to(tl.int64) * M + row, v, mask=mask)  # stride M between threads


@triton.jit
def transpose_tiled_kernel(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tile = tl.load(x_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], mask=mask)
    # [BN, BM]: stored along rm, the contiguous dim of y; the layout change
    # goes through shared memory
    tl.store(y_ptr + rn[:, None].to(tl.int64) * M + rm[None, :], tl.trans(tile), mask=tl.trans(mask))


def _matrix(m: int, n: int, device: str):
    g = torch.Generator(device="cpu").manual_seed(m * 31 + n)
    return torch.randn(m, n, generator=g).to(device)


def build_naive(device: str, m: int, n: int, block: int = 1024):
    from opforge.profile.compare import Built

    x = _matrix(m, n, device)
    y = torch.empty(n, m, device=device)
    grid = (m, triton.cdiv(n, block))
    kw = {"BLOCK": block, "num_warps": 4}

    def run():
        transpose_naive_kernel[grid](x, y, m, n, **kw)

    return Built(run, [(transpose_naive_kernel, (x, y, m, n), kw)], lambda: y, x.double().t(), 2.0 * x.numel() * 4)


def build_tiled(device: str, m: int, n: int, tile: int = 32, warps: int = 4):
    from opforge.profile.compare import Built

    x = _matrix(m, n, device)
    y = torch.empty(n, m, device=device)
    grid = (triton.cdiv(m, tile), triton.cdiv(n, tile))
    kw = {"BM": tile, "BN": tile, "num_warps": warps}

    def run():
        transpose_tiled_kernel[grid](x, y, m, n, **kw)

    return Built(run, [(transpose_tiled_kernel, (x, y, m, n), kw)], lambda: y, x.double().t(), 2.0 * x.numel() * 4)


def build_gluon(device: str, m: int, n: int, kind: str):
    """A Gluon step (``transpose_gluon.KINDS``), with the analyzer's model of its accesses."""
    import transpose_gluon as tg

    from opforge.profile.compare import Built

    x = _matrix(m, n, device)
    y = torch.empty(n, m, device=device)
    kernel, kw = tg.launch_args(kind)
    grid = (triton.cdiv(m, tg.TILE), triton.cdiv(n, tg.TILE))

    def run():
        kernel[grid](x, y, m, n, **kw)

    return Built(run, [(kernel, (x, y, m, n), kw)], lambda: y, x.double().t(), 2.0 * x.numel() * 4,
                 accesses=tg.accesses(kind, m, n))


GLUON_STEPS = [("gluon naive", "naive", "explicit layouts, no shared memory: stores 32 sectors per request"),
               ("gluon shared", "unpadded", "a plain 32x32 shared tile: the column read is a 32-way bank conflict"),
               ("gluon padded", "padded", "shared tile (32,32):(33,1): one word of padding per row"),
               ("gluon swizzled", "swizzled", "shared tile swizzled by Swizzle<5,0,5> (col ^ row)")]


def steps(m: int, n: int, gluon: bool = False):
    from opforge.profile.compare import Step

    extra = [Step(name, desc, "transpose_ladder:build_gluon", {"m": m, "n": n, "kind": kind})
             for name, kind, desc in GLUON_STEPS] if gluon else []
    return [
        Step("naive", "row segment in, column out: strided (uncoalesced) stores", "transpose_ladder:build_naive",
             {"m": m, "n": n}),
        Step("tiled 32x32", "tile through shared memory (tl.trans), coalesced both ways",
             "transpose_ladder:build_tiled", {"m": m, "n": n, "tile": 32, "warps": 4}),
        Step("tiled 64x64", "wider tile, 8 warps: 128-bit accesses, another shared layout",
             "transpose_ladder:build_tiled", {"m": m, "n": n, "tile": 64, "warps": 8}),
    ] + extra


def run(out: str | None = None, ncu: bool = False, size: int | None = None, device=None, console=None,
        resources: bool = True) -> dict:
    """The ladder's report (written to ``out`` when given)."""
    from opforge.profile.compare import run_ladder

    on_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu"
    m = n = size or (8192 if on_gpu else 48)
    if not on_gpu:
        n = m + 24  # not square, not a multiple of the tile: masks are exercised
    # Gluon compiles only for a GPU (no interpreter); its steps assume whole 32x32 tiles
    gluon = on_gpu and m % 32 == 0 and n % 32 == 0
    return run_ladder("transpose_ladder", f"transpose ladder: {m}x{n} fp32", steps(m, n, gluon), out=out,
                      console=console, device=device, ncu=ncu, resources=resources, sys_path=[HERE],
                      notes=["bytes counted: the matrix read once and written once"])


def main(argv=None) -> int:
    from opforge.profile.compare import ladder_main

    return ladder_main(run, "transpose_ladder", __doc__.split("\n\n")[0],
                       "matrix side (default 8192 on CUDA, 48 on CPU)", argv)


if __name__ == "__main__":
    from opforge.profile.compare import main_as_module

    main_as_module(__file__)
