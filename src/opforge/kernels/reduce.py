"""Reductions (sum, mean, max, min, argmax/argmin, var/std) over a strided 3-D view.

Every reduction is planned by ``opforge.ops.reduce`` as ``[outer, red, inner]``
with element strides ``(so, sr, si)`` on the *original* tensor (no copy): the
reduced dims collapse into ``red``, the kept dims into ``outer`` and
``inner``. Two tile shapes cover the two memory patterns:

* ``rows`` (``inner == 1``: the reduced dims are innermost, e.g. ``x.sum(-1)``
  or a full reduction): a program owns ``BLOCK_M`` rows and walks them in
  column blocks of ``BLOCK_N`` (unit stride, vectorized loads), keeping a
  ``[BLOCK_M, BLOCK_N]`` accumulator that is reduced across lanes once, at
  the end. Short rows: many rows per program; long rows: one.
* ``cols`` (``inner > 1``: the reduced axis is outer in memory, e.g.
  ``x.sum(0)`` of ``[R, C]``): a program owns ``BLOCK_I`` consecutive
  ``inner`` positions of one ``outer`` index (coalesced along ``inner``) and
  walks ``red`` in blocks of ``BLOCK_R`` rows. No transpose copy.

Both split ``red`` into ``SPLIT`` chunks over a second grid axis when too few
programs would run otherwise (few long rows, full reductions, ``x.sum(0)`` of
a wide matrix). The chunks are then combined in one of two ways:

* two-pass (``MODE = PARTIAL``): each program writes its partial to a
  workspace (sum; extreme value; value + index; chunk mean + M2), and
  ``combine_kernel`` reduces the partials of each output in a fixed order:
  bitwise deterministic.
* atomic (``MODE = ATOMIC``): programs fold their partial into an
  initialized fp32 output with ``tl.atomic_add`` / ``atomic_max`` /
  ``atomic_min``; one launch, not bitwise deterministic for sums. Triton's
  float atomic max/min route a value by its sign bit, so a NaN is first made
  +NaN (max) or -NaN (min): then it wins over every value, as torch's NaN does.

Arithmetic: fp32 for 16-bit floats and fp32, fp64 for fp64, int64 for
integers and bool (sum of ints accumulates in int64, as torch); the input is
first cast to ``CAST`` (torch's ``dtype=`` argument) and results are rounded
once, at the store. max/min/argmax/argmin: NaN propagates and wins; ties and
NaNs go to the first index, as in torch. Lanes past the end of a row are
filled with the row's first element (``x[.., lo, ..]`` of the program's
chunk), which is neutral for max/min/argmax/argmin of every dtype and needs no
dtype-specific identity. var/std: values are shifted by the row's first
element (var is shift-invariant; fp32 then works on the spread, not on a
large mean); each column block gives a chunk mean and sum of squared
deviations from it, merged into the running (n, mean, M2) by Chan's formula
(stable: no sum of squares minus square of sums); the combine pass merges
chunk partials the same way, with chunk counts recomputed from the split.
``var = M2 / max(n - correction, 0)`` (inf or NaN for dof <= 0, as torch).

Offsets are 64-bit (``INT64``) when any tensor reaches 2^31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROWS_VERSION = "1"
COLS_VERSION = "1"
SPLIT_VERSION = "1"

# Reduction kinds (constexpr OP) and epilogue modes (constexpr MODE).
SUM = tl.constexpr(0)
MEAN = tl.constexpr(1)
MAX = tl.constexpr(2)
MIN = tl.constexpr(3)
ARGMAX = tl.constexpr(4)
ARGMIN = tl.constexpr(5)
VAR = tl.constexpr(6)
STD = tl.constexpr(7)
FINAL = tl.constexpr(0)
PARTIAL = tl.constexpr(1)
ATOMIC = tl.constexpr(2)

OP_CODES = {"sum": 0, "mean": 1, "amax": 2, "amin": 3, "argmax": 4, "argmin": 5, "var": 6, "std": 7}
# Ops whose partials fold into an fp32 output with atomics.
ATOMIC_OPS = frozenset({"sum", "mean", "amax", "amin"})


# ---------------------------------------------------------------------------
# Combine rules (shared by the main kernels and the combine pass)
# ---------------------------------------------------------------------------
@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _wins(va, ia, vb, ib, IS_MAX: tl.constexpr):
    """(va, ia) beats (vb, ib): strictly better value, NaN above everything,
    equal values (or two NaNs) to the smaller index."""
    a_nan = va != va
    b_nan = vb != vb
    if IS_MAX:
        strict = va > vb
    else:
        strict = va < vb
    tie = (va == vb) | (a_nan & b_nan)
    return strict | (a_nan & (~b_nan)) | (tie & (ia < ib))


@triton.jit
def _finish_extreme(acc, acc_i, AXIS: tl.constexpr, OP: tl.constexpr):
    """Reduce a block of running max/min (OP 2/3) or arg-max/min (OP 4/5) along
    AXIS: (value, value) or (value, index)."""
    if OP == 2:
        val = tl.reduce(acc, AXIS, _max_combine)
        aux = val
    elif OP == 3:
        val = tl.reduce(acc, AXIS, _min_combine)
        aux = val
    elif OP == 4:
        val, aux = tl.reduce((acc, acc_i), AXIS, _argmax_combine)
    else:
        val, aux = tl.reduce((acc, acc_i), AXIS, _argmin_combine)
    return val, aux


@triton.jit
def _argmax_combine(va, ia, vb, ib):
    a = _wins(va, ia, vb, ib, True)
    return tl.where(a, va, vb), tl.where(a, ia, ib)


@triton.jit
def _argmin_combine(va, ia, vb, ib):
    a = _wins(va, ia, vb, ib, False)
    return tl.where(a, va, vb), tl.where(a, ia, ib)


@triton.jit
def _chan(n, mean, m2, cn, cmean, cm2):
    """Merge a chunk (cn, cmean, cm2) into the running (n, mean, M2)."""
    tot = n + cn
    safe = tl.where(tot > 0, tot, 1.0)
    delta = cmean - mean
    mean = mean + delta * (cn / safe)
    m2 = m2 + cm2 + delta * delta * (n * cn / safe)
    return tot, mean, m2


@triton.jit
def _emit(out_ptr, idx_ptr, ws_ptr, ws2_ptr, offs, woffs, mask, val, aux, count, corr,
          OP: tl.constexpr, MODE: tl.constexpr, VALUES: tl.constexpr, COMPUTE: tl.constexpr):
    """Epilogue. ``val``: sum / extreme value / mean (var); ``aux``: index (arg*) or M2 (var)."""
    if MODE == 1:  # PARTIAL
        tl.store(ws_ptr + woffs, val, mask=mask)
        if OP >= 4:
            tl.store(ws2_ptr + woffs, aux, mask=mask)
    elif MODE == 2:  # ATOMIC (fp32 output, initialized by the launcher)
        if OP == 0:
            tl.atomic_add(out_ptr + offs, val, mask=mask, sem="relaxed")
        elif OP == 1:
            tl.atomic_add(out_ptr + offs, val / count.to(COMPUTE), mask=mask, sem="relaxed")
        elif OP == 2:
            # +NaN (0x7FC00000) takes triton's signed-max path and beats +inf.
            nan = tl.full(val.shape, 2143289344, tl.int32).to(tl.float32, bitcast=True)
            tl.atomic_max(out_ptr + offs, tl.where(val != val, nan, val), mask=mask, sem="relaxed")
        else:
            # -NaN (0xFFC00000) takes the unsigned-max path and beats -inf.
            nan = tl.full(val.shape, -4194304, tl.int32).to(tl.float32, bitcast=True)
            tl.atomic_min(out_ptr + offs, tl.where(val != val, nan, val), mask=mask, sem="relaxed")
    else:  # FINAL
        if OP == 1:
            res = val / count.to(COMPUTE)
        elif OP >= 6:
            dof = tl.maximum(count.to(COMPUTE) - corr, 0.0)
            res = aux / dof
            if OP == 7:
                if COMPUTE == tl.float64:
                    res = tl.sqrt(res)
                else:
                    res = tl.sqrt_rn(res)
        elif OP >= 4:
            res = val
            tl.store(idx_ptr + offs, aux.to(tl.int64), mask=mask)
        else:
            res = val
        if (OP < 4 or OP >= 6) or VALUES:  # triton takes two operands per and/or
            tl.store(out_ptr + offs, res.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# rows: reduce the (unit-stride) last axis of [M, N]
# ---------------------------------------------------------------------------
@triton.jit(do_not_specialize=["N"])
def rows_kernel(
    x_ptr, out_ptr, idx_ptr, ws_ptr, ws2_ptr,
    M, N, sxm, sxn, chunk, wsm, wss, corr,
    OP: tl.constexpr, MODE: tl.constexpr, COMPUTE: tl.constexpr, CAST: tl.constexpr,
    VALUES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    if INT64:
        rows = rows.to(tl.int64)
        lo = pid_s.to(tl.int64) * chunk
    else:
        lo = pid_s * chunk
    hi = tl.minimum(lo + chunk, N)
    rmask = rows < M
    base = x_ptr + rows[:, None] * sxm
    if OP <= 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=COMPUTE)
        for start in range(lo, hi, BLOCK_N):
            c = start + cols
            m = rmask[:, None] & (c < hi)[None, :]
            acc += tl.load(base + c[None, :] * sxn, mask=m, other=0).to(CAST).to(COMPUTE)
        val = tl.sum(acc, axis=1)
        aux = val
    elif OP <= 5:
        first = tl.load(x_ptr + rows * sxm + lo * sxn, mask=rmask, other=0).to(CAST).to(COMPUTE)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=COMPUTE) + first[:, None]
        acc_i = tl.zeros([BLOCK_M, BLOCK_N], dtype=lo.dtype) + lo  # unused (and dropped) for max/min
        for start in range(lo, hi, BLOCK_N):
            c = start + cols
            m = rmask[:, None] & (c < hi)[None, :]
            v = tl.load(base + c[None, :] * sxn, mask=m, other=0).to(CAST).to(COMPUTE)
            v = tl.where(m, v, acc)
            if OP == 2:
                acc = _max_combine(v, acc)
            elif OP == 3:
                acc = _min_combine(v, acc)
            else:
                ci = tl.zeros([BLOCK_M, BLOCK_N], dtype=lo.dtype) + c[None, :]
                take = _wins(v, ci, acc, acc_i, OP == 4)
                acc = tl.where(take, v, acc)
                acc_i = tl.where(take, ci, acc_i)
        val, aux = _finish_extreme(acc, acc_i, 1, OP)
    else:
        n = tl.zeros([BLOCK_M], dtype=COMPUTE)
        val = tl.zeros([BLOCK_M], dtype=COMPUTE)
        aux = tl.zeros([BLOCK_M], dtype=COMPUTE)
        # Shift by the row's first element (the same for every chunk): the moments
        # of O(spread) values, not of O(mean) ones, so fp32 keeps its digits.
        shift = tl.load(x_ptr + rows * sxm, mask=rmask, other=0).to(CAST).to(COMPUTE)
        for start in range(lo, hi, BLOCK_N):
            c = start + cols
            m = rmask[:, None] & (c < hi)[None, :]
            v = tl.load(base + c[None, :] * sxn, mask=m, other=0).to(CAST).to(COMPUTE)
            v = tl.where(m, v - shift[:, None], 0.0)
            cn = tl.minimum(hi - start, BLOCK_N).to(COMPUTE)
            cmean = tl.sum(v, axis=1) / cn
            d = tl.where(m, v - cmean[:, None], 0.0)
            n, val, aux = _chan(n, val, aux, cn, cmean, tl.sum(d * d, axis=1))
    _emit(out_ptr, idx_ptr, ws_ptr, ws2_ptr, rows, rows * wsm + pid_s * wss, rmask, val, aux, N, corr,
          OP, MODE, VALUES, COMPUTE)


# ---------------------------------------------------------------------------
# cols: reduce the middle axis of [O, R, I], coalesced along I
# ---------------------------------------------------------------------------
@triton.jit(do_not_specialize=["R"])
def cols_kernel(
    x_ptr, out_ptr, idx_ptr, ws_ptr, ws2_ptr,
    R, I, sxo, sxr, sxi, chunk, wsm, wss, corr,
    OP: tl.constexpr, MODE: tl.constexpr, COMPUTE: tl.constexpr, CAST: tl.constexpr,
    VALUES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    tiles = tl.cdiv(I, BLOCK_I)
    o = pid // tiles
    i = (pid % tiles) * BLOCK_I + tl.arange(0, BLOCK_I)
    r_off = tl.arange(0, BLOCK_R)
    if INT64:
        o = o.to(tl.int64)
        i = i.to(tl.int64)
        lo = pid_s.to(tl.int64) * chunk
    else:
        lo = pid_s * chunk
    hi = tl.minimum(lo + chunk, R)
    imask = i < I
    base = x_ptr + o * sxo + i[None, :] * sxi
    if OP <= 1:
        acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=COMPUTE)
        for start in range(lo, hi, BLOCK_R):
            r = start + r_off
            m = (r < hi)[:, None] & imask[None, :]
            acc += tl.load(base + r[:, None] * sxr, mask=m, other=0).to(CAST).to(COMPUTE)
        val = tl.sum(acc, axis=0)
        aux = val
    elif OP <= 5:
        first = tl.load(x_ptr + o * sxo + i * sxi + lo * sxr, mask=imask, other=0).to(CAST).to(COMPUTE)
        acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=COMPUTE) + first[None, :]
        acc_i = tl.zeros([BLOCK_R, BLOCK_I], dtype=lo.dtype) + lo  # unused (and dropped) for max/min
        for start in range(lo, hi, BLOCK_R):
            r = start + r_off
            m = (r < hi)[:, None] & imask[None, :]
            v = tl.load(base + r[:, None] * sxr, mask=m, other=0).to(CAST).to(COMPUTE)
            v = tl.where(m, v, acc)
            if OP == 2:
                acc = _max_combine(v, acc)
            elif OP == 3:
                acc = _min_combine(v, acc)
            else:
                ri = tl.zeros([BLOCK_R, BLOCK_I], dtype=lo.dtype) + r[:, None]
                take = _wins(v, ri, acc, acc_i, OP == 4)
                acc = tl.where(take, v, acc)
                acc_i = tl.where(take, ri, acc_i)
        val, aux = _finish_extreme(acc, acc_i, 0, OP)
    else:
        n = tl.zeros([BLOCK_I], dtype=COMPUTE)
        val = tl.zeros([BLOCK_I], dtype=COMPUTE)
        aux = tl.zeros([BLOCK_I], dtype=COMPUTE)
        shift = tl.load(x_ptr + o * sxo + i * sxi, mask=imask, other=0).to(CAST).to(COMPUTE)
        for start in range(lo, hi, BLOCK_R):
            r = start + r_off
            m = (r < hi)[:, None] & imask[None, :]
            v = tl.load(base + r[:, None] * sxr, mask=m, other=0).to(CAST).to(COMPUTE)
            v = tl.where(m, v - shift[None, :], 0.0)
            cn = tl.minimum(hi - start, BLOCK_R).to(COMPUTE)
            cmean = tl.sum(v, axis=0) / cn
            d = tl.where(m, v - cmean[None, :], 0.0)
            n, val, aux = _chan(n, val, aux, cn, cmean, tl.sum(d * d, axis=0))
    offs = o * I + i
    _emit(out_ptr, idx_ptr, ws_ptr, ws2_ptr, offs, offs * wsm + pid_s * wss, imask, val, aux, R, corr,
          OP, MODE, VALUES, COMPUTE)


# ---------------------------------------------------------------------------
# combine: the second pass of the two-pass split, partials [P, S] in fixed order
# ---------------------------------------------------------------------------
@triton.jit(do_not_specialize=["count"])
def combine_kernel(
    ws_ptr, ws2_ptr, out_ptr, idx_ptr,
    P, S, wsp, wss, count, chunk, corr,
    OP: tl.constexpr, COMPUTE: tl.constexpr, VALUES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr, INT64: tl.constexpr,
):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    s_off = tl.arange(0, BLOCK_S)
    if INT64:
        p = p.to(tl.int64)
    pmask = p < P
    rowp = p[:, None] * wsp
    if OP <= 1:
        acc = tl.zeros([BLOCK_P, BLOCK_S], dtype=COMPUTE)
        for start in range(0, S, BLOCK_S):
            s = start + s_off
            m = pmask[:, None] & (s < S)[None, :]
            acc += tl.load(ws_ptr + rowp + s[None, :] * wss, mask=m, other=0)
        val = tl.sum(acc, axis=1)
        aux = val
    elif OP <= 5:
        first = tl.load(ws_ptr + p * wsp, mask=pmask, other=0)
        acc = tl.zeros([BLOCK_P, BLOCK_S], dtype=COMPUTE) + first[:, None]
        acc_i = tl.zeros([BLOCK_P, BLOCK_S], dtype=tl.int64)  # indices: arg-max/min only
        if OP >= 4:
            acc_i += tl.load(ws2_ptr + p * wsp, mask=pmask, other=0)[:, None]
        for start in range(0, S, BLOCK_S):
            s = start + s_off
            m = pmask[:, None] & (s < S)[None, :]
            v = tl.load(ws_ptr + rowp + s[None, :] * wss, mask=m, other=0)
            v = tl.where(m, v, acc)
            if OP == 2:
                acc = _max_combine(v, acc)
            elif OP == 3:
                acc = _min_combine(v, acc)
            else:
                vi = tl.load(ws2_ptr + rowp + s[None, :] * wss, mask=m, other=0)
                vi = tl.where(m, vi, acc_i)
                take = _wins(v, vi, acc, acc_i, OP == 4)
                acc = tl.where(take, v, acc)
                acc_i = tl.where(take, vi, acc_i)
        val, aux = _finish_extreme(acc, acc_i, 1, OP)
    else:
        n = tl.zeros([BLOCK_P], dtype=COMPUTE)
        val = tl.zeros([BLOCK_P], dtype=COMPUTE)
        aux = tl.zeros([BLOCK_P], dtype=COMPUTE)
        for start in range(0, S, BLOCK_S):
            s = start + s_off
            smask = s < S
            m = pmask[:, None] & smask[None, :]
            # Chunk s holds min(chunk, count - s * chunk) elements.
            ns = tl.where(smask, tl.minimum(count - s.to(tl.int64) * chunk, chunk), 0).to(COMPUTE)
            mu = tl.load(ws_ptr + rowp + s[None, :] * wss, mask=m, other=0)
            q = tl.load(ws2_ptr + rowp + s[None, :] * wss, mask=m, other=0)
            cn = tl.sum(ns, axis=0)
            cmean = tl.sum(mu * ns[None, :], axis=1) / cn
            dev = tl.where(m, mu - cmean[:, None], 0.0)
            cm2 = tl.sum(q, axis=1) + tl.sum(dev * dev * ns[None, :], axis=1)
            n, val, aux = _chan(n, val, aux, cn, cmean, cm2)
    _emit(out_ptr, idx_ptr, ws_ptr, ws2_ptr, p, p, pmask, val, aux, count, corr,
          OP, FINAL, VALUES, COMPUTE)


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
_INT32_MAX = 2**31 - 1
# The GPU this is designed for (H200, 132 SMs); the split targets ~8 programs per SM.
TARGET_PROGRAMS = 132 * 8
# Below this many programs the unsplit kernels leave SMs idle, underfed, or
# unevenly loaded (512 long rows are 3.9 programs per SM: a 4-vs-3 tail).
FILL_PROGRAMS = 132 * 4


def compute_dtype(dtype):
    """fp64 for fp64, int64 for integers and bool, else fp32 (what torch accumulates in)."""
    import torch

    if dtype == torch.float64:
        return tl.float64
    if not dtype.is_floating_point:
        return tl.int64
    return tl.float32


def tl_dtype(dtype):
    import torch

    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
            torch.float64: tl.float64, torch.int8: tl.int8, torch.uint8: tl.uint8, torch.int16: tl.int16,
            torch.int32: tl.int32, torch.int64: tl.int64, torch.bool: tl.uint8}[dtype]


def _reach(shape_strides) -> int:
    return sum((n - 1) * abs(s) for n, s in shape_strides if n > 0) + 1


def rows_default_config(M: int, N: int, elem: int = 4) -> dict:
    """Short rows: several per program (a 4096-element tile); long rows: one per
    program in blocks of 4096 (8192 for 16-bit inputs: 16 KiB per trip)."""
    cap = 8192 if elem <= 2 else 4096
    bn = min(triton.next_power_of_2(max(N, 1)), cap)
    bm = max(1, min(cap // bn, triton.next_power_of_2(max(M, 1)), 256))
    tile = bm * bn
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 2 if tile <= 512 else (4 if tile <= 2048 else 8)}


def rows_configs(M: int, N: int, elem: int = 4) -> list[dict]:
    out = []
    bn_full = triton.next_power_of_2(max(N, 1))
    for bn in sorted({min(bn_full, b) for b in (1024, 2048, 4096, 8192)}):
        for bm in (1, 2, 4, 8, 16, 32):
            tile = bm * bn
            if tile > 16384 or (bm > 1 and bm > triton.next_power_of_2(max(M, 1))):
                continue
            for w in (4, 8, 16):
                if tile // (32 * w) >= 4:
                    out.append({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w})
    return out or [rows_default_config(M, N, elem)]


def cols_default_config(R: int, I: int, elem: int = 4, lanes: int = 4096) -> dict:
    """``BLOCK_I`` consecutive inner positions (up to 256: 512 B-1 KiB per row
    segment), ``BLOCK_R`` rows per trip for a ``lanes``-element tile. var and
    arg* pass 2048: their per-block column reductions cost registers (ptxas
    for sm_90: var at 16 lanes per thread needs 235 registers, at 8 lanes 112)."""
    bi = min(triton.next_power_of_2(max(I, 1)), 256)
    br = max(1, min(lanes // bi, triton.next_power_of_2(max(R, 1))))
    tile = br * bi
    return {"BLOCK_R": br, "BLOCK_I": bi, "num_warps": 2 if tile <= 512 else (4 if tile <= 2048 else 8)}


def cols_configs(R: int, I: int, elem: int = 4) -> list[dict]:
    out = []
    bi_full = triton.next_power_of_2(max(I, 1))
    for bi in sorted({min(bi_full, b) for b in (32, 64, 128, 256, 512)}):
        for br in (4, 8, 16, 32, 64):
            tile = br * bi
            if tile > 8192 or tile < 512:
                continue
            for w in (4, 8):
                if tile // (32 * w) >= 2:
                    out.append({"BLOCK_R": br, "BLOCK_I": bi, "num_warps": w})
    return out or [cols_default_config(R, I, elem)]


def programs(geom, cfg: dict) -> int:
    """Programs the unsplit kernel runs for ``geom = (O, R, I, ...)``."""
    O, R, I = geom[:3]
    if I == 1:
        return triton.cdiv(O, cfg["BLOCK_M"])
    return O * triton.cdiv(I, cfg["BLOCK_I"])


def split_count(geom, cfg: dict) -> int:
    """How many chunks to cut ``red`` into so that about ``TARGET_PROGRAMS`` run
    (1: the unsplit kernel fills the GPU, or ``red`` is too short to cut); each
    chunk is at least four blocks long."""
    O, R, I = geom[:3]
    p = programs(geom, cfg)
    block = cfg["BLOCK_N"] if I == 1 else cfg["BLOCK_R"]
    if p >= FILL_PROGRAMS:
        return 1
    return max(1, min(triton.cdiv(TARGET_PROGRAMS, max(p, 1)), R // (4 * block)))


def chunk_of(R: int, splits: int, block: int) -> tuple[int, int]:
    """(chunk, splits): chunks are whole blocks; the split count is what they need."""
    chunk = triton.cdiv(triton.cdiv(R, max(splits, 1)), block) * block
    return chunk, triton.cdiv(R, chunk)


def launch(x, geom, out, idx, name: str, *, mode: int, cfg: dict, cast, correction: float = 1.0,
           values: bool = True) -> None:
    """Run the reduction ``name`` of ``x`` viewed as ``geom = (O, R, I, so, sr, si)``
    into the dense ``out`` (values, ``O * I`` of them) and ``idx`` (arg ops).

    ``mode``: 0 unsplit, 1 two-pass split, 2 atomic split (``out`` initialized
    to the identity by the caller). ``cfg`` carries the tile, ``num_warps``
    and, for split modes, ``SPLIT``."""
    import torch

    O, R, I, so, sr, si = geom
    if O * I == 0 or R == 0:
        return
    op = OP_CODES[name]
    rows = I == 1
    block = cfg["BLOCK_N"] if rows else cfg["BLOCK_R"]
    splits = cfg.get("SPLIT", 1) if mode else 1
    chunk, splits = chunk_of(R, splits, block)
    if mode == 1 and splits == 1:
        mode = 0
    # Sums and moments accumulate in the result's type; extremes compare in the input's.
    comp = compute_dtype(out.dtype if op in (0, 1, 6, 7) else cast)
    ref = out if out is not None else idx
    P = O * I
    int64 = _reach([(O, so), (R, sr), (I, si)]) + block * max(abs(sr), abs(si), 1) > _INT32_MAX \
        or P * splits + 4096 > _INT32_MAX or R + block > _INT32_MAX
    ws = ws2 = None
    if mode == 1:
        tdt = {tl.float32: torch.float32, tl.float64: torch.float64, tl.int64: torch.int64}[comp]
        # rows: [P, S] (a program writes one column); cols: [S, P] (coalesced along inner).
        ws = torch.empty(P * splits, dtype=tdt, device=x.device)
        if op >= 4:
            ws2 = torch.empty(P * splits, dtype=torch.int64 if op <= 5 else tdt, device=x.device)
        wsm, wss = (splits, 1) if rows else (1, P)
    else:
        wsm, wss = 0, 0
    dummy = ref
    args = (x, out if out is not None else dummy, idx if idx is not None else dummy,
            ws if ws is not None else dummy, ws2 if ws2 is not None else dummy)
    meta = dict(OP=op, MODE=mode, COMPUTE=comp, CAST=tl_dtype(cast), VALUES=values and out is not None, INT64=int64,
                num_warps=cfg.get("num_warps", 4))
    if rows:
        grid = (triton.cdiv(O, cfg["BLOCK_M"]), splits)
        rows_kernel[grid](*args, O, R, so, sr, chunk, wsm, wss, float(correction),
                          BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], **meta)
    else:
        grid = (O * triton.cdiv(I, cfg["BLOCK_I"]), splits)
        cols_kernel[grid](*args, R, I, so, sr, si, chunk, wsm, wss, float(correction),
                          BLOCK_R=cfg["BLOCK_R"], BLOCK_I=cfg["BLOCK_I"], **meta)
    if mode == 1:
        bs = min(triton.next_power_of_2(splits), 256)
        bp = max(1, min(triton.next_power_of_2(P), 2048 // bs))
        combine_kernel[(triton.cdiv(P, bp),)](
            ws, ws2 if ws2 is not None else ws, args[1], args[2], P, splits, wsm, wss, R, chunk, float(correction),
            OP=op, COMPUTE=comp, VALUES=meta["VALUES"], BLOCK_P=bp, BLOCK_S=bs, INT64=int64,
            num_warps=4 if bp * bs >= 1024 else 2,
        )
