"""FlashAttention backward for Hopper (sm_90) in Gluon, warp-specialized.

The same design as the forward (``attention_gluon.py``): a 1-warp TMA loader
and two consumer partitions of one warpgroup each, on ``warpgroup_mma``.
Deterministic like ``kernels/attention.py`` (no atomics): two kernels that
recompute ``P = exp2(S * scale * log2 e - lse * log2 e)`` from the forward's
log-sum-exp and ``delta = rowsum(dO * O)``:

* **dK/dV**: a CTA per 128 keys of a key/value head (64 per consumer, held
  in shared memory); the loader streams the ``(Q, dO)`` blocks of 64 queries
  of every query head of the GQA group, in order (the group's sum is
  deterministic), from the first query that sees the tile (causal):
  ``S^T = K Q^T``, ``dV += P^T dO``, ``dP^T = V dO^T``,
  ``dK += (P^T * (dP^T - delta)) Q``.
* **dQ**: a CTA per 128 queries (64 per consumer, Q and dO held); the loader
  streams ``(K, V)`` blocks of 64 keys up to the causal bound:
  ``S = Q K^T``, ``dP = dO V^T``, ``dQ += (P * (dP - delta)) K``.

Scale: ``dK`` and ``dQ`` take the softmax scale once, in the epilogue.
Outputs leave through TMA stores from the buffers that held K/V (dK/dV) or
Q (dQ), clipped at the sequence ends. Same limits as the forward.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from opforge.kernels.attention_gluon import LOADER_REGS, compile_launch_sm90, descriptor

VERSION = "1"
ROWS = 64  # queries or keys per consumer, and per streamed block
STAGES = 4
CONSUMER_REGS = gl.constexpr(240)
_LOG2E = gl.constexpr(1.4426950408889634)


# ---------------------------------------------------------------------------
# dK / dV
# ---------------------------------------------------------------------------
@gluon.jit
def _first_query(n0, Sq, Sk, CAUSAL: gl.constexpr, BLOCK: gl.constexpr):
    """The first query block that sees key ``n0`` (0 without a causal mask)."""
    if CAUSAL:
        lo = (gl.maximum(n0 - (Sk - Sq), 0) // BLOCK) * BLOCK
    else:
        lo = n0 * 0
    return lo


@gluon.jit
def _dkdv_loader(q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_ring, do_ring, kv_ready, ready, empty,
                 b, hk, n0, GROUP, Sq, Sk, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    rows: gl.constexpr = k_desc.block_type.shape[2]
    for c in range(2):
        mbarrier.expect(kv_ready.index(c), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, n0 + c * rows, 0], kv_ready.index(c), k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [b, hk, n0 + c * rows, 0], kv_ready.index(c), v_smem.index(c))
    m_lo = _first_query(n0, Sq, Sk, CAUSAL, rows)
    g = 0
    for hh in range(GROUP):
        h = hk * GROUP + hh
        for m in range(m_lo, Sq, rows):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), 2 * q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, m, 0], ready.index(s), q_ring.index(s))
            tma.async_copy_global_to_shared(do_desc, [b, h, m, 0], ready.index(s), do_ring.index(s))
            g += 1


@gluon.jit
def _dkdv_consumer(k_smem, v_smem, q_ring, do_ring, kv_ready, ready, empty, dk_desc, dv_desc, lse_ptr, delta_ptr,
                   b, hk, n0, GROUP, H, Sq, Sk, qk_scale, scale, CAUSAL: gl.constexpr, C: gl.constexpr,
                   HEAD_D: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    rows: gl.constexpr = k_smem.type.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, rows, 16])
    a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    dtype: gl.constexpr = k_smem.dtype
    off = Sk - Sq
    n0 = n0 + C * rows
    mbarrier.wait(kv_ready, 0)
    k = k_smem.reshape([rows, HEAD_D])
    v = v_smem.reshape([rows, HEAD_D])
    keys = n0 + gl.arange(0, rows, layout=gl.SliceLayout(1, s_layout))
    dk = gl.zeros([rows, HEAD_D], gl.float32, a_layout)
    dv = gl.zeros([rows, HEAD_D], gl.float32, a_layout)
    zero = gl.zeros([rows, rows], gl.float32, s_layout)
    m_lo = _first_query(n0 - C * rows, Sq, Sk, CAUSAL, rows)  # the loader's range: the CTA's first key
    g = 0
    for hh in range(GROUP):
        base = (b * H + hk * GROUP + hh).to(gl.int64) * Sq
        for m in range(m_lo, Sq, rows):
            s = g % STAGES
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            qs = q_ring.index(s).reshape([rows, HEAD_D])
            dos = do_ring.index(s).reshape([rows, HEAD_D])
            st = warpgroup_mma(k, qs.permute((1, 0)), zero, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v, dos.permute((1, 0)), zero, use_acc=False, is_async=True)
            qi = m + gl.arange(0, rows, layout=gl.SliceLayout(0, s_layout))
            lse = gl.load(lse_ptr + base + qi, mask=qi < Sq, other=float("inf")) * _LOG2E
            dl = gl.load(delta_ptr + base + qi, mask=qi < Sq, other=0.0)
            st, dpt = warpgroup_mma_wait(0, deps=[st, dpt])
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:
                pt = gl.where(gl.expand_dims(keys, 1) <= gl.expand_dims(qi + off, 0), pt, 0.0)
            dst = pt * (dpt - gl.expand_dims(dl, 0))
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), dos, dv, is_async=True)
            dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), op_layout), qs, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
            mbarrier.arrive(empty.index(s), count=1)
            g += 1
    k.store((dk * scale).to(dtype))
    v.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, hk, n0, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [b, hk, n0, 0], v_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["H", "GROUP", "Sq", "Sk"])
def attn_bwd_dkdv_ws_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_ptr, delta_ptr,
                            H, GROUP, Sq, Sk, qk_scale, scale,
                            CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                            num_warps: gl.constexpr):
    rows: gl.constexpr = k_desc.block_type.shape[2]
    n0 = gl.program_id(0) * (2 * rows)
    hk = gl.program_id(1)
    b = gl.program_id(2)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_ring = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_ring = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(kv_ready.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    gl.warp_specialize([
        (_dkdv_consumer, (k_smem.index(0), v_smem.index(0), q_ring, do_ring, kv_ready.index(0), ready, empty,
                          dk_desc, dv_desc, lse_ptr, delta_ptr, b, hk, n0, GROUP, H, Sq, Sk, qk_scale, scale,
                          CAUSAL, 0, HEAD_D, STAGES, num_warps)),
        (_dkdv_consumer, (k_smem.index(1), v_smem.index(1), q_ring, do_ring, kv_ready.index(1), ready, empty,
                          dk_desc, dv_desc, lse_ptr, delta_ptr, b, hk, n0, GROUP, H, Sq, Sk, qk_scale, scale,
                          CAUSAL, 1, HEAD_D, STAGES, num_warps)),
        (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_ring, do_ring, kv_ready, ready, empty,
                        b, hk, n0, GROUP, Sq, Sk, CAUSAL, STAGES)),
    ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------
# dQ
# ---------------------------------------------------------------------------
@gluon.jit
def _key_end(m0, Sq, Sk, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
    """One past the last key the queries ``[m0, m0 + BLOCK_M)`` see."""
    if CAUSAL:
        hi = gl.minimum(Sk, m0 + BLOCK_M + Sk - Sq)
    else:
        hi = Sk + m0 * 0
    return hi


@gluon.jit
def _dq_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_ring, v_ring, q_ready, ready, empty,
               b, h, hk, m0, Sq, Sk, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    rows: gl.constexpr = q_desc.block_type.shape[2]
    for c in range(2):
        mbarrier.expect(q_ready.index(c), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + c * rows, 0], q_ready.index(c), q_smem.index(c))
        tma.async_copy_global_to_shared(do_desc, [b, h, m0 + c * rows, 0], q_ready.index(c), do_smem.index(c))
    hi = _key_end(m0, Sq, Sk, CAUSAL, 2 * rows)
    g = 0
    for n in range(0, hi, rows):
        s = g % STAGES
        mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, n, 0], ready.index(s), k_ring.index(s))
        tma.async_copy_global_to_shared(v_desc, [b, hk, n, 0], ready.index(s), v_ring.index(s))
        g += 1


@gluon.jit
def _dq_consumer(q_smem, do_smem, k_ring, v_ring, q_ready, ready, empty, dq_desc, lse_ptr, delta_ptr,
                 b, h, m0, H, Sq, Sk, qk_scale, scale, CAUSAL: gl.constexpr, C: gl.constexpr,
                 HEAD_D: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    rows: gl.constexpr = q_smem.type.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, rows, 16])
    a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    off = Sk - Sq
    hi = _key_end(m0, Sq, Sk, CAUSAL, 2 * rows)  # the loader's range: the CTA's queries
    m0 = m0 + C * rows
    qi = m0 + gl.arange(0, rows, layout=gl.SliceLayout(1, s_layout))
    base = (b * H + h).to(gl.int64) * Sq
    lse = gl.load(lse_ptr + base + qi, mask=qi < Sq, other=0.0) * _LOG2E
    dl = gl.load(delta_ptr + base + qi, mask=qi < Sq, other=0.0)
    mbarrier.wait(q_ready, 0)
    q = q_smem.reshape([rows, HEAD_D])
    do = do_smem.reshape([rows, HEAD_D])
    dq = gl.zeros([rows, HEAD_D], gl.float32, a_layout)
    zero = gl.zeros([rows, rows], gl.float32, s_layout)
    g = 0
    for n in range(0, hi, rows):
        s = g % STAGES
        mbarrier.wait(ready.index(s), (g // STAGES) & 1)
        ks = k_ring.index(s).reshape([rows, HEAD_D])
        vs = v_ring.index(s).reshape([rows, HEAD_D])
        sc = warpgroup_mma(q, ks.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do, vs.permute((1, 0)), zero, use_acc=False, is_async=True)
        sc, dp = warpgroup_mma_wait(0, deps=[sc, dp])
        p = gl.exp2(sc * qk_scale - gl.expand_dims(lse, 1))
        kj = n + gl.arange(0, rows, layout=gl.SliceLayout(0, s_layout))
        ok = gl.expand_dims(kj < Sk, 0)
        if CAUSAL:
            ok = ok & (gl.expand_dims(kj, 0) <= gl.expand_dims(qi + off, 1))
        ds = gl.where(ok, p * (dp - gl.expand_dims(dl, 1)), 0.0)
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), ks, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(empty.index(s), count=1)
        g += 1
    q.store((dq * scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [b, h, m0, 0], q_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["H", "GROUP", "Sq", "Sk"])
def attn_bwd_dq_ws_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, lse_ptr, delta_ptr,
                          H, GROUP, Sq, Sk, qk_scale, scale,
                          CAUSAL: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                          num_warps: gl.constexpr):
    rows: gl.constexpr = q_desc.block_type.shape[2]
    m0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * (2 * rows)  # heaviest causal blocks first
    h = gl.program_id(1)
    b = gl.program_id(2)
    hk = h // GROUP
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(q_ready.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    gl.warp_specialize([
        (_dq_consumer, (q_smem.index(0), do_smem.index(0), k_ring, v_ring, q_ready.index(0), ready, empty, dq_desc,
                        lse_ptr, delta_ptr, b, h, m0, H, Sq, Sk, qk_scale, scale, CAUSAL, 0, HEAD_D, STAGES,
                        num_warps)),
        (_dq_consumer, (q_smem.index(1), do_smem.index(1), k_ring, v_ring, q_ready.index(1), ready, empty, dq_desc,
                        lse_ptr, delta_ptr, b, h, m0, H, Sq, Sk, qk_scale, scale, CAUSAL, 1, HEAD_D, STAGES,
                        num_warps)),
        (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_ring, v_ring, q_ready, ready, empty,
                      b, h, hk, m0, Sq, Sk, CAUSAL, STAGES)),
    ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------
def backward_plans(do, q, k, v, dq, dk, dv, lse, delta, scale: float, causal: bool):
    """``[(kernel, grid, args, constexprs)]`` of the dK/dV and dQ launches."""
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    qd, dod, kd, vd = (descriptor(t, ROWS) for t in (q, do, k, v))
    common = (lse, delta, H, H // Hk, Sq, Sk, float(scale) * 1.4426950408889634, float(scale))
    kw = dict(CAUSAL=bool(causal), HEAD_D=D, STAGES=STAGES, num_warps=4, maxnreg=168)
    return [
        (attn_bwd_dkdv_ws_kernel, (triton.cdiv(Sk, 2 * ROWS), Hk, B),
         (qd, dod, kd, vd, descriptor(dk, ROWS), descriptor(dv, ROWS)) + common, kw),
        (attn_bwd_dq_ws_kernel, (triton.cdiv(Sq, 2 * ROWS), H, B), (qd, dod, kd, vd, descriptor(dq, ROWS)) + common,
         kw),
    ]


def row_delta(do, out):
    """``rowsum(dO * O)`` in fp32, ``(B, H, Sq)``: one read of each in the Triton delta kernel (the torch
    form, two fp32 copies and a vecdot, cost a quarter of the Gluon backward's time on the H200)."""
    from opforge.kernels.attention import _int64, attn_bwd_delta_kernel, seq_strides

    B, H, S, D = out.shape
    delta = torch.empty((B, H, S), dtype=torch.float32, device=out.device)
    block_m = 64
    attn_bwd_delta_kernel[(triton.cdiv(S, block_m), H, B)](
        out, do, delta, delta, delta, *seq_strides(out, False), *seq_strides(do, False),
        delta.stride(0), delta.stride(1), H, S, D=D, BLOCK_M=block_m, VARLEN=False, INT64=_int64(out, do),
        num_warps=4)
    return delta


def launch_backward(do, q, k, v, out, lse, dq, dk, dv, scale: float, causal: bool) -> None:
    """dq, dk, dv of ``attention`` (``lse``: the forward's, natural log, ``(B, H, Sq)``)."""
    delta = row_delta(do, out)
    for kernel, grid, args, kw in backward_plans(do, q, k, v, dq, dk, dv, lse.contiguous(), delta, scale, causal):
        kernel[grid](*args, **kw)


def compile_sm90(D: int = 128, causal: bool = True, dtype=torch.bfloat16, B: int = 2, H: int = 4, Hk: int = 4,
                 S: int = 1024) -> list:
    """Compile (not run) both kernels for sm_90, into Triton's cache as their first launch would."""
    q = torch.empty(B, H, S, D, dtype=dtype, device="meta")
    kv = torch.empty(B, Hk, S, D, dtype=dtype, device="meta")
    lse = torch.empty(B, H, S, dtype=torch.float32, device="meta")
    return [compile_launch_sm90(kernel, args, kw)
            for kernel, _, args, kw in backward_plans(q, q, kv, kv, q, kv, kv, lse, lse, D ** -0.5, causal)]
