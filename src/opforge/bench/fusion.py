"""Bench cases for kernel fusion: a chain of 1, 2, 4 and 8 elementwise ops
fused by ``opforge.fuse`` against torch eager (one kernel, one HBM round trip
per op) and torch.compile (Inductor's own fused kernel), plus the fused ops
bias_gelu, swiglu and geglu, forward and backward, and one small graph-timed shape.

The chains alternate ``x * s``, ``x + t``, ``gelu(x)``, ``tanh(x)`` (``s``,
``t`` Python numbers: kernel arguments). Fused, every chain moves the same
bytes -- x read once, the result written once -- while eager moves them once
per op, so the speedup over eager grows with the chain's length; against
torch.compile the goal is parity or better. The chains are registry ops
``fused.chain_<n>`` (and ``fused.chain_<n>_backward``) created here.

Bytes are the minimum each case must move: inputs read once, outputs
written once. A forward+backward chain case counts x and y for the forward
and x, dy, dx for the backward (the backward recomputes from x, saving
nothing else). bias_gelu_backward counts grad and input read, dinput
written (bias and dbias are one row). FLOPs: 1 per mul/add, 5 per gelu,
4 per tanh, 4 per silu, 10 per gelu derivative, 7 per silu derivative.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase, compiled_peer
from opforge.fusion import fuse
from opforge.ops import fused as FU

_PRIM_FLOPS = (1, 1, 5, 4)  # mul, add, gelu, tanh


def _chain_expr(n: int):
    def chain(x, s, t):
        for i in range(n):
            k = i % 4
            if k == 0:
                x = x * s
            elif k == 1:
                x = x + t
            elif k == 2:
                x = F.gelu(x)
            else:
                x = torch.tanh(x)
        return x

    chain.__name__ = chain.__qualname__ = f"chain_{n}"
    return chain


CHAIN_LENGTHS = (1, 2, 4, 8)
CHAINS = {n: fuse(_chain_expr(n), name=f"chain_{n}") for n in CHAIN_LENGTHS}
_SCALE, _SHIFT = 0.75, 0.125


def _es(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _rand(shape, dtype, dev, scale=2.0):
    return (torch.randn(shape, device=dev, dtype=torch.float32) * scale).to(dtype)


def _peers(fn, device, enabled=True) -> dict:
    if not enabled:
        return {}
    peers = {"torch eager": fn}
    if device.type == "cuda":
        peers["torch.compile"] = compiled_peer(fn)
    return peers


def chain_case(n: int, shape, dtype, device, *, graph=False, variant=None, peers=True, label=None) -> BenchCase:
    numel = math.prod(shape)
    ff = CHAINS[n]
    return BenchCase(
        op=ff.op.name, label=label or f"{'x'.join(map(str, shape))} L={n}", dtype=dtype,
        make_args=lambda dev: (_rand(shape, dtype, dev), _SCALE, _SHIFT),
        run=ff, reference=ff.fn,
        flops=sum(_PRIM_FLOPS[i % 4] for i in range(n)) * numel, nbytes=2 * numel * _es(dtype),
        peers=_peers(ff.fn, device, peers), variant=variant, graph=graph,
    )


def chain_backward_case(n: int, shape, dtype, device) -> BenchCase:
    """Forward + backward through autograd (what training pays)."""
    numel = math.prod(shape)
    ff = CHAINS[n]

    def make(dev):
        return (_rand(shape, dtype, dev).requires_grad_(), _SCALE, _SHIFT, _rand(shape, dtype, dev, 1.0))

    def through(fn):
        def run(x, s, t, g):
            return torch.autograd.grad(fn(x, s, t), x, g)[0]
        return run

    def reference(x, s, t, g):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(ff.fn(x, s, t), x, g)[0]

    return BenchCase(
        op=ff.backward_op.name, label=f"{'x'.join(map(str, shape))} L={n} fwd+bwd", dtype=dtype, make_args=make,
        run=through(ff), reference=reference,
        flops=3 * sum(_PRIM_FLOPS[i % 4] for i in range(n)) * numel, nbytes=5 * numel * _es(dtype),
        peers=_peers(through(ff.fn), device), graph=False,
        op_args=lambda x, s, t, g: (x.detach(), s, t, g, ((1,), 3)),
    )


def bias_gelu_case(shape, dtype, device, approximate="none") -> BenchCase:
    numel = math.prod(shape)

    def make(dev):
        return (_rand(shape, dtype, dev), _rand(shape[-1:], dtype, dev), approximate)

    return BenchCase(
        op="bias_gelu", label="x".join(map(str, shape)) + ("" if approximate == "none" else " tanh"), dtype=dtype,
        make_args=make, run=FU.bias_gelu, reference=FU.bias_gelu_ref,
        flops=6 * numel, nbytes=(2 * numel + shape[-1]) * _es(dtype), peers=_peers(FU.bias_gelu_ref, device),
    )


def bias_gelu_backward_case(shape, dtype, device, approximate="none") -> BenchCase:
    """The backward op alone (dinput and dbias); peers compute the same from
    the same tensors (gelu_backward of input + bias, then the column sum)."""
    numel = math.prod(shape)

    def make(dev):
        return (_rand(shape, dtype, dev, 1.0), _rand(shape, dtype, dev), _rand(shape[-1:], dtype, dev))

    def ours(g, x, b):
        return torch.ops.opforge.bias_gelu_backward(g, x, b, approximate)[0]

    def reference(g, x, b):
        return FU.bias_gelu_backward_ref(g, x, b, approximate)[0]

    def eager(g, x, b):
        dz = torch.ops.aten.gelu_backward(g, x + b, approximate=approximate)
        return dz, dz.sum(tuple(range(dz.dim() - 1)))

    return BenchCase(
        op="bias_gelu_backward", label="x".join(map(str, shape)) + " bwd", dtype=dtype, make_args=make,
        run=ours, reference=reference, flops=12 * numel, nbytes=(3 * numel + 2 * shape[-1]) * _es(dtype),
        peers=_peers(eager, device), op_args=lambda g, x, b: (g, x, b, approximate),
    )


def swiglu_packed_case(rows: int, hidden: int, dtype, device, *, graph=False) -> BenchCase:
    numel = rows * hidden  # output elements; the input has twice as many

    def make(dev):
        return (_rand((rows, 2 * hidden), dtype, dev),)

    return BenchCase(
        op="swiglu_packed", label=f"{rows}x(2x{hidden})", dtype=dtype, make_args=make,
        run=FU.swiglu, reference=FU.swiglu_packed_ref, flops=5 * numel, nbytes=3 * numel * _es(dtype),
        peers=_peers(FU.swiglu_packed_ref, device), graph=graph,
    )


def swiglu_packed_backward_case(rows: int, hidden: int, dtype, device) -> BenchCase:
    numel = rows * hidden

    def make(dev):
        return (_rand((rows, hidden), dtype, dev, 1.0), _rand((rows, 2 * hidden), dtype, dev))

    return BenchCase(
        op="swiglu_packed_backward", label=f"{rows}x(2x{hidden}) bwd", dtype=dtype, make_args=make,
        run=torch.ops.opforge.swiglu_packed_backward, reference=FU.swiglu_packed_backward_ref,
        flops=12 * numel, nbytes=5 * numel * _es(dtype), peers=_peers(FU.swiglu_packed_backward_ref, device),
    )


def swiglu_case(shape, dtype, device) -> BenchCase:
    numel = math.prod(shape)
    return BenchCase(
        op="swiglu", label="x".join(map(str, shape)) + " gate,up", dtype=dtype,
        make_args=lambda dev: (_rand(shape, dtype, dev), _rand(shape, dtype, dev)),
        run=FU.swiglu, reference=FU.swiglu_ref, flops=5 * numel, nbytes=3 * numel * _es(dtype),
        peers=_peers(FU.swiglu_ref, device),
    )


def geglu_case(shape, dtype, device, approximate="tanh") -> BenchCase:
    numel = math.prod(shape)
    return BenchCase(
        op="geglu", label="x".join(map(str, shape)) + f" gate,up {approximate}", dtype=dtype,
        make_args=lambda dev: (_rand(shape, dtype, dev), _rand(shape, dtype, dev), approximate),
        run=FU.geglu, reference=FU.geglu_ref, flops=10 * numel, nbytes=3 * numel * _es(dtype),
        peers=_peers(FU.geglu_ref, device),
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The chain-length sweep, the fused ops forward and backward, one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    if quick or device.type != "cuda":
        return [
            chain_case(1, (64, 256), bf16, device),
            chain_case(4, (64, 256), f32, device),
            bias_gelu_case((32, 256), bf16, device),
            swiglu_packed_case(16, 256, f32, device),
        ]
    big = (32768, 8192)
    out = [chain_case(n, big, bf16, device) for n in CHAIN_LENGTHS]
    out += [
        chain_case(4, big, f32, device),
        chain_backward_case(4, big, bf16, device),
        bias_gelu_case(big, bf16, device),
        bias_gelu_case(big, f32, device),
        bias_gelu_case(big, bf16, device, approximate="tanh"),
        bias_gelu_case((262144, 1024), bf16, device),
        bias_gelu_case((1024, 262144), bf16, device),
        bias_gelu_backward_case(big, bf16, device),
        bias_gelu_backward_case(big, f32, device),
        swiglu_packed_case(16384, 8192, bf16, device),
        swiglu_packed_backward_case(16384, 8192, bf16, device),
        swiglu_case((16384, 8192), bf16, device),
        geglu_case((16384, 8192), bf16, device),
        swiglu_packed_case(32768, 128, bf16, device),
        chain_case(4, (64, 1024), bf16, device, graph=True),
    ]
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Dense operands: the flat and the strided generated kernels (and torch
    eager) over sizes -- where dispatch's flat-first rule holds."""
    gpu = device.type == "cuda" and not quick
    exps = range(12, 27, 2) if gpu else range(10, 15, 4)
    out = []
    for e in exps:
        shape = (1 << (e - 10), 1024) if e >= 10 else (1, 1 << e)
        for v in ("triton_flat", "triton_strided") + (("torch_eager",) if device.type == "cuda" else ()):
            out.append(chain_case(4, shape, torch.bfloat16, device, variant=v, peers=False,
                                  label=f"{shape[0]}x{shape[1]} L=4"))
    return out
