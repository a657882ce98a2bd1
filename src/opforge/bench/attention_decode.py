"""Bench cases for attention decode: the issue's grid (Hq 32, H_kv 8, D 128,
bf16, one query token; batch x context from 1 x 4k to 64 x 4k) over a
contiguous cache and a paged one (block sizes 16 and 256, shuffled physical
blocks), plus head dims 64 and 256, fp16, four query tokens and one small
graph-timed shape.

Decode is memory-bound: bytes are the K and V cache of the live context read
once, plus q read and the output written once; FLOPs ``4 * B * Hq * Sq * ctx
* D`` (two matmuls). The peer ``sdpa`` is ``F.scaled_dot_product_attention``
of ``q [B, Hq, 1, D]`` over the contiguous head-major cache ``[B, H_kv, ctx,
D]`` with ``enable_gqa`` (the layout in which SDPA streams the cache at the
copy bandwidth on the H200). Contiguous cases hand opforge that same tensor as
a ``[B, ctx, H_kv, D]`` view (label ``bhsd``), or a token-major cache as
flash_attn stores it (``bshd``); paged cases hold the same values in blocks.
SDPA gets its own head-major copy where the layouts differ, so both sides read
the same bytes from the layout each is best at.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase
from opforge.ops import attention_decode as A

GIB = 1 << 30


def _sdpa(q, k_ref, v_ref):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k_ref, v_ref,
                                          enable_gqa=q.shape[2] != k_ref.shape[1]).transpose(1, 2)


def decode_case(B: int, ctx: int, *, Hq: int = 32, H_kv: int = 8, D: int = 128, Sq: int = 1,
                dtype=torch.bfloat16, page: int | None = None, layout: str = "bhsd", graph: bool = False,
                peers: bool = True) -> BenchCase:
    """One decode shape. Args of the bench call: ``(q, k, v, seqlens, block_table,
    k_sdpa, v_sdpa)``; every sequence is ``ctx`` tokens long."""
    es = torch.empty((), dtype=dtype).element_size()
    scale = D ** -0.5
    kind = f"paged{page}" if page else layout

    def make(dev):
        def cache():
            return torch.randn(B, H_kv, ctx, D, device=dev, dtype=torch.float32).to(dtype)

        q = torch.randn(B, Sq, Hq, D, device=dev, dtype=torch.float32).to(dtype)
        k_ref, v_ref = cache(), cache()  # SDPA's head-major layout
        seqlens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
        table = None
        if page:
            per_seq = ctx // page
            perm = torch.randperm(B * per_seq, device=dev)

            def paged(t):  # [B, H, ctx, D] -> blocks [B * per_seq, page, H, D], shuffled
                blocks = t.permute(0, 2, 1, 3).reshape(B * per_seq, page, H_kv, D)
                out = torch.empty_like(blocks)
                out[perm] = blocks
                return out

            k, v = paged(k_ref), paged(v_ref)
            table = perm.view(B, per_seq).to(torch.int32)
        elif layout == "bshd":
            k, v = k_ref.transpose(1, 2).contiguous(), v_ref.transpose(1, 2).contiguous()
        else:
            k, v = k_ref.transpose(1, 2), v_ref.transpose(1, 2)
        return q, k, v, seqlens, table, k_ref, v_ref

    def run(q, k, v, seqlens, table, k_ref, v_ref):
        return A.attention_decode(q, k, v, seqlens, table, scale=scale)

    def reference(q, k, v, seqlens, table, k_ref, v_ref):
        return A.reference(q, k, v, seqlens, scale, False, table)[0]

    def op_args(q, k, v, seqlens, table, k_ref, v_ref):
        return (q, k, v, seqlens, scale, False, table)

    peer_fns = {}
    if peers and Sq == 1:
        peer_fns["sdpa"] = lambda q, k, v, seqlens, table, k_ref, v_ref: _sdpa(q, k_ref, v_ref)
    label = f"B{B}x{ctx // 1024}k" if ctx % 1024 == 0 else f"B{B}x{ctx}"
    label += f" Hq{Hq}/{H_kv} D{D}" + (f" Sq{Sq}" if Sq != 1 else "") + f" {kind}"
    return BenchCase(
        op="attention_decode", label=label, dtype=dtype, make_args=make, run=run, reference=reference,
        flops=4.0 * B * Hq * Sq * ctx * D,
        nbytes=2.0 * B * ctx * H_kv * D * es + 2.0 * B * Sq * Hq * D * es,
        peers=peer_fns, graph=graph, op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The issue's decode grid (caches up to 2 GiB of K+V), paged and
    contiguous; on the CPU a few interpreter-sized shapes."""
    if quick or device.type != "cuda":
        f32 = torch.float32
        return [
            decode_case(1, 96, Hq=4, H_kv=2, D=16, dtype=f32),
            decode_case(2, 64, Hq=4, H_kv=2, D=16, dtype=f32, page=16),
            decode_case(2, 48, Hq=4, H_kv=1, D=32, dtype=torch.float16, page=8, layout="bshd"),
        ]
    k = 1024
    grid = [(1, 4 * k), (1, 32 * k), (1, 128 * k), (16, 4 * k), (16, 32 * k), (64, 4 * k)]
    out = [decode_case(B, ctx) for B, ctx in grid]
    for B, ctx in ((1, 128 * k), (16, 32 * k), (64, 4 * k)):
        out.append(decode_case(B, ctx, layout="bshd"))
        out.append(decode_case(B, ctx, page=16))
        out.append(decode_case(B, ctx, page=256))
    out += [
        decode_case(16, 32 * k, D=64),
        decode_case(8, 32 * k, D=256),
        decode_case(16, 32 * k, dtype=torch.float16),
        decode_case(16, 8 * k, Sq=4, page=16),
        decode_case(4, 1 * k, graph=True),
    ]
    return out
