"""FlashAttention (forward and backward) for ``softmax(scale * Q K^T + mask) V``.

Layouts. A "sequence" tensor is seen as ``[batch, heads, seq, D]`` through three
strides ``(sb, sh, ss)`` (the head-dim stride is 1): SDPA's ``(B, H, S, D)`` has
``(s0, s1, s2)``; FlashAttention's packed varlen ``(tokens, H, D)`` has
``(0, s1, s0)``, and sequence ``b`` starts at token ``cu_seqlens[b]`` and has
``cu_seqlens[b+1] - cu_seqlens[b]`` tokens (``VARLEN``). The log-sum-exp
(natural log, fp32) and the backward's ``delta`` are ``(B, H, Sq)`` or, for
varlen, ``(H, tokens)``, addressed as ``b * slb + h * slh + token``.

Masking, as FlashAttention: query ``i`` and key ``j`` of one sequence, with
``off = Sk - Sq`` (the bottom-right alignment), are paired when
``i + off - left <= j <= i + off + right`` (a bound is absent when
``HAS_LEFT`` / ``HAS_RIGHT`` is off; causal is ``right = 0``). GQA: query head
``h`` reads key/value head ``h // GROUP``.

Forward (FlashAttention-2). One program per ``BLOCK_M`` queries of one head
(grid ``(cdiv(max Sq, BLOCK_M), H, B)``: the programs that run together
share a head's K/V in L2; the heaviest causal blocks first);
the query tile stays in registers while the program walks the key/value
blocks with an online softmax: running max ``m``, running sum ``l`` and an
fp32 accumulator rescaled by ``exp2(m_old - m_new)``; ``scale * log2(e)`` is
folded into one multiply so the exponentials are ``exp2``. The key range of
a query block is cut into three loops: blocks that straddle the left window
edge (masked), blocks every query of the block may see entirely (no mask,
no bounds checks: the hot loop), and blocks on the diagonal / right edge /
past the sequence end (masked). Keys outside the band are never loaded, so
causal and windowed attention cost what they compute. A query with no key
(a window that misses every key, or ``Sq > Sk`` under causal) gets output 0
and log-sum-exp ``+inf`` (FlashAttention's convention: the backward then
computes ``exp(s - lse) = 0`` for it, never NaN).

Backward, deterministic by construction (no atomics): ``delta = rowsum(dO *
O)``; a dK/dV kernel (a program per ``BLOCK_N`` keys of a key/value head; it
walks the query blocks of every query head of its GQA group, in order, so
the group's sum is deterministic) and a dQ kernel (a program per
``BLOCK_M`` queries, walking key blocks). Both recompute ``P = exp2(S *
scale * log2 e - lse * log2 e)`` from the saved log-sum-exp: memory beyond
inputs and outputs is O(S) (lse and delta). Each uses the same three-loop
split so its hot loop is unmasked.

Hopper path (``TMA``): the tiles of the hot loops (K/V in the forward and
dQ kernels, Q/dO in the dK/dV kernel) are read through device-side TMA
descriptors made per program over that sequence's ``[length, D]`` rows:
the copy engine fills rows past the sequence with zeros, so masked and
unmasked blocks load the same way, and address arithmetic leaves the
registers. The pointer path (any strides; the interpreter) is the same code
with ``TMA`` off.

Precision: fp32 accumulation; P and dS are rounded to the input dtype for
the tensor-core products (as FlashAttention does); fp32 inputs run
``tl.dot`` in exact fp32 (``input_precision="ieee"``). Offsets are 64-bit
(``INT64``) when any tensor reaches 2^31 elements. Head dims: any power of
two from 16 to 256.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.shapes import pow2

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
FWD_VERSION = "1"
BWD_VERSION = "1"

HEAD_DIMS = (16, 32, 64, 128, 256)

_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)
_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------
@triton.jit
def _bounds(b, cu_q, cu_k, Sq, Sk, VARLEN: tl.constexpr):
    """First token and length of sequence ``b`` in Q and in K."""
    if VARLEN:
        q0 = tl.load(cu_q + b).to(tl.int32)
        lq = tl.load(cu_q + b + 1).to(tl.int32) - q0
        k0 = tl.load(cu_k + b).to(tl.int32)
        lk = tl.load(cu_k + b + 1).to(tl.int32) - k0
    else:
        q0 = b * 0
        lq = Sq + b * 0
        k0 = b * 0
        lk = Sk + b * 0
    return q0, lq, k0, lk


@triton.jit
def _split(start, length, band_lo, band_hi, full_lo, full_hi, BLOCK: tl.constexpr,
           HAS_LO: tl.constexpr, HAS_HI: tl.constexpr):
    """Cut ``[0, length)`` walked in ``BLOCK`` steps into [lo, a) masked, [a, b)
    unmasked (whole blocks that need no mask), [b, hi) masked.

    ``band_lo``/``band_hi``: the first / one-past-last index anyone in the
    program's tile may pair with; ``full_lo``/``full_hi``: the range every
    member of the tile pairs with. Absent bounds (``HAS_*`` off) are ignored.
    """
    lo = start * 0
    hi = length + start * 0
    if HAS_LO:
        lo = tl.maximum(lo, band_lo)
    if HAS_HI:
        hi = tl.minimum(hi, band_hi)
    lo = (lo // BLOCK) * BLOCK
    a = lo
    if HAS_LO:
        a = ((tl.maximum(full_lo, 0) + BLOCK - 1) // BLOCK) * BLOCK
    b = (length // BLOCK) * BLOCK
    if HAS_HI:
        b = tl.minimum(b, (tl.maximum(full_hi, 0) // BLOCK) * BLOCK)
    a = tl.minimum(tl.maximum(a, lo), tl.maximum(hi, lo))
    b = tl.maximum(tl.minimum(b, hi), a)
    return lo, a, b, tl.maximum(hi, b)


@triton.jit
def _key_split(m0, lq, lk, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """``_split`` of the keys for the queries ``[m0, m0 + BLOCK_M)``: keys some
    query may see are ``[m0 + off - left, m0 + BLOCK_M - 1 + off + right]``,
    keys all of them see ``[m0 + BLOCK_M - 1 + off - left, m0 + off + right]``."""
    off = lk - lq
    return _split(m0, lk, m0 + off - left, m0 + BLOCK_M + off + right,
                  m0 + BLOCK_M - 1 + off - left, m0 + off + right + 1,
                  BLOCK_N, HAS_LEFT, HAS_RIGHT)


@triton.jit
def _load_tile(src, start, idx, stride, dcol, limit, MASKED: tl.constexpr, TMA: tl.constexpr):
    """Rows ``idx`` (= ``start + arange``) of a sequence, zeros past ``limit``:
    through a TMA descriptor bounded by the sequence (it fills the edge with
    zeros itself) or through pointers (masked only where asked)."""
    if TMA:
        tile = src.load([start, 0])
    elif MASKED:
        tile = tl.load(src + idx[:, None] * stride + dcol[None, :], mask=(idx < limit)[:, None], other=0.0)
    else:
        tile = tl.load(src + idx[:, None] * stride + dcol[None, :])
    return tile


@triton.jit
def _seq_src(base, length, stride, BLOCK: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """What ``_load_tile`` reads a sequence's ``[length, D]`` rows from: a TMA
    descriptor bounded by the sequence (the copy engine zero-fills past its
    end; an empty sequence still gets a valid 1-row one, never loaded) or the
    base pointer itself."""
    if TMA:
        src = tl.make_tensor_descriptor(base, shape=[tl.maximum(length, 1), D], strides=[stride, 1],
                                        block_shape=[BLOCK, D])
    else:
        src = base
    return src


@triton.jit
def _query_block(GROUP, cu_q, cu_k, Sq, Sk, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, INT64: tl.constexpr):
    """``(b, h, hk, q0, lq, k0, lk, m0)`` of a program over ``BLOCK_M`` queries
    (the forward's and dQ's grid; heaviest causal blocks first), the offsets
    64-bit under ``INT64``. The caller makes ``rows`` after its early exit:
    made here, it cost 27 more registers in the INT64 TMA forward on sm_90."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    q0, lq, k0, lk = _bounds(b, cu_q, cu_k, Sq, Sk, VARLEN)
    if INT64:
        b = b.to(tl.int64)
        h = h.to(tl.int64)
        hk = hk.to(tl.int64)
        q0 = q0.to(tl.int64)
        k0 = k0.to(tl.int64)
    return b, h, hk, q0, lq, k0, lk, pid_m * BLOCK_M


@triton.jit
def _pair_mask(qi, kj, lq, lk, off, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Which (query, key) pairs attend, for broadcastable index tensors."""
    ok = (qi < lq) & (kj < lk)
    if HAS_LEFT:
        ok = ok & (kj >= qi + off - left)
    if HAS_RIGHT:
        ok = ok & (kj <= qi + off + right)
    return ok


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------
@triton.jit
def _fwd_step(acc, l_i, m_i, q, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk, off, left, right,
              qk_scale, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              POS_SCALE: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr):
    kn = n + cols
    if INT64:
        kn = kn.to(tl.int64)
    k = _load_tile(k_src, n, kn, sks, dcol, lk, MASKED, TMA)
    v = _load_tile(v_src, n, kn, svs, dcol, lk, MASKED, TMA)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASKED:
        ok = _pair_mask(rows[:, None], kn[None, :], lq, lk, off, left, right, HAS_LEFT, HAS_RIGHT)
        s = tl.where(ok, s * qk_scale, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no key so far keeps m = -inf: subtract 0 (not -inf - -inf).
        m_sub = tl.where(m_new == _NEG_INF, 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
    elif POS_SCALE:
        # max commutes with a positive scale: the scale rides in one FMA per score.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_sub = m_new
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
    else:
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = m_new
        p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q, cu_k,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, slb, slh,
    H, GROUP, Sq, Sk, qk_scale, left, right,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr, POS_SCALE: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr,
):
    b, h, hk, q0, lq, k0, lk, m0 = _query_block(GROUP, cu_q, cu_k, Sq, Sk, BLOCK_M, VARLEN, INT64)
    if m0 >= lq:
        return
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dcol = tl.arange(0, D)
    if INT64:
        rows = rows.to(tl.int64)
    q_base = q_ptr + b * sqb + h * sqh + q0 * sqs
    k_base = k_ptr + b * skb + hk * skh + k0 * sks
    v_base = v_ptr + b * svb + hk * svh + k0 * svs
    rin = (rows < lq)[:, None]
    q = tl.load(q_base + rows[:, None] * sqs + dcol[None, :], mask=rin, other=0.0)
    k_src = _seq_src(k_base, lk, sks, BLOCK_N, D, TMA)
    v_src = _seq_src(v_base, lk, svs, BLOCK_N, D, TMA)

    off = lk - lq
    lo, a, c, hi = _key_split(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    m_i = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for n in range(lo, a, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk,
                                  off, left, right, qk_scale, True, HAS_LEFT, HAS_RIGHT, POS_SCALE, PRECISION,
                                  INT64, TMA)
    for n in range(a, c, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk,
                                  off, left, right, qk_scale, False, HAS_LEFT, HAS_RIGHT, POS_SCALE, PRECISION,
                                  INT64, TMA)
    for n in range(c, hi, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk,
                                  off, left, right, qk_scale, True, HAS_LEFT, HAS_RIGHT, POS_SCALE, PRECISION,
                                  INT64, TMA)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, _POS_INF, (m_i + tl.math.log2(l_safe)) * _LN2)
    o_base = o_ptr + b * sob + h * soh + q0 * sos
    tl.store(o_base + rows[:, None] * sos + dcol[None, :], out.to(o_ptr.dtype.element_ty), mask=rin)
    tl.store(lse_ptr + b * slb + h * slh + q0 + rows, lse, mask=rows < lq)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------
@triton.jit
def attn_bwd_delta_kernel(
    o_ptr, do_ptr, delta_ptr, cu_q, cu_k,
    sob, soh, sos, sdb, sdh, sds, slb, slh, H, Sq,
    D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, INT64: tl.constexpr,
):
    """delta = rowsum(dO * O), the softmax-backward term of every query."""
    h = tl.program_id(1)
    b = tl.program_id(2)
    q0, lq, k0, lk = _bounds(b, cu_q, cu_q, Sq, Sq, VARLEN)
    m0 = tl.program_id(0) * BLOCK_M
    if m0 >= lq:
        return
    rows = m0 + tl.arange(0, BLOCK_M)
    if INT64:
        b = b.to(tl.int64)
        h = h.to(tl.int64)
        q0 = q0.to(tl.int64)
        rows = rows.to(tl.int64)
    dcol = tl.arange(0, D)
    rin = rows < lq
    o = tl.load(o_ptr + b * sob + h * soh + (q0 + rows)[:, None] * sos + dcol[None, :],
                mask=rin[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * sdb + h * sdh + (q0 + rows)[:, None] * sds + dcol[None, :],
                 mask=rin[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + b * slb + h * slh + q0 + rows, tl.sum(o * do, 1), mask=rin)


@triton.jit
def _dkdv_step(dk, dv, k, v, q_src, do_src, lse_base, delta_base, sqs, sds, m, kn, dcol, lq, lk, off,
               left, right, qk_scale, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               BLOCK_M: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr):
    qm = m + tl.arange(0, BLOCK_M)
    if INT64:
        qm = qm.to(tl.int64)
    q = _load_tile(q_src, m, qm, sqs, dcol, lq, MASKED, TMA)
    do = _load_tile(do_src, m, qm, sds, dcol, lq, MASKED, TMA)
    if MASKED:
        rin = qm < lq
        lse = tl.load(lse_base + qm, mask=rin, other=_POS_INF)
        dlt = tl.load(delta_base + qm, mask=rin, other=0.0)
    else:
        lse = tl.load(lse_base + qm)
        dlt = tl.load(delta_base + qm)
    # Transposed scores: keys on rows, so dK and dV accumulate in place.
    st = tl.dot(k, tl.trans(q), input_precision=PRECISION)
    pt = tl.math.exp2(st * qk_scale - (lse * _LOG2E)[None, :])
    if MASKED:
        ok = _pair_mask(qm[None, :], kn[:, None], lq, lk, off, left, right, HAS_LEFT, HAS_RIGHT)
        pt = tl.where(ok, pt, 0.0)
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
    dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    dst = pt * (dpt - dlt[None, :])
    dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q, cu_k,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    sdkb, sdkh, sdks, sdvb, sdvh, sdvs, slb, slh,
    HK, GROUP, Sq, Sk, qk_scale, scale, left, right,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr,
):
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
    b = tl.program_id(2)
    q0, lq, k0, lk = _bounds(b, cu_q, cu_k, Sq, Sk, VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= lk:
        return
    if INT64:
        b = b.to(tl.int64)
        hk = hk.to(tl.int64)
        q0 = q0.to(tl.int64)
        k0 = k0.to(tl.int64)
    kn = n0 + tl.arange(0, BLOCK_N)
    if INT64:
        kn = kn.to(tl.int64)
    dcol = tl.arange(0, D)
    kin = (kn < lk)[:, None]
    k = tl.load(k_ptr + b * skb + hk * skh + (k0 + kn)[:, None] * sks + dcol[None, :], mask=kin, other=0.0)
    v = tl.load(v_ptr + b * svb + hk * svh + (k0 + kn)[:, None] * svs + dcol[None, :], mask=kin, other=0.0)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)

    off = lk - lq
    # Queries i pair with key j when j - off - right <= i <= j - off + left.
    lo, a, c, hi = _split(n0, lq, n0 - off - right, n0 + BLOCK_N - off + left,
                          n0 + BLOCK_N - 1 - off - right, n0 - off + left + 1,
                          BLOCK_M, HAS_RIGHT, HAS_LEFT)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = q_ptr + b * sqb + h * sqh + q0 * sqs
        do_base = do_ptr + b * sdb + h * sdh + q0 * sds
        q_src = _seq_src(q_base, lq, sqs, BLOCK_M, D, TMA)
        do_src = _seq_src(do_base, lq, sds, BLOCK_M, D, TMA)
        lse_base = lse_ptr + b * slb + h * slh + q0
        delta_base = delta_ptr + b * slb + h * slh + q0
        for m in range(lo, a, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, lse_base, delta_base, sqs, sds, m, kn, dcol,
                                lq, lk, off, left, right, qk_scale, True, HAS_LEFT, HAS_RIGHT, BLOCK_M,
                                PRECISION, INT64, TMA)
        for m in range(a, c, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, lse_base, delta_base, sqs, sds, m, kn, dcol,
                                lq, lk, off, left, right, qk_scale, False, HAS_LEFT, HAS_RIGHT, BLOCK_M,
                                PRECISION, INT64, TMA)
        for m in range(c, hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, lse_base, delta_base, sqs, sds, m, kn, dcol,
                                lq, lk, off, left, right, qk_scale, True, HAS_LEFT, HAS_RIGHT, BLOCK_M,
                                PRECISION, INT64, TMA)
    dk = dk * scale
    tl.store(dk_ptr + b * sdkb + hk * sdkh + (k0 + kn)[:, None] * sdks + dcol[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=kin)
    tl.store(dv_ptr + b * sdvb + hk * sdvh + (k0 + kn)[:, None] * sdvs + dcol[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=kin)


@triton.jit
def _dq_step(dq, q, do, lse2, dlt, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk, off, left, right,
             qk_scale, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
             PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr):
    kn = n + cols
    if INT64:
        kn = kn.to(tl.int64)
    k = _load_tile(k_src, n, kn, sks, dcol, lk, MASKED, TMA)
    v = _load_tile(v_src, n, kn, svs, dcol, lk, MASKED, TMA)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        ok = _pair_mask(rows[:, None], kn[None, :], lq, lk, off, left, right, HAS_LEFT, HAS_RIGHT)
        p = tl.where(ok, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - dlt[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)


@triton.jit
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q, cu_k,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds, sdqb, sdqh, sdqs, slb, slh,
    H, GROUP, Sq, Sk, qk_scale, scale, left, right,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr, TMA: tl.constexpr,
):
    b, h, hk, q0, lq, k0, lk, m0 = _query_block(GROUP, cu_q, cu_k, Sq, Sk, BLOCK_M, VARLEN, INT64)
    if m0 >= lq:
        return
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dcol = tl.arange(0, D)
    if INT64:
        rows = rows.to(tl.int64)
    rin = rows < lq
    q = tl.load(q_ptr + b * sqb + h * sqh + (q0 + rows)[:, None] * sqs + dcol[None, :],
                mask=rin[:, None], other=0.0)
    do = tl.load(do_ptr + b * sdb + h * sdh + (q0 + rows)[:, None] * sds + dcol[None, :],
                 mask=rin[:, None], other=0.0)
    lse2 = tl.load(lse_ptr + b * slb + h * slh + q0 + rows, mask=rin, other=_POS_INF) * _LOG2E
    dlt = tl.load(delta_ptr + b * slb + h * slh + q0 + rows, mask=rin, other=0.0)
    k_base = k_ptr + b * skb + hk * skh + k0 * sks
    v_base = v_ptr + b * svb + hk * svh + k0 * svs
    k_src = _seq_src(k_base, lk, sks, BLOCK_N, D, TMA)
    v_src = _seq_src(v_base, lk, svs, BLOCK_N, D, TMA)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)

    off = lk - lq
    lo, a, c, hi = _key_split(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for n in range(lo, a, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, dlt, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk, off, left,
                      right, qk_scale, True, HAS_LEFT, HAS_RIGHT, PRECISION, INT64, TMA)
    for n in range(a, c, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, dlt, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk, off, left,
                      right, qk_scale, False, HAS_LEFT, HAS_RIGHT, PRECISION, INT64, TMA)
    for n in range(c, hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, dlt, k_src, v_src, sks, svs, n, rows, cols, dcol, lq, lk, off, left,
                      right, qk_scale, True, HAS_LEFT, HAS_RIGHT, PRECISION, INT64, TMA)
    dq = dq * scale
    tl.store(dq_ptr + b * sdqb + h * sdqh + (q0 + rows)[:, None] * sdqs + dcol[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=rin[:, None])


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
def seq_strides(t, varlen: bool) -> tuple[int, int, int]:
    """``(sb, sh, ss)`` of a ``(B, H, S, D)`` tensor or a packed ``(tokens, H, D)`` one."""
    return (0, t.stride(1), t.stride(0)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _lse_strides(lse, varlen: bool) -> tuple[int, int]:
    return (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))


def _precision(dtype) -> str:
    """Exact fp32 products for fp32 inputs (no TF32); 16-bit inputs keep Triton's
    default (it only matters for fp32 operands: 16-bit ones always run on wgmma)."""
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"


def _int64(*tensors) -> bool:
    return any(t.numel() >= 2**31 for t in tensors)


def _window_args(left: int, right: int) -> tuple[int, int, bool, bool]:
    """Kernel window arguments: a negative bound means "no bound"."""
    return max(left, 0), max(right, 0), left >= 0, right >= 0


def tma_ok(*tensors, varlen: bool) -> bool:
    """TMA needs 16-byte aligned bases and row / head / batch strides that are
    multiples of 16 bytes (every program's sequence base is then aligned)."""
    for t in tensors:
        es = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any(s * es % 16 for s in seq_strides(t, varlen)):
            return False
    return True


def _set_allocator(device) -> None:
    """Device-side TMA descriptors live in a small global-memory scratch that
    Triton asks the allocator for at launch."""
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


def launch_forward(q, k, v, o, lse, geom, scale: float, left: int, right: int, config: dict,
                   tma: bool = False) -> None:
    """``geom``: ``(B, H, HK, Sq, Sk, cu_q, cu_k)`` with ``Sq``/``Sk`` the (max)
    lengths; ``cu_q is None`` for the ``(B, H, S, D)`` layout. ``tma``: K/V
    tiles through TMA descriptors (Hopper; ``tma_ok`` inputs)."""
    import math

    B, H, HK, Sq, Sk, cu_q, cu_k = geom
    varlen = cu_q is not None
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    wl, wr, has_l, has_r = _window_args(left, right)
    grid = (triton.cdiv(Sq, bm), H, B)
    if tma:
        _set_allocator(q.device)
    attn_fwd_kernel[grid](
        q, k, v, o, lse, cu_q if varlen else lse, cu_k if varlen else lse,
        *seq_strides(q, varlen), *seq_strides(k, varlen), *seq_strides(v, varlen), *seq_strides(o, varlen),
        *_lse_strides(lse, varlen),
        H, H // HK, Sq, Sk, scale * math.log2(math.e), wl, wr,
        D=q.shape[-1], BLOCK_M=bm, BLOCK_N=bn, HAS_LEFT=has_l, HAS_RIGHT=has_r, VARLEN=varlen, POS_SCALE=scale > 0,
        PRECISION=_precision(q.dtype), INT64=_int64(q, k, v), TMA=tma,
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 2),
    )


def launch_backward(do, q, k, v, o, lse, dq, dk, dv, geom, scale: float, left: int, right: int,
                    config: dict, tma: bool = False) -> None:
    """delta, then dK/dV (per key block), then dQ (per query block); no atomics.
    ``tma``: the hot loops' tiles (Q/dO, K/V) through TMA descriptors."""
    import math

    import torch

    B, H, HK, Sq, Sk, cu_q, cu_k = geom
    varlen = cu_q is not None
    D = q.shape[-1]
    wl, wr, has_l, has_r = _window_args(left, right)
    delta = torch.empty_like(lse)
    cq = cu_q if varlen else lse
    ck = cu_k if varlen else lse
    int64 = _int64(q, k, v, do)
    bm_d = 64
    attn_bwd_delta_kernel[(triton.cdiv(Sq, bm_d), H, B)](
        o, do, delta, cq, cq, *seq_strides(o, varlen), *seq_strides(do, varlen), *_lse_strides(lse, varlen),
        H, Sq, D=D, BLOCK_M=bm_d, VARLEN=varlen, INT64=int64, num_warps=4,
    )
    qk_scale = scale * math.log2(math.e)
    if tma:
        _set_allocator(q.device)
    common = dict(D=D, HAS_LEFT=has_l, HAS_RIGHT=has_r, VARLEN=varlen, PRECISION=_precision(q.dtype), INT64=int64,
                  TMA=tma)
    if Sk == 0:  # no keys: dq is zero, dk and dv are empty
        dq.zero_()
        return
    attn_bwd_dkdv_kernel[(triton.cdiv(Sk, config["KV_BLOCK_N"]), HK, B)](
        q, k, v, do, lse, delta, dk, dv, cq, ck,
        *seq_strides(q, varlen), *seq_strides(k, varlen), *seq_strides(v, varlen), *seq_strides(do, varlen),
        *seq_strides(dk, varlen), *seq_strides(dv, varlen), *_lse_strides(lse, varlen),
        HK, H // HK, Sq, Sk, qk_scale, scale, wl, wr,
        BLOCK_M=config["KV_BLOCK_M"], BLOCK_N=config["KV_BLOCK_N"], **common,
        num_warps=config.get("kv_warps", 8), num_stages=config.get("kv_stages", 2),
    )
    attn_bwd_dq_kernel[(triton.cdiv(Sq, config["Q_BLOCK_M"]), H, B)](
        q, k, v, do, lse, delta, dq, cq, ck,
        *seq_strides(q, varlen), *seq_strides(k, varlen), *seq_strides(v, varlen), *seq_strides(do, varlen),
        *seq_strides(dq, varlen), *_lse_strides(lse, varlen),
        H, H // HK, Sq, Sk, qk_scale, scale, wl, wr,
        BLOCK_M=config["Q_BLOCK_M"], BLOCK_N=config["Q_BLOCK_N"], **common,
        num_warps=config.get("q_warps", 8), num_stages=config.get("q_stages", 2),
    )


# ---------------------------------------------------------------------------
# Configs (H200 defaults; autotune picks among the lists per shape bucket)
# ---------------------------------------------------------------------------
def _fit(n: int, block: int) -> int:
    """Shrink a block for short sequences (>= 16: tl.dot's smallest tile)."""
    return max(16, min(block, pow2(n)))


# fp32 inputs run tl.dot in exact fp32 (FMA, no tensor cores): the operand tiles
# live in registers, so the 16-bit tiles would spill tens of KB or overflow shared
# memory (D = 128 backward, D = 256). These fit, chosen from sm_90 compiles
# (`opforge.profile.op_resources`): no spills, except 4 KB in the D = 256 dQ kernel
# at its smallest tile.
FP32_FORWARD = {64: (32, 64, 8, 1), 128: (32, 64, 8, 1), 256: (32, 32, 8, 1)}
FP32_FORWARD_MORE = {64: [(16, 64, 8, 1), (32, 32, 4, 1)], 128: [(16, 64, 8, 1), (16, 64, 4, 1)],
                     256: [(16, 32, 8, 1), (32, 16, 8, 1)]}
FP32_BACKWARD = {64: ((32, 64, 8, 1), (16, 32, 4, 1)), 128: ((16, 32, 8, 1), (16, 16, 8, 1)),
                 256: ((16, 16, 8, 1), (16, 16, 4, 1))}


def _fp32_head(D: int) -> int:
    return 64 if D <= 64 else 128 if D <= 128 else 256


def forward_default_config(D: int, Sq: int, Sk: int, itemsize: int = 2) -> dict:
    """BLOCK_M 128 (two warpgroups of 64 rows with 8 warps: the fp32 accumulator
    is 64 registers a thread at D = 128); K/V tiles of 64 keys, 3 stages:
    q 32 KB + 3 x 32 KB of K/V in shared memory at D = 128. fp32: ``FP32_FORWARD``."""
    if itemsize == 4:
        bm, bn, w, s = FP32_FORWARD[_fp32_head(D)]
    elif D <= 64:
        bm, bn, w, s = 128, 64, 4, 3
    elif D <= 128:
        bm, bn, w, s = 128, 64, 8, 3
    else:
        bm, bn, w, s = 64, 64, 4, 2
    return {"BLOCK_M": _fit(Sq, bm), "BLOCK_N": _fit(Sk, bn), "num_warps": w, "num_stages": s}


def forward_configs(D: int, Sq: int, Sk: int, itemsize: int = 2) -> list[dict]:
    if itemsize == 4:
        raw = [FP32_FORWARD[_fp32_head(D)]] + FP32_FORWARD_MORE[_fp32_head(D)]
    elif D <= 128:
        raw = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3),
               (128, 32, 4, 4)]
    else:
        raw = [(64, 64, 4, 2), (64, 32, 4, 3), (128, 32, 8, 2), (128, 64, 8, 2)]
    out = []
    for bm, bn, w, s in raw:
        cfg = {"BLOCK_M": _fit(Sq, bm), "BLOCK_N": _fit(Sk, bn), "num_warps": w, "num_stages": s}
        if cfg not in out:
            out.append(cfg)
    return out


def backward_default_config(D: int, Sq: int, Sk: int, itemsize: int = 2) -> dict:
    """dK/dV: 128 keys a program (dK and dV accumulators 64 registers each with
    8 warps at D = 128), 32 queries a step; dQ: 128 queries, 64 keys a step.
    fp32: ``FP32_BACKWARD``."""
    if itemsize == 4:
        kv, qb = FP32_BACKWARD[_fp32_head(D)]
    elif D <= 128:
        kv = (32, 128, 8, 3)  # (KV_BLOCK_M, KV_BLOCK_N, warps, stages)
        qb = (128, 64, 8, 3)  # (Q_BLOCK_M, Q_BLOCK_N, warps, stages)
    else:
        kv = (32, 64, 8, 2)
        qb = (64, 32, 8, 2)
    return _backward_cfg(kv, qb, Sq, Sk)


def _backward_cfg(kv, qb, Sq, Sk) -> dict:
    return {"KV_BLOCK_M": _fit(Sq, kv[0]), "KV_BLOCK_N": _fit(Sk, kv[1]), "kv_warps": kv[2], "kv_stages": kv[3],
            "Q_BLOCK_M": _fit(Sq, qb[0]), "Q_BLOCK_N": _fit(Sk, qb[1]), "q_warps": qb[2], "q_stages": qb[3]}


def backward_configs(D: int, Sq: int, Sk: int, itemsize: int = 2) -> list[dict]:
    if itemsize == 4:
        return [backward_default_config(D, Sq, Sk, itemsize)]
    if D <= 128:
        kvs = [(32, 128, 8, 3), (64, 128, 8, 2), (32, 128, 4, 4), (64, 64, 4, 3)]
        qbs = [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)]
    else:
        kvs = [(32, 64, 8, 2), (16, 64, 4, 2)]
        qbs = [(64, 32, 8, 2), (32, 32, 4, 2)]
    out = []
    for kv in kvs:
        for qb in qbs:
            cfg = _backward_cfg(kv, qb, Sq, Sk)
            if cfg not in out:
                out.append(cfg)
    return out
