"""Bench cases for quantization: per-token int8 and fp8, per-block fp8,
per-tensor int8 (dynamic: two reads; static: given scale, one read), and
dequantize.

Bytes are the fewest the op must move: the input read once, the quantized
data written once, the scales (and zero points) written once -- for
dequantize the data and scales read once, the output written once. Dynamic
per-tensor quantization has to read its input twice (the scale depends on
every value), so its floor is out of reach by design: it is there to be
compared with its peers. FLOPs: about 4 per element (abs/max, multiply,
round, clamp). Peers: the torch implementation (the reference's ops) eager
and under torch.compile.
"""

from __future__ import annotations

import math

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import quant as Q

FLOPS_PER_ELEMENT = 4


def _scale_elems(shape, granularity, block) -> int:
    return math.prod(Q.plan(tuple(shape), granularity, tuple(block), -1).scale_shape)


def quantize_case(shape, dtype, qdtype, granularity, *, block=(), symmetric=True, static=False, graph=False,
                  variant=None, peers=True, compile_peer=True, label=None) -> BenchCase:
    n = math.prod(shape)
    es = torch.empty((), dtype=dtype).element_size()
    groups = _scale_elems(shape, granularity, block)
    nbytes = n * es + n * 1 + groups * 4 * (1 if symmetric else 2)
    block = tuple(block)

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).mul_(3).to(dtype)
        if not static:
            return (x,)
        _, s, z = Q.quantize_reference(x, qdtype, granularity, block, -1, symmetric)
        return (x, s) if symmetric else (x, s, z)

    def op_args(x, s=None, z=None):
        args = (x, qdtype, granularity, list(block), -1, symmetric)
        return args if s is None else args + ((s,) if z is None else (s, z))

    def run(x, s=None, z=None):
        return Q.quantize(x, qdtype, granularity, block=block or None, symmetric=symmetric,
                          scale=s, zero_point=z).data

    def reference(x, s=None, z=None):
        return Q.quantize_reference(*op_args(x, s, z))[0]

    def torch_impl(x, s=None, z=None):
        return Q.quantize_reference(*op_args(x, s, z))

    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = torch_impl
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(torch_impl)
    tag = f"{granularity}{'' if not block else f' {block[0]}x{block[1]}'} {str(qdtype).replace('torch.', '')}" \
          f"{' static' if static else ''}{'' if symmetric else ' asym'}"
    return BenchCase(
        op="quantize", label=label or f"{'x'.join(map(str, shape))} {tag}", dtype=dtype, make_args=make,
        run=run, reference=reference, flops=FLOPS_PER_ELEMENT * n, nbytes=nbytes,
        peers=peer_fns, variant=variant, graph=graph, op_args=op_args, upcast_reference=False,
    )


def dequantize_case(shape, qdtype, out_dtype, granularity, *, block=(), symmetric=True, graph=False,
                    peers=True, compile_peer=True, label=None) -> BenchCase:
    n = math.prod(shape)
    groups = _scale_elems(shape, granularity, block)
    es = torch.empty((), dtype=out_dtype).element_size()
    block = tuple(block)

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).mul_(3)
        data, s, z = Q.quantize_reference(x, qdtype, granularity, block, -1, symmetric)
        return (data, s) if symmetric else (data, s, z)

    def op_args(data, s, z=None):
        args = (data, s, granularity, list(block), -1, out_dtype)
        return args if z is None else args + (z,)

    def run(data, s, z=None):
        q = Q.QuantizedTensor(data, s, z, granularity, block or None, None, out_dtype)
        return Q.dequantize(q)

    def reference(data, s, z=None):
        return Q.dequantize_reference(*op_args(data, s, z))

    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = reference
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(reference)
    return BenchCase(
        op="dequantize", label=label or f"{'x'.join(map(str, shape))} {granularity} "
                                        f"{str(qdtype).replace('torch.', '')}{'' if symmetric else ' asym'}",
        dtype=out_dtype, make_args=make, run=run, reference=reference,
        flops=2 * n, nbytes=n * 1 + n * es + groups * 4 * (1 if symmetric else 2),
        peers=peer_fns, graph=graph, op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The issue's grid: per-token int8 / fp8, per-block fp8, per-tensor int8
    (dynamic and static) on 1 Gi elements, dequantize, one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    i8, e4, e5 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            quantize_case((64, 256), bf16, i8, "token", compile_peer=compile_peer),
            quantize_case((128, 256), f32, e4, "block", block=(128, 128), compile_peer=compile_peer),
            quantize_case((16, 512), bf16, i8, "tensor", static=True, compile_peer=compile_peer),
            dequantize_case((64, 256), i8, bf16, "token", compile_peer=compile_peer),
        ]
    big = (16384, 8192)
    return [
        quantize_case(big, bf16, i8, "token"),
        quantize_case(big, bf16, e4, "token"),
        quantize_case(big, bf16, i8, "token", symmetric=False),
        quantize_case(big, f32, e4, "token"),
        quantize_case(big, bf16, e4, "block", block=(128, 128)),
        quantize_case(big, bf16, e4, "block", block=(1, 128)),
        quantize_case(big, bf16, e5, "block", block=(128, 128)),
        quantize_case((512, 262144), bf16, e4, "token"),
        quantize_case((65536, 128), bf16, i8, "token"),
        quantize_case((65536, 16384), bf16, i8, "tensor"),
        quantize_case((65536, 16384), bf16, i8, "tensor", static=True),
        quantize_case(big, bf16, i8, "channel"),
        dequantize_case(big, i8, bf16, "token"),
        dequantize_case(big, e4, bf16, "block", block=(128, 128)),
        dequantize_case(big, i8, f32, "token", symmetric=False),
        quantize_case((64, 1024), bf16, i8, "token", graph=True),
    ]


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Per-token rows: the fused kernel (one read) vs the stats path (two reads)
    over row lengths, up to the fused kernel's limit."""
    from opforge.kernels.quant import ROW_LIMIT

    gpu = device.type == "cuda" and not quick
    exps = range(7, 15) if gpu else range(7, 10)
    out = []
    for e in exps:
        cols = 1 << e
        rows = max(1, (1 << (27 if gpu else 12)) // cols)
        for v in ("triton_fused", "triton_stats") + (("torch_eager",) if device.type == "cuda" else ()):
            if v == "triton_fused" and cols > ROW_LIMIT:
                continue
            out.append(quantize_case((rows, cols), torch.bfloat16, torch.int8, "token", variant=v, peers=False,
                                     label=f"{rows}x{cols}"))
    return out
