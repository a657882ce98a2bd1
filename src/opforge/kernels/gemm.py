"""GEMM with fused epilogues: ``C = epilogue(A @ B)`` on tensor cores.

Problem. Every call is reduced (by ``opforge.ops.matmul``) to a batched
``[Bt, M, K] @ [Bt, K, N] -> [Bt, M, N]`` with arbitrary strides (a batch
stride of 0 broadcasts an operand). The output is dense. Accumulation is in
fp32 (fp64 for fp64 inputs); the epilogue runs on the accumulator in
registers and rounds once, at the single store:

    z = acc + bias[n]            (HAS_BIAS)
    y = act(z)                   (ACT: relu, gelu (erf), gelu_tanh, silu)
    y = y + residual[b, m, n]    (HAS_RES)
    C = y.to(C.dtype)

The gradient epilogues (``ACT >= GRAD_BASE``) instead produce
``residual * act'(z)``: the backward recomputes the pre-activation GEMM and
multiplies by the incoming gradient (passed as ``residual``) in registers, so
neither the pre-activation nor its derivative ever goes to memory.

Three kernels share the tiling helpers (``tile_coords`` / ``tile_origin``:
grouped ordering of ``[BLOCK_M, BLOCK_N]`` output tiles, ``GROUP_M`` tile-rows
share the same columns of B while they sit in L2; ``tile_ranges``) and the
epilogue (``epilogue_store``). These, the pointer K loop (``dot_k_loop``,
``load_k_block``) and the split-K partial store (``store_partial``) serve the
scaled and grouped GEMM kernels too (Triton inlines them):

* ``gemm_tma_persistent_kernel`` (Hopper): one program per SM walks output
  tiles ``start, start + #programs, ...``; A and B blocks come through device-
  side TMA descriptors (``tl.make_tensor_descriptor``), which need a unit
  stride on one dim and 16-byte aligned bases and leading strides: an operand
  whose unit stride is on K is loaded as is, one whose unit stride is on M
  (or N) is loaded as the transposed block and ``.T``'d in registers (what
  the backward's ``A^T`` and ``Linear``'s ``W^T`` are). ``tl.dot`` lowers to
  wgmma; ``num_stages`` pipelines the K loop. 2-D problems only (Bt == 1).
* ``gemm_tiled_kernel`` (portable): one program per output tile and batch,
  pointer-based block loads with any strides; rows and columns past the edge
  are wrapped (``% M``) rather than masked so only the K tail needs a mask
  (none when ``EVEN_K``). With ``SPLIT_K > 1`` program ``(tile, b, s)``
  accumulates the K slice ``[s * K_SPLIT, (s + 1) * K_SPLIT)`` and stores its
  fp32 partial to a ``[SPLIT_K, Bt, M, N]`` workspace; ``splitk_reduce_kernel``
  then sums the slices in a fixed order (deterministic, no atomics) and runs
  the epilogue. This is the small-M (decode) path: few output tiles, long K,
  so cutting K is what fills 132 SMs.

fp32 inputs run ``tl.dot`` with ``input_precision="ieee"`` (exact fp32)
unless TF32 is asked for. The Triton 3.6 interpreter computes bf16 ``tl.dot``
wrongly, so under the interpreter the launchers set ``UPCAST`` and bf16
blocks are widened to fp32 before the dot (bf16 products are exact in fp32:
the same result as the tensor-core path with fp32 accumulation).

Offsets are 64-bit (``INT64``) when any tensor spans 2^31 elements.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from opforge.runtime.launch import launch

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
TMA_VERSION = "1"
TILED_VERSION = "1"
SPLITK_VERSION = "1"

# Activation codes (constexpr ACT). The gradient codes multiply the residual
# operand (the incoming gradient) by act'(z) instead.
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
GRAD_BASE = 8
GRAD_ACTIVATIONS = {f"{name}_grad": code + GRAD_BASE for name, code in ACTIVATIONS.items() if name}

# Grid dims 1 and 2 are limited to 65535 programs.
MAX_GRID_YZ = 65535
_INT32_MAX = 2**31 - 1
H200_SMS = 132

_SQRT1_2 = tl.constexpr(0.7071067811865476)
_SQRT2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_GELU_C = tl.constexpr(0.044715)


# ---------------------------------------------------------------------------
# Shared device helpers: tile order, activations, epilogue
# ---------------------------------------------------------------------------
@triton.jit
def tile_coords(tile, grid_m, grid_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M tile-rows walk the columns together (L2 reuse of B)."""
    width = GROUP_M * grid_n
    group = tile // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % size_m
    pid_n = (tile % width) // size_m
    return pid_m, pid_n


@triton.jit
def _tanh(x):
    # The interpreter has no libdevice tanh; 2 sigmoid(2x) - 1 is exact in the limits.
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def apply_activation(x, ACT: tl.constexpr):
    if ACT == 1:  # relu; NaN stays NaN as in torch
        x = tl.where(x < 0, 0.0, x)
    elif ACT == 2:  # gelu, exact (erf)
        x = 0.5 * x * (1.0 + tl.math.erf(x * _SQRT1_2))
    elif ACT == 3:  # gelu, tanh approximation
        x = 0.5 * x * (1.0 + _tanh(_SQRT2_PI * (x + _GELU_C * x * x * x)))
    elif ACT == 4:  # silu = x * sigmoid(x)
        x = x / (1.0 + tl.exp(-x))
    return x


@triton.jit
def activation_grad(z, ACT: tl.constexpr):
    """d act / dz at the pre-activation z (ACT is a forward code 1..4)."""
    if ACT == 1:
        d = tl.where(z > 0, 1.0, 0.0)
    elif ACT == 2:
        d = 0.5 * (1.0 + tl.math.erf(z * _SQRT1_2)) + z * _INV_SQRT_2PI * tl.exp(-0.5 * z * z)
    elif ACT == 3:
        t = _tanh(_SQRT2_PI * (z + _GELU_C * z * z * z))
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT2_PI * (1.0 + 3.0 * _GELU_C * z * z)
    else:
        s = 1.0 / (1.0 + tl.exp(-z))
        d = s * (1.0 + z * (1.0 - s))
    return d


@triton.jit
def tile_origin(tile, grid_m, grid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The first row and column of output tile ``tile`` in the grouped order."""
    pid_m, pid_n = tile_coords(tile, grid_m, grid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def tile_ranges(om, on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """The rows and columns of the tile at origin (om, on), 64-bit when offsets need it."""
    rm = om + tl.arange(0, BLOCK_M)
    rn = on + tl.arange(0, BLOCK_N)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    return rm, rn


@triton.jit
def load_k_block(a_ptrs, b_ptrs, k, rk, k_hi, EVEN_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N] blocks at K offset k (the K tail masked)."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=(k + rk)[None, :] < k_hi, other=0.0)
        b = tl.load(b_ptrs, mask=(k + rk)[:, None] < k_hi, other=0.0)
    return a, b


@triton.jit
def dot_k_loop(acc, a_ptr, b_ptr, am, bn, k_lo, k_hi, s_am, s_ak, s_bk, s_bn,
               EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, COMPUTE: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """acc + A[am, k_lo:k_hi] @ B[k_lo:k_hi, bn] through pointer loads (the portable kernels' K loop)."""
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + am[:, None] * s_am + (k_lo + rk)[None, :] * s_ak
    b_ptrs = b_ptr + (k_lo + rk)[:, None] * s_bk + bn[None, :] * s_bn
    for k in range(k_lo, k_hi, BLOCK_K):
        a, b = load_k_block(a_ptrs, b_ptrs, k, rk, k_hi, EVEN_K)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=COMPUTE)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    return acc


@triton.jit
def store_partial(ws_ptr, plane, acc, rm, rn, M, N):
    """Split-K: this slice's fp32 (fp64) partial into plane ``plane`` of a dense [.., M, N] workspace."""
    ws = ws_ptr + (plane * M) * N
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(ws + rm[:, None] * N + rn[None, :], acc, mask=mask)


@triton.jit
def epilogue_store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, res_ptr, s_rm, s_rn,
                   HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    """bias -> activation -> residual -> one rounding store. ``c_ptr`` and
    ``res_ptr`` already point at this batch; ``rm``/``rn`` are the tile's rows
    and columns (masked here)."""
    mask_n = rn < N
    mask = (rm < M)[:, None] & mask_n[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn * s_bias, mask=mask_n, other=0.0)
        acc = acc + bias.to(acc.dtype)[None, :]
    if HAS_RES:
        r = tl.load(res_ptr + rm[:, None] * s_rm + rn[None, :] * s_rn, mask=mask, other=0.0).to(acc.dtype)
    if ACT >= 8:  # gradient epilogue: residual * act'(z)
        acc = r * activation_grad(acc, ACT - 8)
    else:
        acc = apply_activation(acc, ACT)
        if HAS_RES:
            acc = acc + r
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Portable tiled kernel (also the split-K first pass)
# ---------------------------------------------------------------------------
@triton.jit
def gemm_tiled_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, ws_ptr,
    M, N, K, K_SPLIT,
    s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_bias, s_rb, s_rm, s_rn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    COMPUTE: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    tile = tl.program_id(0)
    batch = tl.program_id(1)
    split = tl.program_id(2)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    om, on = tile_origin(tile, grid_m, grid_n, BLOCK_M, BLOCK_N, GROUP_M)
    rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
    if INT64:
        batch = batch.to(tl.int64)
    # Wrapped rows/columns load valid data that the store mask discards.
    am = rm % M
    bn = rn % N
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
    acc = dot_k_loop(acc, a_ptr + batch * s_ab, b_ptr + batch * s_bb, am, bn, k_lo, k_hi, s_am, s_ak, s_bk, s_bn,
                     EVEN_K, UPCAST, PRECISION, COMPUTE, BLOCK_K)
    if SPLIT_K == 1:
        epilogue_store(acc, rm, rn, M, N, c_ptr + batch * s_cb, s_cm, s_cn, bias_ptr, s_bias,
                       res_ptr + batch * s_rb, s_rm, s_rn, HAS_BIAS, ACT, HAS_RES)
    else:
        # Partial [split, batch, m, n] of a dense fp32 (fp64) workspace.
        nb = tl.num_programs(1)
        if INT64:
            split = split.to(tl.int64)
        store_partial(ws_ptr, split * nb + batch, acc, rm, rn, M, N)


@triton.jit
def splitk_reduce_kernel(
    ws_ptr, c_ptr, bias_ptr, res_ptr, M, N, SPLITS, plane,
    s_cb, s_cm, s_cn, s_bias, s_rb, s_rm, s_rn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
    COMPUTE: tl.constexpr, INT64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Sum the K slices in order 0..SPLITS-1 (deterministic), then the epilogue."""
    tile = tl.program_id(0)
    batch = tl.program_id(1)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm, rn = tile_ranges((tile // grid_n) * BLOCK_M, (tile % grid_n) * BLOCK_N, BLOCK_M, BLOCK_N, INT64)
    if INT64:
        batch = batch.to(tl.int64)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = (batch * M + rm[:, None]) * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
    for s in range(0, SPLITS):
        acc += tl.load(ws_ptr + s * plane + offs, mask=mask, other=0.0)
    epilogue_store(acc, rm, rn, M, N, c_ptr + batch * s_cb, s_cm, s_cn, bias_ptr, s_bias,
                   res_ptr + batch * s_rb, s_rm, s_rn, HAS_BIAS, ACT, HAS_RES)


# ---------------------------------------------------------------------------
# Hopper: TMA descriptors, persistent tile loop
# ---------------------------------------------------------------------------
@triton.jit
def gemm_tma_persistent_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr,
    M, N, K, lda, ldb, s_cm, s_cn, s_bias, s_rm, s_rn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
    A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # A[m, k] lies at m * lda + k (K-major) or k * lda + m; B[k, n] at
    # n * ldb + k (K-major, e.g. a Linear weight seen as W^T) or k * ldb + n.
    if A_KMAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[lda, 1], block_shape=[BLOCK_K, BLOCK_M])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[ldb, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[ldb, 1], block_shape=[BLOCK_K, BLOCK_N])
    start = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    n_tiles = grid_m * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, n_tiles, tl.num_programs(0), flatten=FLATTEN):
        om, on = tile_origin(tile, grid_m, grid_n, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            ok = kt * BLOCK_K
            # TMA fills blocks past the edges (M, N and the K tail) with zeros.
            if A_KMAJOR:
                a = a_desc.load([om, ok])
            else:
                a = a_desc.load([ok, om]).T
            if B_KMAJOR:
                b = b_desc.load([on, ok]).T
            else:
                b = b_desc.load([ok, on])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
        epilogue_store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, res_ptr, s_rm, s_rn,
                       HAS_BIAS, ACT, HAS_RES)


# ---------------------------------------------------------------------------
# Configs (H200: 132 SMs, 228 KB shared memory per SM)
# ---------------------------------------------------------------------------
def _itemsize_block_k(itemsize: int) -> int:
    return {2: 64, 4: 32, 8: 16}[itemsize]


def smem_bytes(cfg: dict, itemsize: int) -> int:
    """Shared memory of the pipelined operand buffers."""
    return cfg.get("num_stages", 3) * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * itemsize


SMEM_LIMIT = 220 * 1024  # 228 KB per SM, less room for the epilogue's layout conversion


def _fit(dim: int, block: int, lo: int = 16) -> int:
    """A block no larger than the next power of two of ``dim`` (small problems)."""
    return max(lo, min(block, triton.next_power_of_2(max(dim, 1))))


def filling_shape(shapes, Bt: int, M: int, N: int, sms: int) -> tuple:
    """The first (BLOCK_M, BLOCK_N, warps, stages) whose grid gives about one
    program per SM (the last, smallest, when none does)."""
    for shape in shapes:
        if Bt * triton.cdiv(M, shape[0]) * triton.cdiv(N, shape[1]) >= 0.9 * sms:
            return shape
    return shapes[-1]


def add_tile_configs(out: list, shapes, M: int, N: int, K: int, itemsize: int) -> list:
    """Append each (BLOCK_M, BLOCK_N, BLOCK_K multiple, warps, stages) candidate
    that fits shared memory and is not already in ``out``."""
    bk = _itemsize_block_k(itemsize)
    for bm, bn, k_mul, w, s in shapes:
        cfg = {"BLOCK_M": _fit(M, bm), "BLOCK_N": _fit(N, bn), "BLOCK_K": _fit(K, bk * k_mul),
               "GROUP_M": 8, "num_warps": w, "num_stages": s}
        if smem_bytes(cfg, itemsize) <= SMEM_LIMIT and cfg not in out:
            out.append(cfg)
    return out


def tile_default_config(Bt: int, M: int, N: int, K: int, itemsize: int, sms: int = H200_SMS) -> dict:
    """The largest tile that still gives about one program per SM.

    128x256x64 (8 warps, 3 stages: 144 KB of buffers) for large 16-bit
    problems, as the Triton Hopper tutorials and cuBLAS's own choice for
    8192^3; smaller tiles while the grid would leave SMs idle (1024^3 runs
    64x128: 128 tiles). fp32 halves BLOCK_K (same bytes a stage); fp64 (FMA,
    no tensor cores) runs 64x64x16.
    """
    if itemsize == 8:
        return {"BLOCK_M": _fit(M, 64), "BLOCK_N": _fit(N, 64), "BLOCK_K": 16, "GROUP_M": 8,
                "num_warps": 4, "num_stages": 2}
    bk = _itemsize_block_k(itemsize)
    shapes = [(128, 256, 8, 3), (128, 128, 8, 4), (64, 128, 4, 4), (64, 64, 4, 4)]
    if itemsize == 4:
        shapes = [(128, 128, 8, 3), (64, 128, 4, 3), (64, 64, 4, 3)]
    bm, bn, w, s = filling_shape(shapes, Bt, M, N, sms)
    return {"BLOCK_M": _fit(M, bm), "BLOCK_N": _fit(N, bn), "BLOCK_K": _fit(K, bk), "GROUP_M": 8,
            "num_warps": w, "num_stages": s}


def tile_configs(Bt: int, M: int, N: int, K: int, itemsize: int) -> list[dict]:
    """The autotune candidates: a handful of tile shapes, warps and stages."""
    if itemsize == 8:
        return [tile_default_config(Bt, M, N, K, itemsize),
                {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}]
    out = add_tile_configs([], ((128, 256, 1, 8, 3), (128, 256, 1, 8, 4), (256, 128, 1, 8, 3),
                                (128, 128, 1, 8, 4), (128, 128, 2, 8, 3), (128, 128, 1, 4, 4),
                                (64, 256, 1, 4, 4), (64, 128, 1, 4, 4), (64, 128, 2, 4, 3), (64, 64, 1, 4, 5)),
                           M, N, K, itemsize)
    default = tile_default_config(Bt, M, N, K, itemsize)
    return out if default in out else [default] + out


def tma_default_config(M: int, N: int, K: int, itemsize: int, sms: int = H200_SMS) -> dict:
    cfg = tile_default_config(1, M, N, K, itemsize, sms)
    cfg["FLATTEN"] = False
    return cfg


def tma_configs(M: int, N: int, K: int, itemsize: int) -> list[dict]:
    out = [dict(c, FLATTEN=False) for c in tile_configs(1, M, N, K, itemsize)]
    # Flattening the tile and K loops lets the next tile's loads overlap this
    # tile's epilogue; worth measuring on the large shapes.
    out += [dict(c, FLATTEN=True) for c in out[:3]]
    return out


# Split-K: the decode path (few output tiles, long K).
SPLITK_MAX_M = 64
SPLITK_MIN_K_BLOCKS = 4  # each slice at least this many BLOCK_K steps
SPLITK_MAX_SPLITS = 32


def splitk_default_config(Bt: int, M: int, N: int, K: int, itemsize: int, sms: int = H200_SMS) -> dict:
    """BLOCK_M just covers M (16 is the smallest tensor-core tile), BLOCK_N 64
    (128 from M > 16) and long K steps (128 for 16-bit); K is cut so that about
    two programs run per SM. The weight stream dominates: 4 stages keep
    64-96 KB of it in flight per program."""
    bm = _fit(M, 64)
    bn = _fit(N, 64 if M <= 16 else 128)
    bk = _fit(K, 2 * _itemsize_block_k(itemsize) if itemsize <= 4 else 16)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": 4,
           "num_stages": 4 if bm <= 32 else 3}
    cfg["SPLIT_K"] = splitk_splits(Bt, M, N, K, cfg, sms)
    return cfg


def splitk_splits(Bt: int, M: int, N: int, K: int, cfg: dict, sms: int = H200_SMS) -> int:
    """K slices so that tiles * slices is about 2 programs per SM, each slice at
    least ``SPLITK_MIN_K_BLOCKS`` K blocks long."""
    tiles = Bt * triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    k_blocks = triton.cdiv(max(K, 1), cfg["BLOCK_K"])
    want = triton.cdiv(2 * sms, max(tiles, 1))
    return max(1, min(want, k_blocks // SPLITK_MIN_K_BLOCKS, SPLITK_MAX_SPLITS))


def add_splitk_configs(out: list, cfg: dict, Bt: int, M: int, N: int, K: int, sms: int) -> None:
    """Append ``cfg`` with the rule's K slices, half and twice as many (those not in ``out``)."""
    base = splitk_splits(Bt, M, N, K, cfg, sms)
    for splits in sorted({base, max(1, base // 2), base * 2}):
        c = dict(cfg, SPLIT_K=min(splits, SPLITK_MAX_SPLITS))
        if c not in out:
            out.append(c)


def splitk_configs(Bt: int, M: int, N: int, K: int, itemsize: int, sms: int = H200_SMS) -> list[dict]:
    bk = 2 * _itemsize_block_k(itemsize) if itemsize <= 4 else 16
    out = [splitk_default_config(Bt, M, N, K, itemsize, sms)]
    for bn, k_mul, w, s in ((64, 1, 4, 4), (128, 1, 4, 4), (64, 2, 4, 3), (128, 1, 8, 3), (256, 1, 8, 3), (32, 1, 2, 6)):
        cfg = {"BLOCK_M": _fit(M, 64), "BLOCK_N": _fit(N, bn), "BLOCK_K": _fit(K, bk * k_mul),
               "GROUP_M": 1, "num_warps": w, "num_stages": s}
        if smem_bytes(cfg, itemsize) <= SMEM_LIMIT:
            add_splitk_configs(out, cfg, Bt, M, N, K, sms)
    return out


def k_slices(K: int, bk: int, config: dict) -> tuple[int, int]:
    """(slices, K_SPLIT): at most ``SPLIT_K`` slices of whole BLOCK_K steps, none empty."""
    splits = max(1, min(int(config.get("SPLIT_K", 1)), triton.cdiv(max(K, 1), bk)))
    k_split = triton.cdiv(triton.cdiv(max(K, 1), bk), splits) * bk
    return triton.cdiv(max(K, 1), k_split), k_split


# ---------------------------------------------------------------------------
# Launch helpers. A is [Bt, M, K], B [Bt, K, N], C [Bt, M, N] (any strides,
# batch stride 0 broadcasts); bias is [N] or None; R (residual or incoming
# gradient) is [Bt, M, N] or None. ``act`` is an ACT code.
# ---------------------------------------------------------------------------
def _span(t) -> int:
    if t is None or t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def needs_int64(*tensors, extra: int = 0) -> bool:
    return max(_span(t) for t in tensors) + extra > _INT32_MAX


def precision(dtype, tf32: bool) -> str:
    import torch

    return "tf32" if (tf32 and dtype == torch.float32) else "ieee"


def _compute(dtype):
    import torch

    return tl.float64 if dtype == torch.float64 else tl.float32


def _upcast(dtype) -> bool:
    import torch

    from opforge.runtime.device import interpret_mode

    return interpret_mode() and dtype == torch.bfloat16


def _epilogue_args(C, bias, R):
    # Unused pointers point at C (never dereferenced: the constexpr flags are off).
    return (bias if bias is not None else C, R if R is not None else C, *_epilogue_strides(bias, R))


class GemmPlan(NamedTuple):
    """One GEMM launch (or the split-K pair) as far as the shapes, strides and
    dtypes of its operands decide it, so a runner bound to one dispatch
    decision computes it once. Each launch takes its tensors first (``main``:
    A, B, C, bias, residual, then the workspace for the tiled kernel; the
    reduce: workspace, C, bias, residual), then ``*_scalars``, with ``*_kw``.
    ``workspace``: the split-K partials' shape (None: no second pass)."""

    kernel: Any
    main_grid: tuple
    main_scalars: tuple
    main_kw: dict
    workspace: tuple | None = None
    ws_dtype: Any = None
    reduce_grid: tuple = ()
    reduce_scalars: tuple = ()
    reduce_kw: dict | None = None


def _epilogue_strides(bias, R) -> tuple:
    return (bias.stride(0) if bias is not None else 0, *(R.stride() if R is not None else (0, 0, 0)))


def _ws_dtype(compute):
    import torch

    return torch.float64 if compute == tl.float64 else torch.float32


def tiled_plan(A, B, C, bias, R, act: int, tf32: bool, config: dict) -> GemmPlan:
    """``launch_tiled``'s launches; A, B, C, R non-empty [Bt, M, N]-shaped (see ``launch_tiled``)."""
    Bt, M, K = A.shape
    N = B.shape[2]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    splits, k_split = k_slices(K, bk, config)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if Bt > MAX_GRID_YZ:
        raise ValueError(f"opforge.matmul: a batch of {Bt} exceeds the {MAX_GRID_YZ} the tiled kernel launches")
    s_bias, s_rb, s_rm, s_rn = _epilogue_strides(bias, R)
    compute = _compute(A.dtype)
    workspace = (splits, Bt, M, N) if splits > 1 else None
    ws_span = splits * Bt * M * N if splits > 1 else 0
    int64 = max(_span(A), _span(B), _span(C), _span(R), ws_span) + max(bm, bn) * max(bk, 1) > _INT32_MAX
    flags = dict(HAS_BIAS=bias is not None, ACT=act, HAS_RES=R is not None)
    main_kw = dict(flags, SPLIT_K=splits, EVEN_K=K % bk == 0, PRECISION=precision(A.dtype, tf32),
                   UPCAST=_upcast(A.dtype), COMPUTE=compute, INT64=int64, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                   GROUP_M=config.get("GROUP_M", 8), num_warps=config.get("num_warps", 4),
                   num_stages=config.get("num_stages", 3))
    main_scalars = (M, N, K, k_split, *A.stride(), *B.stride(), *C.stride(), s_bias, s_rb, s_rm, s_rn)
    if workspace is None:
        return GemmPlan(gemm_tiled_kernel, (tiles, Bt, splits), main_scalars, main_kw)
    rbm, rbn = 32, 128
    return GemmPlan(gemm_tiled_kernel, (tiles, Bt, splits), main_scalars, main_kw, workspace, _ws_dtype(compute),
                    (triton.cdiv(M, rbm) * triton.cdiv(N, rbn), Bt),
                    (M, N, splits, Bt * M * N, *C.stride(), s_bias, s_rb, s_rm, s_rn),
                    dict(flags, COMPUTE=compute, INT64=int64, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4))


def launch_tiled(A, B, C, bias, R, act: int, tf32: bool, config: dict) -> None:
    """One program per output tile and batch (``SPLIT_K`` absent or 1), or the
    split-K pair of kernels (``SPLIT_K`` > 1)."""
    import torch

    Bt, M, K = A.shape
    N = B.shape[2]
    if Bt == 0 or M == 0 or N == 0:
        return
    plan = tiled_plan(A, B, C, bias, R, act, tf32, config)
    bias_t, res_t = (bias if bias is not None else C), (R if R is not None else C)
    ws = C if plan.workspace is None else torch.empty(plan.workspace, dtype=plan.ws_dtype, device=C.device)
    launch(gemm_tiled_kernel, plan.main_grid, A, B, C, bias_t, res_t, ws, *plan.main_scalars, **plan.main_kw)
    if plan.workspace is not None:
        launch(splitk_reduce_kernel, plan.reduce_grid, ws, C, bias_t, res_t, *plan.reduce_scalars,
               **plan.reduce_kw)


_allocators: dict = {}


def set_allocator(device) -> None:
    """Device-side TMA descriptors live in a small global-memory scratch that
    Triton asks the allocator for at launch. One allocator a device, kept: no
    new closure a call."""
    alloc = _allocators.get(device)
    if alloc is None:
        import torch

        def alloc(size: int, alignment: int, stream):
            return torch.empty(size, dtype=torch.int8, device=device)

        _allocators[device] = alloc
    triton.set_allocator(alloc)


_set_allocator = set_allocator  # the name the scaled and grouped GEMMs import


def tma_layout(A, B) -> tuple[bool, bool, int, int] | None:
    """(A K-major, B K-major, lda, ldb) when both 2-D operands suit TMA, else None.

    TMA needs a unit stride on one dim, 16-byte aligned bases and 16-byte
    multiples for the other stride (size-1 dims take any stride)."""
    M, K = A.shape
    N = B.shape[1]
    es = A.element_size()

    def major(t, rows, cols):
        s0, s1 = t.stride()
        if cols == 1 or s1 == 1:  # unit stride on the second dim
            return True, (s0 if rows > 1 else cols)
        if rows == 1 or s0 == 1:
            return False, (s1 if cols > 1 else rows)
        return None

    a = major(A, M, K)
    b = major(B, K, N)
    if a is None or b is None:
        return None
    a_k, lda = a
    b_n, ldb = b
    b_k = not b_n
    if any(x.data_ptr() % 16 for x in (A, B)) or (lda * es) % 16 or (ldb * es) % 16 or lda <= 0 or ldb <= 0:
        return None
    # The descriptor's leading extent must cover the strided dim.
    if (a_k and lda < K) or (not a_k and lda < M) or (b_k and ldb < K) or (not b_k and ldb < N):
        return None
    return a_k, b_k, lda, ldb


def tma_plan(A, B, C, bias, R, act: int, tf32: bool, config: dict, sms: int) -> GemmPlan:
    """``launch_tma``'s launch; A [M, K], B [K, N], C and R [M, N], none empty."""
    M, K = A.shape
    N = B.shape[1]
    a_k, b_k, lda, ldb = tma_layout(A, B)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = max(1, min(sms, tiles))
    s_bias, _, s_rm, s_rn = _epilogue_strides(bias, R.unsqueeze(0) if R is not None else None)
    return GemmPlan(
        gemm_tma_persistent_kernel, (programs,),
        (M, N, K, lda, ldb, *C.stride(), s_bias, s_rm, s_rn),
        dict(HAS_BIAS=bias is not None, ACT=act, HAS_RES=R is not None, A_KMAJOR=a_k, B_KMAJOR=b_k,
             PRECISION=precision(A.dtype, tf32), UPCAST=_upcast(A.dtype),
             INT64=needs_int64(C, R, extra=max(bm, bn)), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
             GROUP_M=config.get("GROUP_M", 8), FLATTEN=config.get("FLATTEN", False),
             num_warps=config.get("num_warps", 8), num_stages=config.get("num_stages", 3)))


def launch_tma(A, B, C, bias, R, act: int, tf32: bool, config: dict, sms: int) -> None:
    """A [M, K], B [K, N], C [M, N], R [M, N] or None; ``tma_layout(A, B)`` must hold."""
    M, K = A.shape
    N = B.shape[1]
    if M == 0 or N == 0:
        return
    plan = tma_plan(A, B, C, bias, R, act, tf32, config, sms)
    set_allocator(A.device)
    gemm_tma_persistent_kernel[plan.main_grid](
        A, B, C, bias if bias is not None else C, R if R is not None else C, *plan.main_scalars, **plan.main_kw)
