"""Bench cases for the reduction family: the last dim (rows kernel), dim 0 of
a matrix (cols kernel, no transpose), full reductions and few long rows (the
split kernels), argmax and var, a row-length sweep, and a small graph-timed
shape.

Bytes are the fewest the op must move: the input read once, the output
written once (the split partials are not counted). FLOPs per input element:
1 for sum/mean/max/argmax (one add or compare), 3 for var/std (subtract,
multiply, add).
"""

from __future__ import annotations

import math

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import reduce as R

FLOPS_PER_ELEMENT = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "argmax": 1, "argmin": 1, "var": 3, "std": 3}


def _out_numel(shape, dim) -> int:
    if dim is None:
        return 1
    dims = {d % len(shape) for d in ((dim,) if isinstance(dim, int) else dim)}
    return math.prod(s for i, s in enumerate(shape) if i not in dims)


def reduce_case(name: str, shape, dtype, dim=None, *, graph=False, variant=None, peers=True,
                compile_peer=True, label=None) -> BenchCase:
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    out_es = 8 if name in ("argmax", "argmin") else es
    public = getattr(R, name)
    torch_fn = getattr(torch, name)

    if name in ("argmax", "argmin"):
        def fn(x, f=public):
            return f(x, dim)

        def ref(x):
            return torch_fn(x, dim)
        dims = () if dim is None else (dim % len(shape),)
        op_args = (lambda x: (x, dims, False))
    else:
        def fn(x, f=public):
            return f(x) if dim is None else f(x, dim)

        def ref(x):
            return torch_fn(x) if dim is None else torch_fn(x, dim)
        dims = () if dim is None else tuple(sorted({d % len(shape) for d in ((dim,) if isinstance(dim, int) else dim)}))
        if name in ("var", "std"):
            op_args = (lambda x: (x, dims, 1.0, False))
        elif name in ("sum", "mean"):
            op_args = (lambda x: (x, dims, False, None))
        else:
            op_args = (lambda x: (x, dims, False))

    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = ref
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(ref)

    def make(dev):
        return (torch.randn(shape, device=dev, dtype=torch.float32).mul_(3).add_(0.5).to(dtype),)

    where = "all" if dim is None else f"dim={dim}"
    return BenchCase(
        op=name, label=label or f"{'x'.join(map(str, shape))} {where}", dtype=dtype, make_args=make,
        run=fn, reference=ref, flops=FLOPS_PER_ELEMENT[name] * n,
        nbytes=n * es + _out_numel(shape, dim) * out_es,
        peers=peer_fns, variant=variant, graph=graph, op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid: bandwidth-bound shapes (>= 256 MiB), long rows, the
    row-length sweep, one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            reduce_case("sum", (64, 256), f32, -1, compile_peer=compile_peer),
            reduce_case("sum", (256, 64), bf16, 0, compile_peer=compile_peer),
            reduce_case("argmax", (16, 300), f32, -1, compile_peer=compile_peer),
            reduce_case("var", (1 << 16,), f32, None, compile_peer=compile_peer),
        ]
    out = [
        reduce_case("sum", (32768, 8192), bf16, -1),
        reduce_case("sum", (32768, 8192), bf16, 0),
        reduce_case("sum", (16384, 16384), f32, -1),
        reduce_case("sum", (16384, 16384), f32, 0),
        reduce_case("sum", (1 << 30,), f32, None, label="1Gi all"),
        reduce_case("mean", (1 << 28,), bf16, None, label="256Mi all"),
        reduce_case("argmax", (32768, 8192), bf16, -1),
        reduce_case("amax", (32768, 8192), bf16, 0),
        reduce_case("var", (32768, 8192), f32, -1),
        reduce_case("std", (16384, 16384), f32, 0),
        reduce_case("sum", (64, 1 << 20), f32, -1),
        reduce_case("amax", (8, 64, 1 << 17), bf16, (0, 2), label="8x64x131072 dim=(0,2)"),
    ]
    # Row lengths 128 .. 262144 at 2^27 elements (256 MiB bf16, 512 MiB fp32).
    for e in (7, 9, 11, 13, 15, 17, 18):
        cols = 1 << e
        for dt in (bf16, f32):
            out.append(reduce_case("sum", ((1 << 27) // cols, cols), dt, -1))
    out.append(reduce_case("sum", (64, 1024), bf16, -1, graph=True))
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Full fp32 sums: two-pass (deterministic) vs atomic split, over sizes."""
    small = quick or device.type != "cuda"
    exps = (16,) if small else range(16, 31, 2)
    variants = ("triton_split_two_pass", "triton_split_atomic") + (("torch_eager",) if device.type == "cuda" else ())
    out = []
    for e in exps:
        for v in variants:
            out.append(reduce_case("sum", (1 << e,), torch.float32, None, variant=v, peers=False,
                                   label=f"2^{e} all"))
    return out
