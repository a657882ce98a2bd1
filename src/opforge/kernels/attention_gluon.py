"""FlashAttention forward for Hopper (sm_90) in Gluon, warp-specialized (FA3-style).

Why Gluon: Triton 3.6's automatic warp specialization failed on the FA2
forward of ``kernels/attention.py``; Gluon lets us place the work by hand.

Tiles of ``BLOCK_M`` queries of one head, numbered query block fastest (the
CTAs in flight share a head's K/V in L2), heaviest causal block first; a
1-D grid of one CTA per tile, or one per SM walking the tiles
(``PERSISTENT``). The CTA is split with ``gl.warp_specialize`` into

* a **loader** (1 warp, 24 registers): TMA loads of each consumer's Q tile
  and of the K and V tiles into a ``STAGES``-deep shared-memory ring, each
  slot guarded by a ``ready`` mbarrier (TMA transaction count) and an
  ``empty`` one (released by every consumer);
* the **consumers**: ``CONSUMERS = 2`` partitions of one warpgroup, each
  owning 64 query rows and running on its own (``CONSUMERS = 1``: one 8-warp
  partition whose warpgroups wait for each other at every barrier, 25 %
  slower on the H200), ``setmaxnreg`` giving them 240 registers.
  ``S = Q K^T`` and ``O += P V`` run on ``warpgroup_mma`` (async; P from
  registers), the online softmax in registers. The loop is
  software-pipelined as in FA3: ``S_{j+1} = Q K_{j+1}^T`` is issued with
  ``P_j V_j`` and the softmax of block ``j+1`` runs while ``P_j V_j`` is
  still on the tensor cores (``warpgroup_mma_wait(1)`` waits for the older
  QK only; wgmma groups retire in order). ``PINGPONG``: the two consumers
  take turns issuing their GEMMs (an mbarrier pair), so one's softmax
  overlaps the other's GEMMs.

The scale is folded with ``log2(e)`` so the exponentials are ``exp2`` (the
max commutes with a positive scale, so it is one FMA per score). Masks (the
causal diagonal, keys past ``Sk``) are applied only to the blocks that need
them (``n + BLOCK_N > full``). O goes out through a TMA store from its own
buffer (or, ``O_IN_Q``, the Q buffer, leaving room for a deeper ring); the
log-sum-exp (natural log, fp32, ``(B, H, Sq)``) is the convention of
``kernels/attention.py`` so its backward takes it.

Tensors are seen through 4-D TMA descriptors ``[B, H, S, D]`` with a
``[1, 1, rows, D]`` box: the copy engine zero-fills rows past a head's
sequence and clips the O store there, so ragged lengths need no pointer
path. What it takes (checked by ``ops/attention_gluon.py``): fp16/bf16, head
dim 64 or 128, causal (bottom-right, ``Sq <= Sk``) or full, GQA, no windows,
no varlen, a positive scale, 16-byte aligned bases and strides, unit head-dim
stride.
"""

from __future__ import annotations

import functools

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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Bump when the kernel's code changes: it is part of the autotune key.
VERSION = "1"
HEAD_DIMS = (64, 128)
LOADER_REGS = gl.constexpr(24)  # the loader only issues TMA: the minimum setmaxnreg allows
CONSUMER_REGS = gl.constexpr(240)  # a second consumer partition: what the default one gets too
_LOG2E = 1.4426950408889634
_LN2 = gl.constexpr(0.6931471805599453)
_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


# ---------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------
@gluon.jit
def _tile(t, n_m, H, Sq, Sk, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Tile ``t``: ``(b, h, m0, full, n_blocks)``. Query blocks run fastest
    (the CTAs in flight share a head's K/V in L2), heaviest causal block first.
    Keys below ``full`` are seen by every query of the tile (no mask); keys
    past the tile's last query are never loaded (causal)."""
    bh = t // n_m
    m0 = (n_m - 1 - t % n_m) * BLOCK_M
    off = Sk - Sq
    if CAUSAL:
        hi = gl.minimum(Sk, m0 + BLOCK_M + off)
        full = gl.maximum(gl.minimum(m0 + off + 1, Sk), 0)
    else:
        hi = Sk
        full = Sk
    return bh // H, bh % H, m0, (full // BLOCK_N) * BLOCK_N, gl.cdiv(hi, BLOCK_N)


# ---------------------------------------------------------------------------
# Loader partition
# ---------------------------------------------------------------------------
@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
            H, GROUP, Sq, Sk, n_m, n_tiles, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    rows: gl.constexpr = q_desc.block_type.shape[2]
    g = 0  # K/V blocks loaded so far (the ring position runs on across tiles)
    i = 0  # tiles done by this CTA
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        b, h, m0, full, n_blocks = _tile(t, n_m, H, Sq, Sk, CAUSAL, BLOCK_M, BLOCK_N)
        hk = h // GROUP
        for c in range(CONSUMERS):  # each consumer's query rows, once its previous tile is stored
            # A fresh mbarrier counts as having completed phase 1: the first wait passes.
            mbarrier.wait(q_empty.index(c), (i & 1) ^ 1)
            mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, m0 + c * rows, 0], q_ready.index(c), q_smem.index(c))
        for j in range(n_blocks):
            s = g % STAGES
            phase = (g // STAGES) & 1
            mbarrier.wait(k_empty.index(s), phase ^ 1)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(s), k_ring.index(s))
            mbarrier.wait(v_empty.index(s), phase ^ 1)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_ready.index(s), v_ring.index(s))
            g += 1
        i += 1


# ---------------------------------------------------------------------------
# Consumer partition
# ---------------------------------------------------------------------------
@gluon.jit
def _scores(q, k_ring, k_ready, g, s_layout: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr):
    """Issue ``S = Q K^T`` (async) for the ring's ``g``-th block once it has landed; returns the wgmma token."""
    s = g % STAGES
    mbarrier.wait(k_ready.index(s), (g // STAGES) & 1)
    k = k_ring.index(s).reshape([BLOCK_N, HEAD_D])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q, k.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _values(v_ring, v_ready, g, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr):
    """The ring's ``g``-th V tile, once it has landed, as a ``[BLOCK_N, D]`` operand."""
    s = g % STAGES
    mbarrier.wait(v_ready.index(s), (g // STAGES) & 1)
    return v_ring.index(s).reshape([BLOCK_N, HEAD_D])


@gluon.jit
def _softmax(sc, m_i, l_i, j, m0, full, Sk, off, qk_scale, s_layout: gl.constexpr, CAUSAL: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Online-softmax step on the raw scores of key block ``j``: the new
    running max / sum, the probabilities and the accumulator's rescale."""
    n = j * BLOCK_N
    if n + BLOCK_N > full:  # the diagonal or the ragged end: mask this block only
        cols = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = gl.expand_dims(cols < Sk, 0)
        if CAUSAL:
            rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            ok = ok & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + off, 1))
        sc = gl.where(ok, sc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, 1) * qk_scale)
    p = gl.exp2(sc * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _take_turn(turn, k, C: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: consumer ``C`` issues its ``k``-th round of GEMMs only after
    the other consumer issued its own (consumer 0 goes first), so one
    warpgroup's softmax runs while the other's GEMMs hold the tensor cores."""
    if PINGPONG:
        mbarrier.wait(turn.index(C), (k & 1) ^ (1 - C))


@gluon.jit
def _pass_turn(turn, C: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - C), count=1)


@gluon.jit
def _consumer(q_smem, o_smem, k_ring, v_ring, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn,
              o_desc, lse_ptr, H, Sq, Sk, n_m, n_tiles, qk_scale,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              STAGES: gl.constexpr, CONSUMERS: gl.constexpr, C: gl.constexpr, PINGPONG: gl.constexpr,
              O_IN_Q: gl.constexpr, num_warps: gl.constexpr):
    """Consumer ``C`` of ``CONSUMERS``: rows ``[C * ROWS, (C + 1) * ROWS)`` of
    each tile, in its own Q and O buffers; releases each K/V slot once (a
    slot's empty barrier counts every consumer) and its Q buffer after the
    tile's last QK^T, so the next tile's Q loads during the last PV and the
    epilogue, whose O store drains while the next tile computes. ``O_IN_Q``:
    O is staged in the Q buffer (``o_smem`` is ``q_smem``), which then frees
    only once O has left: the shared memory goes to a deeper K/V ring."""
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    off = Sk - Sq
    q = q_smem.reshape([ROWS, HEAD_D])
    o = o_smem.reshape([ROWS, HEAD_D])
    g = 0  # K/V blocks consumed so far (the ring position)
    kt = 0  # ping-pong turns taken so far
    i = 0  # tiles done by this CTA
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        b, h, m0, full, n_blocks = _tile(t, n_m, H, Sq, Sk, CAUSAL, BLOCK_M, BLOCK_N)
        m0 = m0 + C * ROWS
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([ROWS], gl.float32, row_s)
        acc = gl.zeros([ROWS, HEAD_D], gl.float32, o_layout)
        mbarrier.wait(q_ready, i & 1)

        # Block 0: nothing to overlap with yet.
        _take_turn(turn, kt, C, PINGPONG)
        sc = _scores(q, k_ring, k_ready, g, s_layout, ROWS, BLOCK_N, HEAD_D, STAGES)
        _pass_turn(turn, C, PINGPONG)
        sc = warpgroup_mma_wait(0, deps=[sc])
        mbarrier.arrive(k_empty.index(g % STAGES), count=1)
        p, m_i, l_i, alpha = _softmax(sc, m_i, l_i, 0, m0, full, Sk, off, qk_scale, s_layout, CAUSAL, ROWS,
                                      BLOCK_N)
        p = gl.convert_layout(p.to(dtype), p_layout)

        for j in range(1, n_blocks):
            # S_j = Q K_j^T and O += P_{j-1} V_{j-1} in flight together; the softmax of
            # block j runs while the second still holds the tensor cores.
            _take_turn(turn, kt + j, C, PINGPONG)
            sc = _scores(q, k_ring, k_ready, g + j, s_layout, ROWS, BLOCK_N, HEAD_D, STAGES)
            v = _values(v_ring, v_ready, g + j - 1, BLOCK_N, HEAD_D, STAGES)
            acc = warpgroup_mma(p, v, acc, is_async=True)
            _pass_turn(turn, C, PINGPONG)
            sc = warpgroup_mma_wait(1, deps=[sc])  # S_j done (wgmma groups retire in order)
            mbarrier.arrive(k_empty.index((g + j) % STAGES), count=1)
            p_next, m_i, l_i, alpha = _softmax(sc, m_i, l_i, j, m0, full, Sk, off, qk_scale, s_layout, CAUSAL,
                                               ROWS, BLOCK_N)
            acc, p = warpgroup_mma_wait(0, deps=[acc, p])
            mbarrier.arrive(v_empty.index((g + j - 1) % STAGES), count=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            p = gl.convert_layout(p_next.to(dtype), p_layout)

        if not O_IN_Q:
            mbarrier.arrive(q_empty, count=1)  # every QK^T of the tile is done: the next tile's Q may load
        v = _values(v_ring, v_ready, g + n_blocks - 1, BLOCK_N, HEAD_D, STAGES)
        _take_turn(turn, kt + n_blocks, C, PINGPONG)
        acc = warpgroup_mma(p, v, acc, is_async=True)
        _pass_turn(turn, C, PINGPONG)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index((g + n_blocks - 1) % STAGES), count=1)
        g += n_blocks
        kt += n_blocks + 1

        # Epilogue: O through shared memory and a TMA store (clipped at Sq); lse by pointer.
        out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        tma.store_wait(0)  # the previous tile's O has left the buffer
        o.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, h, m0, 0], o_smem)
        rows = m0 + gl.arange(0, ROWS, layout=row_s)
        lse = (m_i + gl.log2(l_i)) * _LN2
        gl.store(lse_ptr + (b * H + h).to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
        if O_IN_Q:
            tma.store_wait(0)
            mbarrier.arrive(q_empty, count=1)
        i += 1
    tma.store_wait(0)


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["B", "H", "GROUP", "Sq", "Sk"])  # one compile per (dtype, D, mask, config)
def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, B, H, GROUP, Sq, Sk, qk_scale,
                       CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HEAD_D: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                       PINGPONG: gl.constexpr, O_IN_Q: gl.constexpr, num_warps: gl.constexpr):
    """Tiles ``program_id, program_id + num_programs, ...`` of the ``cdiv(Sq,
    BLOCK_M) * H * B`` tiles: one each with a grid of all tiles, several with
    a persistent grid (the loader then fetches the next tile's Q and K/V
    while the consumers finish the current one)."""
    gl.static_assert(q_desc.block_type.shape[2] * CONSUMERS == BLOCK_M)
    n_m = gl.cdiv(Sq, BLOCK_M)
    n_tiles = n_m * H * B

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    if O_IN_Q:
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=CONSUMERS)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=CONSUMERS)
    for c in gl.static_range(2):
        mbarrier.init(turn.index(c), count=1)

    loader_args = (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, k_empty, v_ready,
                   v_empty, H, GROUP, Sq, Sk, n_m, n_tiles, CAUSAL, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (q_smem.index(0), o_smem.index(0), k_ring, v_ring, q_ready.index(0), q_empty.index(0),
                         k_ready, k_empty, v_ready, v_empty, turn, o_desc, lse_ptr, H, Sq, Sk, n_m, n_tiles, qk_scale,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, 0, False, O_IN_Q, num_warps)),
            (_loader, loader_args),
        ], [1], [LOADER_REGS])
    else:
        gl.static_assert(CONSUMERS == 2)
        gl.warp_specialize([
            (_consumer, (q_smem.index(0), o_smem.index(0), k_ring, v_ring, q_ready.index(0), q_empty.index(0),
                         k_ready, k_empty, v_ready, v_empty, turn, o_desc, lse_ptr, H, Sq, Sk, n_m, n_tiles, qk_scale,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, 0, PINGPONG, O_IN_Q, num_warps)),
            (_consumer, (q_smem.index(1), o_smem.index(1), k_ring, v_ring, q_ready.index(1), q_empty.index(1),
                         k_ready, k_empty, v_ready, v_empty, turn, o_desc, lse_ptr, H, Sq, Sk, n_m, n_tiles, qk_scale,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CONSUMERS, 1, PINGPONG, O_IN_Q, num_warps)),
            (_loader, loader_args),
        ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------
def forward_default_config(D: int, Sq: int, Sk: int, causal: bool = False, group: int = 1) -> dict:
    """128 queries x 128 keys, two consumer partitions of one warpgroup (64
    rows) each, the ring as deep as shared memory allows (Q + O + STAGES x (K
    + V) tiles under ~227 KB). From the H200 (bf16, B 4, H 16, device run 2):
    D 128 full runs best on a persistent grid (628 / 626 / 628 TFLOP/s at S
    2048 / 8192 / 16384, against 589 / 619 / 599 with a CTA per tile), causal
    on a CTA per tile (the persistent grid's round robin leaves causal tiles
    unbalanced: 616 against 529 at S 16384), GQA 32/8 with O staged in the Q
    buffer and a 3-deep ring (660 / 558 full / causal against 594 / 542); one
    8-warp consumer runs 20-25 % slower everywhere. D 64: persistent, 465 /
    389 full / causal at S 4096.

    Keys: ``CONSUMERS`` 1 (one 8-warp partition, both warpgroups in step) or 2
    (a 4-warp partition per warpgroup), ``PINGPONG`` (two consumers take
    turns at the tensor cores), ``PERSISTENT`` (one CTA per SM walking the
    tiles; the same compiled kernel), ``O_IN_Q`` (O staged in the Q buffer:
    room for a deeper ring)."""
    two = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2 if D == 128 else 4, "CONSUMERS": 2, "PINGPONG": False,
           "PERSISTENT": False, "num_warps": 4}
    if D != 128:
        return dict(two, PERSISTENT=True)
    if group > 1:
        return dict(two, STAGES=3, O_IN_Q=True)
    return two if causal else dict(two, PERSISTENT=True)


def forward_configs(D: int, Sq: int, Sk: int, causal: bool = False, group: int = 1) -> list[dict]:
    """The default first, then the variations the device runs measured (and, D 64, 256-key blocks)."""
    two = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2 if D == 128 else 4, "CONSUMERS": 2, "PINGPONG": False,
           "PERSISTENT": False, "num_warps": 4}
    one = dict(two, CONSUMERS=1, num_warps=8)
    out = [forward_default_config(D, Sq, Sk, causal, group), two, dict(two, PINGPONG=True),
           dict(two, PERSISTENT=True), dict(two, PINGPONG=True, PERSISTENT=True), one]
    if D == 128:  # a 3-deep ring fits when O is staged in the Q buffer (32 + 3 x 64 KB)
        out += [dict(two, STAGES=3, O_IN_Q=True), dict(two, STAGES=3, O_IN_Q=True, PINGPONG=True),
                dict(two, STAGES=3, O_IN_Q=True, PERSISTENT=True), dict(two, BLOCK_N=64, STAGES=4)]
    else:
        out += [dict(two, BLOCK_N=256, STAGES=2), dict(two, BLOCK_N=256, STAGES=2, PINGPONG=True, PERSISTENT=True)]
    unique = []
    for cfg in out:
        if cfg not in unique:
            unique.append(cfg)
    return unique


def max_registers(cfg: dict) -> int:
    """``maxnreg`` for the whole CTA: the consumers' warps plus the loader's
    warpgroup (registers are allotted by groups of 4 warps) must fit in the
    SM's 64K registers; ``setmaxnreg`` then moves the loader's share to the
    consumers."""
    threads = (cfg["num_warps"] * cfg["CONSUMERS"] + 4) * 32
    return min(255, (65536 // threads) // 8 * 8)


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 4-D ``[B, H, S, D]`` descriptor with a ``[1, 1, rows, D]`` box."""
    block = [1, 1, rows, t.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def forward_plan(q, k, v, out, lse, scale: float, causal: bool, cfg: dict):
    """``(grid, args, constexprs)`` of one launch: shared by ``launch_forward``
    and the CPU compile check (which passes meta tensors)."""
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    rows = bm // cfg["CONSUMERS"]
    args = (descriptor(q, rows), descriptor(k, bn), descriptor(v, bn), descriptor(out, rows), lse,
            B, H, H // Hk, Sq, Sk, float(scale) * _LOG2E)
    constexprs = dict(CAUSAL=bool(causal), BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, STAGES=cfg["STAGES"],
                      CONSUMERS=cfg["CONSUMERS"], PINGPONG=bool(cfg["PINGPONG"]), O_IN_Q=bool(cfg.get("O_IN_Q")),
                      num_warps=cfg["num_warps"],
                      maxnreg=max_registers(cfg))
    n_tiles = triton.cdiv(Sq, bm) * H * B
    if cfg.get("PERSISTENT") and q.device.type == "cuda":
        n_tiles = min(n_tiles, _sm_count(q.device))
    return (n_tiles,), args, constexprs


@functools.cache
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_forward(q, k, v, out, lse, scale: float, causal: bool, cfg: dict) -> None:
    grid, args, constexprs = forward_plan(q, k, v, out, lse, scale, causal, cfg)
    attn_fwd_ws_kernel[grid](*args, **constexprs)


def compile_sm90(D: int = 128, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                 B: int = 2, H: int = 4, Hk: int = 4, S: int = 1024):
    """Compile (not run) the kernel for sm_90 on any machine, into Triton's
    cache as the first launch of that specialization would (the device script
    compiles its variants in parallel this way); returns the compiled kernel
    (``.asm['cubin']``, ``.asm['ptx']``, ``.metadata``)."""
    cfg = cfg or forward_default_config(D, S, S)
    q = torch.empty(B, H, S, D, dtype=dtype, device="meta")
    kv = torch.empty(B, Hk, S, D, dtype=dtype, device="meta")
    lse = torch.empty(B, H, S, dtype=torch.float32, device="meta")
    _, args, kw = forward_plan(q, kv, kv, q, lse, D ** -0.5, causal, cfg)
    return compile_launch_sm90(attn_fwd_ws_kernel, args, kw)


def compile_launch_sm90(kernel, args, kw):
    """``triton.compile`` of the launch ``kernel[grid](*args, **kw)`` for sm_90,
    with the options a launch passes, so it lands where the launch looks in
    Triton's cache (``args`` may hold meta tensors: nothing runs)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = dict(kw, debug=kernel.debug or knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, specialization, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, opts)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)
