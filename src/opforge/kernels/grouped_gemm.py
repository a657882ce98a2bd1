"""Grouped GEMM (MoE experts): many independent GEMMs in one launch.

Problems. Two forms, both with fp32 accumulation (fp64 for fp64 inputs) and
the GEMM family's epilogue (``kernels.gemm.epilogue_store``: bias, activation,
or the backward's gradient epilogue ``residual * act'(z)``, one rounding at
the store):

* packed (the MoE form, as ``torch._grouped_mm``): ``A [M_total, K]`` holds
  the rows of all groups back to back, ``B [G, K, N]`` one weight per group,
  ``offs [G]`` (int32) the cumulative END row of each group; group ``g`` is
  ``C[s_g:e_g] = A[s_g:e_g] @ B[g]`` with ``s_g = offs[g-1]`` (0 for g = 0)
  and ``e_g = offs[g]``. Groups may be empty.
* list: ``C_i [M_i, N_i] = A_i [M_i, K_i] @ B_i [K_i, N_i]``, shapes and
  strides free per group, described by an int64 table on the device (one row
  of addresses, sizes and strides per group).

Tile schedule (both forms). Output tiles are numbered group after group:
group ``g`` owns ``cdiv(M_g, BLOCK_M) * cdiv(N_g, BLOCK_N)`` consecutive tile
ids, in the GEMM family's grouped order inside the group (``GROUP_M`` tile
rows walk the columns together, so a block of B is reused from L2). A
persistent grid (one program per SM) walks ``tile = pid, pid + P, ...``.
Finding a tile's group is a vector compare against the tile prefix, held in
registers (``BLOCK_G >= G`` lanes): ``g = #{groups whose tiles end <= tile}``.
For the packed form the prefix is computed *in the kernel* from ``offs``
(a load, a cdiv and a ``tl.cumsum`` per program): the host never reads the
offsets (no sync, CUDA-graph capturable) and no helper launch is needed. The
list form's prefix is built on the host from the shapes it already knows.

Robustness. The kernels clamp the offsets to ``[0, M_total]`` and treat a
decreasing pair as an empty group, so malformed offsets on the device (which
the host does not read) give wrong rows, never an out-of-bounds access.

Kernels:

* ``grouped_gemm_kernel`` (portable, the interpreter's path): pointer loads,
  any strides. Rows past a group's end are clamped to its last row (valid
  memory, discarded by the store mask); columns wrap ``% N``; only the K tail
  is masked (none when ``EVEN_K``).
* ``grouped_gemm_tma_kernel`` (Hopper): A through one 2-D TMA descriptor over
  ``[M_total, K]`` (a tile may straddle the next group's rows: they only
  reach output rows the store masks; rows past ``M_total`` and the K tail are
  zero-filled by TMA), B through one 3-D descriptor over ``[G, K, N]`` (or
  ``[G, N, K]`` when B's unit stride is on K, e.g. the backward's ``B^T``):
  a block ``[1, BLOCK_K, BLOCK_N]`` never crosses into the next group's K
  rows, so no per-group descriptor has to be built. ``tl.dot`` lowers to
  wgmma and ``num_stages`` pipelines the K loop.
* ``grouped_wgrad_kernel``: the weight gradient ``dB[g] = A_g^T dY_g``, one
  program per ``(g, k-tile, n-tile)`` tile (their number does not depend on
  the offsets), reducing over the group's rows read from ``offs`` on the
  device; an empty group stores zeros.
* ``grouped_gemm_list_kernel``: the list form, pointer loads from the table.

Under the interpreter bf16 ``tl.dot`` is wrong in Triton 3.6; the launchers
set ``UPCAST`` there (as the GEMM family does). Offsets are 64-bit
(``INT64``) when any tensor spans 2^31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.kernels.gemm import (
    H200_SMS, SMEM_LIMIT, _compute, _fit, _set_allocator, _upcast, add_tile_configs, dot_k_loop, epilogue_store,
    needs_int64, precision, tile_origin, tile_ranges,
)
from opforge.kernels.gemm import _itemsize_block_k as _block_k

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
GROUPED_VERSION = "1"
TMA_VERSION = "1"
WGRAD_VERSION = "1"
LIST_VERSION = "1"

# The tile prefix lives in registers: groups beyond this go to the vendor/reference paths.
MAX_GROUPS = 4096
# The list form's per-group table: int64 fields, one row per group.
LIST_FIELDS = ("a", "b", "c", "bias", "M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_cm", "s_cn", "s_bias")
_F = {name: i for i, name in enumerate(LIST_FIELDS)}
F_A, F_B, F_C, F_BIAS = (tl.constexpr(_F[n]) for n in ("a", "b", "c", "bias"))
F_M, F_N, F_K = (tl.constexpr(_F[n]) for n in ("M", "N", "K"))
F_SAM, F_SAK, F_SBK, F_SBN = (tl.constexpr(_F[n]) for n in ("s_am", "s_ak", "s_bk", "s_bn"))
F_SCM, F_SCN, F_SBIAS = (tl.constexpr(_F[n]) for n in ("s_cm", "s_cn", "s_bias"))
N_FIELDS = tl.constexpr(len(LIST_FIELDS))


# ---------------------------------------------------------------------------
# The packed schedule: group bounds and tile prefix from the offsets
# ---------------------------------------------------------------------------
@triton.jit
def packed_schedule(offs_ptr, G, M_total, grid_n, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Per-group (first row, rows, first tile id) in registers, and the tile count."""
    gi = tl.arange(0, BLOCK_G)
    live = gi < G
    ends = tl.load(offs_ptr + gi, mask=live, other=0)
    starts = tl.load(offs_ptr + gi - 1, mask=live & (gi > 0), other=0)
    ends = tl.minimum(tl.maximum(ends, 0), M_total)
    starts = tl.minimum(tl.maximum(starts, 0), M_total)
    rows = tl.where(live, tl.maximum(ends - starts, 0), 0)
    tiles = tl.cdiv(rows, BLOCK_M) * grid_n
    incl = tl.cumsum(tiles, 0)
    return gi, starts, rows, incl - tiles, incl, tl.sum(tiles, 0)


@triton.jit
def locate(tile, gi, starts, rows, first, incl):
    """The group of ``tile``: the number of groups whose tiles end at or before it."""
    g = tl.sum((incl <= tile).to(tl.int32), 0)
    sel = gi == g
    row_lo = tl.sum(tl.where(sel, starts, 0), 0)
    m_g = tl.sum(tl.where(sel, rows, 0), 0)
    t0 = tl.sum(tl.where(sel, first, 0), 0)
    return g, row_lo, m_g, tile - t0


# ---------------------------------------------------------------------------
# Portable packed kernel
# ---------------------------------------------------------------------------
@triton.jit
def grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, bias_ptr, res_ptr,
    G, M_total, N, K,
    s_am, s_ak, s_bg, s_bk, s_bn, s_cm, s_cn, s_biasg, s_biasn, s_rm, s_rn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, COMPUTE: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    grid_n = tl.cdiv(N, BLOCK_N)
    gi, starts, rows, first, incl, total = packed_schedule(offs_ptr, G, M_total, grid_n, BLOCK_M, BLOCK_G)
    for tile in range(tl.program_id(0), total, tl.num_programs(0)):
        g, row_lo, m_g, local = locate(tile, gi, starts, rows, first, incl)
        om, on = tile_origin(local, tl.cdiv(m_g, BLOCK_M), grid_n, BLOCK_M, BLOCK_N, GROUP_M)
        rm, rn = tile_ranges(row_lo + om, on, BLOCK_M, BLOCK_N, INT64)
        gg = g
        if INT64:
            gg = g.to(tl.int64)
        row_hi = row_lo + m_g
        # Rows past the group's end read its last row; the store drops them.
        am = tl.minimum(rm, row_hi - 1)
        bn = rn % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
        acc = dot_k_loop(acc, a_ptr, b_ptr + gg * s_bg, am, bn, 0, K, s_am, s_ak, s_bk, s_bn,
                         EVEN_K, UPCAST, PRECISION, COMPUTE, BLOCK_K)
        epilogue_store(acc, rm, rn, row_hi, N, c_ptr, s_cm, s_cn, bias_ptr + gg * s_biasg, s_biasn,
                       res_ptr, s_rm, s_rn, HAS_BIAS, ACT, HAS_RES)


# ---------------------------------------------------------------------------
# Hopper packed kernel: TMA descriptors, persistent tiles
# ---------------------------------------------------------------------------
@triton.jit
def grouped_gemm_tma_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, bias_ptr, res_ptr,
    G, M_total, N, K, lda, s_bg, ldb,
    s_cm, s_cn, s_biasg, s_biasn, s_rm, s_rn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, B_KMAJOR: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # A[m, k] at m * lda + k; B[g, k, n] at g * s_bg + n * ldb + k (K-major) or g * s_bg + k * ldb + n.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M_total, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, N, K], strides=[s_bg, ldb, 1],
                                           block_shape=[1, BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, K, N], strides=[s_bg, ldb, 1],
                                           block_shape=[1, BLOCK_K, BLOCK_N])
    grid_n = tl.cdiv(N, BLOCK_N)
    gi, starts, rows, first, incl, total = packed_schedule(offs_ptr, G, M_total, grid_n, BLOCK_M, BLOCK_G)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), total, tl.num_programs(0)):
        g, row_lo, m_g, local = locate(tile, gi, starts, rows, first, incl)
        om, on = tile_origin(local, tl.cdiv(m_g, BLOCK_M), grid_n, BLOCK_M, BLOCK_N, GROUP_M)
        om = row_lo + om
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            ok = kt * BLOCK_K
            a = a_desc.load([om, ok])
            if B_KMAJOR:
                b = b_desc.load([g, on, ok]).reshape(BLOCK_N, BLOCK_K).T
            else:
                b = b_desc.load([g, ok, on]).reshape(BLOCK_K, BLOCK_N)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
        gg = g
        if INT64:
            gg = g.to(tl.int64)
        epilogue_store(acc, rm, rn, row_lo + m_g, N, c_ptr, s_cm, s_cn, bias_ptr + gg * s_biasg, s_biasn,
                       res_ptr, s_rm, s_rn, HAS_BIAS, ACT, HAS_RES)


# ---------------------------------------------------------------------------
# Weight gradient: dB[g] = A_g^T @ dY_g
# ---------------------------------------------------------------------------
@triton.jit
def grouped_wgrad_kernel(
    a_ptr, d_ptr, c_ptr, offs_ptr, M_total, K, N,
    s_am, s_ak, s_dm, s_dn, s_cg, s_ck, s_cn,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, COMPUTE: tl.constexpr, INT64: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr,
):
    tile = tl.program_id(0)
    grid_k = tl.cdiv(K, BLOCK_K)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = grid_k * grid_n
    g = tile // per_group
    ok, on = tile_origin(tile % per_group, grid_k, grid_n, BLOCK_K, BLOCK_N, GROUP_M)
    row_hi = tl.load(offs_ptr + g)
    row_lo = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    row_hi = tl.minimum(tl.maximum(row_hi, 0), M_total)
    row_lo = tl.minimum(tl.maximum(row_lo, 0), M_total)
    rk, rn = tile_ranges(ok, on, BLOCK_K, BLOCK_N, INT64)
    rr = tl.arange(0, BLOCK_R)
    if INT64:
        g = g.to(tl.int64)
    ak = rk % K
    dn = rn % N
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=COMPUTE)
    for r in range(row_lo, row_hi, BLOCK_R):
        rows = r + rr
        live = rows < row_hi
        if INT64:
            rows = rows.to(tl.int64)
        at = tl.load(a_ptr + rows[None, :] * s_am + ak[:, None] * s_ak, mask=live[None, :], other=0.0)
        d = tl.load(d_ptr + rows[:, None] * s_dm + dn[None, :] * s_dn, mask=live[:, None], other=0.0)
        if UPCAST:
            at = at.to(tl.float32)
            d = d.to(tl.float32)
        acc = tl.dot(at, d, acc, input_precision=PRECISION, out_dtype=COMPUTE)
    mask = (rk < K)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + g * s_cg + rk[:, None] * s_ck + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# List form: per-group pointer/shape/stride table
# ---------------------------------------------------------------------------
@triton.jit
def grouped_gemm_list_kernel(
    table_ptr, prefix_ptr, G, a0_ptr, b0_ptr, c0_ptr, bias0_ptr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    COMPUTE: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # prefix (int64) [g] is group g's first tile id, [G] the tile count. The
    # *0_ptr arguments carry the element types of the groups' tensors.
    gi = tl.arange(0, BLOCK_G)
    first = tl.load(prefix_ptr + gi, mask=gi < G, other=2147483647).to(tl.int32)
    total = tl.load(prefix_ptr + G).to(tl.int32)
    for tile in range(tl.program_id(0), total, tl.num_programs(0)):
        g = tl.sum((first <= tile).to(tl.int32), 0) - 1
        t0 = tl.sum(tl.where(gi == g, first, 0), 0)
        row = table_ptr + g.to(tl.int64) * N_FIELDS
        a_ptr = tl.load(row + F_A).to(tl.pointer_type(a0_ptr.dtype.element_ty))
        b_ptr = tl.load(row + F_B).to(tl.pointer_type(b0_ptr.dtype.element_ty))
        c_ptr = tl.load(row + F_C).to(tl.pointer_type(c0_ptr.dtype.element_ty))
        bias_ptr = tl.load(row + F_BIAS).to(tl.pointer_type(bias0_ptr.dtype.element_ty))
        M = tl.load(row + F_M).to(tl.int32)
        N = tl.load(row + F_N).to(tl.int32)
        K = tl.load(row + F_K).to(tl.int32)
        s_am = tl.load(row + F_SAM)
        s_ak = tl.load(row + F_SAK)
        s_bk = tl.load(row + F_SBK)
        s_bn = tl.load(row + F_SBN)
        s_cm = tl.load(row + F_SCM)
        s_cn = tl.load(row + F_SCN)
        s_bias = tl.load(row + F_SBIAS)
        if not INT64:
            s_am = s_am.to(tl.int32)
            s_ak = s_ak.to(tl.int32)
            s_bk = s_bk.to(tl.int32)
            s_bn = s_bn.to(tl.int32)
            s_cm = s_cm.to(tl.int32)
            s_cn = s_cn.to(tl.int32)
            s_bias = s_bias.to(tl.int32)
        om, on = tile_origin(tile - t0, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), BLOCK_M, BLOCK_N, GROUP_M)
        rm, rn = tile_ranges(om, on, BLOCK_M, BLOCK_N, INT64)
        am = rm % M
        bn = rn % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
        acc = dot_k_loop(acc, a_ptr, b_ptr, am, bn, 0, K, s_am, s_ak, s_bk, s_bn,
                         False, UPCAST, PRECISION, COMPUTE, BLOCK_K)
        epilogue_store(acc, rm, rn, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_bias, c_ptr, 0, 0,
                       HAS_BIAS, ACT, False)


# ---------------------------------------------------------------------------
# Configs (H200: 132 SMs, 228 KB shared memory per SM)
# ---------------------------------------------------------------------------
def estimated_tiles(M_total: int, G: int, N: int, bm: int, bn: int) -> int:
    """Tiles of the packed problem without reading the offsets: every group
    adds at most one partial row of tiles."""
    return (triton.cdiv(M_total, bm) + min(G, M_total)) * triton.cdiv(N, bn)


def _n_block(N: int, sms: int, tiles_at_256: int) -> int:
    """256 columns unless that pads N noticeably more than 128 does (N = 1408:
    6 x 256 = 1536 vs 11 x 128 = 1408) or leaves SMs idle."""
    pad256 = triton.cdiv(N, 256) * 256
    pad128 = triton.cdiv(N, 128) * 128
    return 256 if pad256 <= 1.03 * pad128 and tiles_at_256 >= sms else 128


def default_config(M_total: int, G: int, N: int, K: int, itemsize: int, sms: int = H200_SMS) -> dict:
    """128x256x64 (8 warps, 3 stages: 144 KB of buffers) for large 16-bit MoE
    problems, as the dense GEMM; 128 columns when 256 pads N or starves the
    grid; 64 rows when the groups average fewer than 128 rows (a 128-row tile
    would be mostly padding). fp32 halves BLOCK_K; fp64 runs 64x64x16."""
    if itemsize == 8:
        return {"BLOCK_M": _fit(M_total, 64), "BLOCK_N": _fit(N, 64), "BLOCK_K": 16, "GROUP_M": 8,
                "num_warps": 4, "num_stages": 2}
    bk = _block_k(itemsize)
    avg = M_total / max(G, 1)
    bm = 128 if avg >= 128 else 64
    bn = _n_block(N, sms, estimated_tiles(M_total, G, N, bm, 256)) if itemsize == 2 else 128
    if estimated_tiles(M_total, G, N, bm, bn) < 0.9 * sms:
        bm, bn = 64, min(bn, 128)
    if estimated_tiles(M_total, G, N, bm, bn) < 0.9 * sms:
        bn = 64
    warps = 8 if bm * bn >= 128 * 128 else 4
    stages = 3 if bm * bn >= 128 * 256 or itemsize == 4 else 4
    return {"BLOCK_M": _fit(M_total, bm), "BLOCK_N": _fit(N, bn), "BLOCK_K": _fit(K, bk), "GROUP_M": 8,
            "num_warps": warps, "num_stages": stages}


def configs(M_total: int, G: int, N: int, K: int, itemsize: int) -> list[dict]:
    """The autotune candidates: a handful of tile shapes, warps and stages."""
    default = default_config(M_total, G, N, K, itemsize)
    if itemsize == 8:
        return [default, {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4,
                          "num_stages": 2}]
    return add_tile_configs([default], ((128, 256, 1, 8, 3), (128, 256, 1, 8, 4), (256, 128, 1, 8, 3),
                                        (128, 128, 1, 8, 4), (128, 128, 2, 8, 3), (128, 128, 1, 4, 4),
                                        (64, 256, 1, 4, 4), (64, 128, 1, 4, 4), (64, 128, 2, 4, 3)),
                            M_total, N, K, itemsize)


def wgrad_default_config(M_total: int, G: int, K: int, N: int, itemsize: int, sms: int = H200_SMS) -> dict:
    """Output tiles ``[BLOCK_K, BLOCK_N]`` of each ``[K, N]`` gradient, the
    group's rows reduced ``BLOCK_R`` at a time (the dot's inner dim)."""
    if itemsize == 8:
        return {"BLOCK_K": _fit(K, 64), "BLOCK_N": _fit(N, 64), "BLOCK_R": 16, "GROUP_M": 8,
                "num_warps": 4, "num_stages": 2}
    br = _block_k(itemsize)
    bk, bn = 128, 128
    if G * triton.cdiv(K, bk) * triton.cdiv(N, bn) < sms:
        bk, bn = 64, 64
    return {"BLOCK_K": _fit(K, bk), "BLOCK_N": _fit(N, bn), "BLOCK_R": _fit(M_total // max(G, 1), br, 16),
            "GROUP_M": 8, "num_warps": 8 if bk * bn >= 128 * 128 else 4, "num_stages": 3}


def wgrad_configs(M_total: int, G: int, K: int, N: int, itemsize: int) -> list[dict]:
    default = wgrad_default_config(M_total, G, K, N, itemsize)
    if itemsize == 8:
        return [default]
    br = _block_k(itemsize)
    out = [default]
    for bk, bn, r_mul, w, s in ((128, 128, 1, 8, 3), (128, 128, 1, 8, 4), (128, 256, 1, 8, 3),
                                (64, 128, 1, 4, 4), (128, 128, 2, 8, 3)):
        cfg = {"BLOCK_K": _fit(K, bk), "BLOCK_N": _fit(N, bn), "BLOCK_R": _fit(M_total // max(G, 1), br * r_mul, 16),
               "GROUP_M": 8, "num_warps": w, "num_stages": s}
        if s * (bk + bn) * cfg["BLOCK_R"] * itemsize <= SMEM_LIMIT and cfg not in out:
            out.append(cfg)
    return out


def list_default_config(shapes: list[tuple[int, int, int]], itemsize: int, sms: int = H200_SMS) -> dict:
    """The packed rule applied to the groups' total rows and widest N and K."""
    M_total = sum(m for m, _, _ in shapes)
    N = max((n for _, n, _ in shapes), default=1)
    K = max((k for _, _, k in shapes), default=1)
    return default_config(M_total, len(shapes), N, K, itemsize, sms)


def list_configs(shapes: list[tuple[int, int, int]], itemsize: int) -> list[dict]:
    M_total = sum(m for m, _, _ in shapes)
    N = max((n for _, n, _ in shapes), default=1)
    K = max((k for _, _, k in shapes), default=1)
    return configs(M_total, len(shapes), N, K, itemsize)


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
def _epilogue_args(C, bias, R):
    # Unused pointers point at C (never dereferenced: the constexpr flags are off).
    sb = bias.stride() if bias is not None else (0, 0)
    sr = R.stride() if R is not None else (0, 0)
    return (bias if bias is not None else C, R if R is not None else C, *sb, *sr)


def block_g(G: int) -> int:
    return max(16, triton.next_power_of_2(G))


def launch_grouped(A, B, offs, C, bias, R, act: int, tf32: bool, config: dict, sms: int) -> None:
    """A [M_total, K], B [G, K, N], offs int32 [G], C [M_total, N]; bias [G, N]
    or None; R [M_total, N] (gradient epilogue) or None. Any strides."""
    M_total, K = A.shape
    G, _, N = B.shape
    if M_total == 0 or N == 0 or G == 0:
        return
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    programs = max(1, min(sms, estimated_tiles(M_total, G, N, bm, bn)))
    bias_t, res_t, *strides = _epilogue_args(C, bias, R)
    grouped_gemm_kernel[(programs,)](
        A, B, C, offs, bias_t, res_t, G, M_total, N, K,
        *A.stride(), *B.stride(), *C.stride(), *strides,
        HAS_BIAS=bias is not None, ACT=act, HAS_RES=R is not None, EVEN_K=K % bk == 0,
        PRECISION=precision(A.dtype, tf32), UPCAST=_upcast(A.dtype), COMPUTE=_compute(A.dtype),
        INT64=needs_int64(A, B, C, R, extra=max(bm, bn) * bk), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=config.get("GROUP_M", 8), BLOCK_G=block_g(G),
        num_warps=config.get("num_warps", 8), num_stages=config.get("num_stages", 3),
    )


def tma_layout(A, B) -> tuple[bool, int, int, int] | None:
    """(B K-major, lda, s_bg, ldb) when A [M_total, K] and B [G, K, N] suit the
    TMA kernel, else None: A with unit stride on K, B with unit stride on N or
    on K, 16-byte aligned bases and 16-byte multiples for the other strides."""
    M_total, K = A.shape
    G, _, N = B.shape
    es = A.element_size()
    if not (A.stride(1) == 1 or K == 1):
        return None
    lda = A.stride(0) if M_total > 1 else K
    s_bg, s_bk, s_bn = B.stride()
    if s_bn == 1 or N == 1:
        kmajor, ldb = False, (s_bk if K > 1 else N)
    elif s_bk == 1 or K == 1:
        kmajor, ldb = True, (s_bn if N > 1 else K)
    else:
        return None
    if G == 1:
        s_bg = (N if kmajor else K) * ldb
    ldb = max(ldb, 1)
    if any(t.data_ptr() % 16 for t in (A, B)) or any((s * es) % 16 for s in (lda, s_bg, ldb)):
        return None
    if lda < K or ldb < (K if kmajor else N) or min(lda, s_bg, ldb) <= 0:
        return None
    return kmajor, lda, s_bg, ldb


def launch_tma(A, B, offs, C, bias, R, act: int, tf32: bool, config: dict, sms: int) -> None:
    """As ``launch_grouped``; ``tma_layout(A, B)`` must hold and K > 0."""
    M_total, K = A.shape
    G, _, N = B.shape
    if M_total == 0 or N == 0 or G == 0:
        return
    kmajor, lda, s_bg, ldb = tma_layout(A, B)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    programs = max(1, min(sms, estimated_tiles(M_total, G, N, bm, bn)))
    bias_t, res_t, *strides = _epilogue_args(C, bias, R)
    _set_allocator(A.device)
    grouped_gemm_tma_kernel[(programs,)](
        A, B, C, offs, bias_t, res_t, G, M_total, N, K, lda, s_bg, ldb, *C.stride(), *strides,
        HAS_BIAS=bias is not None, ACT=act, HAS_RES=R is not None, B_KMAJOR=kmajor,
        PRECISION=precision(A.dtype, tf32), UPCAST=_upcast(A.dtype),
        INT64=needs_int64(C, R, bias, extra=max(bm, bn)), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=config.get("GROUP_M", 8), BLOCK_G=block_g(G),
        num_warps=config.get("num_warps", 8), num_stages=config.get("num_stages", 3),
    )


def launch_wgrad(A, D, offs, C, tf32: bool, config: dict) -> None:
    """C [G, K, N] = per group A_g^T @ D_g (A [M_total, K], D [M_total, N])."""
    M_total, K = A.shape
    N = D.shape[1]
    G = C.shape[0]
    if C.numel() == 0:
        return
    bk, bn, br = config["BLOCK_K"], config["BLOCK_N"], config["BLOCK_R"]
    grouped_wgrad_kernel[(G * triton.cdiv(K, bk) * triton.cdiv(N, bn),)](
        A, D, C, offs, M_total, K, N, *A.stride(), *D.stride(), *C.stride(),
        PRECISION=precision(A.dtype, tf32), UPCAST=_upcast(A.dtype), COMPUTE=_compute(A.dtype),
        INT64=needs_int64(A, D, C, extra=max(bk, bn) * br), BLOCK_K=bk, BLOCK_N=bn, BLOCK_R=br,
        GROUP_M=config.get("GROUP_M", 8),
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3),
    )


def launch_list(As, Bs, Cs, biases, act: int, tf32: bool, config: dict, sms: int) -> None:
    """C_i = epilogue(A_i @ B_i) for each group, one launch. Builds the int64
    table and the tile prefix on the host (the shapes are host metadata) and
    copies them to the device in one transfer (so, unlike the packed form,
    a call is not CUDA-graph capturable: the copy's host buffer is per call)."""
    import torch

    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    rows, prefix, total = [], [0], 0
    for i, (a, b, c) in enumerate(zip(As, Bs, Cs)):
        M, K = a.shape
        N = b.shape[1]
        bias = biases[i] if biases is not None else None
        rows.append([a.data_ptr(), b.data_ptr(), c.data_ptr(), bias.data_ptr() if bias is not None else c.data_ptr(),
                     M, N, K, *a.stride(), *b.stride(), *c.stride(), bias.stride(0) if bias is not None else 0])
        total += triton.cdiv(M, bm) * triton.cdiv(N, bn) if M and N else 0
        prefix.append(total)
    if total == 0:
        return
    G = len(rows)
    device = Cs[0].device
    # One host buffer, one copy: the table's int64 rows, then the prefix.
    host = torch.tensor([v for r in rows for v in r] + prefix, dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    buf = host.to(device, non_blocking=True)
    table = buf[: G * len(LIST_FIELDS)]
    prefix_t = buf[G * len(LIST_FIELDS):]
    tensors = list(As) + list(Bs) + list(Cs)
    bias0 = biases[0] if biases is not None else Cs[0]
    grouped_gemm_list_kernel[(max(1, min(sms, total)),)](
        table, prefix_t, G, As[0], Bs[0], Cs[0], bias0,
        HAS_BIAS=biases is not None, ACT=act, PRECISION=precision(As[0].dtype, tf32), UPCAST=_upcast(As[0].dtype),
        COMPUTE=_compute(As[0].dtype), INT64=needs_int64(*tensors, extra=max(bm, bn) * config["BLOCK_K"]),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=config["BLOCK_K"], GROUP_M=config.get("GROUP_M", 8), BLOCK_G=block_g(G),
        num_warps=config.get("num_warps", 8), num_stages=config.get("num_stages", 3),
    )
