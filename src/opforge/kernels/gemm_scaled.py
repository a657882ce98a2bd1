"""Scaled 8-bit GEMM: ``C = epilogue((A * sa) @ (B * sb))`` for FP8 and INT8.

Problem. ``A [M, K]`` and ``B [K, N]`` hold quantized values (``float8_e4m3fn`` /
``float8_e5m2``, or ``int8``); ``sa`` and ``sb`` are fp32 scales. The product
runs on the 8-bit tensor cores (QGMMA / IGMMA on Hopper) and the scales are
applied late, to the accumulator ("dequantize late"):

    acc = sum_k A[m, k] * B[k, n]       int32 for int8 (exact), fp32 for fp8
    z   = acc * sa[m] * sb[n] + bias[n]
    C   = act(z).to(C.dtype)            one rounding, at the store

Scale modes (constexpr ``SA_MODE`` / ``SB_MODE``), as ``opforge.scaled_matmul``
lays them out (``sa`` is passed as a 2-D ``[rows, cols]`` view, ``sb`` too):

* ``TENSOR`` (0): one scale; applied once in the epilogue.
* ``ROW`` (1): ``sa[m, 0]`` per token of A / ``sb[0, n]`` per channel of B
  (torch._scaled_mm's "rowwise"); applied once in the epilogue.
* ``BLOCK`` (2): DeepSeek-V3 blocks, ``sa[m, k // 128]`` (1 x 128) and
  ``sb[k // 128, n // 128]`` (128 x 128). A block scale changes along K, so it
  cannot wait for the epilogue: each ``BLOCK_K`` step (``BLOCK_K`` divides
  128) computes its own partial product and adds
  ``partial * sa[:, kb] * sb[kb, :]`` to an fp32 accumulator. This doubles
  as fp8 accumulation promotion.

The modes combine freely; a non-block scale on one side is applied in the
epilogue while the other side's block scale is applied in the loop.

FP8 accumulation. Hopper's fp8 wgmma accumulates in reduced precision (about
14 mantissa bits); Triton's default on sm_90 lets it run the whole K loop that
way (``max_num_imprecise_acc = 2**30``, cuBLAS's "fast accumulation"). With
``FAST_ACC`` off the kernels pass ``max_num_imprecise_acc=BLOCK_K``: every
``BLOCK_K`` step lands in a separate partial accumulator that is added to the
fp32 one (Triton's promotion), which is what torch._scaled_mm does by default
(``use_fast_accum=False``). The partial accumulator doubles the accumulator
registers, so precise-accumulation tiles are 128 x 128 (8 warps) rather than
128 x 256.

INT8 accumulates exactly in int32 (``tl.dot(..., out_dtype=tl.int32)``): the
sum cannot overflow while ``K * 127 * 127 < 2**31`` (K < 133,143), the same
bound as torch._int_mm.

Kernels (the tile order, the K-block loads, the split-K partial store and the
activations come from ``opforge.kernels.gemm``):

* ``scaled_gemm_tma_kernel`` (Hopper): persistent, one program per SM walking
  grouped output tiles; A and B blocks through device-side TMA descriptors.
  8-bit wgmma reads both operands K-major from shared memory, so both must be
  K-major in memory: A row-major ``[M, K]`` and B as ``W.t()`` of a row-major
  ``W [N, K]`` (a Linear weight, torch._scaled_mm's column-major B). The B
  block is loaded ``[BLOCK_N, BLOCK_K]`` and ``.T``'d (a view on the shared
  memory tile, no data movement). TMA zero-fills the edges and the K tail.
* ``scaled_gemm_tiled_kernel`` (portable): pointer loads with any strides;
  rows and columns past the edge wrap (``% M``) so only the K tail is masked.
  With ``SPLIT_K > 1`` each program accumulates one K slice and stores its
  scaled fp32 partial to a workspace; ``opforge.kernels.gemm``'s
  ``splitk_reduce_kernel`` sums the slices in a fixed order and runs the bias
  and activation (the decode path: few output tiles, long K).

Offsets are 64-bit (``INT64``) when a tensor spans 2^31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.kernels.gemm import (
    H200_SMS,
    MAX_GRID_YZ,
    SMEM_LIMIT,
    SPLITK_MAX_M,  # re-exported: the split-K limits are gemm's
    _epilogue_args,
    _fit,
    _set_allocator,
    add_splitk_configs,
    apply_activation,
    filling_shape,
    k_slices,
    load_k_block,
    needs_int64,
    splitk_reduce_kernel,
    store_partial,
    tile_origin,
    tile_ranges,
)
from opforge.kernels.gemm import splitk_splits as _gemm_splitk_splits

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
TMA_VERSION = "1"
TILED_VERSION = "1"
SPLITK_VERSION = "1"

TENSOR, ROW, BLOCK = 0, 1, 2
SCALE_BLOCK = 128  # DeepSeek-V3: A scales per 1 x 128, B scales per 128 x 128
_SCALE_BLOCK = tl.constexpr(SCALE_BLOCK)
MIN_BLOCK_K = 32  # 8-bit mma takes K in steps of 32


# ---------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------
@triton.jit
def _mma(a, b, acc, DOT_T: tl.constexpr, FAST_ACC: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a @ b on the 8-bit tensor cores (acc None: a fresh partial)."""
    if FAST_ACC:
        return tl.dot(a, b, acc, out_dtype=DOT_T)
    else:
        return tl.dot(a, b, acc, out_dtype=DOT_T, max_num_imprecise_acc=BLOCK_K)


@triton.jit
def _step(a, b, acc, k, am, bn, sa_ptr, sb_ptr, s_sam, s_sak, s_sbk, s_sbn,
          SA_MODE: tl.constexpr, SB_MODE: tl.constexpr, IN_LOOP: tl.constexpr,
          DOT_T: tl.constexpr, FAST_ACC: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K step: plain accumulation, or a block-scaled partial added in fp32."""
    if IN_LOOP:
        part = _mma(a, b, None, DOT_T, FAST_ACC, BLOCK_K).to(tl.float32)
        kb = k // _SCALE_BLOCK
        if SA_MODE == 2:
            part = part * tl.load(sa_ptr + am * s_sam + kb * s_sak)[:, None]
        if SB_MODE == 2:
            part = part * tl.load(sb_ptr + kb * s_sbk + (bn // _SCALE_BLOCK) * s_sbn)[None, :]
        acc += part
    else:
        acc = _mma(a, b, acc, DOT_T, FAST_ACC, BLOCK_K)
    return acc


@triton.jit
def _late_scales(acc, am, bn, sa_ptr, sb_ptr, s_sam, s_sbn, SA_MODE: tl.constexpr, SB_MODE: tl.constexpr):
    """The accumulator in fp32 times the per-tensor / per-row / per-column scales."""
    acc = acc.to(tl.float32)
    if SA_MODE == 0:
        acc = acc * tl.load(sa_ptr)
    elif SA_MODE == 1:
        acc = acc * tl.load(sa_ptr + am * s_sam)[:, None]
    if SB_MODE == 0:
        acc = acc * tl.load(sb_ptr)
    elif SB_MODE == 1:
        acc = acc * tl.load(sb_ptr + bn * s_sbn)[None, :]
    return acc


@triton.jit
def _store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """bias -> activation -> one rounding store (masked at the edges). gemm's
    ``epilogue_store`` computes the same, but in its order the INT64 tiled
    kernel compiles to 50-80 more registers on sm_90."""
    mask_n = rn < N
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn * s_bias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    acc = apply_activation(acc, ACT)
    mask = (rm < M)[:, None] & mask_n[None, :]
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Portable tiled kernel (also the split-K first pass)
# ---------------------------------------------------------------------------
@triton.jit
def scaled_gemm_tiled_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, ws_ptr,
    M, N, K, K_SPLIT,
    s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_sam, s_sak, s_sbk, s_sbn, s_bias,
    SA_MODE: tl.constexpr, SB_MODE: tl.constexpr, IN_LOOP: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, ACC_T: tl.constexpr, DOT_T: tl.constexpr,
    FAST_ACC: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    om, on = tile_origin(tile, grid_m, grid_n, BLOCK_M, BLOCK_N, GROUP_M)
    rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
    rk = tl.arange(0, BLOCK_K)
    # Wrapped rows/columns load valid data (and valid scales) that the store mask discards.
    am = rm % M
    bn = rn % N
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    a_ptrs = a_ptr + am[:, None] * s_am + (k_lo + rk)[None, :] * s_ak
    b_ptrs = b_ptr + (k_lo + rk)[:, None] * s_bk + bn[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_T)
    for k in range(k_lo, k_hi, BLOCK_K):
        a, b = load_k_block(a_ptrs, b_ptrs, k, rk, k_hi, EVEN_K)
        acc = _step(a, b, acc, k, am, bn, sa_ptr, sb_ptr, s_sam, s_sak, s_sbk, s_sbn,
                    SA_MODE, SB_MODE, IN_LOOP, DOT_T, FAST_ACC, BLOCK_K)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    acc = _late_scales(acc, am, bn, sa_ptr, sb_ptr, s_sam, s_sbn, SA_MODE, SB_MODE)
    if SPLIT_K == 1:
        _store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, HAS_BIAS, ACT)
    else:
        # The scaled fp32 partial of slice ``split``, [SPLIT_K, M, N] dense.
        if INT64:
            split = split.to(tl.int64)
        store_partial(ws_ptr, split, acc, rm, rn, M, N)


# ---------------------------------------------------------------------------
# Hopper: TMA descriptors, persistent tile loop
# ---------------------------------------------------------------------------
@triton.jit
def scaled_gemm_tma_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr,
    M, N, K, lda, ldb, s_cm, s_cn, s_sam, s_sak, s_sbk, s_sbn, s_bias,
    SA_MODE: tl.constexpr, SB_MODE: tl.constexpr, IN_LOOP: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, ACC_T: tl.constexpr, DOT_T: tl.constexpr,
    FAST_ACC: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # A[m, k] at m * lda + k; B[k, n] at n * ldb + k (both K-major).
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[ldb, 1], block_shape=[BLOCK_N, BLOCK_K])
    start = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    n_tiles = grid_m * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, n_tiles, tl.num_programs(0), flatten=FLATTEN):
        om, on = tile_origin(tile, grid_m, grid_n, BLOCK_M, BLOCK_N, GROUP_M)
        rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
        am = rm % M
        bn = rn % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_T)
        for kt in range(k_tiles):
            ok = kt * BLOCK_K
            a = a_desc.load([om, ok])
            b = b_desc.load([on, ok]).T
            acc = _step(a, b, acc, ok, am, bn, sa_ptr, sb_ptr, s_sam, s_sak, s_sbk, s_sbn,
                        SA_MODE, SB_MODE, IN_LOOP, DOT_T, FAST_ACC, BLOCK_K)
        acc = _late_scales(acc, am, bn, sa_ptr, sb_ptr, s_sam, s_sbn, SA_MODE, SB_MODE)
        _store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, HAS_BIAS, ACT)


# ---------------------------------------------------------------------------
# Configs (H200: 132 SMs, 228 KB shared memory per SM; operands are 1 byte)
# ---------------------------------------------------------------------------
def smem_bytes(cfg: dict) -> int:
    """Shared memory of the pipelined 8-bit operand buffers."""
    return cfg.get("num_stages", 3) * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]


def _block_k(K: int, bk: int, block_scaled: bool) -> int:
    bk = _fit(K, bk, MIN_BLOCK_K)
    return min(bk, SCALE_BLOCK) if block_scaled else bk


def _wide_ok(fp8: bool, fast_acc: bool) -> bool:
    """128 x 256 accumulators fit the registers unless fp8 promotion doubles them."""
    return not fp8 or fast_acc


def tile_default_config(M: int, N: int, K: int, *, fp8: bool, fast_acc: bool, block_scaled: bool,
                        sms: int = H200_SMS) -> dict:
    """The largest tile that still gives about one program per SM.

    128x256x128 (8 warps, 3 stages: 144 KB of buffers) is the usual best for
    8-bit wgmma on large problems (the Triton Hopper tutorials' fp8 choice);
    with fp8 promotion (``fast_acc`` off) or block scales, whose partial
    accumulator doubles the registers, 128x128x128 with 4 stages (128 KB).
    Smaller tiles while the grid would leave SMs idle.
    """
    shapes = [(128, 256, 8, 3), (128, 128, 8, 4), (64, 128, 4, 4), (64, 64, 4, 4)]
    if not _wide_ok(fp8, fast_acc) or block_scaled:
        shapes = shapes[1:]
    bm, bn, w, s = filling_shape(shapes, 1, M, N, sms)
    return {"BLOCK_M": _fit(M, bm), "BLOCK_N": _fit(N, bn), "BLOCK_K": _block_k(K, 128, block_scaled),
            "GROUP_M": 8, "num_warps": w, "num_stages": s}


def tile_configs(M: int, N: int, K: int, *, fp8: bool, fast_acc: bool, block_scaled: bool) -> list[dict]:
    """The autotune candidates: a handful of tile shapes, warps and stages."""
    out = []
    for bm, bn, bk, w, s in ((128, 256, 128, 8, 3), (128, 256, 128, 8, 4), (256, 128, 128, 8, 3),
                             (128, 128, 128, 8, 4), (128, 128, 128, 8, 5), (128, 128, 256, 8, 3),
                             (128, 128, 128, 4, 4), (64, 256, 128, 4, 4), (64, 128, 128, 4, 4),
                             (64, 64, 128, 4, 5)):
        wide = bm * bn > 128 * 128 or (bm * bn == 128 * 128 and w == 4)
        if wide and (not _wide_ok(fp8, fast_acc) or block_scaled):
            continue
        cfg = {"BLOCK_M": _fit(M, bm), "BLOCK_N": _fit(N, bn), "BLOCK_K": _block_k(K, bk, block_scaled),
               "GROUP_M": 8, "num_warps": w, "num_stages": s}
        if smem_bytes(cfg) <= SMEM_LIMIT and cfg not in out:
            out.append(cfg)
    default = tile_default_config(M, N, K, fp8=fp8, fast_acc=fast_acc, block_scaled=block_scaled)
    return out if default in out else [default] + out


def tma_default_config(M: int, N: int, K: int, **kw) -> dict:
    return dict(tile_default_config(M, N, K, **kw), FLATTEN=False)


def tma_configs(M: int, N: int, K: int, **kw) -> list[dict]:
    # A TMA box row is at most the 128-byte swizzle span: BLOCK_K <= 128 for 1-byte operands.
    out = [dict(c, FLATTEN=False) for c in tile_configs(M, N, K, **kw) if c["BLOCK_K"] <= 128]
    # Flattening the tile and K loops overlaps the next tile's loads with this
    # tile's epilogue; worth measuring on the large shapes.
    out += [dict(c, FLATTEN=True) for c in out[:3]]
    return out


# Split-K: the decode path (few output tiles, long K); the limits are gemm's
# (SPLITK_MAX_M, SPLITK_MIN_K_BLOCKS, SPLITK_MAX_SPLITS).
def splitk_splits(M: int, N: int, K: int, cfg: dict, sms: int = H200_SMS) -> int:
    """gemm's rule for one (unbatched) problem: about 2 programs per SM."""
    return _gemm_splitk_splits(1, M, N, K, cfg, sms)


def splitk_default_config(M: int, N: int, K: int, *, block_scaled: bool, sms: int = H200_SMS, **kw) -> dict:
    """BLOCK_M just covers M (16 is the smallest tensor-core tile), BLOCK_N 64
    (128 from M > 16), BLOCK_K 256 (128 with block scales): the weight stream
    dominates, 4 stages keep 64-96 KB of it in flight per program."""
    bm = _fit(M, 64)
    cfg = {"BLOCK_M": bm, "BLOCK_N": _fit(N, 64 if M <= 16 else 128), "BLOCK_K": _block_k(K, 256, block_scaled),
           "GROUP_M": 1, "num_warps": 4, "num_stages": 4 if bm <= 32 else 3}
    cfg["SPLIT_K"] = splitk_splits(M, N, K, cfg, sms)
    return cfg


def splitk_configs(M: int, N: int, K: int, *, block_scaled: bool, sms: int = H200_SMS, **kw) -> list[dict]:
    out = [splitk_default_config(M, N, K, block_scaled=block_scaled, sms=sms)]
    for bn, bk, w, s in ((64, 256, 4, 4), (128, 256, 4, 4), (64, 512, 4, 3), (128, 128, 4, 5), (256, 128, 8, 3),
                         (32, 256, 2, 6)):
        cfg = {"BLOCK_M": _fit(M, 64), "BLOCK_N": _fit(N, bn), "BLOCK_K": _block_k(K, bk, block_scaled),
               "GROUP_M": 1, "num_warps": w, "num_stages": s}
        if smem_bytes(cfg) <= SMEM_LIMIT:
            add_splitk_configs(out, cfg, 1, M, N, K, sms)
    return out


# ---------------------------------------------------------------------------
# Launch helpers. A [M, K], B [K, N], C [M, N] (dense output); SA and SB are
# 2-D fp32 scale views; bias [N] or None; modes are TENSOR / ROW / BLOCK.
# ---------------------------------------------------------------------------
def _types(A, sa_mode: int, sb_mode: int, fast_acc: bool):
    """(IN_LOOP, ACC_T, DOT_T, FAST_ACC) for the operand dtype and scale modes."""
    import torch

    in_loop = BLOCK in (sa_mode, sb_mode)
    is_int = A.dtype == torch.int8
    dot_t = tl.int32 if is_int else tl.float32
    acc_t = tl.float32 if in_loop else dot_t
    return in_loop, acc_t, dot_t, bool(fast_acc or is_int)


def _check_block_k(bk: int, sa_mode: int, sb_mode: int) -> None:
    if BLOCK in (sa_mode, sb_mode) and SCALE_BLOCK % bk:
        raise ValueError(f"opforge.scaled_matmul: BLOCK_K={bk} must divide the scale block {SCALE_BLOCK}")


def launch_tiled(A, B, C, SA, SB, sa_mode: int, sb_mode: int, bias, act: int, fast_acc: bool, config: dict) -> None:
    """One program per output tile (``SPLIT_K`` absent or 1), or the split-K
    pair of kernels (``SPLIT_K`` > 1: scaled partials, then gemm's reduce)."""
    import torch

    M, K = A.shape
    N = B.shape[1]
    if M == 0 or N == 0:
        return
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    _check_block_k(bk, sa_mode, sb_mode)
    splits, k_split = k_slices(K, bk, config)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if splits > MAX_GRID_YZ:
        raise ValueError(f"opforge.scaled_matmul: {splits} K slices exceed a grid dim's {MAX_GRID_YZ}")
    bias_t, _, s_bias, *_ = _epilogue_args(C, bias, None)
    ws = C
    if splits > 1:
        ws = torch.empty((splits, M, N), dtype=torch.float32, device=C.device)
    in_loop, acc_t, dot_t, fast = _types(A, sa_mode, sb_mode, fast_acc)
    int64 = needs_int64(A, B, C, SA, SB, ws, extra=max(bm, bn) * max(bk, 1))
    scaled_gemm_tiled_kernel[(tiles, splits)](
        A, B, C, SA, SB, bias_t, ws, M, N, K, k_split,
        *A.stride(), *B.stride(), *C.stride(), *SA.stride(), *SB.stride(), s_bias,
        SA_MODE=sa_mode, SB_MODE=sb_mode, IN_LOOP=in_loop, HAS_BIAS=bias is not None and splits == 1,
        ACT=act if splits == 1 else 0, ACC_T=acc_t, DOT_T=dot_t, FAST_ACC=fast, SPLIT_K=splits,
        EVEN_K=K % bk == 0, INT64=int64, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.get("GROUP_M", 8),
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3),
    )
    if splits > 1:
        rbm, rbn = 32, 128
        splitk_reduce_kernel[(triton.cdiv(M, rbm) * triton.cdiv(N, rbn), 1)](
            ws, C, bias_t, C, M, N, splits, M * N, 0, *C.stride(), s_bias, 0, 0, 0,
            HAS_BIAS=bias is not None, ACT=act, HAS_RES=False, COMPUTE=tl.float32,
            INT64=int64, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4,
        )


def tma_layout(A, B) -> tuple[int, int] | None:
    """(lda, ldb) when A [M, K] and B [K, N] are both K-major with 16-byte
    aligned bases and leading strides (what 8-bit TMA + wgmma needs), else None."""
    M, K = A.shape
    N = B.shape[1]
    if not (A.stride(1) == 1 or K == 1) or not (B.stride(0) == 1 or K == 1):
        return None
    lda = A.stride(0) if M > 1 else K
    ldb = B.stride(1) if N > 1 else K
    if lda < K or ldb < K or lda % 16 or ldb % 16 or A.data_ptr() % 16 or B.data_ptr() % 16:
        return None
    return lda, ldb


def launch_tma(A, B, C, SA, SB, sa_mode: int, sb_mode: int, bias, act: int, fast_acc: bool, config: dict,
               sms: int) -> None:
    """``tma_layout(A, B)`` must hold."""
    M, K = A.shape
    N = B.shape[1]
    if M == 0 or N == 0:
        return
    lda, ldb = tma_layout(A, B)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    _check_block_k(bk, sa_mode, sb_mode)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = max(1, min(sms, tiles))
    bias_t, _, s_bias, *_ = _epilogue_args(C, bias, None)
    in_loop, acc_t, dot_t, fast = _types(A, sa_mode, sb_mode, fast_acc)
    _set_allocator(A.device)
    scaled_gemm_tma_kernel[(programs,)](
        A, B, C, SA, SB, bias_t, M, N, K, lda, ldb, *C.stride(), *SA.stride(), *SB.stride(), s_bias,
        SA_MODE=sa_mode, SB_MODE=sb_mode, IN_LOOP=in_loop, HAS_BIAS=bias is not None, ACT=act,
        ACC_T=acc_t, DOT_T=dot_t, FAST_ACC=fast, INT64=needs_int64(C, SA, SB, extra=max(bm, bn)),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.get("GROUP_M", 8), FLATTEN=config.get("FLATTEN", False),
        num_warps=config.get("num_warps", 8), num_stages=config.get("num_stages", 3),
    )
