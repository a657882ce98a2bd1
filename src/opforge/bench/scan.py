"""Bench cases for the scan family: cumsum (1-D device-wide, rows, columns),
cummax, segmented cumsum and stream compaction, and a small graph-timed shape.

Bytes are the fewest the op must move: each input read once, each output
written once (cummax writes fp values and int64 indices; segmented cumsum
reads the bool flags; compaction reads input and mask and writes the kept
values). FLOPs: one combine per element (two compares for cummax).

Peers: torch eager and torch.compile of the same torch expression; the
segmented peer is torch's usual way (one cumsum minus the prefix at each
segment start), the compaction peer ``x[mask]``.
"""

from __future__ import annotations

import math

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import compact as C
from opforge.ops import scan as S


def _es(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _peers(fn, peers: bool, compile_peer: bool) -> dict:
    out = {}
    if peers:
        out["torch eager"] = fn
        if compile_peer:
            out["torch.compile"] = compiled_peer(fn)
    return out


def _torch_cumsum(x, dim):
    return torch.cumsum(x, dim)


def _torch_cummax_values(x, dim):
    return torch.cummax(x, dim).values


def cumsum_case(shape, dtype, *, dim: int = -1, graph=False, variant=None, peers=True, compile_peer=True,
                label=None) -> BenchCase:
    n = math.prod(shape)

    def make(dev):
        return (torch.randn(shape, device=dev, dtype=torch.float32).to(dtype), dim)

    return BenchCase(
        op="cumsum", label=label or "x".join(map(str, shape)) + ("" if dim in (-1, len(shape) - 1) else f" dim={dim}"),
        dtype=dtype, make_args=make, run=S.cumsum, reference=S.REFERENCE["cumsum"],
        flops=n, nbytes=2 * n * _es(dtype), peers=_peers(_torch_cumsum, peers, compile_peer),
        variant=variant, graph=graph,
    )


def cummax_case(shape, dtype, *, dim: int = -1, compile_peer=True) -> BenchCase:
    n = math.prod(shape)

    def make(dev):
        return (torch.randn(shape, device=dev, dtype=torch.float32).to(dtype), dim)

    return BenchCase(
        op="cummax", label="x".join(map(str, shape)), dtype=dtype, make_args=make,
        run=lambda x, d: S.cummax(x, d)[0], reference=_torch_cummax_values,
        flops=2 * n, nbytes=n * (2 * _es(dtype) + 8), peers=_peers(_torch_cummax_values, True, compile_peer),
        op_args=lambda x, d: (x, d),
    )


def segmented_case(n: int, seg: int, dtype=torch.float32, *, compile_peer=True) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(7)
        x = torch.randn(n, device=dev, dtype=torch.float32).to(dtype)
        # Segment starts about every `seg` elements (a start with probability 1/seg).
        flags = (torch.rand(n, generator=g) < 1.0 / seg).to(dev)
        return (x, flags)

    def run(x, flags):
        return S.segmented_cumsum(x, flags=flags)

    def peer(x, flags):
        return S._segmented_eager(x, flags)

    return BenchCase(
        op="segmented_cumsum", label=f"{n} seg~{seg}", dtype=dtype, make_args=make, run=run,
        reference=lambda x, flags: S._segmented_ref(x, flags),
        flops=n, nbytes=n * (2 * _es(dtype) + 1), peers=_peers(peer, True, compile_peer),
        op_args=lambda x, flags: (x, flags, False, False),
    )


def compact_case(n: int, dtype=torch.float32, keep: float = 0.5, *, compile_peer=True) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(11)
        x = torch.randn(n, device=dev, dtype=torch.float32).to(dtype)
        return (x, (torch.rand(n, generator=g) < keep).to(dev))

    def peer(x, mask):
        return x[mask]

    return BenchCase(
        op="compact", label=f"{n} keep={keep}", dtype=dtype, make_args=make, run=C.compact,
        reference=lambda x, mask: x[mask],
        flops=n, nbytes=n * (_es(dtype) + 1) + int(n * keep) * _es(dtype),
        # x[mask] has a data-dependent shape: torch.compile graph-breaks on it, so eager is the peer.
        peers=_peers(peer, True, False),
        op_args=lambda x, mask: (x, mask, None, 0),
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid: the 1 Gi peer shape, rows, columns, cummax, segmented, compaction."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            cumsum_case((64, 256), f32, compile_peer=compile_peer),
            cumsum_case((20000,), f32, compile_peer=compile_peer),
            cummax_case((32, 100), f32, compile_peer=compile_peer),
            compact_case(5000, compile_peer=compile_peer),
        ]
    out = [
        cumsum_case((1 << 30,), f32),  # the peer shape: 4 GiB in, 4 GiB out
        cumsum_case((32768, 8192), bf16),
        cumsum_case((32768, 8192), f32),
        cumsum_case((16384, 16384), f32, dim=0),
        cummax_case((32768, 8192), f32),
        segmented_case(1 << 28, 1000),
        compact_case(1 << 28),
    ]
    # Row lengths 128 .. 262144 at 2^27 bf16 elements (256 MiB in, 256 MiB out).
    for cols in (128, 2048, 65536, 262144):
        out.append(cumsum_case(((1 << 27) // cols, cols), bf16))
    out.append(cumsum_case((64, 1024), bf16, graph=True))
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Look-back vs reduce-then-scan vs one program per row, over 1-D lengths and few long rows."""
    gpu = device.type == "cuda" and not quick
    variants = ("triton_lookback", "triton_reduce_scan", "triton_row") + (("torch_eager",) if gpu else ())
    shapes = ([(1 << e,) for e in (20, 24, 27, 30)] + [(64, 1 << 20), (1024, 1 << 16)]) if gpu else [(1 << 15,)]
    out = []
    for shape in shapes:
        for v in variants:
            out.append(cumsum_case(shape, torch.float32, variant=v, peers=False))
    return out
