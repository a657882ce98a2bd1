"""Rotary position embedding kernel (Llama's ``rotate_half`` convention).

For a head vector ``x = [x1, x2]`` (two halves of ``D / 2``) and the rows
``cos = [c1, c2]``, ``sin = [s1, s2]`` of its position:

* forward:  ``[x1 c1 - x2 s1,  x2 c2 + x1 s2]``  (``x cos + rotate_half(x) sin``)
* backward: ``[g1 c1 + g2 s2,  g2 c2 - g1 s1]``  (the transpose of that map)

One program owns one ``(batch, position)`` pair: it loads the position's
``cos`` / ``sin`` row once (gathered through ``position_ids`` when given) and
rotates every query head and every key head of that position, so q and k
are one launch and the tables are read once per token, not once per head.
Tensors are addressed through their strides (``[B, H, S, D]`` or ``[B, S,
H, D]``, any layout), and the output may alias the input (in place).
Arithmetic in fp32 (fp64 for fp64), rounded once at the store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.launch import launch
from opforge.runtime.shapes import pow2

VERSION = "1"
# Elements of one head block held in registers: heads beyond it are walked in blocks.
TILE_LIMIT = 8192


@triton.jit
def _rotate(x_ptr, o_ptr, xs_b, xs_h, xs_s, xs_d, os_b, os_h, os_s, os_d, b, s, H,
            c1, c2, s1, s2, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
            BACKWARD: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HALF
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = (offs_h < H)[:, None] & dmask[None, :]
        xin = x_ptr + b * xs_b + s * xs_s + offs_h[:, None] * xs_h + offs_d[None, :] * xs_d
        x1 = tl.load(xin, mask=mask, other=0.0)
        x2 = tl.load(xin + HALF * xs_d, mask=mask, other=0.0)
        dtype = x1.dtype
        x1 = x1.to(c1.dtype)
        x2 = x2.to(c1.dtype)
        if BACKWARD:
            y1 = x1 * c1[None, :] + x2 * s2[None, :]
            y2 = x2 * c2[None, :] - x1 * s1[None, :]
        else:
            y1 = x1 * c1[None, :] - x2 * s1[None, :]
            y2 = x2 * c2[None, :] + x1 * s2[None, :]
        out = o_ptr + b * os_b + s * os_s + offs_h[:, None] * os_h + offs_d[None, :] * os_d
        tl.store(out, y1.to(dtype), mask=mask)
        tl.store(out + HALF * os_d, y2.to(dtype), mask=mask)


@triton.jit
def rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
                S, HQ, HK,
                qs_b, qs_h, qs_s, qs_d, ks_b, ks_h, ks_s, ks_d,
                qos_b, qos_h, qos_s, qos_d, kos_b, kos_h, kos_s, kos_d,
                cs_b, cs_s, cs_d, ps_b, ps_s,
                HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                HAS_POS: tl.constexpr, BACKWARD: tl.constexpr, FP64: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets: batch x stride may pass 2^31
    b = pid // S
    s = pid % S
    if HAS_POS:
        row = tl.load(pos_ptr + b * ps_b + s * ps_s).to(tl.int64)
    else:
        row = s
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HALF
    crow = b * cs_b + row * cs_s + offs_d * cs_d
    compute = tl.float64 if FP64 else tl.float32
    c1 = tl.load(cos_ptr + crow, mask=dmask, other=0.0).to(compute)
    c2 = tl.load(cos_ptr + crow + HALF * cs_d, mask=dmask, other=0.0).to(compute)
    s1 = tl.load(sin_ptr + crow, mask=dmask, other=0.0).to(compute)
    s2 = tl.load(sin_ptr + crow + HALF * cs_d, mask=dmask, other=0.0).to(compute)
    _rotate(q_ptr, qo_ptr, qs_b, qs_h, qs_s, qs_d, qos_b, qos_h, qos_s, qos_d, b, s, HQ,
            c1, c2, s1, s2, HALF, BLOCK_HQ, BLOCK_D, BACKWARD)
    _rotate(k_ptr, ko_ptr, ks_b, ks_h, ks_s, ks_d, kos_b, kos_h, kos_s, kos_d, b, s, HK,
            c1, c2, s1, s2, HALF, BLOCK_HK, BLOCK_D, BACKWARD)


def default_config(heads_q: int, heads_k: int, head_dim: int) -> dict:
    """Head blocks as large as the register tile allows; 4 warps (one token per program)."""
    half = pow2(max(head_dim // 2, 1))
    cap = max(1, TILE_LIMIT // half)
    return {"BLOCK_HQ": min(pow2(max(heads_q, 1)), cap), "BLOCK_HK": min(pow2(max(heads_k, 1)), cap),
            "num_warps": 4}


def configs(heads_q: int, heads_k: int, head_dim: int) -> list[dict]:
    base = default_config(heads_q, heads_k, head_dim)
    return [dict(base, num_warps=w) for w in (1, 2, 4, 8)]


def launch_rope(q, k, qo, ko, cos, sin, pos, batch: int, seq: int, heads_q: int, heads_k: int,
                strides: tuple, backward: bool, cfg: dict) -> None:
    """Rotate ``q`` into ``qo`` and ``k`` into ``ko`` (either may alias its input).

    ``strides``: of q, k, qo, ko in the logical ``[B, H, S, D]`` order (4
    each), then the tables' ``(batch, row, d)`` (batch stride 0 when shared),
    then ``position_ids``' ``(batch, s)``; ``pos`` None: the row is ``s``."""
    if batch * seq == 0:
        return
    half = q.shape[-1] // 2
    launch(rope_kernel, (batch * seq,), q, k, qo, ko, cos, sin, pos if pos is not None else cos,
           seq, heads_q, heads_k, *strides,
           HALF=half, BLOCK_D=pow2(half), BLOCK_HQ=cfg["BLOCK_HQ"], BLOCK_HK=cfg["BLOCK_HK"],
           HAS_POS=pos is not None, BACKWARD=backward, FP64=q.element_size() == 8, num_warps=cfg["num_warps"])
