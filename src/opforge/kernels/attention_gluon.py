"""FlashAttention forward for Hopper (sm_90) in Gluon, warp-specialized (FA3-style).

Why Gluon: Triton 3.6's automatic warp specialization failed on the FA2
forward of ``kernels/attention.py``; Gluon lets us place the work by hand.

One program per ``BLOCK_M`` queries of one head (grid ``(cdiv(Sq, BLOCK_M),
H, B)``, the heaviest causal blocks first). The CTA is split with
``gl.warp_specialize`` into

* a **loader** (1 warp, few registers): TMA loads of the Q tile and of the
  K and V tiles into a ``STAGES``-deep shared-memory ring, each slot guarded
  by a ``ready`` mbarrier (TMA transaction count) and an ``empty`` mbarrier
  (the consumer's release);
* the **consumer** (the default partition, ``num_warps`` = 4 per 64 query
  rows: two warpgroups for ``BLOCK_M = 128``): ``S = Q K^T`` and ``O += P V``
  on ``warpgroup_mma`` (async), with the online softmax in registers. The
  loop is software-pipelined as in FA3: ``S_{j+1} = Q K_{j+1}^T`` is issued
  before ``P_j V_j``, and the softmax of block ``j+1`` runs while ``P_j V_j``
  is still on the tensor cores (``warpgroup_mma_wait(1)`` waits for the
  older QK only; wgmma groups retire in order).

The scale is folded with ``log2(e)`` so the exponentials are ``exp2`` (the
max commutes with a positive scale, so it is one FMA per score). Masks (the
causal diagonal, keys past ``Sk``) are applied only to the blocks that need
them (``n + BLOCK_N > full``). O goes out through a TMA store from the
shared buffer that held Q; the log-sum-exp (natural log, fp32, ``(B, H,
Sq)``) is the convention of ``kernels/attention.py`` so its backward takes it.

Tensors are seen through 4-D TMA descriptors ``[B, H, S, D]`` with a
``[1, 1, rows, D]`` box: the copy engine zero-fills rows past a head's
sequence and clips the O store there, so ragged lengths need no pointer
path. What it takes (checked by ``ops/attention_gluon.py``): fp16/bf16, head
dim 64 or 128, causal (bottom-right, ``Sq <= Sk``) or full, GQA, no windows,
no varlen, a positive scale, 16-byte aligned bases and strides, unit head-dim
stride.
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
# Loader partition
# ---------------------------------------------------------------------------
@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, k_ready, k_empty, v_ready, v_empty,
            b, h, hk, m0, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    rows: gl.constexpr = q_desc.block_type.shape[2]
    for c in range(CONSUMERS):  # each consumer's query rows
        mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + c * rows, 0], q_bar.index(c), q_smem.index(c))
    for j in range(n_blocks):
        s = j % STAGES
        phase = (j // STAGES) & 1
        # A fresh mbarrier counts as having completed phase 1: the first lap passes.
        mbarrier.wait(k_empty.index(s), phase ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(s), k_ring.index(s))
        mbarrier.wait(v_empty.index(s), phase ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_ready.index(s), v_ring.index(s))


# ---------------------------------------------------------------------------
# Consumer partition
# ---------------------------------------------------------------------------
@gluon.jit
def _scores(q, k_ring, k_ready, j, s_layout: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr):
    """Issue ``S_j = Q K_j^T`` (async) once K_j has landed; returns the wgmma token."""
    s = j % STAGES
    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
    k = k_ring.index(s).reshape([BLOCK_N, HEAD_D])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q, k.permute((1, 0)), zero, use_acc=False, is_async=True)


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
def _consumer(q_smem, k_ring, v_ring, q_bar, k_ready, k_empty, v_ready, v_empty, turn, o_desc, lse_ptr,
              b, h, H, m0, Sq, Sk, n_blocks, full, qk_scale,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              STAGES: gl.constexpr, C: gl.constexpr, PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    """Consumer ``C``: the ``BLOCK_M`` query rows from ``m0`` (its Q buffer and
    barrier are ``q_smem`` / ``q_bar``); releases each K/V slot once (the
    slot's empty barrier counts every consumer)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    off = Sk - Sq

    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([BLOCK_M, HEAD_D])
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

    # Block 0: nothing to overlap with yet.
    _take_turn(turn, 0, C, PINGPONG)
    sc = _scores(q, k_ring, k_ready, 0, s_layout, BLOCK_M, BLOCK_N, HEAD_D, STAGES)
    _pass_turn(turn, C, PINGPONG)
    sc = warpgroup_mma_wait(0, deps=[sc])
    mbarrier.arrive(k_empty.index(0), count=1)
    p, m_i, l_i, alpha = _softmax(sc, m_i, l_i, 0, m0, full, Sk, off, qk_scale, s_layout, CAUSAL, BLOCK_M, BLOCK_N)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_blocks):
        _take_turn(turn, j, C, PINGPONG)
        sc = _scores(q, k_ring, k_ready, j, s_layout, BLOCK_M, BLOCK_N, HEAD_D, STAGES)
        sv = (j - 1) % STAGES
        mbarrier.wait(v_ready.index(sv), ((j - 1) // STAGES) & 1)
        v = v_ring.index(sv).reshape([BLOCK_N, HEAD_D])
        acc = warpgroup_mma(p, v, acc, is_async=True)
        _pass_turn(turn, C, PINGPONG)
        sc = warpgroup_mma_wait(1, deps=[sc])  # S_j done; P_{j-1} V_{j-1} may still run
        mbarrier.arrive(k_empty.index(j % STAGES), count=1)
        p_next, m_i, l_i, alpha = _softmax(sc, m_i, l_i, j, m0, full, Sk, off, qk_scale, s_layout, CAUSAL,
                                           BLOCK_M, BLOCK_N)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index(sv), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p = gl.convert_layout(p_next.to(dtype), p_layout)

    sv = (n_blocks - 1) % STAGES
    mbarrier.wait(v_ready.index(sv), ((n_blocks - 1) // STAGES) & 1)
    v = v_ring.index(sv).reshape([BLOCK_N, HEAD_D])
    _take_turn(turn, n_blocks, C, PINGPONG)
    acc = warpgroup_mma(p, v, acc, is_async=True)
    _pass_turn(turn, C, PINGPONG)
    acc, p = warpgroup_mma_wait(0, deps=[acc, p])
    mbarrier.arrive(v_empty.index(sv), count=1)

    # Epilogue: O through the Q buffer and a TMA store (clipped at Sq); lse by pointer.
    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    q.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, m0, 0], q_smem)
    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse = (m_i + gl.log2(l_i)) * _LN2
    gl.store(lse_ptr + (b * H + h).to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
    tma.store_wait(0)


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------
@gluon.jit(do_not_specialize=["H", "GROUP", "Sq", "Sk"])  # one compile per (dtype, D, mask, config)
def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, GROUP, Sq, Sk, qk_scale,
                       CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HEAD_D: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                       PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS  # query rows of one consumer partition
    gl.static_assert(q_desc.block_type.shape[2] == ROWS)
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    h = gl.program_id(1)
    b = gl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    off = Sk - Sq
    if CAUSAL:  # keys past the block's last query are never loaded
        hi = gl.minimum(Sk, m0 + BLOCK_M + off)
        full = gl.maximum(gl.minimum(m0 + off + 1, Sk), 0)
    else:
        hi = Sk
        full = Sk
    full = (full // BLOCK_N) * BLOCK_N  # keys below `full`: every query of the block sees the whole block
    n_blocks = gl.cdiv(hi, BLOCK_N)  # the same for every consumer (ping-pong hands turns over to the end)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=CONSUMERS)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=CONSUMERS)
    for c in gl.static_range(2):
        mbarrier.init(turn.index(c), count=1)

    loader_args = (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_bar, k_ready, k_empty, v_ready, v_empty,
                   b, h, hk, m0, n_blocks, BLOCK_N, STAGES, CONSUMERS)
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (q_smem.index(0), k_ring, v_ring, q_bar.index(0), k_ready, k_empty, v_ready, v_empty, turn,
                         o_desc, lse_ptr, b, h, H, m0, Sq, Sk, n_blocks, full, qk_scale,
                         CAUSAL, ROWS, BLOCK_N, HEAD_D, STAGES, 0, False, num_warps)),
            (_loader, loader_args),
        ], [1], [LOADER_REGS])
    else:
        gl.static_assert(CONSUMERS == 2)
        gl.warp_specialize([
            (_consumer, (q_smem.index(0), k_ring, v_ring, q_bar.index(0), k_ready, k_empty, v_ready, v_empty, turn,
                         o_desc, lse_ptr, b, h, H, m0, Sq, Sk, n_blocks, full, qk_scale,
                         CAUSAL, ROWS, BLOCK_N, HEAD_D, STAGES, 0, PINGPONG, num_warps)),
            (_consumer, (q_smem.index(1), k_ring, v_ring, q_bar.index(1), k_ready, k_empty, v_ready, v_empty, turn,
                         o_desc, lse_ptr, b, h, H, m0 + ROWS, Sq, Sk, n_blocks, full, qk_scale,
                         CAUSAL, ROWS, BLOCK_N, HEAD_D, STAGES, 1, PINGPONG, num_warps)),
            (_loader, loader_args),
        ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------
def forward_default_config(D: int, Sq: int, Sk: int) -> dict:
    """128 queries (two warpgroups of 64 rows) x 128 keys; the ring as deep as
    shared memory allows (Q + STAGES x (K + V) tiles under ~227 KB).
    ``CONSUMERS``: 1 (one 8-warp partition, both warpgroups in step) or 2 (a
    4-warp partition per warpgroup, each on its own, ``PINGPONG`` optional)."""
    return {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2 if D == 128 else 4, "CONSUMERS": 1, "PINGPONG": False,
            "num_warps": 8}


def forward_configs(D: int, Sq: int, Sk: int) -> list[dict]:
    base = forward_default_config(D, Sq, Sk)
    two = dict(base, CONSUMERS=2, num_warps=4)
    return [base, two, dict(two, PINGPONG=True), dict(base, BLOCK_N=64, STAGES=2 * base["STAGES"])]


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
            H, H // Hk, Sq, Sk, float(scale) * _LOG2E)
    constexprs = dict(CAUSAL=bool(causal), BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, STAGES=cfg["STAGES"],
                      CONSUMERS=cfg["CONSUMERS"], PINGPONG=bool(cfg["PINGPONG"]), num_warps=cfg["num_warps"],
                      maxnreg=max_registers(cfg))
    return (triton.cdiv(Sq, bm), H, B), args, constexprs


def launch_forward(q, k, v, out, lse, scale: float, causal: bool, cfg: dict) -> None:
    grid, args, constexprs = forward_plan(q, k, v, out, lse, scale, causal, cfg)
    attn_fwd_ws_kernel[grid](*args, **constexprs)


def compile_sm90(D: int = 128, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                 B: int = 2, H: int = 4, Hk: int = 4, S: int = 1024):
    """Compile (not run) the kernel for sm_90 on any machine, into Triton's
    cache as the first launch of that specialization would (the device script
    compiles its variants in parallel this way); returns the compiled kernel
    (``.asm['cubin']``, ``.asm['ptx']``, ``.metadata``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    cfg = cfg or forward_default_config(D, S, S)
    q = torch.empty(B, H, S, D, dtype=dtype, device="meta")
    kv = torch.empty(B, Hk, S, D, dtype=dtype, device="meta")
    lse = torch.empty(B, H, S, dtype=torch.float32, device="meta")
    _, args, kw = forward_plan(q, kv, kv, q, lse, D ** -0.5, causal, cfg)
    kernel = attn_fwd_ws_kernel
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    from triton import knobs

    # The options a launch would pass, so the compile lands where the launch looks in Triton's cache.
    kw = dict(kw, debug=kernel.debug or knobs.runtime.debug, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, specialization, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, opts)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)
