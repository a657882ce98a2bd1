"""FP8 (e4m3 / e5m2) scaled GEMM for Hopper (sm_90), written in Gluon.

``C = ((A * sa) @ (B * sb) + bias).to(C.dtype)`` with ``A [M, K]`` row-major
and ``B`` given as ``Bt [N, K]`` row-major (K-major: what 8-bit wgmma reads
from shared memory). Scale modes as in ``opforge.kernels.gemm_scaled``:
``TENSOR`` (one scale), ``ROW`` (``sa[m]`` per row of A, ``sb[n]`` per
column of C), ``BLOCK`` (DeepSeek-V3: ``sa[m, k // 128]`` and
``sb[k // 128, n // 128]``).

Why Gluon: Triton's automatic warp specialization does not give the
producer / consumer split DeepGEMM and cuBLAS use on Hopper; Gluon states it
explicitly (``gl.warp_specialize``), with the register budget per role
(``setmaxnreg``).

Accumulation. Hopper's fp8 wgmma keeps about 14 mantissa bits in its
accumulator. By default (``FAST_ACC`` off, torch._scaled_mm's default) every
128-wide K chunk is computed into a fresh fp32 partial and added into the
main accumulator ("promotion", DeepGEMM's precise accumulation); with block
scales that add is ``acc += partial * sa[m, kb] * sb[kb, nb]``, so block
scaling costs one FMA per accumulator element per chunk and nothing else.
With ``FAST_ACC`` (per-tensor / row scales only) wgmma accumulates the whole
K loop itself.

Kernels:

* ``fp8_gemm_ws_kernel``: persistent (one CTA per SM walking grouped output
  tiles), ``STAGES``-deep shared-memory ring of ``[128, 128]`` A and
  ``[BN, 128]`` B tiles filled by TMA, ``ready`` / ``empty`` mbarriers per
  slot; three partitions: two consumer warpgroups (rows 0-63 and 64-127 of
  the tile; wgmma, promotion and the epilogue: scales, bias, TMA store) and
  one producer warp issuing the TMA loads. Each consumer releases a slot with
  its own arrive (``empty`` counts two), so the two warpgroups drift freely
  and one's promotion FMAs overlap the other's MMAs. A 128-wide tile without
  block scales also pipelines within the warpgroup (``PIPE``: the next
  chunk's MMA runs while this chunk's partial is promoted); a 256-wide tile
  holds two 128-wide accumulators per warpgroup, promoted one at a time.
  Registers: consumers 232, producer 40 (setmaxnreg); no spills.
* ``fp8_gemm_simple_kernel``: the plain form (one tile per CTA, one
  warpgroup, TMA loads ``STAGES - 1`` chunks ahead, synchronous wgmma): the
  first-light kernel and a cross-check of the specialized one.

TMA zero-fills the M / N / K edges of loads and clips stores, so any
``M, N`` work; ``A``, ``Bt`` and ``C`` need 16-byte aligned bases and rows
(the op's ``check``).

H200, two device runs (TFLOP/s, bf16 out; benchmarks/gluon_fp8_gemm.py;
run-to-run noise about 5 %): per-tensor precise 1140-1243 at the default
config, 0.92-1.06x torch._scaled_mm (1137-1336); fast accumulation
1259-1332, 0.95-1.02x; row-wise 0.92-1.02x; 128-block scales 890-973,
1.37-1.62x the fastest other path (opforge's Triton kernel, 590-650; torch
2.11 has no blockwise _scaled_mm on sm_90). Not reached: 1.1x _scaled_mm
per-tensor. What is left: the epilogue does not overlap the next tile's MMAs
(both warpgroups store at once), a 128 x 256 tile promotes its two halves
one at a time (registers: the pipelined form needs 256), and 128-wide tiles
move twice the L2 bytes per FLOP of cuBLAS's clustered 256 x 128 ones (no
TMA multicast in triton 3.6's Gluon).
"""

from __future__ import annotations

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

VERSION = "gluon-fp8-1"
TENSOR, ROW, BLOCK = 0, 1, 2
SCALE_BLOCK = 128
BLOCK_K = 128  # = SCALE_BLOCK: one promotion (and one block scale) per chunk
SUB_M = 64  # rows per consumer warpgroup (wgmma's M)
HALF_N = 128  # columns per accumulator (a 256-wide tile holds two)
H200_SMS = 132

_GL_DTYPES = {"torch.float8_e4m3fn": gl.float8e4nv, "torch.float8_e5m2": gl.float8e5, "torch.bfloat16": gl.bfloat16,
              "torch.float16": gl.float16, "torch.float32": gl.float32}  # by name: kernels do not import torch


# ---------------------------------------------------------------------------
# Device helpers shared by both kernels
# ---------------------------------------------------------------------------
@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """Grouped rasterization: GROUP_M row-tiles share each B column strip in L2."""
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % size_m
    pid_n = (tile % group) // size_m
    return pid_m, pid_n


@gluon.jit
def _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, kb, nb, MODE_A: gl.constexpr,
                 MODE_B: gl.constexpr):
    """The K-chunk's block scale per row: sa[rows, kb] * sb[kb, nb] for the block sides, 1 for the others
    (loaded a chunk or an MMA ahead of its use, so its latency hides behind the tensor cores)."""
    if MODE_A == 2:
        f = gl.load(sa_ptr + rows * stride_sa + kb, mask=rows < M, other=0.0)
    else:
        f = gl.full(rows.shape, 1.0, gl.float32, rows.type.layout)
    if MODE_B == 2:
        f = f * gl.load(sb_ptr + kb * stride_sb + nb)
    return f


@gluon.jit
def _promote(acc, part, f, MODE_A: gl.constexpr, MODE_B: gl.constexpr):
    """acc += part * f with block scales, acc += part without (fp32 promotion of the fp8 partial)."""
    if MODE_A == 2 or MODE_B == 2:
        acc = acc + part * gl.expand_dims(f, 1)
    else:
        acc = acc + part
    return acc


@gluon.jit
def _epilogue_scale(acc, sa_ptr, sb_ptr, bias_ptr, rows, cols, M, N, stride_sa, MODE_A: gl.constexpr,
                    MODE_B: gl.constexpr, HAS_BIAS: gl.constexpr):
    """The per-tensor / row scales (the block ones were applied in the loop) and the bias."""
    if MODE_A == 0:
        acc = acc * gl.load(sa_ptr)
    if MODE_A == 1:
        acc = acc * gl.expand_dims(gl.load(sa_ptr + rows * stride_sa, mask=rows < M, other=0.0), 1)
    if MODE_B == 0:
        acc = acc * gl.load(sb_ptr)
    if MODE_B == 1:
        acc = acc * gl.expand_dims(gl.load(sb_ptr + cols, mask=cols < N, other=0.0), 0)
    if HAS_BIAS:
        acc = acc + gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
    return acc


@gluon.jit
def _store(acc, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, rows, off_m, off_n, M, N, stride_sa,
           MODE_A: gl.constexpr, MODE_B: gl.constexpr, HAS_BIAS: gl.constexpr):
    """Epilogue of one [rows, 128] accumulator: scales, bias, cast, TMA store through c_smem."""
    cols = off_n + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    acc = _epilogue_scale(acc, sa_ptr, sb_ptr, bias_ptr, rows, cols, M, N, stride_sa, MODE_A, MODE_B, HAS_BIAS)
    tma.store_wait(0)  # the previous store has left c_smem
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)


# ---------------------------------------------------------------------------
# Warp-specialized persistent kernel
# ---------------------------------------------------------------------------
@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        for kk in range(k_tiles):
            s = it % STAGES
            # A fresh barrier counts as having completed the phase before 0: the first lap passes.
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kk * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BN, kk * BK], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _issue(a_bufs, b_bufs, ready, zero, it, WG: gl.constexpr, STAGES: gl.constexpr):
    """Wait for chunk ``it``'s slot to fill, then start its MMA into a fresh partial."""
    SM: gl.constexpr = zero.shape[0]
    s = it % STAGES
    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(s).slice(WG * SM, SM), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                         is_async=True)


@gluon.jit
def _mainloop_pipelined(a_bufs, b_bufs, ready, empty, zero, sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, pid_n,
                        k_tiles, it, WG: gl.constexpr, MODE_A: gl.constexpr, MODE_B: gl.constexpr,
                        STAGES: gl.constexpr):
    """Precise accumulation with the next chunk's MMA in flight while this chunk's partial is promoted
    (two 64x128 partials + the accumulator: 192 registers), so the tensor cores need not wait on the FMAs.
    Unrolled by two with the partials in alternate registers (pa, pb): a partial carried in flight across
    the loop's back edge in the same registers needs no copy, which would make ptxas serialize the wgmmas.
    The block scales are loaded an MMA ahead."""
    pa = _issue(a_bufs, b_bufs, ready, zero, it, WG, STAGES)
    fa = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, 0, pid_n, MODE_A, MODE_B)
    acc = zero
    for p in range(0, (k_tiles - 1) // 2):
        ca = warpgroup_mma_wait(0, deps=[pa])
        mbarrier.arrive(empty.index(it % STAGES))
        pb = _issue(a_bufs, b_bufs, ready, zero, it + 1, WG, STAGES)
        fb = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, 2 * p + 1, pid_n, MODE_A, MODE_B)
        acc = _promote(acc, ca, fa, MODE_A, MODE_B)
        cb = warpgroup_mma_wait(0, deps=[pb])
        mbarrier.arrive(empty.index((it + 1) % STAGES))
        pa = _issue(a_bufs, b_bufs, ready, zero, it + 2, WG, STAGES)
        fa = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, 2 * p + 2, pid_n, MODE_A, MODE_B)
        acc = _promote(acc, cb, fb, MODE_A, MODE_B)
        it += 2
    ca = warpgroup_mma_wait(0, deps=[pa])
    mbarrier.arrive(empty.index(it % STAGES))
    it += 1
    if k_tiles % 2 == 0:  # one chunk left
        pb = _issue(a_bufs, b_bufs, ready, zero, it, WG, STAGES)
        fb = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, k_tiles - 1, pid_n, MODE_A, MODE_B)
        acc = _promote(acc, ca, fa, MODE_A, MODE_B)
        cb = warpgroup_mma_wait(0, deps=[pb])
        mbarrier.arrive(empty.index(it % STAGES))
        it += 1
        acc = _promote(acc, cb, fb, MODE_A, MODE_B)
    else:
        acc = _promote(acc, ca, fa, MODE_A, MODE_B)
    return acc, it


@gluon.jit
def _consumer(c_desc, a_bufs, b_bufs, ready, empty, c_smem, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_sa,
              stride_sb, WG: gl.constexpr, MODE_A: gl.constexpr, MODE_B: gl.constexpr, HAS_BIAS: gl.constexpr,
              FAST_ACC: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, PIPE: gl.constexpr):
    """Rows WG*64 .. WG*64+63 of each tile; a 256-wide tile runs as two 128-wide halves (acc0, acc1) so
    that promotion needs one 64x128 partial at a time (registers: 2 x 64 + 64 of the 232)."""
    BM: gl.constexpr = a_bufs.shape[1]
    BK: gl.constexpr = a_bufs.shape[2]
    BN: gl.constexpr = b_bufs.shape[1]
    SM: gl.constexpr = c_desc.block_type.shape[0]
    HN: gl.constexpr = c_desc.block_type.shape[1]
    NSUB: gl.constexpr = BN // HN
    # Pipelined promotion: 128-wide tiles without block scales (with them it spills and ptxas serializes).
    PIPELINED: gl.constexpr = PIPE and NSUB == 1 and not FAST_ACC and MODE_A != 2 and MODE_B != 2
    gl.static_assert(NSUB == 1 or NSUB == 2, "BLOCK_N must be 128 or 256")
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HN, 32])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    zero = gl.zeros([SM, HN], gl.float32, mma_layout)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM + WG * SM
        off_n = pid_n * BN
        rows = off_m + gl.arange(0, SM, layout=gl.SliceLayout(1, mma_layout))
        acc0 = zero
        acc1 = zero
        if PIPELINED:
            acc0, it = _mainloop_pipelined(a_bufs, b_bufs, ready, empty, zero, sa_ptr, sb_ptr, rows, M, stride_sa,
                                           stride_sb, pid_n, k_tiles, it, WG, MODE_A, MODE_B, STAGES)
        else:
            for kk in range(k_tiles):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                a = a_bufs.index(s).slice(WG * SM, SM)
                b0 = b_bufs.index(s).slice(0, HN).permute((1, 0))
                if FAST_ACC:
                    acc0 = warpgroup_mma(a, b0, acc0, is_async=True)
                    if NSUB == 2:
                        acc1 = warpgroup_mma(a, b_bufs.index(s).slice(HN, HN).permute((1, 0)), acc1, is_async=True)
                        acc0, acc1 = warpgroup_mma_wait(2, deps=[acc0, acc1])
                    else:
                        acc0 = warpgroup_mma_wait(1, deps=[acc0])
                    prev = (it + STAGES - 1) % STAGES
                    mbarrier.arrive(empty.index(prev), pred=kk > 0)  # this chunk's MMAs are all that may run
                else:
                    part = warpgroup_mma(a, b0, zero, use_acc=False, is_async=True)
                    f0 = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, kk, pid_n * NSUB, MODE_A,
                                      MODE_B)
                    if NSUB == 2:
                        f1 = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, kk, pid_n * 2 + 1, MODE_A,
                                          MODE_B)
                        part = warpgroup_mma_wait(0, deps=[part])
                        acc0 = _promote(acc0, part, f0, MODE_A, MODE_B)
                        part = warpgroup_mma(a, b_bufs.index(s).slice(HN, HN).permute((1, 0)), zero, use_acc=False,
                                             is_async=True)
                        part = warpgroup_mma_wait(0, deps=[part])
                        mbarrier.arrive(empty.index(s))
                        acc1 = _promote(acc1, part, f1, MODE_A, MODE_B)
                    else:
                        part = warpgroup_mma_wait(0, deps=[part])
                        mbarrier.arrive(empty.index(s))
                        acc0 = _promote(acc0, part, f0, MODE_A, MODE_B)
                it += 1
            if FAST_ACC:
                if NSUB == 2:
                    acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
                else:
                    acc0 = warpgroup_mma_wait(0, deps=[acc0])
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        _store(acc0, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, rows, off_m, off_n, M, N, stride_sa, MODE_A, MODE_B,
               HAS_BIAS)
        if NSUB == 2:
            _store(acc1, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, rows, off_m, off_n + HN, M, N, stride_sa, MODE_A,
                   MODE_B, HAS_BIAS)
    tma.store_wait(0)


@gluon.jit
def fp8_gemm_ws_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_sa, stride_sb,
                       MODE_A: gl.constexpr, MODE_B: gl.constexpr, HAS_BIAS: gl.constexpr, FAST_ACC: gl.constexpr,
                       GROUP_M: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       PRODUCER_REGS: gl.constexpr, PIPE: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    c0 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c1 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    gl.warp_specialize([
        (_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c0, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_sa, stride_sb,
                     gl.constexpr(0), MODE_A, MODE_B, HAS_BIAS, FAST_ACC, GROUP_M, STAGES, PIPE)),
        (_consumer, (c_desc, a_bufs, b_bufs, ready, empty, c1, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_sa, stride_sb,
                     gl.constexpr(1), MODE_A, MODE_B, HAS_BIAS, FAST_ACC, GROUP_M, STAGES, PIPE)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# Simple kernel (one warpgroup, one tile per CTA)
# ---------------------------------------------------------------------------
@gluon.jit
def fp8_gemm_simple_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K, stride_sa, stride_sb,
                           MODE_A: gl.constexpr, MODE_B: gl.constexpr, HAS_BIAS: gl.constexpr,
                           FAST_ACC: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 32])
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    pid_m, pid_n = _tile_coords(gl.program_id(0), gl.cdiv(M, BM), gl.cdiv(N, BN), GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_layout))
    k_tiles = gl.cdiv(K, BK)
    zero = gl.zeros([BM, BN], gl.float32, mma_layout)
    acc = zero
    for kk in range(k_tiles + STAGES - 1):
        if kk < k_tiles:  # load chunk kk into its slot (the slot's last reader finished: MMAs are synchronous)
            s = kk % STAGES
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [off_n, kk * BK], ready.index(s), b_bufs.index(s))
        j = kk - (STAGES - 1)
        if j >= 0:
            s = j % STAGES
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            b = b_bufs.index(s).permute((1, 0))
            if FAST_ACC:
                acc = warpgroup_mma(a_bufs.index(s), b, acc)
            else:
                f = _chunk_scale(sa_ptr, sb_ptr, rows, M, stride_sa, stride_sb, j, pid_n, MODE_A, MODE_B)
                part = warpgroup_mma(a_bufs.index(s), b, zero, use_acc=False)
                acc = _promote(acc, part, f, MODE_A, MODE_B)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    _store(acc, c_desc, c_smem, sa_ptr, sb_ptr, bias_ptr, rows, off_m, off_n, M, N, stride_sa, MODE_A, MODE_B,
           HAS_BIAS)
    tma.store_wait(0)


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------
KERNELS = {"ws": fp8_gemm_ws_kernel, "simple": fp8_gemm_simple_kernel}


SMEM_BYTES = 232448 - 2048  # sm_90's per-block limit, less the barriers and slack


def max_stages(bn: int, out_bytes: int, bm: int = 128) -> int:
    """The deepest ring that fits next to the output tiles (one [64, 128] per consumer warpgroup)."""
    stage = (bm + bn) * BLOCK_K
    c = bm * HALF_N * out_bytes
    return min(6, (SMEM_BYTES - c) // stage)


def default_config(M: int, N: int, K: int, kernel: str = "ws", fast_acc: bool = False, out_bytes: int = 2,
                   block: bool = False, sms: int = H200_SMS) -> dict:
    """Measured on the H200 (benchmarks/gluon_fp8_gemm.py): 128 x 256 tiles (a 256-wide tile is two
    128-wide accumulators per warpgroup) once there are four waves of them, else 128 x 128 with the
    pipelined promotion; block scales run 128 x 128 (1.5x the 128 x 256 form there)."""
    if kernel == "simple":
        return {"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 4, "GROUP_M": 8}
    wide = not block and triton.cdiv(M, 128) * triton.cdiv(N, 256) >= 4 * sms
    bn = 256 if wide else 128
    return {"BLOCK_M": 128, "BLOCK_N": bn, "STAGES": min(5, max_stages(bn, out_bytes)), "GROUP_M": 16 if wide else 8,
            "CONSUMER_REGS": 232, "PRODUCER_REGS": 40, "PIPE": 1}


def _desc(t, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[str(t.dtype)])
    return TensorDescriptor.from_tensor(t, block, layout)


def plan(A, Bt, C, SA, SB, mode_a, mode_b, bias, fast_acc, config, sms=H200_SMS, kernel="ws"):
    """(kernel, grid, positional args, constexpr kwargs) of one launch; shared by ``launch`` and the
    sm_90 compile check (which passes CPU tensors)."""
    M, K = A.shape
    N = Bt.shape[0]
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    sub_m = SUB_M if kernel == "ws" else bm
    a_desc = _desc(A, [bm, BLOCK_K])
    b_desc = _desc(Bt, [bn, BLOCK_K])
    c_desc = _desc(C, [sub_m, HALF_N if kernel == "ws" else bn])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    grid = (max(1, min(sms, tiles)),) if kernel == "ws" else (tiles,)
    SA, SB = SA.contiguous(), SB.contiguous()  # row strides = their widths
    stride_sa, stride_sb = SA.shape[-1], SB.shape[-1]
    args = (a_desc, b_desc, c_desc, SA, SB, bias if bias is not None else SA, M, N, K, stride_sa, stride_sb)
    kw = {"MODE_A": mode_a, "MODE_B": mode_b, "HAS_BIAS": bias is not None, "FAST_ACC": bool(fast_acc),
          "GROUP_M": config["GROUP_M"], "STAGES": config["STAGES"]}
    if kernel == "ws":
        kw.update(CONSUMER_REGS=config["CONSUMER_REGS"], PRODUCER_REGS=config["PRODUCER_REGS"],
                  PIPE=config.get("PIPE", 1))
    return KERNELS[kernel], grid, args, kw


def launch(A, Bt, C, SA, SB, mode_a: int, mode_b: int, bias=None, fast_acc: bool = False, config=None,
           sms: int = H200_SMS, kernel: str = "ws") -> None:
    """C = scaled A @ Bt.T (fp8 operands, TMA-aligned: see ``opforge.ops.scaled_matmul_gluon.check``). SA / SB are the 2-D scale views
    (``opforge.ops.scaled_matmul.scales_2d``): [1, 1], [M, 1] / [1, N], [M, KB] / [KB, NB]."""
    M, K = A.shape
    N = Bt.shape[0]
    if M == 0 or N == 0:
        return
    config = config or default_config(M, N, K, kernel, fast_acc, C.element_size(), BLOCK in (mode_a, mode_b), sms)
    fn, grid, args, kw = plan(A, Bt, C, SA, SB, mode_a, mode_b, bias, fast_acc, config, sms, kernel)
    fn[grid](*args, **kw, num_warps=4)


def compile_sm90(kernel: str = "ws", modes=(TENSOR, TENSOR), out_dtype=None, fast_acc: bool = False,
                 bias: bool = False, config: dict | None = None, size: int = 512):
    """Compile (not run) one launch for sm_90 on any machine, with CPU stand-in tensors: Triton's bundled
    ptxas is the GPU machine's. ``out_dtype``: a torch dtype, bf16 by default. Returns the CompiledKernel
    (``asm["cubin"]``, ``asm["ptx"]``, ``metadata``)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    M = N = K = size
    A = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    Bt = torch.empty(N, K, dtype=torch.float8_e4m3fn)
    C = torch.empty(M, N, dtype=out_dtype or torch.bfloat16)
    kb = -(-K // SCALE_BLOCK)
    SA = torch.empty((1, 1) if modes[0] == TENSOR else (M, 1) if modes[0] == ROW else (M, kb))
    SB = torch.empty((1, 1) if modes[1] == TENSOR else (1, N) if modes[1] == ROW else (kb, -(-N // SCALE_BLOCK)))
    config = config or default_config(M, N, K, kernel, fast_acc, C.element_size(), BLOCK in modes)
    fn, _, args, kw = plan(A, Bt, C, SA, SB, *modes, torch.empty(N) if bias else None, fast_acc, config,
                           kernel=kernel)
    names = [p.name for p in fn.params]
    signature = {n: mangle_type(a) for n, a in zip(names, args)}
    signature.update({n: "constexpr" for n in kw})
    constexprs = {(names.index(n),): v for n, v in kw.items()}
    src = GluonASTSource(fn, signature, constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
