"""Bench cases for the transpose family: large true transposes (the tiled
kernel), a strided copy of contiguous chunks and a tall-skinny matrix (the
gather and small-side paths), a sweep of square sizes, one graph-timed shape.

Bytes are the fewest the op must move: the input read once, the output
written once (2 x numel x element size). A transpose does no arithmetic:
FLOPs are 0, so the roofline is the copy bandwidth alone.
"""

from __future__ import annotations

import math

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import transpose as T


def _eager_transpose(x, dim0, dim1):
    return x.transpose(dim0, dim1).contiguous()


def _random(shape, dtype, dev):
    """Random values, never zeros (so a missed write cannot pass as a zero)."""
    if dtype.is_floating_point:
        x = torch.randn(shape, device=dev, dtype=torch.float32).mul_(3)
        return x.masked_fill_(x == 0, 1.0).to(dtype)
    hi = 127 if dtype in (torch.int8, torch.uint8) else 30000
    return torch.randint(1, hi, shape, device=dev, dtype=dtype)


def transpose_case(shape, dtype, dim0=-2, dim1=-1, *, graph=False, variant=None, peers=True,
                   compile_peer=True, label=None) -> BenchCase:
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = _eager_transpose
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(_eager_transpose)

    def make(dev):
        return (_random(shape, dtype, dev), dim0, dim1)

    return BenchCase(
        op="transpose", label=label or f"{'x'.join(map(str, shape))} ({dim0},{dim1})", dtype=dtype,
        make_args=make, run=T.transpose, reference=T.REFERENCE["transpose"],
        flops=0, nbytes=2 * n * es, peers=peer_fns, variant=variant, graph=graph,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid: the peer shape, bf16 and int8 matrices, batched and
    strided-copy layouts, tall-skinny, square sizes 128..16384, one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            transpose_case((64, 96), f32, compile_peer=compile_peer),
            transpose_case((4, 32, 48), bf16, compile_peer=compile_peer),
            transpose_case((16, 4, 64), bf16, 0, 1, compile_peer=compile_peer),
            transpose_case((512, 3), f32, compile_peer=compile_peer),
        ]
    out = [
        transpose_case((16384, 16384), f32),
        transpose_case((32768, 8192), bf16),
        transpose_case((64, 2048, 2048), bf16),
        transpose_case((8192, 64, 1024), bf16, 0, 1),
        transpose_case((4096, 4096), torch.int8),
        transpose_case((1 << 26, 3), f32),
    ]
    for e in range(7, 15):
        n = 1 << e
        if n != 16384:
            out.append(transpose_case((n, n), f32))
    out.append(transpose_case((64, 1024), bf16, graph=True))
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Tiled vs gather over the size of the plane's small side: batched
    ``[B, k, k]`` planes and tall-skinny ``[N, k]`` matrices (where the tile
    stops paying against packing many small planes per program)."""
    gpu = device.type == "cuda" and not quick
    total = 1 << (26 if gpu else 12)
    sides = (4, 8, 16, 32, 64, 128, 256) if gpu else (4, 32)
    variants = ("triton_tiled", "triton_gather") + (("torch_eager",) if device.type == "cuda" else ())
    out = []
    for k in sides:
        shapes = [(max(1, total // k), k)]
        if k * k >= 1024:  # smaller planes are the gather kernel's alone
            shapes.append((max(1, total // (k * k)), k, k))
        for shape in shapes:
            for v in variants:
                out.append(transpose_case(shape, torch.float32, variant=v, peers=False))
    return out
