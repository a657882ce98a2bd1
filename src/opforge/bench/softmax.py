"""Bench cases for the softmax family: short rows (row-resident kernel),
long rows (online kernel), and a small graph-timed shape.

Bytes are the fewest the op must move: the input read once, the output
written once (the online kernel reads long rows twice; the roofline counts
what the op needs, not what a kernel does). FLOPs: about 5 per element
(max, subtract, exp, sum, scale).
"""

from __future__ import annotations

import math

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.kernels.softmax import ROW_LIMIT
from opforge.ops import softmax as S

FLOPS_PER_ELEMENT = 5


def softmax_case(name: str, shape, dtype, *, dim: int = -1, graph=False, variant=None, peers=True,
                 compile_peer=True, label=None) -> BenchCase:
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    public = getattr(S, name)
    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = S.REFERENCE[name]
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(S.REFERENCE[name])

    def make(dev):
        return (torch.randn(shape, device=dev, dtype=torch.float32).mul_(3).to(dtype), dim)

    return BenchCase(
        op=name, label=label or "x".join(map(str, shape)), dtype=dtype, make_args=make,
        run=public, reference=S.REFERENCE[name],
        flops=FLOPS_PER_ELEMENT * n, nbytes=2 * n * es,
        peers=peer_fns, variant=variant, graph=graph,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid: bandwidth-bound shapes, long rows, one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            softmax_case("softmax", (64, 256), f32, compile_peer=compile_peer),
            softmax_case("softmax", (8, 1000), bf16, compile_peer=compile_peer),
            softmax_case("log_softmax", (64, 256), f32, compile_peer=compile_peer),
            softmax_case("softmax", (2, 20000), f32, compile_peer=compile_peer),
        ]
    return [
        softmax_case("softmax", (32768, 8192), bf16),
        softmax_case("softmax", (8192, 8192), f32),
        softmax_case("softmax", (2048, 65536), bf16),
        softmax_case("softmax", (512, 262144), bf16),
        softmax_case("softmax", (1024, 65536), f32),
        softmax_case("log_softmax", (512, 262144), f32),
        softmax_case("log_softmax", (32768, 8192), bf16),
        softmax_case("softmax", (4096, 4096), bf16, dim=0, label="4096x4096 dim=0"),
        softmax_case("softmax", (8192, 8192), f32, dim=0, label="8192x8192 dim=0"),
        softmax_case("softmax", (64, 1024, 1024), bf16, dim=1, label="64x1024x1024 dim=1"),
        softmax_case("softmax", (64, 1024), bf16, graph=True),
    ]


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Row-resident vs split vs online kernel over row lengths (where each stops paying)."""
    exps = range(8, 13, 2) if (quick or device.type != "cuda") else range(8, 19)
    out = []
    for e in exps:
        cols = 1 << e
        rows = max(1, (1 << (12 if quick or device.type != "cuda" else 26)) // cols)
        for v in ("triton_row", "triton_split", "triton_online") + (("torch_eager",) if device.type == "cuda" else ()):
            if v == "triton_row" and cols > ROW_LIMIT or v == "triton_split" and device.type != "cuda":
                continue
            out.append(softmax_case("softmax", (rows, cols), torch.bfloat16, variant=v, peers=False,
                                    label=f"{rows}x{cols}"))
    return out
