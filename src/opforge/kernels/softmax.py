"""Softmax and log-softmax over the last dim of a 2-D ``[rows, cols]`` view.

Two strategies, each with a forward and a backward kernel:

* ``row``: the whole row lives in registers. A program owns a
  ``[BLOCK_R, BLOCK_C]`` tile with ``BLOCK_C = next_pow2(cols)`` (up to
  ``ROW_LIMIT``) and ``BLOCK_R`` rows (several short rows per program, one long
  one). One read, one write: the bandwidth floor.
* ``online``: any row length. One program per row walks the row in column
  blocks of ``BLOCK``, keeping a running max ``m`` and a running sum ``s`` of
  ``exp(x - m)`` (rescaled by ``exp(m_old - m_new)`` when the max grows), then
  a second pass writes the output. Reads the row twice; the row never has to
  fit on chip, so any row length works.
* ``col``: softmax over a dim that is not innermost, of a contiguous tensor
  seen as ``[outer, R, inner]``: a program owns ``BLOCK_I`` adjacent columns
  (loads coalesced along ``inner``) and runs the online recurrence down ``R``,
  then writes. No transpose copy; reads twice (the second read mostly from L2).
  ``col_split`` cuts ``R`` into chunks held in registers by cooperating
  programs, as ``split`` does for rows: one read, one write, and enough
  programs when ``outer * inner`` is small.
* ``split``: a long row is cut into ``P`` chunks of ``CHUNK`` columns, one
  program each (``rows * P`` programs fill the GPU even when rows are few).
  A program keeps its chunk in registers, publishes the chunk's max and sum
  to a ``[rows, P]`` workspace, waits at a per-row barrier (an atomic arrival
  counter), combines the row's ``P`` partials and writes its chunk: one read,
  one write, like the row kernel, for rows up to ``SPLIT_MAX_PARTS * CHUNK``.
  The barrier is safe because programs start in launch order and a row's
  ``P <= 64`` programs are far fewer than the GPU holds at once. The Triton
  interpreter runs programs one by one, so there the split kernel only takes
  rows that fit one chunk.

Arithmetic runs in fp32 for 16-bit floats and fp32, fp64 for fp64; results
are rounded once, at the store. The max is subtracted before ``exp`` (1e4 does
not overflow). NaN and infinities behave as in torch: a NaN or a +inf in a
row makes the row NaN; a row of all -inf is NaN (0/0). A -inf running max is
replaced by 0 when rescaling, so leading blocks of -inf (masked positions) do
not poison a row that has finite values later.

Backward: ``dx = y * (dy - sum(dy * y))`` for softmax and
``dx = dy - exp(y) * sum(dy)`` for log-softmax, ``y`` the forward output.

Each input has its own row stride (the column stride is 1); the output is a
dense ``[rows, cols]``. Offsets are 64-bit when any tensor reaches 2^31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.kernels.waves import (pending_words, wave_arrive, wave_counters, wave_gather_pairs, wave_plan,
                                  wave_publish_pair, wave_role, wave_rows_for, wave_wait)
from opforge.runtime.launch import launch

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROW_VERSION = "1"
ONLINE_VERSION = "1"
SPLIT_VERSION = "2"
WAVE_VERSION = "2"
COL_VERSION = "2"
COL_SPLIT_VERSION = "2"

# Most programs one row may be split into: far below the programs the GPU
# holds at once (132 SMs, at least one program each), so a row's programs are
# always co-resident and the barrier cannot deadlock.
SPLIT_MAX_PARTS = 64

# Longest row the row-resident kernels take (values are fp32 in registers).
ROW_LIMIT = 16384

_NEG_INF = tl.constexpr(float("-inf"))


# ---------------------------------------------------------------------------
# Row-resident kernels
# ---------------------------------------------------------------------------
@triton.jit
def _row_tile(pid, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """Program ``pid``'s rows, the columns of a whole row, and the tile's mask."""
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    return r, c, (r[:, None] < rows) & (c[None, :] < cols)


@triton.jit
def row_forward_kernel(
    x_ptr, y_ptr, rows, cols, sx, sy,
    LOG: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    r, c, mask = _row_tile(tl.program_id(0), rows, cols, BLOCK_R, BLOCK_C, INT64)
    x = tl.load(x_ptr + r[:, None] * sx + c[None, :], mask=mask, other=_NEG_INF).to(COMPUTE)
    m = tl.max(x, axis=1)
    z = x - m[:, None]
    e = tl.exp(z)
    s = tl.sum(e, axis=1)
    if LOG:
        out = z - tl.log(s)[:, None]
    else:
        out = e / s[:, None]
    tl.store(y_ptr + r[:, None] * sy + c[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_backward_kernel(
    g_ptr, y_ptr, dx_ptr, rows, cols, sg, sy, sdx,
    LOG: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    r, c, mask = _row_tile(tl.program_id(0), rows, cols, BLOCK_R, BLOCK_C, INT64)
    g = tl.load(g_ptr + r[:, None] * sg + c[None, :], mask=mask, other=0.0).to(COMPUTE)
    y = tl.load(y_ptr + r[:, None] * sy + c[None, :], mask=mask, other=0.0).to(COMPUTE)
    if LOG:
        s = tl.sum(g, axis=1)
        dx = g - tl.exp(y) * s[:, None]
    else:
        s = tl.sum(g * y, axis=1)
        dx = y * (g - s[:, None])
    tl.store(dx_ptr + r[:, None] * sdx + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Online (long-row) kernels: one program per row, column blocks of BLOCK
# ---------------------------------------------------------------------------
@triton.jit
def online_forward_kernel(
    x_ptr, y_ptr, cols, sx, sy,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    row = tl.program_id(0)
    if INT64:
        row = row.to(tl.int64)
    x_row = x_ptr + row * sx
    y_row = y_ptr + row * sy
    offs = tl.arange(0, BLOCK)
    m = tl.full([1], float("-inf"), COMPUTE)
    s = tl.zeros([1], dtype=COMPUTE)
    # Pass 1: running max and running sum of exp(x - max).
    for start in range(0, cols, BLOCK):
        c = start + offs
        x = tl.load(x_row + c, mask=c < cols, other=_NEG_INF).to(COMPUTE)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # All -inf so far: subtract 0 instead (exp(-inf - -inf) would be NaN).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub), axis=0)
        m = m_new
    # Pass 2: write. A row of all -inf has m = -inf: x - m is NaN, as in torch.
    if LOG:
        shift = m + tl.log(s)
    else:
        inv = 1.0 / s
    for start in range(0, cols, BLOCK):
        c = start + offs
        mask = c < cols
        x = tl.load(x_row + c, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            out = x - shift
        else:
            out = tl.exp(x - m) * inv
        tl.store(y_row + c, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def online_backward_kernel(
    g_ptr, y_ptr, dx_ptr, cols, sg, sy, sdx,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    row = tl.program_id(0)
    if INT64:
        row = row.to(tl.int64)
    g_row = g_ptr + row * sg
    y_row = y_ptr + row * sy
    dx_row = dx_ptr + row * sdx
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=COMPUTE)
    for start in range(0, cols, BLOCK):
        c = start + offs
        mask = c < cols
        g = tl.load(g_row + c, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            acc += g
        else:
            y = tl.load(y_row + c, mask=mask, other=0.0).to(COMPUTE)
            acc += g * y
    s = tl.sum(acc, axis=0)
    for start in range(0, cols, BLOCK):
        c = start + offs
        mask = c < cols
        g = tl.load(g_row + c, mask=mask, other=0.0).to(COMPUTE)
        y = tl.load(y_row + c, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            dx = g - tl.exp(y) * s
        else:
            dx = y * (g - s)
        tl.store(dx_row + c, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Split (cooperative) kernels: a row is cut into P chunks, one program each;
# the chunk stays in registers while the P programs of a row exchange their
# partial statistics through a small workspace. One read, one write.
# ---------------------------------------------------------------------------
@triton.jit
def _row_barrier(count_ptr, row, P):
    """Wait until all P programs of ``row`` have published their partials.

    The release on the increment orders the partial stores before it; the
    acquire on the polls orders the partial loads after it. All P programs
    of a row are co-resident because programs start in launch order and
    P is far below the number that fit on the GPU (see ``split_parts``).
    """
    tl.atomic_add(count_ptr + row, 1, sem="release")
    arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    while arrived < P:
        arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")


@triton.jit
def _row_chunk(pid, P, cols, CHUNK: tl.constexpr, INT64: tl.constexpr):
    """Program ``pid``'s row, its part of the row, and that part's columns and mask."""
    row = pid // P
    part = pid % P
    if INT64:
        row = row.to(tl.int64)
    c = part * CHUNK + tl.arange(0, CHUNK)
    return row, part, c, c < cols


@triton.jit
def split_forward_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, count_ptr, cols, sx, sy, P,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr, P_BLOCK: tl.constexpr,
    INT64: tl.constexpr,
):
    row, part, c, mask = _row_chunk(tl.program_id(0), P, cols, CHUNK, INT64)
    x = tl.load(x_ptr + row * sx + c, mask=mask, other=_NEG_INF).to(COMPUTE)
    m = tl.max(x, axis=0)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m_sub)  # kept: the output is e rescaled, one exp per element
    s = tl.sum(e, axis=0)
    tl.store(m_ptr + row * P + part, m)
    tl.store(s_ptr + row * P + part, s)
    _row_barrier(count_ptr, row, P)
    # Combine the row's P partials (every program of the row does the same sum,
    # in the same order: the result is identical across the row).
    p = tl.arange(0, P_BLOCK)
    ms = tl.load(m_ptr + row * P + p, mask=p < P, other=_NEG_INF, volatile=True)
    ss = tl.load(s_ptr + row * P + p, mask=p < P, other=0.0, volatile=True)
    big = tl.max(ms, axis=0)
    big_sub = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.where(ms == float("-inf"), 0.0, ss * tl.exp(ms - big_sub)), axis=0)
    if LOG:
        # A row of all -inf has big = -inf: x - big is NaN, as in torch.
        out = x - (big + tl.log(total))
    else:
        # exp(m - big) is 0 for a chunk of all -inf, and 0 / 0 = NaN for a row
        # of all -inf, as in torch.
        out = e * (tl.exp(m - big_sub) / total)
    tl.store(y_ptr + row * sy + c, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def split_backward_kernel(
    g_ptr, y_ptr, dx_ptr, s_ptr, count_ptr, cols, sg, sy, sdx, P,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr, P_BLOCK: tl.constexpr,
    INT64: tl.constexpr,
):
    row, part, c, mask = _row_chunk(tl.program_id(0), P, cols, CHUNK, INT64)
    g = tl.load(g_ptr + row * sg + c, mask=mask, other=0.0).to(COMPUTE)
    y = tl.load(y_ptr + row * sy + c, mask=mask, other=0.0).to(COMPUTE)
    if LOG:
        s = tl.sum(g, axis=0)
    else:
        s = tl.sum(g * y, axis=0)
    tl.store(s_ptr + row * P + part, s)
    _row_barrier(count_ptr, row, P)
    p = tl.arange(0, P_BLOCK)
    total = tl.sum(tl.load(s_ptr + row * P + p, mask=p < P, other=0.0, volatile=True), axis=0)
    if LOG:
        dx = g - tl.exp(y) * total
    else:
        dx = y * (g - total)
    tl.store(dx_ptr + row * sdx + c, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Wave kernel (forward): a long row cut into P pieces, stats and apply
# programs interleaved by waves of rows (``kernels.waves``): one HBM read,
# the second touch of a piece an L2 hit, no program holding a piece while it
# waits.
# ---------------------------------------------------------------------------
@triton.jit
def wave_forward_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, count_ptr, rows, cols, sx, sy, P, n, W,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr, P_BLOCK: tl.constexpr,
    INT64: tl.constexpr, PACKED: tl.constexpr = False,
):
    """PACKED (fp32): ``m_ptr`` holds each piece's (max, sum) as one int64 word
    (``waves.wave_publish_pair``); else separate arrays and the wave counter."""
    is_stats, wave, idx = wave_role(tl.program_id(0), n, W)
    slot = wave * n + idx  # [waves * wave_rows, P] partials: row-major by (row, part)
    row = slot // P
    part = slot - row * P
    if INT64:
        row = row.to(tl.int64)
    c = part * CHUNK + tl.arange(0, CHUNK)
    mask = (c < cols) & (row < rows)
    if is_stats:
        # evict_last: the apply program re-reads the piece about one wave later.
        x = tl.load(x_ptr + row * sx + c, mask=mask, other=_NEG_INF, eviction_policy="evict_last").to(COMPUTE)
        m = tl.max(x, axis=0)
        m_sub = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.exp(x - m_sub), axis=0)
        if PACKED:
            wave_publish_pair(m_ptr + slot, m, s)
        else:
            tl.store(m_ptr + slot, m)
            tl.store(s_ptr + slot, s)
            wave_arrive(count_ptr, wave)
    else:
        # Issued before the wait: the piece comes from L2 while the stats land.
        x = tl.load(x_ptr + row * sx + c, mask=mask, other=_NEG_INF, eviction_policy="evict_first").to(COMPUTE)
        p = tl.arange(0, P_BLOCK)
        first = slot - part
        if PACKED:
            ms, ss = wave_gather_pairs(m_ptr + first + p, p < P)
            ms = tl.where(p < P, ms, float("-inf"))
        else:
            wave_wait(count_ptr, wave, n)
            ms = tl.load(m_ptr + first + p, mask=p < P, other=_NEG_INF, volatile=True)
            ss = tl.load(s_ptr + first + p, mask=p < P, other=0.0, volatile=True)
        big = tl.max(ms, axis=0)
        big_sub = tl.where(big == float("-inf"), 0.0, big)
        total = tl.sum(tl.where(ms == float("-inf"), 0.0, ss * tl.exp(ms - big_sub)), axis=0)
        if LOG:
            # A row of all -inf has big = -inf: x - big is NaN, as in torch.
            out = x - (big + tl.log(total))
        else:
            # 0 / 0 = NaN for a row of all -inf, as in torch.
            out = tl.exp(x - big_sub) / total
        tl.store(y_ptr + row * sy + c, out.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


# ---------------------------------------------------------------------------
# Column kernels: softmax over a dim that is not innermost, of a contiguous
# tensor seen as [outer, R, inner]. A program owns BLOCK_I adjacent columns
# (coalesced along inner) and walks R in blocks of BLOCK_R rows.
# ---------------------------------------------------------------------------
@triton.jit
def _col_tile(tile, n_tiles, R, inner, BLOCK_I: tl.constexpr, INT64: tl.constexpr):
    """Column tile ``tile`` of [outer, R, inner]: its outer slice's base offset and its columns."""
    o = tile // n_tiles
    i = (tile % n_tiles) * BLOCK_I + tl.arange(0, BLOCK_I)
    if INT64:
        o = o.to(tl.int64)
    return o * R * inner, i


@triton.jit
def _col_block(base, i, r, R, inner, INT64: tl.constexpr):
    """Offsets and mask of rows ``r`` (a vector) of columns ``i``."""
    if INT64:
        r = r.to(tl.int64)
    return base + r[:, None] * inner + i[None, :], (r[:, None] < R) & (i[None, :] < inner)


@triton.jit
def col_forward_kernel(
    x_ptr, y_ptr, R, inner, n_tiles,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
    INT64: tl.constexpr,
):
    base, i = _col_tile(tl.program_id(0), n_tiles, R, inner, BLOCK_I, INT64)
    rr = tl.arange(0, BLOCK_R)
    m = tl.full([BLOCK_I], float("-inf"), COMPUTE)
    s = tl.zeros([BLOCK_I], dtype=COMPUTE)
    for r0 in range(0, R, BLOCK_R):
        offs, mask = _col_block(base, i, r0 + rr, R, inner, INT64)
        x = tl.load(x_ptr + offs, mask=mask, other=_NEG_INF).to(COMPUTE)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub[None, :]), axis=0)
        m = m_new
    if LOG:
        shift = m + tl.log(s)
    else:
        inv = 1.0 / s
    for r0 in range(0, R, BLOCK_R):
        offs, mask = _col_block(base, i, r0 + rr, R, inner, INT64)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            out = x - shift[None, :]
        else:
            out = tl.exp(x - m[None, :]) * inv[None, :]
        tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def col_backward_kernel(
    g_ptr, y_ptr, dx_ptr, R, inner, n_tiles,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
    INT64: tl.constexpr,
):
    base, i = _col_tile(tl.program_id(0), n_tiles, R, inner, BLOCK_I, INT64)
    rr = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=COMPUTE)
    for r0 in range(0, R, BLOCK_R):
        offs, mask = _col_block(base, i, r0 + rr, R, inner, INT64)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            acc += g
        else:
            acc += g * tl.load(y_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    total = tl.sum(acc, axis=0)
    for r0 in range(0, R, BLOCK_R):
        offs, mask = _col_block(base, i, r0 + rr, R, inner, INT64)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        if LOG:
            dx = g - tl.exp(y) * total[None, :]
        else:
            dx = y * (g - total[None, :])
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def col_split_forward_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, count_ptr, R, inner, n_tiles, P,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, CHUNK_R: tl.constexpr, BLOCK_I: tl.constexpr,
    P_BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    """The column tile's R rows cut into P chunks of CHUNK_R, one program each,
    exchanging per-column partials through a [groups, P, BLOCK_I] workspace."""
    pid = tl.program_id(0)
    group = pid // P
    part = pid % P
    base, i = _col_tile(group, n_tiles, R, inner, BLOCK_I, INT64)
    offs, mask = _col_block(base, i, part * CHUNK_R + tl.arange(0, CHUNK_R), R, inner, INT64)
    x = tl.load(x_ptr + offs, mask=mask, other=_NEG_INF).to(COMPUTE)
    m = tl.max(x, axis=0)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m_sub[None, :])
    cols = tl.arange(0, BLOCK_I)
    slot = (group * P + part) * BLOCK_I + cols
    tl.store(m_ptr + slot, m)
    tl.store(s_ptr + slot, tl.sum(e, axis=0))
    _row_barrier(count_ptr, group, P)
    p = tl.arange(0, P_BLOCK)
    slots = (group * P + p[:, None]) * BLOCK_I + cols[None, :]
    ms = tl.load(m_ptr + slots, mask=p[:, None] < P, other=_NEG_INF, volatile=True)
    ss = tl.load(s_ptr + slots, mask=p[:, None] < P, other=0.0, volatile=True)
    big = tl.max(ms, axis=0)
    big_sub = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.where(ms == float("-inf"), 0.0, ss * tl.exp(ms - big_sub[None, :])), axis=0)
    if LOG:
        out = x - (big + tl.log(total))[None, :]
    else:
        out = e * (tl.exp(m - big_sub) / total)[None, :]
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def col_split_backward_kernel(
    g_ptr, y_ptr, dx_ptr, s_ptr, count_ptr, R, inner, n_tiles, P,
    LOG: tl.constexpr, COMPUTE: tl.constexpr, CHUNK_R: tl.constexpr, BLOCK_I: tl.constexpr,
    P_BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    group = pid // P
    part = pid % P
    base, i = _col_tile(group, n_tiles, R, inner, BLOCK_I, INT64)
    offs, mask = _col_block(base, i, part * CHUNK_R + tl.arange(0, CHUNK_R), R, inner, INT64)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    if LOG:
        s = tl.sum(g, axis=0)
    else:
        s = tl.sum(g * y, axis=0)
    cols = tl.arange(0, BLOCK_I)
    tl.store(s_ptr + (group * P + part) * BLOCK_I + cols, s)
    _row_barrier(count_ptr, group, P)
    p = tl.arange(0, P_BLOCK)
    slots = (group * P + p[:, None]) * BLOCK_I + cols[None, :]
    total = tl.sum(tl.load(s_ptr + slots, mask=p[:, None] < P, other=0.0, volatile=True), axis=0)
    if LOG:
        dx = g - tl.exp(y) * total[None, :]
    else:
        dx = y * (g - total[None, :])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Launch helpers. Tensors are 2-D [rows, cols] with stride(1) == 1.
# ---------------------------------------------------------------------------
_INT32_MAX = 2**31 - 1


def compute_dtype(dtype):
    """fp32 for 16-bit floats and fp32, fp64 for fp64."""
    import torch

    return tl.float64 if dtype == torch.float64 else tl.float32


def _needs_int64(rows: int, cols: int, tensors, tile: int) -> bool:
    reach = max((rows - 1) * abs(t.stride(0)) for t in tensors) + cols
    return reach + tile > _INT32_MAX


def row_default_config(rows: int, cols: int) -> dict:
    bc = triton.next_power_of_2(max(cols, 1))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(rows, 1)), 64))
    tile = br * bc
    warps = 4 if tile <= 2048 else (8 if tile <= 8192 else 16)
    return {"BLOCK_R": br, "num_warps": warps}


def row_configs(rows: int, cols: int) -> list[dict]:
    bc = triton.next_power_of_2(max(cols, 1))
    out = []
    for br in (1, 2, 4, 8, 16, 32):
        if br * bc > 16384 or (br > 1 and br * bc < 256 and br > rows):
            continue
        for w in (2, 4, 8, 16):
            if 32 * w <= max(br * bc, 64) and br * bc // (32 * w) <= 64:
                out.append({"BLOCK_R": br, "num_warps": w})
    return out or [row_default_config(rows, cols)]


def online_default_config(rows: int, cols: int) -> dict:
    block = min(4096, triton.next_power_of_2(max(cols, 1)))
    return {"BLOCK": block, "num_warps": 8 if block >= 2048 else 4}


def online_configs(rows: int, cols: int) -> list[dict]:
    return [{"BLOCK": b, "num_warps": w} for b in (1024, 2048, 4096, 8192) for w in (4, 8, 16)
            if b // (32 * w) >= 4]


def row_options(rows: int, cols: int, row_strides, dtype, log: bool, config: dict) -> tuple[tuple, dict]:
    """The grid and keyword arguments of the row kernels: all fixed by the
    shapes and strides, so a pre-bound launcher (``ops.softmax``) computes them once."""
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    reach = max((rows - 1) * abs(s) for s in row_strides) + cols
    return (triton.cdiv(rows, br),), dict(
        LOG=log, COMPUTE=compute_dtype(dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=reach + br * bc > _INT32_MAX, num_warps=config.get("num_warps", 4))


def launch_row_forward(x, y, log: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    grid, kw = row_options(rows, cols, (x.stride(0), y.stride(0)), y.dtype, log, config)
    launch(row_forward_kernel, grid, x, y, rows, cols, x.stride(0), y.stride(0), **kw)


def launch_row_backward(g, y, dx, log: bool, config: dict) -> None:
    rows, cols = g.shape
    if rows == 0 or cols == 0:
        return
    grid, kw = row_options(rows, cols, (g.stride(0), y.stride(0), dx.stride(0)), dx.dtype, log, config)
    launch(row_backward_kernel, grid, g, y, dx, rows, cols, g.stride(0), y.stride(0), dx.stride(0), **kw)


def launch_online_forward(x, y, log: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    launch(online_forward_kernel, (rows,),
        x, y, cols, x.stride(0), y.stride(0),
        LOG=log, COMPUTE=compute_dtype(y.dtype), BLOCK=block,
        INT64=_needs_int64(rows, cols, (x, y), block), num_warps=config.get("num_warps", 8),
    )


def launch_online_backward(g, y, dx, log: bool, config: dict) -> None:
    rows, cols = g.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    launch(online_backward_kernel, (rows,),
        g, y, dx, cols, g.stride(0), y.stride(0), dx.stride(0),
        LOG=log, COMPUTE=compute_dtype(dx.dtype), BLOCK=block,
        INT64=_needs_int64(rows, cols, (g, y, dx), block), num_warps=config.get("num_warps", 8),
    )


def split_parts(cols: int, chunk: int) -> int:
    return triton.cdiv(max(cols, 1), chunk)


def split_default_config(rows: int, cols: int) -> dict:
    """Chunks of 8192 with 8 warps (32 values a thread): the fastest on the H200
    at 32768-262144 columns in bf16 and fp32 (benchmarks/sweep.py, 2026-11-29).
    Halved while the grid would not give every SM two programs."""
    chunk = min(8192, max(1024, triton.next_power_of_2(max(cols, 1))))
    while chunk > 1024 and rows * split_parts(cols, chunk) < 2 * 132:
        chunk //= 2
    while split_parts(cols, chunk) > SPLIT_MAX_PARTS:
        chunk *= 2
    return {"CHUNK": chunk, "num_warps": max(2, min(16, chunk // 1024))}


def split_configs(rows: int, cols: int) -> list[dict]:
    out = [{"CHUNK": ch, "num_warps": w} for ch in (1024, 2048, 4096, 8192, 16384) for w in (2, 4, 8, 16)
           if split_parts(cols, ch) <= SPLIT_MAX_PARTS and 4 <= ch // (32 * w) <= 64]
    return out or [split_default_config(rows, cols)]


def _split_workspace(numel: int, groups: int, n: int, dtype, device):
    """``n`` partial arrays of ``numel`` values and one arrival counter per group
    of cooperating programs."""
    import torch

    partials = [torch.empty(numel, dtype=dtype, device=device) for _ in range(n)]
    return partials, torch.zeros(groups, dtype=torch.int32, device=device)


def _check_parts(parts: int) -> None:
    from opforge.runtime.device import interpret_mode

    if parts > SPLIT_MAX_PARTS:
        raise ValueError(f"split softmax: {parts} parts per row exceed {SPLIT_MAX_PARTS}; use a larger CHUNK")
    if parts > 1 and interpret_mode():
        # The interpreter runs programs one after another: a barrier between
        # the programs of a row would wait forever.
        raise RuntimeError("split softmax: programs of a row wait for each other, which the Triton "
                           "interpreter cannot run; use CHUNK >= cols there")


def launch_split_forward(x, y, log: bool, config: dict) -> None:
    import torch

    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    chunk = config.get("CHUNK", 16384)
    parts = split_parts(cols, chunk)
    _check_parts(parts)
    (m, s), count = _split_workspace(rows * parts, rows, 2, torch.float64 if y.dtype == torch.float64 else torch.float32,
                                     x.device)
    launch(split_forward_kernel, (rows * parts,),
        x, y, m, s, count, cols, x.stride(0), y.stride(0), parts,
        LOG=log, COMPUTE=compute_dtype(y.dtype), CHUNK=chunk, P_BLOCK=triton.next_power_of_2(parts),
        INT64=_needs_int64(rows, cols, (x, y), chunk), num_warps=config.get("num_warps", 16),
    )


def launch_split_backward(g, y, dx, log: bool, config: dict) -> None:
    import torch

    rows, cols = g.shape
    if rows == 0 or cols == 0:
        return
    chunk = config.get("CHUNK", 16384)
    parts = split_parts(cols, chunk)
    _check_parts(parts)
    (s,), count = _split_workspace(rows * parts, rows, 1, torch.float64 if dx.dtype == torch.float64 else torch.float32,
                                   g.device)
    launch(split_backward_kernel, (rows * parts,),
        g, y, dx, s, count, cols, g.stride(0), y.stride(0), dx.stride(0), parts,
        LOG=log, COMPUTE=compute_dtype(dx.dtype), CHUNK=chunk, P_BLOCK=triton.next_power_of_2(parts),
        INT64=_needs_int64(rows, cols, (g, y, dx), chunk), num_warps=config.get("num_warps", 16),
    )


def wave_default_config(rows: int, cols: int, itemsize: int = 2) -> dict:
    """Pieces of 4096 values with 4 warps (32 a thread), waves of about 4 MiB
    (``wave_rows_for``): the fastest at 1024x65536 and 1024x262144 bf16 on the
    H200 (72-73 % of copy, 1.5x torch eager; 2026-12-02, rows_scan.py)."""
    chunk = min(triton.next_power_of_2(max(cols, 1)), 4096)
    return {"CHUNK": chunk, "num_warps": max(1, min(4, chunk // 1024)),
            "WAVE_ROWS": wave_rows_for(cols * itemsize)}


def wave_configs(rows: int, cols: int, itemsize: int = 2) -> list[dict]:
    return [{"CHUNK": ch, "num_warps": w, "WAVE_ROWS": wave_rows_for(cols * itemsize, t << 20)}
            for ch in (2048, 4096, 8192, 16384) for w in (4, 8, 16) for t in (2, 4, 8)
            if 4 <= ch // (32 * w) <= 64]


def launch_wave_forward(x, y, log: bool, config: dict) -> None:
    import torch

    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    chunk = config.get("CHUNK", 8192)
    parts = split_parts(cols, chunk)
    wave_rows, waves, programs = wave_plan(rows, parts, config.get("WAVE_ROWS", 32))
    n = wave_rows * parts
    packed = bool(config.get("PACKED", 1)) and y.dtype != torch.float64
    if packed:
        m = s = count = pending_words(waves * n, x.device)
    else:
        wide = torch.float64 if y.dtype == torch.float64 else torch.float32
        m = torch.empty(waves * n, dtype=wide, device=x.device)
        s = torch.empty(waves * n, dtype=wide, device=x.device)
        count = wave_counters(waves, x.device)
    launch(wave_forward_kernel, (programs,),
        x, y, m, s, count, rows, cols, x.stride(0), y.stride(0), parts, n, waves,
        LOG=log, COMPUTE=compute_dtype(y.dtype), CHUNK=chunk, P_BLOCK=triton.next_power_of_2(parts),
        INT64=_needs_int64(waves * wave_rows, cols, (x, y), chunk), PACKED=packed,
        num_warps=config.get("num_warps", 8),
    )


def col_default_config(outer: int, R: int, inner: int) -> dict:
    """Up to 128 columns a program, halved (down to 16) until every SM has two
    programs; about 2048 elements a block of rows."""
    bi = min(128, triton.next_power_of_2(max(inner, 1)))
    while bi > 16 and outer * triton.cdiv(inner, bi) < 2 * 132:
        bi //= 2
    br = max(1, min(2048 // bi, triton.next_power_of_2(max(R, 1))))
    return {"BLOCK_R": br, "BLOCK_I": bi, "num_warps": 4}


def col_configs(outer: int, R: int, inner: int) -> list[dict]:
    return [{"BLOCK_R": br, "BLOCK_I": bi, "num_warps": w}
            for bi in (16, 32, 64, 128, 256) for br in (4, 8, 16, 32, 64) for w in (2, 4, 8)
            if 512 <= br * bi <= 8192 and br * bi // (32 * w) <= 64 and bi <= max(16, 2 * inner)]


def _col_launch(kernel, tensors, outer: int, R: int, inner: int, log: bool, config: dict) -> None:
    if outer == 0 or R == 0 or inner == 0:
        return
    bi, br = config.get("BLOCK_I", 64), config.get("BLOCK_R", 32)
    n_tiles = triton.cdiv(inner, bi)
    launch(kernel, (outer * n_tiles,),
        *tensors, R, inner, n_tiles,
        LOG=log, COMPUTE=compute_dtype(tensors[-1].dtype), BLOCK_R=br, BLOCK_I=bi,
        INT64=outer * R * inner + br * bi > _INT32_MAX, num_warps=config.get("num_warps", 4),
    )


def launch_col_forward(x, y, outer: int, R: int, inner: int, log: bool, config: dict) -> None:
    """``x`` and ``y`` contiguous, seen as [outer, R, inner]; softmax over R."""
    _col_launch(col_forward_kernel, (x, y), outer, R, inner, log, config)


def launch_col_backward(g, y, dx, outer: int, R: int, inner: int, log: bool, config: dict) -> None:
    _col_launch(col_backward_kernel, (g, y, dx), outer, R, inner, log, config)


def col_split_default_config(outer: int, R: int, inner: int, itemsize: int = 4) -> dict:
    """Tiles of 8192 values: 16 columns by 512 rows with 4 warps for 16-bit
    types, 32 by 256 with 8 warps for 32-bit (the fastest on the H200 at
    4096x4096 bf16 and 8192x8192 fp32 over dim 0, benchmarks/sweep.py,
    2026-11-29); the chunk doubles while a tile needs more than
    ``SPLIT_MAX_PARTS`` programs."""
    bi = min(16 if itemsize <= 2 else 32, triton.next_power_of_2(max(inner, 1)))
    chunk = max(1, min(8192 // bi, triton.next_power_of_2(max(R, 1))))
    while triton.cdiv(R, chunk) > SPLIT_MAX_PARTS:
        chunk *= 2
    return {"CHUNK_R": chunk, "BLOCK_I": bi, "num_warps": 4 if itemsize <= 2 else 8}


# The walking column kernel is faster once it has this many column tiles of
# 64 (64x1024x1024 bf16 over dim 1: 121 µs against 137 µs split).
COL_WALK_MIN_TILES = 4 * 132


def col_split_configs(outer: int, R: int, inner: int) -> list[dict]:
    out = [{"CHUNK_R": ch, "BLOCK_I": bi, "num_warps": w}
           for bi in (16, 32, 64, 128) for ch in (32, 64, 128, 256, 512) for w in (4, 8, 16)
           if triton.cdiv(R, ch) <= SPLIT_MAX_PARTS and 1024 <= ch * bi <= 16384
           and 4 <= ch * bi // (32 * w) <= 64 and bi <= max(16, 2 * inner)]
    return out or [col_split_default_config(outer, R, inner)]


def col_split_parts(R: int, config: dict) -> int:
    return triton.cdiv(max(R, 1), config["CHUNK_R"])


def _col_split_launch(kernel, tensors, n_partials, outer, R, inner, log, config) -> None:
    import torch

    if outer == 0 or R == 0 or inner == 0:
        return
    bi, chunk = config["BLOCK_I"], config["CHUNK_R"]
    parts = col_split_parts(R, config)
    _check_parts(parts)
    n_tiles = triton.cdiv(inner, bi)
    groups = outer * n_tiles
    wide = tensors[-1].dtype == torch.float64
    partials, count = _split_workspace(groups * parts * bi, groups, n_partials,
                                       torch.float64 if wide else torch.float32, tensors[0].device)
    launch(kernel, (groups * parts,),
        *tensors, *partials, count, R, inner, n_tiles, parts,
        LOG=log, COMPUTE=compute_dtype(tensors[-1].dtype), CHUNK_R=chunk, BLOCK_I=bi,
        P_BLOCK=triton.next_power_of_2(parts), INT64=outer * R * inner + chunk * bi > _INT32_MAX,
        num_warps=config.get("num_warps", 8),
    )


def launch_col_split_forward(x, y, outer: int, R: int, inner: int, log: bool, config: dict) -> None:
    _col_split_launch(col_split_forward_kernel, (x, y), 2, outer, R, inner, log, config)


def launch_col_split_backward(g, y, dx, outer: int, R: int, inner: int, log: bool, config: dict) -> None:
    _col_split_launch(col_split_backward_kernel, (g, y, dx), 1, outer, R, inner, log, config)
