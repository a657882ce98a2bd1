"""Normalization kernels: LayerNorm and RMSNorm over the last dim of a 2-D view,
optionally fused with the residual add that precedes them in a transformer block.

Every input is viewed as a contiguous ``[rows, cols]`` matrix (``cols`` = the
product of ``normalized_shape``). One kernel body serves both norms, chosen by
the ``IS_RMS`` constexpr:

* LayerNorm: ``y = (x - mean) * rstd * w + b``, ``rstd = 1/sqrt(var + eps)``,
  ``var`` the biased variance.
* RMSNorm: ``y = x * rstd * w``, ``rstd = 1/sqrt(mean(x^2) + eps)``.

Residual fusion (``HAS_RES``, forward): the kernel reads ``x`` and ``res``,
forms ``s = x + res`` in the compute dtype, rounds it once to the storage dtype
(exactly what torch's ``x + res`` gives), stores it as the new residual and
normalizes the *rounded* ``s`` (what ``norm(x + res)`` in torch sees). Two
reads and two writes, the fewest the fused op can move. In the backward
(``HAS_DRES``) the incoming gradient of the new residual is added to ``dx``
before the store: ``d_input = d_residual = dx + d_new_residual``.

Three strategies:

* ``row`` (row-resident): a program owns a ``[BLOCK_R, BLOCK_C]`` tile of
  whole rows (``BLOCK_C = next_pow2(cols)``), so each row is read from HBM
  once. Mean and variance are a shifted two-pass in registers: the row's first
  element ``K`` (one scalar load per row, an L1 hit) is subtracted (exact for
  nearby values), then the mean of ``x - K``, then the sum of squared
  deviations from the mean. So ``1e4 + N(0, 1)`` inputs keep their variance
  (no ``E[x^2] - E[x]^2`` cancellation) and their mean (no large-magnitude
  fp32 sum).
* ``split`` (long rows, or few rows): each row is cut into ``CHUNK``-column
  pieces and every piece is a program, so a 256-row x 262144-column input is
  4096 programs instead of 256. Pass 1 (``norm_split_stats_kernel``) holds
  its piece in registers and writes the piece's exact statistics (mean of
  ``x - K`` and sum of squared deviations; sum of squares for RMS) to a tiny
  ``[rows, pieces, 2]`` buffer; with ``HAS_RES`` it also writes ``s``. Pass 2
  (``norm_split_apply_kernel``) merges a row's pieces with Chan's parallel
  formula (``M2 = sum(M2_i + n_i (mean_i - mean)^2)``), re-reads its piece and
  writes ``y``. Pass 2 walks the pieces in reverse launch order, so it starts
  on what pass 1 read last, still in L2. Traffic: plain norms 2 reads + 1
  write; fused 2 reads + 2 writes + 1 re-read (80 % of the fused minimum).
  No atomics and no inter-program waiting: deterministic, and it runs under
  the interpreter.
* ``looped`` (any row length, the fallback; the long-row backward): one
  program per row walks it in ``BLOCK_C`` column blocks: two sweeps for the
  statistics, a third to normalize. Re-reads come from L2 in the common case.

Arithmetic runs in fp32 for 16/32-bit inputs and in fp64 for fp64 inputs
(``compute_dtype``); results are rounded once, at the store. The forward can
also store the per-row ``mean`` (LayerNorm) and ``rstd`` in the compute dtype
(``STATS``). The backward recomputes them from ``x`` instead of reading them:
the backward loads the row anyway, so recomputing costs no HBM traffic, and it
keeps the public ops single-output (see ``ops.norm``).

Backward, with ``xhat = (x - mean) * rstd`` and ``g = dy * w`` (or ``dy``):

* LayerNorm: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``
* RMSNorm:   ``dx = rstd * (g - xhat * mean(g * xhat))``
* ``dw = sum_rows(dy * xhat)``, ``db = sum_rows(dy)``.

``dw``/``db`` are reduced deterministically: each of ``P`` programs owns the
rows ``pid, pid + P, ...`` (grid-stride) and writes its partial sums to row
``pid`` of a ``[P, cols]`` buffer in the compute dtype; ``torch.sum`` over dim
0 of that buffer (done by the launcher's caller, one small reduction) gives the
result. No atomics, so results are bitwise reproducible for a fixed ``P``.

64-bit offsets (``INT64``): every row offset is ``row * cols`` with ``row``
cast to int64 before the multiply, and the column index of a split piece is
int64 too, whenever ``rows * cols`` (plus one block of slack for masked
lanes) reaches 2^31 (``needs_int64``). Program ids, piece counts and the
per-program partial-buffer rows stay int32: the grid itself is below 2^31.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.kernels.waves import (pending_words, wave_arrive, wave_counters, wave_gather_pairs, wave_plan,
                                  wave_publish_pair, wave_role, wave_rows_for, wave_wait)
from opforge.runtime.launch import launch

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROW_VERSION = "2"
LOOPED_VERSION = "3"
SPLIT_VERSION = "2"
WAVE_VERSION = "3"

# Longest row the row-resident kernels hold in registers (elements).
ROW_MAX = 16384
# Column pieces of the split kernels: powers of two in [SPLIT_MIN_CHUNK, ROW_MAX].
SPLIT_MIN_CHUNK = 2048
# Largest block of per-piece statistics pass 2 loads at once (it loops beyond).
_PART_BLOCK = 1024
_INT32_MAX = 2**31 - 1


@triton.jit
def _inv_sqrt(v):
    # Correctly rounded sqrt then a true division: sqrt_rn for fp32 (plain
    # sqrt is approximate there), sqrt for fp64 (always correctly rounded).
    if v.dtype == tl.float64:
        r = 1.0 / tl.sqrt(v)
    else:
        r = 1.0 / tl.sqrt_rn(v)
    return r


@triton.jit
def _load_input(x_ptr, res_ptr, s_ptr, offs, mask, HAS_RES: tl.constexpr, STORE: tl.constexpr,
                COMPUTE: tl.constexpr):
    # The value the norm sees: x, or s = x + res rounded to the storage dtype
    # (stored as the new residual when STORE).
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        s = (x.to(COMPUTE) + tl.load(res_ptr + offs, mask=mask, other=0.0).to(COMPUTE)).to(s_ptr.dtype.element_ty)
        if STORE:
            tl.store(s_ptr + offs, s, mask=mask)
        x = s
    return x.to(COMPUTE)


# ---------------------------------------------------------------------------
# Row-resident kernels: a [BLOCK_R, BLOCK_C] tile of whole rows per program.
# ---------------------------------------------------------------------------
@triton.jit
def norm_fwd_row_kernel(
    x_ptr, res_ptr, s_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    STATS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    if INT64:
        r = r.to(tl.int64)
    rmask = r < rows
    cmask = c < cols
    mask = rmask[:, None] & cmask[None, :]
    roff = r * cols
    offs = roff[:, None] + c[None, :]
    x = _load_input(x_ptr, res_ptr, s_ptr, offs, mask, HAS_RES, True, COMPUTE)
    if IS_RMS:
        xc = x
    else:
        # Shifted two-pass: subtract the row's first element (exact for close
        # values; a scalar load per row, not a reduction), then the mean of the
        # shifted row, so a large common offset costs no digits in the mean.
        shift = _load_input(x_ptr, res_ptr, s_ptr, roff, rmask, HAS_RES, False, COMPUTE)
        xs = tl.where(mask, x - shift[:, None], 0.0)
        ms = tl.sum(xs, axis=1) / cols
        mean = shift + ms
        xc = tl.where(mask, xs - ms[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / cols
    rstd = _inv_sqrt(var + eps)
    y = xc * rstd[:, None]
    if HAS_W:
        w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(COMPUTE)
        y = y * w[None, :]
    if HAS_B:
        b = tl.load(b_ptr + c, mask=cmask, other=0.0).to(COMPUTE)
        y = y + b[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STATS:
        tl.store(rstd_ptr + r, rstd, mask=rmask)
        if not IS_RMS:
            tl.store(mean_ptr + r, mean, mask=rmask)


@triton.jit
def norm_bwd_row_kernel(
    dy_ptr, x_ptr, w_ptr, dres_ptr, dx_ptr, dw_part_ptr, db_part_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DRES: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    # Grid-stride over row tiles; dw/db partial sums stay in registers and are
    # written once to row ``pid`` of the [programs, cols] partial buffers.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles = tl.cdiv(rows, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    cmask = c < cols
    if HAS_W:
        w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(COMPUTE)
    dw_acc = tl.zeros([BLOCK_C], dtype=COMPUTE)
    db_acc = tl.zeros([BLOCK_C], dtype=COMPUTE)
    for t in range(pid, tiles, nprog):
        r = t * BLOCK_R + tl.arange(0, BLOCK_R)
        if INT64:
            r = r.to(tl.int64)
        rmask = r < rows
        mask = rmask[:, None] & cmask[None, :]
        roff = r * cols
        offs = roff[:, None] + c[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        if IS_RMS:
            xc = x
        else:
            shift = tl.load(x_ptr + roff, mask=rmask, other=0.0).to(COMPUTE)
            xs = tl.where(mask, x - shift[:, None], 0.0)
            xc = tl.where(mask, xs - (tl.sum(xs, axis=1) / cols)[:, None], 0.0)
        rstd = _inv_sqrt(tl.sum(xc * xc, axis=1) / cols + eps)
        xhat = xc * rstd[:, None]
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        c1 = tl.sum(g * xhat, axis=1) / cols
        if IS_RMS:
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(g, axis=1) / cols
            dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        if HAS_DRES:
            dx += tl.load(dres_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_W:
            dw_acc += tl.sum(dy * xhat, axis=0)
        if HAS_B:
            db_acc += tl.sum(dy, axis=0)
    if INT64:
        base = pid.to(tl.int64) * cols
    else:
        base = pid * cols
    if HAS_W:
        tl.store(dw_part_ptr + base + c, dw_acc, mask=cmask)
    if HAS_B:
        tl.store(db_part_ptr + base + c, db_acc, mask=cmask)


# ---------------------------------------------------------------------------
# Split kernels: rows cut into CHUNK-column pieces, one program per piece.
# ---------------------------------------------------------------------------
@triton.jit
def norm_split_stats_kernel(
    x_ptr, res_ptr, s_ptr, part_ptr, rows, cols, pieces,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr,
    INT64: tl.constexpr,
):
    # Pass 1: this piece's statistics -> part[row, piece, 0:2].
    _split_stats(x_ptr, res_ptr, s_ptr, part_ptr, tl.program_id(0), rows, cols, pieces,
                 IS_RMS, HAS_RES, COMPUTE, CHUNK, INT64, False)


@triton.jit
def _split_stats(x_ptr, res_ptr, s_ptr, part_ptr, pid, rows, cols, pieces,
                 IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr,
                 INT64: tl.constexpr, KEEP: tl.constexpr, word_ptr=None, PACKED: tl.constexpr = False):
    """Piece ``pid`` (row-major over ``[rows, pieces]``; rows past ``rows`` are empty) -> part[pid, 0:2].
    ``KEEP`` (no residual): the piece is loaded evict_last, for a re-read from L2 soon after.
    ``PACKED`` (fp32): the pair is published as one word at ``word_ptr + pid`` (``kernels.waves``)."""
    row = pid // pieces
    piece = pid - row * pieces
    if INT64:
        row = row.to(tl.int64)
        piece = piece.to(tl.int64)
    start = piece * CHUNK
    c = start + tl.arange(0, CHUNK)
    m = (c < cols) & (row < rows)
    roff = row * cols
    if KEEP:
        x = tl.load(x_ptr + roff + c, mask=m, other=0.0, eviction_policy="evict_last").to(COMPUTE)
    else:
        x = _load_input(x_ptr, res_ptr, s_ptr, roff + c, m, HAS_RES, True, COMPUTE)
    if IS_RMS:
        p0 = tl.sum(x * x, axis=0)
        p1 = p0 * 0.0
    else:
        n = tl.minimum(cols - start, CHUNK).to(COMPUTE)
        shift = _load_input(x_ptr, res_ptr, s_ptr, roff, row < rows, HAS_RES, False, COMPUTE)
        xs = tl.where(m, x - shift, 0.0)
        p0 = tl.sum(xs, axis=0) / n  # mean of x - K over the piece
        xc = tl.where(m, xs - p0, 0.0)
        p1 = tl.sum(xc * xc, axis=0)  # its sum of squared deviations
    if PACKED:
        wave_publish_pair(word_ptr + pid, p0, p1)
    else:
        if INT64:
            pofs = pid.to(tl.int64) * 2
        else:
            pofs = pid * 2
        tl.store(part_ptr + pofs, p0)
        tl.store(part_ptr + pofs + 1, p1)


@triton.jit
def norm_split_apply_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, mean_ptr, rstd_ptr, rows, cols, pieces, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STATS: tl.constexpr,
    COMPUTE: tl.constexpr, CHUNK: tl.constexpr, PBLOCK: tl.constexpr, INT64: tl.constexpr,
):
    # Pass 2: merge the row's piece statistics, normalize this piece. Reverse
    # order: the first programs re-read what pass 1 read last (L2-resident).
    _split_apply(x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, mean_ptr, rstd_ptr, tl.num_programs(0) - 1 - tl.program_id(0),
                 rows, cols, pieces, eps, IS_RMS, HAS_W, HAS_B, STATS, COMPUTE, CHUNK, PBLOCK, INT64, False)


@triton.jit
def _chan(mu, m2, k, km, cols, eps, COMPUTE: tl.constexpr, CHUNK: tl.constexpr):
    """Chan's merge of one block of pieces (``k``, live where ``km``): the row's mean of x - K and rstd."""
    n = tl.where(km, tl.minimum(cols - k * CHUNK, CHUNK), 0).to(COMPUTE)
    ms = tl.sum(n * mu, axis=0) / cols
    d = mu - ms
    return ms, _inv_sqrt(tl.sum(m2 + n * d * d, axis=0) / cols + eps)


@triton.jit
def _split_apply(x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, mean_ptr, rstd_ptr, q, rows, cols, pieces, eps,
                 IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STATS: tl.constexpr,
                 COMPUTE: tl.constexpr, CHUNK: tl.constexpr, PBLOCK: tl.constexpr, INT64: tl.constexpr,
                 VOLATILE: tl.constexpr, count_ptr=None, wave=0, expected=0, WAIT: tl.constexpr = False,
                 word_ptr=None, PACKED: tl.constexpr = False):
    """Merge piece ``q``'s row statistics, normalize and write the piece (rows past ``rows`` write
    nothing). The piece (and the row's shift) are loaded first, so their latency overlaps the
    wait and the statistics' loads. ``VOLATILE``: the statistics were written by programs of
    the same grid (L1 bypassed); ``WAIT``: first wait for them (``kernels.waves``); ``PACKED``:
    they are words at ``word_ptr``, polled until published (one block: ``PBLOCK >= pieces``)."""
    row = q // pieces
    piece = q - row * pieces
    if INT64:
        row = row.to(tl.int64)
        piece = piece.to(tl.int64)
    roff = row * cols
    c = piece * CHUNK + tl.arange(0, CHUNK)
    live = row < rows
    m = (c < cols) & live
    # Last use of this piece, and y is never re-read here: evict_first keeps
    # L2 for the pass-1 data the next programs re-read.
    x = tl.load(x_ptr + roff + c, mask=m, other=0.0, eviction_policy="evict_first").to(COMPUTE)
    if not IS_RMS:
        shift = tl.load(x_ptr + roff, mask=live, other=0.0).to(COMPUTE)
    if WAIT:
        wave_wait(count_ptr, wave, expected)
    pbase = row * pieces * 2
    k = tl.arange(0, PBLOCK)
    if PACKED:
        km = k < pieces
        mu, m2 = wave_gather_pairs(word_ptr + row * pieces + k, km)  # masked lanes: 0, 0
        if IS_RMS:
            rstd = _inv_sqrt(tl.sum(mu, axis=0) / cols + eps)
        else:
            ms, rstd = _chan(mu, m2, k, km, cols, eps, COMPUTE, CHUNK)
    elif IS_RMS:
        acc = tl.zeros([PBLOCK], dtype=COMPUTE)
        for p0 in range(0, pieces, PBLOCK):
            km = p0 + k < pieces
            acc += tl.load(part_ptr + pbase + (p0 + k) * 2, mask=km, other=0.0, volatile=VOLATILE)
        rstd = _inv_sqrt(tl.sum(acc, axis=0) / cols + eps)
    else:
        # Chan: mean = sum(n_i mean_i) / N; M2 = sum(M2_i + n_i (mean_i - mean)^2).
        if PBLOCK >= pieces:
            # One block: both statistics in one round of loads, kept in registers.
            km = k < pieces
            mu = tl.load(part_ptr + pbase + k * 2, mask=km, other=0.0, volatile=VOLATILE)
            m2 = tl.load(part_ptr + pbase + k * 2 + 1, mask=km, other=0.0, volatile=VOLATILE)
            ms, rstd = _chan(mu, m2, k, km, cols, eps, COMPUTE, CHUNK)
        else:
            acc = tl.zeros([PBLOCK], dtype=COMPUTE)
            for p0 in range(0, pieces, PBLOCK):
                i = p0 + k
                if INT64:
                    i = i.to(tl.int64)
                km = i < pieces
                n = tl.where(km, tl.minimum(cols - i * CHUNK, CHUNK), 0).to(COMPUTE)
                acc += n * tl.load(part_ptr + pbase + i * 2, mask=km, other=0.0, volatile=VOLATILE)
            ms = tl.sum(acc, axis=0) / cols
            acc2 = tl.zeros([PBLOCK], dtype=COMPUTE)
            for p0 in range(0, pieces, PBLOCK):
                i = p0 + k
                if INT64:
                    i = i.to(tl.int64)
                km = i < pieces
                n = tl.where(km, tl.minimum(cols - i * CHUNK, CHUNK), 0).to(COMPUTE)
                d = tl.load(part_ptr + pbase + i * 2, mask=km, other=0.0, volatile=VOLATILE) - ms
                acc2 += tl.load(part_ptr + pbase + i * 2 + 1, mask=km, other=0.0, volatile=VOLATILE) + n * d * d
            rstd = _inv_sqrt(tl.sum(acc2, axis=0) / cols + eps)
    if IS_RMS:
        y = x * rstd
    else:
        y = ((x - shift) - ms) * rstd
    if HAS_W:
        y = y * tl.load(w_ptr + c, mask=m, other=0.0).to(COMPUTE)
    if HAS_B:
        y = y + tl.load(b_ptr + c, mask=m, other=0.0).to(COMPUTE)
    tl.store(y_ptr + roff + c, y.to(y_ptr.dtype.element_ty), mask=m, eviction_policy="evict_first")
    if STATS:
        if (piece == 0) & live:
            tl.store(rstd_ptr + row, rstd)
            if not IS_RMS:
                tl.store(mean_ptr + row, shift + ms)


@triton.jit
def norm_wave_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, mean_ptr, rstd_ptr, count_ptr, word_ptr, rows, cols, pieces, eps, n, W,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STATS: tl.constexpr,
    COMPUTE: tl.constexpr, CHUNK: tl.constexpr, PBLOCK: tl.constexpr, INT64: tl.constexpr,
    PACKED: tl.constexpr = False,
):
    """Both split passes in one grid, interleaved by waves of rows (``kernels.waves``):
    the apply program re-reads its piece from L2, so HBM sees one read and one write.
    PACKED: the pieces' statistics are words at ``word_ptr`` (no counter, no fence)."""
    is_stats, wave, idx = wave_role(tl.program_id(0), n, W)
    slot = wave * n + idx
    if is_stats:
        _split_stats(x_ptr, x_ptr, x_ptr, part_ptr, slot, rows, cols, pieces, IS_RMS, False, COMPUTE, CHUNK, INT64,
                     True, word_ptr, PACKED)
        if not PACKED:
            wave_arrive(count_ptr, wave)
    else:
        _split_apply(x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, mean_ptr, rstd_ptr, slot, rows, cols, pieces, eps,
                     IS_RMS, HAS_W, HAS_B, STATS, COMPUTE, CHUNK, PBLOCK, INT64, True, count_ptr, wave, n,
                     not PACKED, word_ptr, PACKED)


# ---------------------------------------------------------------------------
# Looped kernels: one row per program, walked in BLOCK_C column blocks.
# ---------------------------------------------------------------------------
@triton.jit
def _row_stats(x_ptr, row_off, cols, eps, IS_RMS: tl.constexpr, COMPUTE: tl.constexpr,
               BLOCK_C: tl.constexpr):
    # One read of the row: returns (shift K, mean of x - K, rstd). LayerNorm keeps a
    # Welford mean and M2 per lane over the column blocks (lane j sees columns
    # j, j + BLOCK_C, ...), then merges the lanes with Chan's formula; the data are
    # shifted by the row's first value, so that 1e4-scale rows keep their digits.
    # Callers centre as (x - K) - mean_shifted, never x - (K + mean_shifted).
    c = tl.arange(0, BLOCK_C)
    zero = tl.sum(tl.zeros([BLOCK_C], dtype=COMPUTE), axis=0)
    shift = zero
    if IS_RMS:
        acc2 = tl.zeros([BLOCK_C], dtype=COMPUTE)
        for start in range(0, cols, BLOCK_C):
            m = start + c < cols
            x = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            acc2 += x * x
        ms = zero
        var = tl.sum(acc2, axis=0) / cols
    else:
        shift = tl.load(x_ptr + row_off).to(COMPUTE)
        mean = tl.zeros([BLOCK_C], dtype=COMPUTE)
        m2 = tl.zeros([BLOCK_C], dtype=COMPUTE)
        k = zero
        for start in range(0, cols, BLOCK_C):
            m = start + c < cols
            xs = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE) - shift
            k += 1.0
            delta = tl.where(m, xs - mean, 0.0)
            mean += delta * (1.0 / k)
            m2 += delta * tl.where(m, xs - mean, 0.0)
        n = ((cols - c + BLOCK_C - 1) // BLOCK_C).to(COMPUTE)  # values lane j saw
        n = tl.where(c < cols, n, 0.0)
        ms = tl.sum(n * mean, axis=0) / cols
        d = mean - ms
        var = (tl.sum(m2, axis=0) + tl.sum(n * d * d, axis=0)) / cols
    rstd = _inv_sqrt(var + eps)
    return shift, ms, rstd


@triton.jit
def norm_fwd_looped_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STATS: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    row = tl.program_id(0)
    if INT64:
        row = row.to(tl.int64)
    row_off = row * cols
    shift, ms, rstd = _row_stats(x_ptr, row_off, cols, eps, IS_RMS, COMPUTE, BLOCK_C)
    c = tl.arange(0, BLOCK_C)
    for start in range(0, cols, BLOCK_C):
        m = start + c < cols
        x = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
        y = ((x - shift) - ms) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + start + c, mask=m, other=0.0).to(COMPUTE)
        if HAS_B:
            y = y + tl.load(b_ptr + start + c, mask=m, other=0.0).to(COMPUTE)
        tl.store(y_ptr + row_off + start + c, y.to(y_ptr.dtype.element_ty), mask=m)
    if STATS:
        tl.store(rstd_ptr + row, rstd)
        if not IS_RMS:
            tl.store(mean_ptr + row, shift + ms)


@triton.jit
def norm_bwd_looped_kernel(
    dy_ptr, x_ptr, w_ptr, dres_ptr, dx_ptr, dw_part_ptr, db_part_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DRES: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    # Grid-stride over rows; this program's partial dw/db live in row ``pid``
    # of the zero-initialized partial buffers (owned by it alone: no races).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    c = tl.arange(0, BLOCK_C)
    if INT64:
        part = pid.to(tl.int64) * cols
    else:
        part = pid * cols
    for row in range(pid, rows, nprog):
        if INT64:
            row_off = row.to(tl.int64) * cols
        else:
            row_off = row * cols
        shift, ms, rstd = _row_stats(x_ptr, row_off, cols, eps, IS_RMS, COMPUTE, BLOCK_C)
        # Sweep 1: the row constants mean(g * xhat) and mean(g).
        acc1 = tl.zeros([BLOCK_C], dtype=COMPUTE)
        acc2 = tl.zeros([BLOCK_C], dtype=COMPUTE)
        for start in range(0, cols, BLOCK_C):
            m = start + c < cols
            x = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            dy = tl.load(dy_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            xhat = tl.where(m, ((x - shift) - ms) * rstd, 0.0)
            if HAS_W:
                g = dy * tl.load(w_ptr + start + c, mask=m, other=0.0).to(COMPUTE)
            else:
                g = dy
            acc1 += g * xhat
            acc2 += g
        c1 = tl.sum(acc1, axis=0) / cols
        c2 = tl.sum(acc2, axis=0) / cols
        # Sweep 2: dx, and this row's share of dw/db.
        for start in range(0, cols, BLOCK_C):
            m = start + c < cols
            x = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            dy = tl.load(dy_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            xhat = tl.where(m, ((x - shift) - ms) * rstd, 0.0)
            if HAS_W:
                g = dy * tl.load(w_ptr + start + c, mask=m, other=0.0).to(COMPUTE)
            else:
                g = dy
            if IS_RMS:
                dx = (g - xhat * c1) * rstd
            else:
                dx = (g - xhat * c1 - c2) * rstd
            if HAS_DRES:
                dx += tl.load(dres_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
            tl.store(dx_ptr + row_off + start + c, dx.to(dx_ptr.dtype.element_ty), mask=m)
            if HAS_W:
                p = tl.load(dw_part_ptr + part + start + c, mask=m, other=0.0)
                tl.store(dw_part_ptr + part + start + c, p + dy * xhat, mask=m)
            if HAS_B:
                p = tl.load(db_part_ptr + part + start + c, mask=m, other=0.0)
                tl.store(db_part_ptr + part + start + c, p + dy, mask=m)


# ---------------------------------------------------------------------------
# Launch helpers. All tensors are contiguous; x/dy/y/dx/res/s are [rows, cols].
# ---------------------------------------------------------------------------
def compute_dtype(dtype):
    """The dtype arithmetic (and the saved stats, and dw/db partials) use."""
    import torch

    return tl.float64 if dtype == torch.float64 else tl.float32


def torch_compute_dtype(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def _warps_for_bytes(nbytes: int, lo: int, hi: int) -> int:
    # About 64 bytes of loads per thread: four 16-byte vector loads in flight.
    w = triton.next_power_of_2(max(1, nbytes // 2048))
    return max(lo, min(hi, w))


def row_default_config(rows: int, cols: int, elem_bytes: int = 2) -> dict:
    """Rows per program for a tile of about 4096 elements; warps by tile size.

    Warps are the larger of the element rule (measured at 90-99 % of roofline
    for bf16 on the H200) and the byte rule (64 bytes of loads per thread): a
    4-byte dtype doubles the bytes per element, so fp32 / fp64 tiles of 8192+
    elements get 16 warps instead of 8 and keep the bf16 load shape (four
    16-byte loads per thread) rather than eight.
    """
    bc = triton.next_power_of_2(max(cols, 1))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(rows, 1)), 16))
    tile = br * bc
    warps = 16 if tile >= 16384 else 8 if tile >= 4096 else 4 if tile >= 1024 else 2 if tile >= 256 else 1
    if tile >= 4096:
        warps = max(warps, _warps_for_bytes(tile * elem_bytes, 1, 16))
    return {"BLOCK_R": br, "num_warps": warps}


def row_backward_default_config(rows: int, cols: int, elem_bytes: int = 2) -> dict:
    """The forward's tile, with about 256 elements a warp (up to 32 warps).

    The backward holds x, dy, w, the dw/db accumulators and temporaries per
    element: with the forward's warps ptxas (sm_90a) spills from 8192 columns
    on (8 warps: 255 registers and 256 bytes of spill stores, 1012 with the
    fused residual gradient); 32 warps cut that to 120 / 280 bytes at 8192
    and halve it at 16384, and 4096-column tiles fit without spills at 16.
    """
    cfg = row_default_config(rows, cols, elem_bytes)
    tile = cfg["BLOCK_R"] * triton.next_power_of_2(max(cols, 1))
    cfg["num_warps"] = max(cfg["num_warps"], min(32, triton.next_power_of_2(max(1, tile // 256))))
    return cfg


def split_pieces(cols: int, chunk: int) -> int:
    return -(-cols // chunk)


def split_default_config(rows: int, cols: int, elem_bytes: int = 2, sms: int = 132) -> dict:
    """Pieces of 8192 columns (16 values a thread at 16 warps for fp32), halved
    down to ``SPLIT_MIN_CHUNK`` until there are at least four programs per SM."""
    chunk = min(8192, triton.next_power_of_2(max(cols, 1)))
    chunk = max(chunk, SPLIT_MIN_CHUNK) if cols >= SPLIT_MIN_CHUNK else triton.next_power_of_2(max(cols, 1))
    while chunk > SPLIT_MIN_CHUNK and rows * split_pieces(cols, chunk) < 4 * sms:
        chunk //= 2
    return {"CHUNK": chunk, "num_warps": _warps_for_bytes(chunk * elem_bytes, 4, 16)}


def looped_default_config(rows: int, cols: int) -> dict:
    return {"BLOCK_C": 4096, "num_warps": 8}


def needs_int64(rows: int, cols: int, block: int) -> bool:
    """True when an offset (plus one block of masked slack) can pass int32."""
    return rows * cols + block >= _INT32_MAX


_int64 = needs_int64


def _res_args(x, res, s):
    if (res is None) != (s is None):
        raise ValueError("kernels.norm: res and s (the new residual) come together")
    return (res, s) if res is not None else (x, x)


def fwd_row_options(rows: int, cols: int, dtype, is_rms: bool, has_res: bool, has_w: bool, has_b: bool,
                    stats: bool, config: dict) -> tuple[tuple, dict]:
    """The grid and keyword arguments of ``norm_fwd_row_kernel``: all fixed by
    the shapes, so a pre-bound launcher (``ops.norm``) computes them once."""
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    return (triton.cdiv(rows, br),), dict(
        IS_RMS=is_rms, HAS_RES=has_res, HAS_W=has_w, HAS_B=has_b, STATS=stats,
        COMPUTE=compute_dtype(dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=needs_int64(rows, cols, br * bc), num_warps=config.get("num_warps", 4))


def launch_fwd_row(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict, res=None, s=None) -> None:
    """``res``/``s`` (optional): residual to add and the new residual ``x + res`` to write."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    res_, s_ = _res_args(x, res, s)
    stats = rstd is not None
    grid, kw = fwd_row_options(rows, cols, x.dtype, is_rms, res is not None, w is not None, b is not None, stats,
                               config)
    launch(norm_fwd_row_kernel, grid,
           x, res_, s_, y, w if w is not None else x, b if b is not None else x,
           mean if mean is not None else (rstd if stats else y), rstd if stats else y,
           rows, cols, eps, **kw)


def launch_fwd_split(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict, res=None, s=None) -> None:
    """Two passes over ``CHUNK``-column pieces (see the module docstring)."""
    import torch

    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    res_, s_ = _res_args(x, res, s)
    chunk = min(config.get("CHUNK", 8192), triton.next_power_of_2(cols))
    pieces = split_pieces(cols, chunk)
    programs = rows * pieces
    if programs > _INT32_MAX:
        raise ValueError(f"kernels.norm: {rows} rows x {pieces} pieces exceed the grid; use a larger CHUNK")
    part = torch.empty(programs * 2, dtype=torch_compute_dtype(x.dtype), device=x.device)
    int64 = needs_int64(rows, cols, chunk)
    warps = config.get("num_warps", 8)
    ct = compute_dtype(x.dtype)
    launch(norm_split_stats_kernel, (programs,),
        x, res_, s_, part, rows, cols, pieces,
        IS_RMS=is_rms, HAS_RES=res is not None, COMPUTE=ct, CHUNK=chunk, INT64=int64, num_warps=warps,
    )
    stats = rstd is not None
    launch(norm_split_apply_kernel, (programs,),
        s if s is not None else x, y, w if w is not None else x, b if b is not None else x, part,
        mean if mean is not None else (rstd if stats else y), rstd if stats else y,
        rows, cols, pieces, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=b is not None, STATS=stats, COMPUTE=ct, CHUNK=chunk,
        PBLOCK=min(_PART_BLOCK, triton.next_power_of_2(pieces)), INT64=int64, num_warps=warps,
    )


def wave_default_config(rows: int, cols: int, elem_bytes: int = 2) -> dict:
    """Pieces of 4096 columns with 4 warps, waves of about 4 MiB of input
    (``wave_rows_for``): the fastest for both norms at 1024x262144 bf16 on the
    H200 (67-77 % of copy, 1.7x torch eager; 2026-12-02, rows_scan.py)."""
    chunk = min(4096, triton.next_power_of_2(max(cols, 1)))
    return {"CHUNK": chunk, "num_warps": max(1, min(4, chunk // 1024)), "WAVE_ROWS": wave_rows_for(cols * elem_bytes)}


def launch_fwd_wave(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict) -> None:
    """The split forward in one grid (see ``norm_wave_kernel``); no residual."""
    import torch

    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    chunk = min(config.get("CHUNK", 8192), triton.next_power_of_2(cols))
    pieces = split_pieces(cols, chunk)
    wave_rows, waves, programs = wave_plan(rows, pieces, config.get("WAVE_ROWS", 32))
    if programs > _INT32_MAX:
        raise ValueError(f"kernels.norm: {rows} rows x {pieces} pieces exceed the grid; use a larger CHUNK")
    n = wave_rows * pieces
    pblock = min(_PART_BLOCK, triton.next_power_of_2(pieces))
    packed = bool(config.get("PACKED", 1)) and x.dtype != torch.float64 and pblock >= pieces
    if packed:
        words = pending_words(waves * n, x.device)
        part, count = words.view(torch.float32), words  # the same memory: (lo, hi) = part[2i], part[2i + 1]
    else:
        part = torch.empty(waves * n * 2, dtype=torch_compute_dtype(x.dtype), device=x.device)
        words, count = part, wave_counters(waves, x.device)
    stats = rstd is not None
    launch(norm_wave_kernel, (programs,),
        x, y, w if w is not None else x, b if b is not None else x, part,
        mean if mean is not None else (rstd if stats else y), rstd if stats else y, count, words,
        rows, cols, pieces, eps, n, waves,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=b is not None, STATS=stats, COMPUTE=compute_dtype(x.dtype),
        CHUNK=chunk, PBLOCK=pblock, INT64=needs_int64(waves * wave_rows, cols, chunk), PACKED=packed,
        num_warps=config.get("num_warps", 8),
    )


def launch_fwd_looped(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    bc = min(config.get("BLOCK_C", 4096), triton.next_power_of_2(cols))
    stats = rstd is not None
    launch(norm_fwd_looped_kernel, (rows,),
        x, y, w if w is not None else x, b if b is not None else x,
        mean if mean is not None else (rstd if stats else y), rstd if stats else y,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=b is not None, STATS=stats,
        COMPUTE=compute_dtype(x.dtype), BLOCK_C=bc,
        INT64=needs_int64(rows, cols, bc), num_warps=config.get("num_warps", 8),
    )


def backward_programs(rows_or_tiles: int, device, config: dict) -> int:
    """How many programs (= rows of the dw/db partial buffer) the backward uses."""
    if "PROGRAMS" in config:
        p = config["PROGRAMS"]
    elif getattr(device, "type", "cpu") == "cuda":
        import torch

        p = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        p = 4
    return max(1, min(p, rows_or_tiles))


def launch_bwd_row(dy, x, w, dx, dw_part, db_part, eps: float, is_rms: bool, has_b: bool,
                   programs: int, config: dict, dres=None) -> None:
    """``dw_part``/``db_part``: [programs, cols] in the compute dtype (or None).
    ``dres`` (optional): a gradient added to ``dx`` (the fused residual's)."""
    rows, cols = x.shape
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    launch(norm_bwd_row_kernel, (programs,),
        dy, x, w if w is not None else x, dres if dres is not None else dy, dx,
        dw_part if dw_part is not None else dx, db_part if db_part is not None else dx,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=has_b, HAS_DRES=dres is not None,
        COMPUTE=compute_dtype(x.dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=needs_int64(max(rows, programs), cols, br * bc), num_warps=config.get("num_warps", 4),
    )


def launch_bwd_looped(dy, x, w, dx, dw_part, db_part, eps: float, is_rms: bool, has_b: bool,
                      programs: int, config: dict, dres=None) -> None:
    """``dw_part``/``db_part`` must be zero-initialized: programs accumulate into them."""
    rows, cols = x.shape
    bc = min(config.get("BLOCK_C", 4096), triton.next_power_of_2(cols))
    launch(norm_bwd_looped_kernel, (programs,),
        dy, x, w if w is not None else x, dres if dres is not None else dy, dx,
        dw_part if dw_part is not None else dx, db_part if db_part is not None else dx,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=has_b, HAS_DRES=dres is not None,
        COMPUTE=compute_dtype(x.dtype), BLOCK_C=bc,
        INT64=needs_int64(max(rows, programs), cols, bc), num_warps=config.get("num_warps", 8),
    )
