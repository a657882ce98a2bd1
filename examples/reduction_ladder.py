"""Reduction ladder: from atomics to warp shuffles, profiled.

    python examples/reduction_ladder.py [--out DIR] [--ncu] [--size 67108864]

Five real kernels summing an fp32 vector (the CUDA reduction article's
steps, as Triton expresses them):

1. ``atomic``: every element is an atomic add to one address: the
   contention is the whole story (no reduction on chip at all).
2. ``interleaved``: a program loads ``BLOCK`` elements and halves them in a
   loop of pairs of *neighbours* (``reshape(n/2, 2).sum(1)``, the article's
   interleaved addressing), then one atomic per program.
3. ``sequential``: the same tree over *halves* (``reshape(2, n/2).sum(0)``,
   the article's sequential addressing).
   In CUDA each thread owns one element of a shared array, and sequential
   addressing wins (no divergence, no bank conflicts). In Triton the compiler
   maps elements to threads, and a thread holds *adjacent* elements: pairs of
   neighbours add inside a thread's registers, while pairs of halves live in
   different threads, so each step moves data through shared memory (the
   compiled resources show it: about 16 bytes of shared memory for the
   neighbours' tree, 2 KB for the halves'). The ladder keeps the article's
   order and shows what Triton makes of it.
4. ``block``: ``tl.sum`` of the block: Triton reduces in registers, then
   across lanes with warp shuffles and across warps through a few bytes of
   shared memory (the article's warp-level step); one atomic per program.
5. ``two_pass``: ``tl.sum`` per block into a partials buffer, then one
   program sums the partials: no atomics, a deterministic result.

Bytes counted: the vector read once (the scalar write is negligible); FLOPs:
one add per element. The vector holds zeros and ones (see ``_vector``), so
every step must match the float64 sum exactly. Without CUDA each kernel runs
under the Triton interpreter on a small vector.
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
def reduce_atomic_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(out_ptr + tl.zeros([BLOCK], dtype=tl.int32), x, mask=mask)


@triton.jit
def reduce_tree_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, LOG2: tl.constexpr, SEQUENTIAL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    for i in tl.static_range(LOG2):  # unrolled: the width halves each step
        if SEQUENTIAL:
            x = tl.sum(tl.reshape(x, [2, BLOCK >> (i + 1)]), axis=0)  # element j + element j + width
        else:
            x = tl.sum(tl.reshape(x, [BLOCK >> (i + 1), 2]), axis=1)  # element 2j + element 2j + 1
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


@triton.jit
def reduce_block_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


@triton.jit
def reduce_partials_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(part_ptr + tl.program_id(0), tl.sum(x, axis=0))


@triton.jit
def reduce_final_kernel(part_ptr, out_ptr, parts, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, parts, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(part_ptr + offs, mask=offs < parts, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))


def _vector(n: int, device: str):
    """Zeros and ones, with fewer than 2**23 ones expected: every partial sum is
    an integer below 2**24, exact in fp32, so each step's sum is exact whatever
    its order of additions (a sum of 2**26 values near 1 would not be: fp32
    stops adding 1 to a total past 2**24, and atomics add in any order)."""
    g = torch.Generator(device="cpu").manual_seed(n)
    p = min(0.5, 2.0**23 / n)
    return (torch.rand(n, generator=g) < p).float().to(device)


def _built(x, out, run, launches):
    from opforge.profile.compare import Built

    return Built(run, launches, lambda: out, x.double().sum().reshape(1), float(x.numel() * 4),
                 flops=float(x.numel()), tolerance=0.0)


def _one_atomic_sum(kernel, device: str, n: int, kw: dict):
    """A step of one ``kernel(x, out, n, BLOCK=...)`` launch that atomically adds into a zeroed ``out``."""
    x, out = _vector(n, device), torch.zeros(1, device=device)

    def run():
        out.zero_()
        kernel[(triton.cdiv(n, kw["BLOCK"]),)](x, out, n, **kw)

    return _built(x, out, run, [(kernel, (x, out, n), kw)])


def build_atomic(device: str, n: int, block: int = 1024):
    return _one_atomic_sum(reduce_atomic_kernel, device, n, {"BLOCK": block, "num_warps": 4})


def build_tree(device: str, n: int, sequential: bool, block: int = 1024, log2: int = 5):
    return _one_atomic_sum(reduce_tree_kernel, device, n,
                           {"BLOCK": block, "LOG2": log2, "SEQUENTIAL": sequential, "num_warps": 4})


def build_block(device: str, n: int, block: int = 4096, warps: int = 8):
    return _one_atomic_sum(reduce_block_kernel, device, n, {"BLOCK": block, "num_warps": warps})


def build_two_pass(device: str, n: int, block: int = 4096, warps: int = 8):
    x, out = _vector(n, device), torch.zeros(1, device=device)
    parts = triton.cdiv(n, block)
    partials = torch.empty(parts, device=device)
    kw1 = {"BLOCK": block, "num_warps": warps}
    kw2 = {"BLOCK": 1024, "num_warps": 4}

    def run():
        reduce_partials_kernel[(parts,)](x, partials, n, **kw1)
        reduce_final_kernel[(1,)](partials, out, parts, **kw2)

    return _built(x, out, run, [(reduce_partials_kernel, (x, partials, n), kw1),
                                (reduce_final_kernel, (partials, out, parts), kw2)])


def steps(n: int):
    from opforge.profile.compare import Step

    return [
        Step("atomic", "every element an atomic add to one address", "reduction_ladder:build_atomic", {"n": n}),
        Step("interleaved", "tree over neighbours (reshape n/2 x 2): in a thread's registers; one atomic/program",
             "reduction_ladder:build_tree", {"n": n, "sequential": False}),
        Step("sequential", "tree over halves (reshape 2 x n/2): across threads, via shared memory; one atomic/program",
             "reduction_ladder:build_tree", {"n": n, "sequential": True}),
        Step("block tl.sum", "registers, warp shuffles, shared memory across warps; one atomic per program",
             "reduction_ladder:build_block", {"n": n}),
        Step("two-pass", "tl.sum per block into partials, one program sums them: deterministic",
             "reduction_ladder:build_two_pass", {"n": n}),
    ]


def run(out: str | None = None, ncu: bool = False, size: int | None = None, device=None, console=None,
        resources: bool = True) -> dict:
    """The ladder's report (written to ``out`` when given)."""
    from opforge.profile.compare import run_ladder

    on_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu"
    n = size or ((1 << 26) if on_gpu else 5000)
    return run_ladder("reduction_ladder", f"reduction ladder: sum of {n} fp32", steps(n), out=out, console=console,
                      device=device, ncu=ncu, resources=resources, sys_path=[HERE],
                      notes=["bytes counted: the vector read once; FLOPs: one add per element"])


def main(argv=None) -> int:
    from opforge.profile.compare import ladder_main

    return ladder_main(run, "reduction_ladder", __doc__.split("\n\n")[0],
                       "vector length (default 2**26 on CUDA, 5000 on CPU)", argv)


if __name__ == "__main__":
    from opforge.profile.compare import main_as_module

    main_as_module(__file__)
