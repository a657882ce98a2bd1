"""Bench cases for ``opforge.topk`` at MoE-gating shapes (8 and 64 experts,
top-2 / top-8, 8192 tokens) and a sampling shape (top-50 of 4096).

Bytes: the rows read once, values and int64 indices written. FLOPs: one
compare per element per pick. Peer: ``torch.topk``.
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase
from opforge.ops import topk as T


def topk_case(rows: int, cols: int, k: int, dtype=torch.float32) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(4)
        return (torch.randn((rows, cols), generator=g).to(dtype).to(dev),)

    es = torch.empty((), dtype=dtype).element_size()
    return BenchCase(op="topk", label=f"{rows}x{cols} k{k}", dtype=dtype, make_args=make,
                     run=lambda x: T.topk(x, k)[0], reference=lambda x: torch.topk(x, k)[0],
                     flops=rows * cols * k, nbytes=rows * cols * es + rows * k * (es + 8),
                     peers={"torch.topk": lambda x: torch.topk(x, k)[0]}, op_args=lambda x: (x, k, -1, True))


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    if quick or device.type != "cuda":
        return [topk_case(37, 8, 2)]
    return [topk_case(8192, 8, 2), topk_case(8192, 64, 8), topk_case(64, 4096, 50)]
