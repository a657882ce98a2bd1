"""Bench cases for the elementwise family, and the size sweep that shows
where dispatch should switch variants (the crossover)."""

from __future__ import annotations

import math

import torch

import opforge
from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops.elementwise import REFERENCE

# FLOPs per output element, counted as a reader would (a special function as one).
FLOPS_PER_ELEMENT = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "maximum": 1, "minimum": 1, "neg": 1, "abs": 1, "relu": 1,
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "sigmoid": 3, "tanh": 4, "silu": 4, "gelu": 5,
    "gelu_tanh": 9, "gelu_backward": 10, "silu_backward": 7,
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


def _rand(shape, dtype, device, positive=False):
    x = torch.randn(shape, device=device, dtype=torch.float32)
    if positive:
        x = x.abs() + 0.1
    return x.to(dtype)


def unary_case(name, shape, dtype, *, graph=False, variant=None, peers=True, compile_peer=True) -> BenchCase:
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    public = getattr(opforge, name)
    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = REFERENCE[name]
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(REFERENCE[name])
    return BenchCase(
        op=name, label="x".join(map(str, shape)), dtype=dtype,
        make_args=lambda dev: (_rand(shape, dtype, dev, name in POSITIVE_ONLY),),
        run=public, reference=REFERENCE[name],
        flops=FLOPS_PER_ELEMENT[name] * n, nbytes=2 * n * es,
        peers=peer_fns, variant=variant, graph=graph,
    )


def binary_case(name, shape, other_shape, dtype, *, transpose_a=False, graph=False, variant=None,
                peers=True, compile_peer=True, label=None) -> BenchCase:
    """``other_shape`` None: a Python scalar operand. ``transpose_a``: a is a transposed view."""
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    public = getattr(opforge, name)
    other_n = math.prod(other_shape) if other_shape is not None else 0

    def make(dev):
        if transpose_a:
            a = _rand(shape[::-1], dtype, dev).t()
        else:
            a = _rand(shape, dtype, dev)
        b = _rand(other_shape, dtype, dev) if other_shape is not None else 1.25
        return a, b

    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = REFERENCE[name]
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(REFERENCE[name])
    shape_label = label or ("x".join(map(str, shape)) + ("ᵀ" if transpose_a else "") +
                            (" ⊙ " + ("x".join(map(str, other_shape)) if other_shape else "scalar")))
    return BenchCase(
        op=name, label=shape_label, dtype=dtype, make_args=make, run=public,
        reference=REFERENCE[name], flops=FLOPS_PER_ELEMENT[name] * n,
        nbytes=(2 * n + other_n) * es, peers=peer_fns, variant=variant, graph=graph,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid: large shapes at the bandwidth limit, and small ones graph-timed."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        big, rows = (1 << 14, 1 << 16), (64, 256)
        return [
            binary_case("add", (big[1],), (big[1],), f32, compile_peer=compile_peer),
            binary_case("mul", rows, (rows[1],), bf16, compile_peer=compile_peer),
            unary_case("gelu", rows, bf16, compile_peer=compile_peer),
            unary_case("silu", rows, f32, compile_peer=compile_peer),
            binary_case("add", (96, 80), (96, 80), f32, transpose_a=True, compile_peer=compile_peer),
        ]
    return [
        binary_case("add", (1 << 28,), (1 << 28,), f32),
        binary_case("add", (32768, 8192), (32768, 8192), bf16),
        binary_case("add", (32768, 8192), (8192,), bf16),
        binary_case("mul", (32768, 8192), None, bf16),
        binary_case("mul", (16384, 16384), (16384, 16384), f32, transpose_a=True),
        unary_case("gelu", (32768, 8192), bf16),
        unary_case("gelu", (16384, 8192), f32),
        unary_case("gelu_tanh", (32768, 8192), bf16),
        unary_case("silu", (32768, 8192), bf16),
        unary_case("exp", (32768, 8192), f32),
        binary_case("gelu_backward", (32768, 8192), (32768, 8192), bf16),
        binary_case("add", (4096,), (4096,), f32, graph=True),
        unary_case("gelu", (256, 1024), bf16, graph=True),
    ]


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Each variant forced, over sizes: where does the cheapest one change?

    Timed without graphs, as a user calls them, so host overhead counts: on
    tiny tensors that is what separates the variants.
    """
    exps = range(10, 17, 2) if (quick or device.type != "cuda") else range(10, 29, 2)
    variants = ["triton_flat", "triton_strided"] + (["torch_eager"] if device.type == "cuda" else [])
    out = []
    for e in exps:
        for v in variants:
            out.append(binary_case("add", (1 << e,), (1 << e,), torch.float32, variant=v, peers=False,
                                   label=f"2^{e}"))
    for e in exps:
        side = 1 << (e // 2)
        for v in variants[1:]:
            out.append(binary_case("add", (side, side), (side, side), torch.float32, transpose_a=True,
                                   variant=v, peers=False, label=f"{side}x{side}ᵀ"))
    return out


def tune_shapes(quick: bool = False) -> list[tuple[str, tuple, tuple | None, torch.dtype]]:
    """What ``opforge tune --preset elementwise`` tunes: (op, shape, other shape or None, dtype).

    The most used ops on contiguous inputs, one size per power of 4; other
    ops and layouts run the nearest of these buckets' configs (the default
    mode), or tune on first use with OPFORGE_AUTOTUNE=on or background.
    """
    exps = range(10, 17, 3) if quick else range(8, 29, 2)
    ops = ("add", "gelu") if quick else ("add", "mul", "gelu", "silu")
    dtypes = (torch.float32,) if quick else (torch.float32, torch.bfloat16)
    out = []
    for dtype in dtypes:
        for name in ops:
            for e in exps:
                binary = name in ("add", "mul")
                out.append((name, (1 << e,), (1 << e,) if binary else None, dtype))
    return out
