"""Quantize to INT8 / FP8 and dequantize, over a 2-D ``[R, C]`` view.

The input is seen as rows of unit column stride (row stride ``sx``); data,
scales and zero points are written dense. A *group* is the set of values that
share one scale: the whole tensor, one row (per token), one column (per
channel) or a ``bm x bk`` block (per block; edge blocks may be smaller).

Kernels:

* ``group_quant_kernel`` (dynamic scales, one read, one write): the groups are
  ``bm x bk`` blocks (per token is the block ``1 x C``). A program owns a
  ``[GM, PBM, GK, PBK]`` tile -- ``GM x GK`` groups of ``PBM x PBK`` (the block
  padded to powers of two, padding masked) -- reduces each group's max and
  min in registers, derives the scale, and quantizes the tile it already holds.
* ``tensor_stats_kernel`` / ``rc_stats_kernel`` + ``finalize_kernel`` +
  ``apply_kernel`` (dynamic scales whose group does not fit one program: per
  tensor, per channel, per token of rows longer than ``ROW_LIMIT``): pass 1
  writes partial max/min per program (grid-stride over a flat tensor, or per
  column / per row tile of the ``[R, C]`` view), a tiny kernel combines the
  partials into scales and zero points, pass 2 quantizes. Reads twice.
* ``apply_kernel`` alone is static quantization (scales given: calibrated
  activations), one read one write; ``dequant_kernel`` is its inverse.
  Both index scales by ``MODE``: 0 one scale, 1 per row (``r // bm``), 2 per
  column (``c // bk``), 3 per block. Per tensor runs on the flat ``[1, N]``.

Numerics, shared bit for bit with ``opforge.ops.quant.quantize_reference``
(every step is one correctly rounded fp32 operation; FMA contraction is off
at launch so no step is fused with the next):

* statistics over finite values only (NaN and +-inf count as 0), and the
  range always includes 0: ``mx = max(x, 0)``, ``mn = min(x, 0)``;
* symmetric ``scale = max(absmax / QMAX, FLT_MIN)``, asymmetric
  ``scale = max((mx - mn) / 255, FLT_MIN)`` (true divisions, ``div_rn``);
  ``FLT_MIN`` (smallest normal fp32) stands in for a zero scale, so nothing is
  ever divided by zero;
* ``inv = 1 / max(scale, FLT_MIN)``, ``v = x * inv`` (a multiply, not a
  division per element);
* int8: ``q = clamp(rne(v) (+ zp), lo, hi)``, NaN -> 0, with
  ``zp = clamp(rne(-mn * inv) - 128, -128, 127)``; symmetric uses -127..127,
  asymmetric -128..127; fp8: ``q = fp8_rne(clamp(v, -QMAX, QMAX))``, NaN
  stays NaN; +-inf saturates to the range's ends in every format;
* dequantize: ``(q - zp) * scale`` in fp32, rounded once to the output dtype.

Round half to even is ``rne``: ``rint`` (one ``cvt.rni``) compiled, a
floor-and-compare formula under the interpreter, which lacks libdevice. The
fp8 cast is the hardware's RNE with ``satfinite`` compiled; the interpreter's
fp8 conversion truncates subnormals and does not carry into the exponent, so
under it the kernel rounds to the fp8 grid itself (same RNE) and the cast is
exact.

Offsets are 64-bit when any tensor reaches 2^31 elements (``INT64``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
FUSED_VERSION = "1"
STATS_VERSION = "1"
STATIC_VERSION = "1"
DEQUANT_VERSION = "1"

# Most values one program holds for a fused group tile (fp32 in registers).
ROW_LIMIT = 16384
# Most programs of the grid-stride per-tensor statistics pass (partials the
# finalize kernel combines).
TENSOR_STATS_PROGRAMS = 1024

FLT_MIN = 1.1754943508222875e-38  # smallest normal fp32
_FLT_MIN: tl.constexpr = tl.constexpr(FLT_MIN)
_INF: tl.constexpr = tl.constexpr(float("inf"))
_INT32_MAX = 2**31 - 1

# QKIND codes
INT8, E4M3, E5M2 = 0, 1, 2


# ---------------------------------------------------------------------------
# Shared numerics
# ---------------------------------------------------------------------------
@triton.jit
def rne(v, HW: tl.constexpr):
    """Round half to even (the sign of a zero kept). NaN stays NaN, +-inf stays +-inf."""
    if HW:
        r = libdevice.rint(v)
    else:
        f = tl.floor(v)
        d = v - f
        odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
        r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
        r = tl.where(r == 0.0, v * 0.0, r)  # -0.3 rounds to -0.0, as rint does
    return r


@triton.jit
def _fp8_grid(v, MANT: tl.constexpr, MIN_EXP: tl.constexpr, HW: tl.constexpr):
    """``v`` (|v| <= the format's max, or NaN) rounded half to even onto the fp8
    grid: spacing 2^(e - MANT) for the binade e, 2^(MIN_EXP - MANT) below
    the smallest normal. Powers of two are built from exponent bits; every
    product is exact."""
    bits = tl.abs(v).to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) - 127, MIN_EXP)
    e = tl.minimum(e, 127 - MANT)  # NaN/inf bits: keep the powers in range
    up = ((127 - e + MANT) << 23).to(tl.float32, bitcast=True)
    down = ((127 + e - MANT) << 23).to(tl.float32, bitcast=True)
    return rne(v * up, HW) * down


@triton.jit
def quantize_values(xf, inv, zp, QKIND: tl.constexpr, SYM: tl.constexpr, QMAX: tl.constexpr,
                    HW: tl.constexpr):
    """fp32 values, their group's ``inv`` (and ``zp``) -> values ready to store
    in the quantized dtype (already rounded; the cast is exact)."""
    v = xf * inv
    if QKIND == 0:
        r = rne(v, HW)
        if SYM:
            lo = -QMAX
            hi = QMAX
        else:
            r = r + zp
            lo = -128.0
            hi = 127.0
        r = tl.where(r > hi, hi, tl.where(r < lo, lo, r))
        out = tl.where(r == r, r, 0.0).to(tl.int8)
    else:
        # Comparisons keep NaN (tl.minimum may not).
        c = tl.where(v > QMAX, QMAX, tl.where(v < -QMAX, -QMAX, v))
        if QKIND == 1:
            if HW:
                out = c.to(tl.float8e4nv)
            else:
                g = _fp8_grid(c, 3, -6, HW)
                # The interpreter turns a NaN into 384; 480 (mantissa 111 at
                # the top binade) converts to e4m3fn's NaN pattern 0x7F.
                out = tl.where(g == g, g, 480.0).to(tl.float8e4nv)
        else:
            if HW:
                out = c.to(tl.float8e5)
            else:
                out = _fp8_grid(c, 2, -14, HW).to(tl.float8e5)
    return out


@triton.jit
def scale_from_stats(mx, mn, SYM: tl.constexpr, QMAX: tl.constexpr):
    """Scale (>= FLT_MIN) and inverse from a group's max(x, 0) and min(x, 0)."""
    if SYM:
        scale = tl.math.div_rn(tl.maximum(mx, -mn), QMAX)
    else:
        scale = tl.math.div_rn(mx - mn, 255.0)
    scale = tl.maximum(scale, _FLT_MIN)
    inv = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    return scale, inv


@triton.jit
def zero_point_from_min(mn, inv, HW: tl.constexpr):
    zp = rne(-mn * inv, HW) - 128.0
    return tl.where(zp > 127.0, 127.0, tl.where(zp < -128.0, -128.0, zp))


@triton.jit
def _finite(xf):
    return tl.where(tl.abs(xf) < _INF, xf, 0.0)


# ---------------------------------------------------------------------------
# Fused dynamic quantization: groups of bm x bk held by one program
# ---------------------------------------------------------------------------
@triton.jit
def group_quant_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, R, C, sx, bm, bk, n_gr, n_gc, n_pc,
    QKIND: tl.constexpr, SYM: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
    GM: tl.constexpr, PBM: tl.constexpr, GK: tl.constexpr, PBK: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    pr = pid // n_pc
    pc = pid % n_pc
    gi = pr * GM + tl.arange(0, GM)
    gj = pc * GK + tl.arange(0, GK)
    i = tl.arange(0, PBM)
    j = tl.arange(0, PBK)
    if INT64:
        gi = gi.to(tl.int64)
        gj = gj.to(tl.int64)
    rows = gi[:, None, None, None] * bm + i[None, :, None, None]
    cols = gj[None, None, :, None] * bk + j[None, None, None, :]
    mask = ((i[None, :, None, None] < bm) & (rows < R)) & ((j[None, None, None, :] < bk) & (cols < C))
    xf = tl.load(x_ptr + rows * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if SYM:
        # max(|x|) over finite values == max(max(x, 0), -min(x, 0)): one reduction.
        a = tl.abs(xf)
        mx = tl.max(tl.max(tl.where(a < _INF, a, 0.0), axis=3), axis=1)  # [GM, GK]
        mn = -mx
    else:
        xz = _finite(xf)
        mx = tl.maximum(tl.max(tl.max(xz, axis=3), axis=1), 0.0)  # [GM, GK]
        mn = tl.minimum(tl.min(tl.min(xz, axis=3), axis=1), 0.0)
    scale, inv = scale_from_stats(mx, mn, SYM, QMAX)
    if SYM:
        zp = 0.0
        q = quantize_values(xf, inv[:, None, :, None], zp, QKIND, SYM, QMAX, HW)
    else:
        zp = zero_point_from_min(mn, inv, HW)
        q = quantize_values(xf, inv[:, None, :, None], zp[:, None, :, None], QKIND, SYM, QMAX, HW)
    tl.store(q_ptr + rows * C + cols, q, mask=mask)
    gmask = (gi[:, None] < n_gr) & (gj[None, :] < n_gc)
    goffs = gi[:, None] * n_gc + gj[None, :]
    tl.store(s_ptr + goffs, scale, mask=gmask)
    if not SYM:
        tl.store(z_ptr + goffs, zp.to(tl.int32), mask=gmask)


# ---------------------------------------------------------------------------
# Two-pass dynamic quantization: statistics, finalize, then apply
# ---------------------------------------------------------------------------
@triton.jit
def _fold(mx, mn, xf, SYM: tl.constexpr):
    """Running max(x, 0) and min(x, 0) over finite values; symmetric: the
    absmax in ``mx`` alone (``mn`` stays 0 and max(mx, -0) is mx)."""
    if SYM:
        a = tl.abs(xf)
        mx = tl.maximum(mx, tl.where(a < _INF, a, 0.0))
    else:
        xz = _finite(xf)
        mx = tl.maximum(mx, xz)
        mn = tl.minimum(mn, xz)
    return mx, mn


@triton.jit
def tensor_stats_kernel(x_ptr, pmax_ptr, pmin_ptr, N, P, SYM: tl.constexpr, BLOCK: tl.constexpr,
                        INT64: tl.constexpr):
    """Grid-stride over a flat contiguous tensor: program p takes blocks
    p, p + P, ...; writes its max(x, 0) and min(x, 0) to slot p."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mx = tl.zeros([BLOCK], dtype=tl.float32)
    mn = tl.zeros([BLOCK], dtype=tl.float32)
    n_blocks = tl.cdiv(N, BLOCK)
    for b in range(pid, n_blocks, P):
        if INT64:
            start = b.to(tl.int64) * BLOCK
        else:
            start = b * BLOCK
        o = start + offs
        mx, mn = _fold(mx, mn, tl.load(x_ptr + o, mask=o < N, other=0.0).to(tl.float32), SYM)
    tl.store(pmax_ptr + pid, tl.max(mx, axis=0))
    tl.store(pmin_ptr + pid, tl.min(mn, axis=0))


@triton.jit
def rc_stats_kernel(
    x_ptr, pmax_ptr, pmin_ptr, R, C, sx, rows_per, n_pc,
    PER_COL: tl.constexpr, SYM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    INT64: tl.constexpr,
):
    """Partials over an [R, C] view. PER_COL: program (pr, pc) walks rows
    [pr * rows_per, ...) of its column tile and writes part[pr, c] (shape
    [PR, C]). Else (per row): it writes part[r, pc] (shape [R, n_pc]) for
    each row tile it walks."""
    pid = tl.program_id(0)
    pr = pid // n_pc
    pc = pid % n_pc
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    rr = tl.arange(0, BLOCK_R)
    cmask = c < C
    r_start = pr * rows_per
    r_end = tl.minimum(r_start + rows_per, R)
    mx = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    mn = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for r0 in range(r_start, r_end, BLOCK_R):
        r = r0 + rr
        if INT64:
            r = r.to(tl.int64)
        m = (r[:, None] < r_end) & cmask[None, :]
        xf = tl.load(x_ptr + r[:, None] * sx + c[None, :], mask=m, other=0.0).to(tl.float32)
        if PER_COL:
            mx, mn = _fold(mx, mn, xf, SYM)
        else:
            tmx, tmn = _fold(tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32),
                             tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32), xf, SYM)
            rm = r < r_end
            tl.store(pmax_ptr + r * n_pc + pc, tl.max(tmx, axis=1), mask=rm)
            tl.store(pmin_ptr + r * n_pc + pc, tl.min(tmn, axis=1), mask=rm)
    if PER_COL:
        if INT64:
            pr = pr.to(tl.int64)
        tl.store(pmax_ptr + pr * C + c, tl.max(mx, axis=0), mask=cmask)
        tl.store(pmin_ptr + pr * C + c, tl.min(mn, axis=0), mask=cmask)


@triton.jit
def finalize_kernel(
    pmax_ptr, pmin_ptr, s_ptr, z_ptr, G, P, sg, sp,
    SYM: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Combine partials part[g * sg + p * sp] over p into scale[g] (and zp[g])."""
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    p0 = tl.arange(0, BLOCK_P)
    gmask = g < G
    mx = tl.zeros([BLOCK_G, BLOCK_P], dtype=tl.float32)
    mn = tl.zeros([BLOCK_G, BLOCK_P], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        p = start + p0
        m = gmask[:, None] & (p[None, :] < P)
        offs = g[:, None] * sg + p[None, :] * sp
        mx = tl.maximum(mx, tl.load(pmax_ptr + offs, mask=m, other=0.0))
        mn = tl.minimum(mn, tl.load(pmin_ptr + offs, mask=m, other=0.0))
    mxg = tl.max(mx, axis=1)
    mng = tl.min(mn, axis=1)
    scale, inv = scale_from_stats(mxg, mng, SYM, QMAX)
    tl.store(s_ptr + g, scale, mask=gmask)
    if not SYM:
        tl.store(z_ptr + g, zero_point_from_min(mng, inv, HW).to(tl.int32), mask=gmask)


@triton.jit
def _group_params(s_ptr, z_ptr, r, c, bm, bk, ssr, ssc, MODE: tl.constexpr, LOAD_ZP: tl.constexpr):
    """The scale (and zero point) of each element of an [BLOCK_R, BLOCK_C]
    tile, shaped to broadcast against it."""
    if MODE == 0:
        offs = tl.zeros([1, 1], dtype=tl.int32)
    elif MODE == 1:
        offs = ((r // bm) * ssr)[:, None]
    elif MODE == 2:
        offs = ((c // bk) * ssc)[None, :]
    else:
        offs = (r // bm)[:, None] * ssr + (c // bk)[None, :] * ssc
    s = tl.load(s_ptr + offs)
    if LOAD_ZP:
        z = tl.load(z_ptr + offs).to(tl.float32)
    else:
        z = tl.zeros([1, 1], dtype=tl.float32)
    return s, z


@triton.jit
def _tile(R, C, n_pc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """This program's BLOCK_R x BLOCK_C tile of the [R, C] view (``n_pc`` tiles a
    row of tiles): its rows, columns and in-bounds mask."""
    pid = tl.program_id(0)
    pr = pid // n_pc
    pc = pid % n_pc
    r = pr * BLOCK_R + tl.arange(0, BLOCK_R)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    if INT64:
        r = r.to(tl.int64)
        c = c.to(tl.int64)
    return r, c, (r[:, None] < R) & (c[None, :] < C)


@triton.jit
def apply_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, R, C, sx, bm, bk, ssr, ssc, n_pc,
    MODE: tl.constexpr, QKIND: tl.constexpr, SYM: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    """Quantize with given scales (static, or pass 2 of the two-pass path)."""
    r, c, mask = _tile(R, C, n_pc, BLOCK_R, BLOCK_C, INT64)
    s, z = _group_params(s_ptr, z_ptr, r, c, bm, bk, ssr, ssc, MODE, not SYM)
    inv = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.maximum(s, _FLT_MIN))
    xf = tl.load(x_ptr + r[:, None] * sx + c[None, :], mask=mask, other=0.0).to(tl.float32)
    q = quantize_values(xf, inv, z, QKIND, SYM, QMAX, HW)
    tl.store(q_ptr + r[:, None] * C + c[None, :], q, mask=mask)


@triton.jit
def _fp8_decode(b, MANT: tl.constexpr, BIAS: tl.constexpr, FN: tl.constexpr):
    """fp8 bits (int32 0..255) -> fp32, exactly, specials included: e4m3fn
    (FN) has NaN at S.1111.111 and no inf; e5m2 has inf and NaN at exponent 31."""
    EMAX: tl.constexpr = (1 << (7 - MANT)) - 1
    e = (b >> MANT) & EMAX
    m = b & ((1 << MANT) - 1)
    p = (tl.maximum(e, 1) - BIAS - MANT + 127) << 23  # 2^(max(e, 1) - BIAS - MANT)
    mant = tl.where(e == 0, m, m + (1 << MANT)).to(tl.float32)
    mag = mant * p.to(tl.float32, bitcast=True)
    if FN:
        mag = tl.where((e == EMAX) & (m == (1 << MANT) - 1), float("nan"), mag)
    else:
        mag = tl.where(e == EMAX, tl.where(m == 0, float("inf"), float("nan")), mag)
    return mag * tl.where((b & 128) != 0, -1.0, 1.0)  # keeps -0.0


@triton.jit
def dequant_kernel(
    q_ptr, y_ptr, s_ptr, z_ptr, R, C, sq, bm, bk, ssr, ssc, n_pc,
    MODE: tl.constexpr, HAS_ZP: tl.constexpr, QKIND: tl.constexpr, HW: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    """(q - zp) * scale. Under the interpreter, fp8 arrives as its bytes (the
    interpreter's fp8 conversion mistakes NaN, inf and subnormals) and is
    decoded exactly here."""
    r, c, mask = _tile(R, C, n_pc, BLOCK_R, BLOCK_C, INT64)
    s, z = _group_params(s_ptr, z_ptr, r, c, bm, bk, ssr, ssc, MODE, HAS_ZP)
    q = tl.load(q_ptr + r[:, None] * sq + c[None, :], mask=mask)
    if QKIND == 0 or HW:
        q = q.to(tl.float32)
    elif QKIND == 1:
        q = _fp8_decode(q.to(tl.int32), 3, 7, True)
    else:
        q = _fp8_decode(q.to(tl.int32), 2, 15, False)
    if HAS_ZP:
        q = q - z
    tl.store(y_ptr + r[:, None] * C + c[None, :], (q * s).to(y_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Launch helpers and configs
# ---------------------------------------------------------------------------
def qkind(dtype) -> int:
    import torch

    return {torch.int8: INT8, torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}[dtype]


def _hw() -> bool:
    from opforge.runtime.device import interpret_mode

    return not interpret_mode()


def _int64(*reaches: int) -> bool:
    return max(reaches) > _INT32_MAX


def _reach(R: int, C: int, row_stride: int) -> int:
    """One past the largest element offset a valid lane touches (masked lanes
    may compute wrapped offsets; they are never dereferenced)."""
    return (R - 1) * row_stride + C + 1


def _launch_opts(config: dict) -> dict:
    # No FMA contraction: each step rounds as the torch reference does.
    return {"num_warps": config.get("num_warps", 4), "enable_fp_fusion": False}


def group_tile(bm: int, bk: int, n_gr: int, n_gc: int, target: int) -> tuple[int, int, int, int]:
    """(GM, PBM, GK, PBK): whole padded blocks, up to ``target`` values a program."""
    pbm, pbk = triton.next_power_of_2(bm), triton.next_power_of_2(bk)
    per = pbm * pbk
    gk = max(1, min(target // per, triton.next_power_of_2(n_gc)))
    gm = max(1, min(target // (per * gk), triton.next_power_of_2(n_gr)))
    return gm, pbm, gk, pbk


def fused_fits(bm: int, bk: int) -> bool:
    return triton.next_power_of_2(bm) * triton.next_power_of_2(bk) <= ROW_LIMIT


def fused_default_config(R: int, C: int, bm: int, bk: int) -> dict:
    per = triton.next_power_of_2(bm) * triton.next_power_of_2(bk)
    target = max(per, 4096)
    tile = min(max(per, target), ROW_LIMIT)
    warps = 4 if tile <= 2048 else (8 if tile <= 8192 else 16)
    return {"TARGET": target, "num_warps": warps}


def fused_configs(R: int, C: int, bm: int, bk: int) -> list[dict]:
    per = triton.next_power_of_2(bm) * triton.next_power_of_2(bk)
    out = []
    for target in (2048, 4096, 8192, 16384):
        if target < per or target > ROW_LIMIT:
            continue
        for w in (4, 8, 16):
            if 32 * w <= target and target // (32 * w) <= 64:
                out.append({"TARGET": target, "num_warps": w})
    return out or [fused_default_config(R, C, bm, bk)]


def launch_group_quant(x, q, scale, zp, bm: int, bk: int, qmax: float, symmetric: bool, config: dict) -> None:
    """x: [R, C] unit column stride; q: dense [R, C]; scale/zp: dense
    [ceil(R / bm), ceil(C / bk)]."""
    R, C = x.shape
    if R == 0 or C == 0:
        return
    n_gr, n_gc = triton.cdiv(R, bm), triton.cdiv(C, bk)
    gm, pbm, gk, pbk = group_tile(bm, bk, n_gr, n_gc, config.get("TARGET", 4096))
    n_pc = triton.cdiv(n_gc, gk)
    grid = (triton.cdiv(n_gr, gm) * n_pc,)
    group_quant_kernel[grid](
        x, q, scale, zp if zp is not None else scale, R, C, x.stride(0), bm, bk, n_gr, n_gc, n_pc,
        QKIND=qkind(q.dtype), SYM=symmetric, QMAX=float(qmax), HW=_hw(),
        GM=gm, PBM=pbm, GK=gk, PBK=pbk,
        INT64=_int64(_reach(R, C, x.stride(0)), R * C, n_gr * n_gc),
        **_launch_opts(config),
    )


def stats_default_config(R: int, C: int) -> dict:
    return {"BLOCK": 4096, "BLOCK_R": 8, "BLOCK_C": min(512, triton.next_power_of_2(max(C, 1))),
            "num_warps": 8}


def stats_configs(R: int, C: int) -> list[dict]:
    bc_max = triton.next_power_of_2(max(C, 1))
    out = []
    for block, br, bc in ((2048, 4, 256), (4096, 8, 512), (8192, 16, 512), (4096, 32, 128)):
        for w in (4, 8):
            out.append({"BLOCK": block, "BLOCK_R": br, "BLOCK_C": min(bc, bc_max), "num_warps": w})
    return out


def _finalize(pmax, pmin, scale, zp, G: int, P: int, sg: int, sp: int, qmax: float, symmetric: bool) -> None:
    bg = min(64, triton.next_power_of_2(max(G, 1)))
    bp = min(max(4096 // bg, 1), triton.next_power_of_2(max(P, 1)))
    finalize_kernel[(triton.cdiv(G, bg),)](
        pmax, pmin, scale, zp if zp is not None else scale, G, P, sg, sp,
        SYM=symmetric, QMAX=float(qmax), HW=_hw(), BLOCK_G=bg, BLOCK_P=bp,
        num_warps=4, enable_fp_fusion=False,
    )


def launch_tensor_stats(x_flat, scale, zp, qmax: float, symmetric: bool, config: dict) -> None:
    """Per-tensor scale (and zp) of a flat contiguous tensor into 1-element buffers."""
    import torch

    N = x_flat.numel()
    block = config.get("BLOCK", 4096)
    P = max(1, min(triton.cdiv(N, block), _stats_programs(x_flat.device)))
    pmax = torch.empty(P, dtype=torch.float32, device=x_flat.device)
    pmin = torch.empty(P, dtype=torch.float32, device=x_flat.device)
    tensor_stats_kernel[(P,)](x_flat, pmax, pmin, N, P, SYM=symmetric, BLOCK=block, INT64=_int64(N + block * (P + 1)),
                              num_warps=config.get("num_warps", 8))
    _finalize(pmax, pmin, scale, zp, 1, P, 0, 1, qmax, symmetric)


def _stats_programs(device) -> int:
    """One resident wave (about 4 programs an SM) on a GPU; a fixed cap elsewhere."""
    if device.type != "cuda":
        return TENSOR_STATS_PROGRAMS
    from opforge.runtime.device import device_info

    return min(TENSOR_STATS_PROGRAMS, 4 * device_info(device).sm_count)


def _stats_grid(R: int, C: int, br: int, bc: int, per_col: bool) -> tuple[int, int, int]:
    """(PR, PC, rows_per): enough programs to fill the GPU, rows split into
    chunks of whole row tiles."""
    n_pc = triton.cdiv(C, bc)
    want = max(1, 1024 // n_pc)
    pr = max(1, min(want, triton.cdiv(R, br)))
    rows_per = triton.cdiv(triton.cdiv(R, pr), br) * br
    return triton.cdiv(R, rows_per), n_pc, rows_per


def launch_rc_stats(x, scale, zp, per_col: bool, qmax: float, symmetric: bool, config: dict) -> None:
    """Per-column (scale[C]) or per-row (scale[R]) scales of an [R, C] view."""
    import torch

    R, C = x.shape
    br, bc = config.get("BLOCK_R", 8), config.get("BLOCK_C", 512)
    PR, n_pc, rows_per = _stats_grid(R, C, br, bc, per_col)
    shape = (PR, C) if per_col else (R, n_pc)
    pmax = torch.empty(shape, dtype=torch.float32, device=x.device)
    pmin = torch.empty(shape, dtype=torch.float32, device=x.device)
    rc_stats_kernel[(PR * n_pc,)](
        x, pmax, pmin, R, C, x.stride(0), rows_per, n_pc,
        PER_COL=per_col, SYM=symmetric, BLOCK_R=br, BLOCK_C=bc,
        INT64=_int64(_reach(R, C, x.stride(0)), PR * C, R * n_pc),
        num_warps=config.get("num_warps", 8),
    )
    if per_col:
        _finalize(pmax, pmin, scale, zp, C, PR, 1, C, qmax, symmetric)
    else:
        _finalize(pmax, pmin, scale, zp, R, n_pc, n_pc, 1, qmax, symmetric)


def apply_default_config(R: int, C: int) -> dict:
    bc = min(4096, triton.next_power_of_2(max(C, 1)))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(R, 1))))
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": 8 if br * bc >= 2048 else 4}


def apply_configs(R: int, C: int) -> list[dict]:
    cmax = triton.next_power_of_2(max(C, 1))
    out = []
    for tile in (2048, 4096, 8192):
        for bc in (256, 1024, 4096):
            bc = min(bc, cmax)
            br = max(1, min(tile // bc, triton.next_power_of_2(max(R, 1))))
            for w in (4, 8):
                cfg = {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": w}
                if cfg not in out:
                    out.append(cfg)
    return out


def launch_apply(x, q, scale, zp, mode: int, bm: int, bk: int, ssr: int, ssc: int, qmax: float,
                 symmetric: bool, config: dict) -> None:
    R, C = x.shape
    if R == 0 or C == 0:
        return
    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 4096)
    n_pc = triton.cdiv(C, bc)
    apply_kernel[(triton.cdiv(R, br) * n_pc,)](
        x, q, scale, zp if zp is not None else scale, R, C, x.stride(0), bm, bk, ssr, ssc, n_pc,
        MODE=mode, QKIND=qkind(q.dtype), SYM=symmetric, QMAX=float(qmax), HW=_hw(),
        BLOCK_R=br, BLOCK_C=bc, INT64=_int64(_reach(R, C, x.stride(0)), R * C),
        **_launch_opts(config),
    )


def launch_dequant(q, y, scale, zp, mode: int, bm: int, bk: int, ssr: int, ssc: int, config: dict) -> None:
    R, C = q.shape
    if R == 0 or C == 0:
        return
    import torch

    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 4096)
    n_pc = triton.cdiv(C, bc)
    kind, hw = qkind(q.dtype), _hw()
    dequant_kernel[(triton.cdiv(R, br) * n_pc,)](
        q if hw or kind == INT8 else q.view(torch.uint8), y, scale, zp if zp is not None else scale,
        R, C, q.stride(0), bm, bk, ssr, ssc, n_pc,
        MODE=mode, HAS_ZP=zp is not None, QKIND=kind, HW=hw, BLOCK_R=br, BLOCK_C=bc,
        INT64=_int64(_reach(R, C, q.stride(0)), R * C), **_launch_opts(config),
    )
