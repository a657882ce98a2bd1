"""Attention decode: a few query tokens against a long KV cache, split-KV
("flash decoding") with a final combine, over a contiguous or a paged cache.

Layout (the ``flash_attn_with_kvcache`` conventions; any strides):

* ``q``: ``[B, Sq, Hq, D]``; ``out``: ``[B, Sq, Hq, D]`` dense, q's dtype;
  ``lse``: ``[B, Hq, Sq]`` fp32 (natural log of the scaled scores' sum).
* contiguous cache: ``k``/``v`` ``[B, max_ctx, H_kv, D]``;
  paged cache: ``k``/``v`` ``[num_blocks, PAGE, H_kv, D]`` with an int32
  ``block_table[B, max_blocks]``: token ``n`` of sequence ``b`` lies in
  physical block ``block_table[b, n // PAGE]``, slot ``n % PAGE``.
* ``seqlens[B]`` int32: the live tokens of each sequence, the ``Sq`` new ones
  included; query ``i`` sees keys ``[0, seqlen - Sq + i]``.

Algorithm. One program per (sequence ``b``, KV head, block of query rows,
split). The M dim of the program's ``tl.dot`` is every query row that shares
the KV head: ``G = Hq / H_kv`` heads times ``Sq`` tokens (row ``m = i * G +
g``), padded to ``BLOCK_M >= 16``; so each K/V tile is read from HBM once for
the whole GQA group, which is what lets decode reach the copy bandwidth (the
MMA work on padded rows is free: decode is memory-bound by ~100x). The live
context of a sequence, ``cdiv(seqlen, BLOCK_N)`` tiles, is cut into
``SPLITS`` contiguous ranges, one program each, with an online softmax (base
2, ``scale * log2(e)`` folded into one multiply of the fp32 scores) over its
tiles. The ranges follow each sequence's own length, so short sequences make
short programs; ``SPLITS`` is chosen on the host from ``B * H_kv`` and the
cache capacity (the lengths live on the device; reading them would
synchronise) so that the grid covers the SMs several times.

Paged cache: each tile translates logical to physical blocks through the
block table. When ``PAGE`` is a multiple of ``BLOCK_N`` a tile lies in one
block: one scalar table load a tile. Otherwise (pages smaller than a tile, or
sizes that do not divide) each token row looks its block up (a ``BLOCK_N``
gather of int32 from a row that stays in L1). Either way a token's ``D``
values are contiguous, so K/V rows load as 16-byte vectors, and the loads
feed ``tl.dot`` so Triton pipelines them through shared memory
(``num_stages``). Table entries are clamped to ``[0, num_blocks)`` and
lengths to ``[0, capacity]``: bad values on the device give unspecified
numbers, never a memory fault (the op checks them for CPU tensors).

Split results: with one split the program writes ``out`` (and ``lse``)
directly; with several it writes a normalised partial output ``acc / l`` and
its base-2 LSE ``m + log2(l)`` to an fp32 workspace, and ``combine_kernel``
merges a row's splits with weights ``2^(lse_s - max lse)``. A split, or a
row, that sees no key has ``l = 0``: partial 0 with LSE ``-inf``, weight 0;
a row that sees no key at all gets output 0 and LSE ``-inf``. Positions past
``seqlen`` are masked on load (``other=0``), so garbage or NaN in unused
cache slots never reaches the output; a NaN in a live key or value makes its
rows NaN, as in torch.

Arithmetic: scores and the softmax in fp32; ``p`` is rounded to the value
dtype for the second ``tl.dot`` (as FlashAttention does); fp32 inputs use
``input_precision="ieee"`` (no TF32). The output is rounded once, at the
store. Offsets are 64-bit when any tensor reaches 2^31 elements.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
SPLIT_KV_VERSION = "1"

# Largest head dim the kernel takes (the K/V tiles and the fp32 accumulator
# must stay in shared memory and registers).
MAX_HEAD_DIM = 256
# Most splits of one sequence (the combine holds a row's splits in registers).
MAX_SPLITS = 256
# A split gets at least this many tiles: its prologue and its partial write
# are then small beside its stream of K/V (short contexts are latency-bound:
# more, shorter programs finish sooner).
MIN_TILES_PER_SPLIT = 2
# A sequence of at most this many tiles is one split: its program streams them in about the time a
# second launch (the combine) and its partial buffers cost on the host, so a short context is a
# single launch that writes the output itself.
SINGLE_SPLIT_TILES = 4
# Shared memory a config may use (the H200 has 228 KB a SM; leave room for 2
# programs a SM with the default configs).
SMEM_LIMIT = 200 * 1024

# Rows (of D values) below which the combine also cuts D in chunks, to give
# about one program a SM.
COMBINE_MIN_ROWS = 132

_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)
_NEG_INF = tl.constexpr(float("-inf"))
_INT32_MAX = 2**31 - 1


@triton.jit
def split_kv_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, bt_ptr, out_ptr, lse_ptr, po_ptr, plse_ptr,
    qk_scale,  # scale * log2(e)
    Sq, G, HQ, H_KV, D, n_mblk, n_splits, capacity, num_blocks,
    s_sl, s_btb, s_btn,
    s_qb, s_qs, s_qh, s_qd,
    s_kb, s_kt, s_kh, s_kd,
    s_vb, s_vt, s_vh, s_vd,
    PAGED: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr, SPLIT: tl.constexpr, STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid % n_splits
    rest = pid // n_splits
    mb = rest % n_mblk
    rest = rest // n_mblk
    kvh = rest % H_KV
    b = rest // H_KV
    if INT64:
        b = b.to(tl.int64)
        kvh = kvh.to(tl.int64)

    seqlen = tl.load(seqlens_ptr + b * s_sl)
    seqlen = tl.minimum(tl.maximum(seqlen, 0), capacity)
    n_tiles = tl.cdiv(seqlen, BLOCK_N)
    per_split = tl.cdiv(n_tiles, n_splits)
    t_lo = split * per_split
    t_hi = tl.minimum(t_lo + per_split, n_tiles)

    # Query rows of this program: m = i * G + g (token i, head kvh * G + g).
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m < G * Sq
    i = m // G
    h = kvh * G + m % G
    last_key = seqlen - Sq + i  # query i sees keys n <= last_key
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + b * s_qb + i[:, None] * s_qs + h[:, None] * s_qh + d[None, :] * s_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    k_base = k_ptr + kvh * s_kh
    v_base = v_ptr + kvh * s_vh
    if not PAGED:
        k_base += b * s_kb
        v_base += b * s_vb
    bt_row = bt_ptr + b * s_btb

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for t in range(t_lo, t_hi):
        n = t * BLOCK_N + cols
        n_ok = n < seqlen
        if PAGED:
            if PAGE % BLOCK_N == 0:
                # The whole tile lies in one block: one table entry.
                phys = tl.load(bt_row + ((t * BLOCK_N) // PAGE) * s_btn)
            else:
                phys = tl.load(bt_row + (n // PAGE) * s_btn, mask=n_ok, other=0)
            phys = tl.minimum(tl.maximum(phys, 0), num_blocks - 1)
            if INT64:
                phys = phys.to(tl.int64)
            slot = n % PAGE
            k_rows = phys * s_kb + slot * s_kt
            v_rows = phys * s_vb + slot * s_vt
        else:
            if INT64:
                n = n.to(tl.int64)
            k_rows = n * s_kt
            v_rows = n * s_vt
        if EVEN_D:  # a token-row mask only: constant along D, so the loads stay 16-byte vectors
            kv_mask = n_ok[:, None]
        else:
            kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + k_rows[:, None] + d[None, :] * s_kd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (n[None, :] <= last_key[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no key yet keeps m = -inf: subtract 0 instead.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + v_rows[:, None] + d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_i))
    row = (b * Sq + i) * HQ + h  # row of the dense [B, Sq, Hq] output
    if SPLIT:
        tl.store(po_ptr + (row[:, None] * n_splits + split) * D + d[None, :], o,
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(plse_ptr + row * n_splits + split, lse2, mask=row_ok)
    else:
        tl.store(out_ptr + row[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            tl.store(lse_ptr + (b * HQ + h) * Sq + i, lse2 * _LN2, mask=row_ok)


@triton.jit
def combine_kernel(
    po_ptr, plse_ptr, out_ptr, lse_ptr, n_splits, Sq, HQ, D,
    BLOCK_S: tl.constexpr, BLOCK_DC: tl.constexpr, STORE_LSE: tl.constexpr, INT64: tl.constexpr,
):
    """Merge a row's split partials: weights 2^(lse_s - max), normalised."""
    row = tl.program_id(0)
    dc = tl.program_id(1)
    if INT64:
        row = row.to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < n_splits
    lse = tl.load(plse_ptr + row * n_splits + s, mask=s_ok, other=float("-inf"))
    big = tl.max(lse, axis=0)
    big_sub = tl.where(big == float("-inf"), 0.0, big)
    w = tl.exp2(lse - big_sub)  # 0 for splits that saw no key
    total = tl.sum(w, axis=0)
    d = dc * BLOCK_DC + tl.arange(0, BLOCK_DC)
    d_ok = d < D
    o = tl.load(po_ptr + (row * n_splits + s[:, None]) * D + d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row * D + d, res.to(out_ptr.dtype.element_ty), mask=d_ok)
    if STORE_LSE:
        if dc == 0:
            b = row // (Sq * HQ)
            i = (row // HQ) % Sq
            h = row % HQ
            val = tl.where(total == 0.0, float("-inf"), (big_sub + tl.log2(total)) * _LN2)
            tl.store(lse_ptr + (b * HQ + h) * Sq + i, val)


# ---------------------------------------------------------------------------
# Launch helpers and configs
# ---------------------------------------------------------------------------
def block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(max(D, 1)))


def block_m(rows: int, D: int) -> int:
    """Query rows a program holds: the GQA group (``G * Sq``), padded to the 16
    rows ``tl.dot`` needs, capped so the fp32 accumulator stays in registers."""
    cap = 64 if block_d(D) <= 128 else 32
    return max(16, min(triton.next_power_of_2(max(rows, 1)), cap))


def smem_bytes(block_n: int, D: int, itemsize: int, stages: int) -> int:
    """K and V tiles in flight through shared memory."""
    return 2 * stages * block_n * block_d(D) * itemsize


def num_splits(groups: int, capacity: int, block_n: int, sm_count: int) -> int:
    """Splits a sequence is cut into: one when ``groups`` (sequences x KV heads x
    row blocks) already give every SM two programs or the context is short
    (``SINGLE_SPLIT_TILES``); else enough for about four
    programs a SM, each with at least ``MIN_TILES_PER_SPLIT`` tiles."""
    tiles = triton.cdiv(max(capacity, 1), block_n)
    if groups >= 2 * sm_count or tiles <= SINGLE_SPLIT_TILES:
        return 1
    want = triton.cdiv(4 * sm_count, max(groups, 1))
    return max(1, min(want, triton.cdiv(tiles, MIN_TILES_PER_SPLIT), MAX_SPLITS))


def default_config(B: int, Hq: int, H_kv: int, Sq: int, D: int, capacity: int, itemsize: int,
                   sm_count: int = 132) -> dict:
    """64-token tiles of 16-bit K/V with D <= 128 (16 KB a tile; three stages),
    32 for D = 256; 4 warps, 8 when the accumulator is large. fp32: 32-token
    tiles (16 for D = 256) and 8 warps (with 4, D = 128 spills: ptxas for sm_90
    reports 255 registers and a 376-byte stack; 60 registers with 8)."""
    bd = block_d(D)
    bm = block_m(Hq // max(H_kv, 1) * Sq, D)
    if itemsize <= 2:
        bn, stages, warps = (64 if bd <= 128 else 32), 3, (8 if bm * bd > 4096 else 4)
    else:
        bn, stages, warps = (32 if bd <= 128 else 16), 2, 8
    groups = B * H_kv * triton.cdiv(Hq // max(H_kv, 1) * Sq, bm)
    return {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages,
            "SPLITS": num_splits(groups, capacity, bn, sm_count)}


def configs(B: int, Hq: int, H_kv: int, Sq: int, D: int, capacity: int, itemsize: int,
            sm_count: int = 132) -> list[dict]:
    """Tile sizes and pipeline depths that fit shared memory, and split counts
    around the default."""
    base = default_config(B, Hq, H_kv, Sq, D, capacity, itemsize, sm_count)
    out = []
    for bn in (32, 64, 128):
        for stages in (2, 3, 4):
            if smem_bytes(bn, D, itemsize, stages) > SMEM_LIMIT:
                continue
            for w in (4, 8):
                out.append({"BLOCK_N": bn, "num_warps": w, "num_stages": stages, "SPLITS": base["SPLITS"]})
    tiles = triton.cdiv(max(capacity, 1), base["BLOCK_N"])
    for s in (base["SPLITS"] // 2, base["SPLITS"] * 2):
        if 1 <= s <= min(MAX_SPLITS, tiles) and s != base["SPLITS"]:
            out.append(dict(base, SPLITS=s))
    return out or [base]


def _reach(t) -> int:
    return sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0) + 1


class DecodePlan(NamedTuple):
    """Everything a decode launch needs that depends only on the shapes,
    strides and dtypes of its arguments (what the op's memo key holds), so a
    runner bound to one dispatch decision computes it once: the two grids,
    the scalar arguments after the tensor ones, the constexprs and options
    of each kernel, and the size of the split partials (0: one split)."""

    split_grid: tuple
    split_scalars: tuple
    split_kw: dict
    combine_grid: tuple
    combine_scalars: tuple
    combine_kw: dict
    partials: int  # rows * splits (the partial LSEs; the outputs are D times as many)


def decode_plan(q, k, v, seqlens, block_table, store_lse: bool, scale: float, config: dict) -> DecodePlan:
    """The launches of ``launch_decode`` for these arguments (see ``DecodePlan``)."""
    import torch

    B, Sq, Hq, D = q.shape
    H_kv = k.shape[2]
    G = Hq // H_kv
    paged = block_table is not None
    page = k.shape[1]
    capacity = block_table.shape[1] * page if paged else k.shape[1]
    num_blocks = k.shape[0]
    bn = config.get("BLOCK_N", 64)
    bd = block_d(D)
    bm = block_m(G * Sq, D)
    n_mblk = triton.cdiv(G * Sq, bm)
    splits = max(1, min(config.get("SPLITS", 1), triton.cdiv(max(capacity, 1), bn), MAX_SPLITS))
    rows = B * Sq * Hq
    split = splits > 1
    bt = block_table if paged else seqlens  # any pointer: never read unpaged
    int64 = max(_reach(q), _reach(k) + bn * abs(k.stride(1)), _reach(v) + bn * abs(v.stride(1)),
                rows * max(splits, 1) * bd) > _INT32_MAX
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    split_scalars = (scale * _LOG2E, Sq, G, Hq, H_kv, D, n_mblk, splits, capacity, num_blocks,
                     seqlens.stride(0), bt.stride(0), bt.stride(-1), *q.stride(), *k.stride(), *v.stride())
    split_kw = dict(PAGED=paged, PAGE=page if paged else 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, EVEN_D=bd == D,
                    SPLIT=split, STORE_LSE=store_lse, DOT_PRECISION=precision, INT64=int64,
                    num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3))
    # Enough programs to cover the SMs when rows are few: cut D in chunks.
    dc = bd if rows >= COMBINE_MIN_ROWS else max(16, bd // 4)
    # At most 4096 partial values a program (32 a thread).
    dc = min(dc, max(16, 4096 // triton.next_power_of_2(splits)))
    combine_kw = dict(BLOCK_S=triton.next_power_of_2(splits), BLOCK_DC=dc, STORE_LSE=store_lse,
                      INT64=rows * splits * D > _INT32_MAX, num_warps=4)
    return DecodePlan((B * H_kv * n_mblk * splits,), split_scalars, split_kw, (rows, triton.cdiv(D, dc)),
                      (splits, Sq, Hq, D), combine_kw, rows * splits if split else 0)


def partial_buffers(plan: DecodePlan, D: int, device):
    """The fp32 split partials (outputs, LSEs) of one call."""
    import torch

    return (torch.empty(plan.partials * D, dtype=torch.float32, device=device),
            torch.empty(plan.partials, dtype=torch.float32, device=device))


def launch_decode(q, k, v, seqlens, block_table, out, lse, scale: float, config: dict) -> None:
    """``out[B, Sq, Hq, D]`` (dense) and, unless ``lse`` is None, ``lse[B, Hq, Sq]``
    (dense fp32) for a contiguous (``block_table`` None) or paged cache.
    Empty shapes and empty caches are the caller's business."""
    plan = decode_plan(q, k, v, seqlens, block_table, lse is not None, scale, config)
    lse_t = lse if lse is not None else out
    po, plse = partial_buffers(plan, q.shape[3], q.device) if plan.partials else (out, out)
    bt = block_table if block_table is not None else seqlens
    split_kv_kernel[plan.split_grid](q, k, v, seqlens, bt, out, lse_t, po, plse, *plan.split_scalars,
                                     **plan.split_kw)
    if plan.partials:
        combine_kernel[plan.combine_grid](po, plse, out, lse_t, *plan.combine_scalars, **plan.combine_kw)


def split_programs(B: int, Hq: int, H_kv: int, Sq: int, D: int, splits: int) -> int:
    """Programs of the split kernel's grid (for reports and tests)."""
    rows = Hq // H_kv * Sq
    return B * H_kv * math.ceil(rows / block_m(rows, D)) * splits
