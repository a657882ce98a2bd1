"""Bench cases for rotary position embedding (``opforge.rope``), forward, at
the shapes of a Llama-style training step (32 query / 8 key heads, head dim 64
and 128) and of a decode step (one token, gathered by position ids).

Bytes: q and k read once and written once, plus one cos and one sin row per
token. FLOPs: 3 per element (two products and a sum). The case's output is
the rotated q (k is computed in the same launch and timed with it).

Peers: torch eager and torch.compile of transformers' formula
(``x * cos + rotate_half(x) * sin`` on q and k) and, when installed,
Liger-Kernel's ``liger_rotary_pos_emb``.
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import rope as R


def _eager(q, k, cos, sin):
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + R.rotate_half(q) * s, k * c + R.rotate_half(k) * s


def _liger():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None
    return lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin)[0]


def rope_case(batch: int, seq: int, heads_q: int, heads_k: int, dim: int, dtype, *, compile_peer=True) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(3)
        q = torch.randn((batch, seq, heads_q, dim), generator=g).to(dtype).to(dev).transpose(1, 2)
        k = torch.randn((batch, seq, heads_k, dim), generator=g).to(dtype).to(dev).transpose(1, 2)
        angle = torch.rand((batch, seq, dim // 2), generator=g) * 6
        emb = torch.cat([angle, angle], -1)
        return q, k, emb.cos().to(dtype).to(dev), emb.sin().to(dtype).to(dev)

    es = torch.empty((), dtype=dtype).element_size()
    elems = batch * seq * (heads_q + heads_k) * dim
    peers = {"torch eager": lambda *a: _eager(*a)[0]}
    if compile_peer:
        peers["torch.compile"] = compiled_peer(lambda *a: _eager(*a)[0])
    liger = _liger()
    if liger is not None and compile_peer:
        peers["liger"] = liger
    return BenchCase(
        op="rope", label=f"{batch}x{seq} h{heads_q}/{heads_k} d{dim}", dtype=dtype, make_args=make,
        run=lambda q, k, cos, sin: R.rope(q, k, cos, sin)[0],
        reference=lambda q, k, cos, sin: _eager(q, k, cos, sin)[0],
        flops=3 * elems, nbytes=2 * elems * es + 2 * batch * seq * dim * es, peers=peers,
        op_args=lambda q, k, cos, sin: (q, k, cos, sin, 1, False),
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The training step's shape (2 x 4096 tokens, 32 / 8 heads, d 64 and 128) and a small one."""
    bf16 = torch.bfloat16
    gpu = device.type == "cuda"
    if quick or not gpu:
        return [rope_case(1, 4, 2, 1, 16, torch.float32, compile_peer=gpu)]
    return [rope_case(2, 4096, 32, 8, 64, bf16), rope_case(2, 4096, 32, 8, 128, bf16),
            rope_case(64, 1, 32, 8, 128, bf16)]
