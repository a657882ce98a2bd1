"""Scans: cumulative sum / product / max / min, segmented sums, compaction.

Every scan runs over the logical positions ``j = 0 .. cols-1`` of a row. The
physical column is ``j`` or, for a reverse scan, ``cols-1-j``; an exclusive
scan is the inclusive scan of the row shifted by one (position ``j`` reads
logical ``j-1``, position 0 reads the identity), so one code path serves all
four combinations. Operators (``OP``): 0 sum, 1 product, 2 max and 3 min (the
last two scan ``(value, index)`` pairs).

Kernels:

* ``row_scan_kernel``: ``[rows, cols]`` with unit column stride. A program
  owns ``BLOCK_R`` rows and walks them in column blocks of ``BLOCK_C``:
  ``tl.associative_scan`` of the block, combined with the carried prefix of
  the earlier blocks. One read, one write. Short rows pack several per
  program; a long row is one program (fine when rows fill the GPU).
* ``col_scan_kernel``: a contiguous ``[outer, L, inner]`` tensor scanned over
  ``L`` (a non-innermost dim). A program owns ``BLOCK_N`` adjacent columns of
  one ``outer`` slice and walks down ``L`` in ``[BLOCK_L, BLOCK_N]`` tiles,
  scanning along axis 0 and carrying the last row. Loads are coalesced rows;
  no transpose copy.
* ``tile_scan_kernel``: the device-wide scan for few long rows (the 1-D case).
  A row is cut into tiles of ``BLOCK``. ``MODE = 0`` is the single-pass
  chained scan with decoupled look-back (Merrill & Garland, as in CUB): each
  program takes its tile id from an atomic counter, so ids follow the order in
  which programs start and a program only ever waits on tiles that are already
  running; it scans its tile, publishes the tile aggregate (flag 1), looks
  back over a window of ``WINDOW`` predecessors (acquire loads of their flags,
  then their values) summing aggregates until it meets an inclusive prefix
  (flag 2), publishes its own inclusive prefix (flag 2) and writes. A row's
  first tile publishes its inclusive prefix at once. Values are stored, then a
  CTA barrier, then the flag with a release exchange; readers do an acquire
  read of the flags, a barrier, then volatile (L1-bypassing) value loads.
  One read and one write per element. ``MODE = 1`` is phase 3 of the classic
  reduce-then-scan: the tile's prefix comes from an array (phase 1 is
  ``tile_reduce_kernel``, phase 2 an exclusive ``row_scan_kernel`` over the
  tile totals); it reads the input twice.
  With ``SEG`` a flags array marks segment starts; the scan carries
  ``(flag, value)`` pairs with ``(fa, va) + (fb, vb) = (fa|fb, vb if fb else
  va+vb)``. A tile holding a segment start knows its inclusive prefix before
  looking back, so it publishes flag 2 at once; its head (the elements before
  its first start) still takes the looked-back prefix. A reverse segmented
  scan treats segment *ends* (the element before a start) as starts.
* ``tile_scan_late_kernel`` / ``compact_late_kernel``: the look-back kernels
  in their LATE form (config ``LATE: 1``): the tile's loads issued at the
  program's own index before the tile counter's round trip, the tile's total
  published before its own scan, and (``PACK``, 32-bit accumulators) each
  tile's status and value in one 64-bit word: no fences, no L1 invalidation.
  Kernels of their own, so the plain kernels' specializations (listed in the
  warmup manifests) stay as they were.
* ``compact_kernel``: stream compaction. The same look-back tile scan over the
  int32 mask gives each kept element its output slot; the tile then scatters
  its kept values (or, for ``nonzero``, their flat indices) in order. One
  read of the mask and the input, one write of the output.

Arithmetic: fp32 for 16-bit floats and fp32, fp64 for fp64, int64 for
integer sums and products; results are rounded once at the store. Offsets
are 64-bit when any tensor reaches 2^31 elements (``INT64``).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROW_VERSION = "1"
COL_VERSION = "1"
LOOKBACK_VERSION = "3"
REDUCE_SCAN_VERSION = "1"
COMPACT_VERSION = "4"

SUM, PROD, MAX, MIN = 0, 1, 2, 3

# Rows at least this long go to the device-wide tile scans (several tiles a row).
TILE_MIN_COLS = 16384

_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Combine functions
# ---------------------------------------------------------------------------
@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _max_pair(av, ai, bv, bi):
    # torch's rule, b later than a: take b when b is NaN or b >= a (ties: the
    # last index; after a NaN, later NaNs move the index, numbers do not).
    take = (bv != bv) | (bv >= av)
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def _min_pair(av, ai, bv, bi):
    take = (bv != bv) | (bv <= av)
    return tl.where(take, bv, av), tl.where(take, bi, ai)


@triton.jit
def _seg_add(af, av, bf, bv):
    return af | bf, tl.where(bf != 0, bv, av + bv)


@triton.jit
def _scan(v, AXIS: tl.constexpr, OP: tl.constexpr):
    if OP == 0:
        out = tl.associative_scan(v, AXIS, _add)
    else:
        out = tl.associative_scan(v, AXIS, _mul)
    return out


@triton.jit
def _last(v, AXIS: tl.constexpr, N: tl.constexpr):
    """The last lane of ``v`` along ``AXIS`` (of size N) of a 2-D block: a block's
    total under an order-dependent combine is its inclusive scan's last lane.
    (``tl.reduce`` combines lanes in butterfly order on a GPU, which is only
    right for commutative combines; the interpreter goes in order and hides it.)"""
    lanes = tl.arange(0, N)
    if AXIS == 0:
        out = tl.sum(tl.where((lanes == N - 1)[:, None], v, 0), 0)
    else:
        out = tl.sum(tl.where((lanes == N - 1)[None, :], v, 0), 1)
    return out


@triton.jit
def _total(v, AXIS: tl.constexpr, OP: tl.constexpr):
    if OP == 0:
        out = tl.sum(v, AXIS)
    else:
        out = tl.reduce(v, AXIS, _mul)
    return out


@triton.jit
def _combine(a, b, OP: tl.constexpr):
    if OP == 0:
        out = a + b
    else:
        out = a * b
    return out


# ---------------------------------------------------------------------------
# Row scans: [rows, cols], unit column stride
# ---------------------------------------------------------------------------
@triton.jit
def row_scan_kernel(
    x_ptr, y_ptr, i_ptr, rows, cols, sx, sy, si,
    OP: tl.constexpr, EXCL: tl.constexpr, REV: tl.constexpr, ACC: tl.constexpr, IDENT: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    rmask = r < rows
    x_row = x_ptr + r[:, None] * sx
    y_row = y_ptr + r[:, None] * sy
    offs = tl.arange(0, BLOCK_C)
    if INT64:
        offs = offs.to(tl.int64)
    carry = tl.full([BLOCK_R], IDENT, ACC)
    if OP >= 2:
        carry_i = tl.full([BLOCK_R], 0, offs.dtype)
    for start in range(0, cols, BLOCK_C):
        j = start + offs
        if REV:
            p = cols - 1 - j
        else:
            p = j
        m = rmask[:, None] & (j[None, :] < cols)
        if EXCL:
            if REV:
                src = p + 1
            else:
                src = p - 1
            lm = rmask[:, None] & (j[None, :] >= 1) & (j[None, :] < cols)
        else:
            src = p
            lm = m
        x = tl.load(x_row + src[None, :], mask=lm, other=0).to(ACC)
        x = tl.where(lm, x, IDENT)
        if OP >= 2:
            idx = tl.broadcast_to(p[None, :], [BLOCK_R, BLOCK_C])
            if OP == 2:
                sv, sidx = tl.associative_scan((x, idx), 1, _max_pair)
                yv, yi = _max_pair(carry[:, None], carry_i[:, None], sv, sidx)
                carry, carry_i = _max_pair(carry, carry_i, _last(sv, 1, BLOCK_C), _last(sidx, 1, BLOCK_C))
            else:
                sv, sidx = tl.associative_scan((x, idx), 1, _min_pair)
                yv, yi = _min_pair(carry[:, None], carry_i[:, None], sv, sidx)
                carry, carry_i = _min_pair(carry, carry_i, _last(sv, 1, BLOCK_C), _last(sidx, 1, BLOCK_C))
            tl.store(i_ptr + r[:, None] * si + p[None, :], yi.to(tl.int64), mask=m)
        else:
            yv = _combine(carry[:, None], _scan(x, 1, OP), OP)
            carry = _combine(carry, _total(x, 1, OP), OP)
        tl.store(y_row + p[None, :], yv.to(y_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------
# Column scans: contiguous [outer, L, inner], scanned over L
# ---------------------------------------------------------------------------
@triton.jit
def col_scan_kernel(
    x_ptr, y_ptr, i_ptr, L, inner,
    OP: tl.constexpr, EXCL: tl.constexpr, REV: tl.constexpr, ACC: tl.constexpr, IDENT: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    # One grid axis (outer can pass 65535): column tiles of one outer slice are adjacent.
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(inner, BLOCK_N)
    outer = pid // n_tiles
    pid_n = pid - outer * n_tiles
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ls = tl.arange(0, BLOCK_L)
    if INT64:
        n = n.to(tl.int64)
        ls = ls.to(tl.int64)
        outer = outer.to(tl.int64)
    base = outer * L * inner
    nmask = n < inner
    carry = tl.full([BLOCK_N], IDENT, ACC)
    if OP >= 2:
        carry_i = tl.full([BLOCK_N], 0, ls.dtype)
    for start in range(0, L, BLOCK_L):
        j = start + ls
        if REV:
            p = L - 1 - j
        else:
            p = j
        m = (j[:, None] < L) & nmask[None, :]
        if EXCL:
            if REV:
                src = p + 1
            else:
                src = p - 1
            lm = (j[:, None] >= 1) & m
        else:
            src = p
            lm = m
        x = tl.load(x_ptr + base + src[:, None] * inner + n[None, :], mask=lm, other=0).to(ACC)
        x = tl.where(lm, x, IDENT)
        out_off = base + p[:, None] * inner + n[None, :]
        if OP >= 2:
            idx = tl.broadcast_to(p[:, None], [BLOCK_L, BLOCK_N])
            if OP == 2:
                sv, sidx = tl.associative_scan((x, idx), 0, _max_pair)
                yv, yi = _max_pair(carry[None, :], carry_i[None, :], sv, sidx)
                carry, carry_i = _max_pair(carry, carry_i, _last(sv, 0, BLOCK_L), _last(sidx, 0, BLOCK_L))
            else:
                sv, sidx = tl.associative_scan((x, idx), 0, _min_pair)
                yv, yi = _min_pair(carry[None, :], carry_i[None, :], sv, sidx)
                carry, carry_i = _min_pair(carry, carry_i, _last(sv, 0, BLOCK_L), _last(sidx, 0, BLOCK_L))
            tl.store(i_ptr + out_off, yi.to(tl.int64), mask=m)
        else:
            yv = _combine(carry[None, :], _scan(x, 0, OP), OP)
            carry = _combine(carry, _total(x, 0, OP), OP)
        tl.store(y_ptr + out_off, yv.to(y_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------
# Decoupled look-back: publish and look back (scalar values per tile)
# ---------------------------------------------------------------------------
@triton.jit
def _publish(flag_ptr, val_ptr, t, value, FLAG: tl.constexpr):
    tl.store(val_ptr + t, value)
    tl.debug_barrier()  # every thread's store is ordered before the release below
    tl.atomic_xchg(flag_ptr + t, FLAG, sem="release")


@triton.jit
def _look_back(flag_ptr, agg_ptr, inc_ptr, t, row_first,
               OP: tl.constexpr, ACC: tl.constexpr, IDENT: tl.constexpr, WINDOW: tl.constexpr):
    """The combined value of tiles ``row_first .. t-1`` (all of ``t``'s row before it)."""
    prefix = tl.full([], IDENT, ACC)
    hi = t
    todo = (t != row_first).to(tl.int32)
    w = tl.arange(0, WINDOW)
    while todo != 0:
        js = hi - WINDOW + w
        valid = js >= row_first
        fl = tl.atomic_add(flag_ptr + js, 0, mask=valid, sem="acquire")
        fl = tl.where(valid, fl, 0)
        tl.debug_barrier()  # the acquire above happens before every thread's value loads
        last_inc = tl.max(tl.where(valid & (fl == 2), js, -1), 0)
        pending = tl.sum(tl.where(valid & (js > last_inc) & (fl == 0), 1, 0), 0)
        if pending == 0:
            # Aggregates after the last inclusive prefix in the window, then that prefix
            # (the identity when the window holds none: keep walking back).
            take = valid & (js > last_inc)
            a = tl.load(agg_ptr + js, mask=take, other=0, volatile=True).to(ACC)
            part = _total(tl.where(take, a, IDENT), 0, OP)
            hit = valid & (js == last_inc)
            iv = tl.load(inc_ptr + js, mask=hit, other=0, volatile=True).to(ACC)
            part = _combine(_total(tl.where(hit, iv, IDENT), 0, OP), part, OP)
            prefix = _combine(part, prefix, OP)
            hi = hi - WINDOW
            todo = (last_inc < row_first).to(tl.int32)
    return prefix


# Packed look-back (LATE with a 32-bit accumulator): a tile's status and value
# are one 64-bit word, ``flag << 32 | value bits``, written by a relaxed
# exchange and read by volatile (strong) loads: single-copy atomic, so a
# reader sees a flag with its own value and nothing else needs ordering, as in
# CUB. No release fence (MEMBAR.GPU) on publishing, no acquire and no L1
# invalidation on polling, one load per predecessor instead of two.
@triton.jit
def _publish_word(word_ptr, t, value, FLAG: tl.constexpr, ACC: tl.constexpr):
    if ACC == tl.float32:
        bits = value.to(tl.int32, bitcast=True)
    else:
        bits = value.to(tl.int32)
    tl.atomic_xchg(word_ptr + t, (bits.to(tl.int64) & 0xFFFFFFFF) | (FLAG << 32), sem="relaxed")


@triton.jit
def _look_back_words(word_ptr, t, row_first, OP: tl.constexpr, ACC: tl.constexpr, IDENT: tl.constexpr,
                     WINDOW: tl.constexpr):
    """``_look_back`` over packed words: the combined value of tiles ``row_first .. t-1``."""
    prefix = tl.full([], IDENT, ACC)
    hi = t
    todo = (t != row_first).to(tl.int32)
    w = tl.arange(0, WINDOW)
    while todo != 0:
        js = hi - WINDOW + w
        valid = js >= row_first
        word = tl.load(word_ptr + js, mask=valid, other=0, volatile=True)
        fl = tl.where(valid, (word >> 32).to(tl.int32), 0)
        low = (word & 0xFFFFFFFF).to(tl.int32)
        if ACC == tl.float32:
            v = low.to(tl.float32, bitcast=True)
        else:
            v = low.to(ACC)
        last_inc = tl.max(tl.where(valid & (fl == 2), js, -1), 0)
        pending = tl.sum(tl.where(valid & (js > last_inc) & (fl == 0), 1, 0), 0)
        if pending == 0:
            # The last inclusive prefix in the window and the aggregates after it
            # (all aggregates when the window holds none: keep walking back).
            take = valid & (js >= last_inc)
            prefix = _combine(_total(tl.where(take, v, IDENT), 0, OP), prefix, OP)
            hi = hi - WINDOW
            todo = (last_inc < row_first).to(tl.int32)
    return prefix


@triton.jit
def _tile_positions(t, cols, tiles_per_row, BLOCK: tl.constexpr, REV: tl.constexpr, EXCL: tl.constexpr):
    """Tile ``t`` of a row scan: its row, its index in the row, its lanes ``j``
    in scan order, the positions ``p`` they write, the positions ``src`` they
    read (shifted by one for an exclusive scan) and the read mask."""
    row = t // tiles_per_row
    k = t - row * tiles_per_row
    j = k * BLOCK + tl.arange(0, BLOCK)
    if REV:
        p = cols - 1 - j
    else:
        p = j
    if EXCL:
        if REV:
            src = p + 1
        else:
            src = p - 1
        lm = (j >= 1) & (j < cols)
    else:
        src = p
        lm = j < cols
    return row, k, j, p, src, lm


@triton.jit
def tile_reduce_kernel(
    x_ptr, t_ptr, cols, sx, tiles_per_row,
    OP: tl.constexpr, REV: tl.constexpr, EXCL: tl.constexpr, ACC: tl.constexpr, IDENT: tl.constexpr,
    BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    """Phase 1 of reduce-then-scan: each tile's total (of the shifted row when EXCL)."""
    t = tl.program_id(0)
    if INT64:
        t = t.to(tl.int64)
    row, k, j, p, src, lm = _tile_positions(t, cols, tiles_per_row, BLOCK, REV, EXCL)
    x = tl.load(x_ptr + row * sx + src, mask=lm, other=0).to(ACC)
    tl.store(t_ptr + t, _total(tl.where(lm, x, IDENT), 0, OP))


@triton.jit
def tile_scan_kernel(
    x_ptr, f_ptr, y_ptr, state_ptr, agg_ptr, inc_ptr, cols, sx, sf, sy, tiles_per_row,
    OP: tl.constexpr, EXCL: tl.constexpr, REV: tl.constexpr, SEG: tl.constexpr, MODE: tl.constexpr,
    ACC: tl.constexpr, IDENT: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr,
):
    """MODE 0: look-back (state = [counter, flags...]); MODE 1: prefixes given in inc_ptr.

    PUBLISH_INCLUSIVE=False (tests only) leaves every non-first tile at flag 1,
    so look-back walks all the way to the row start through aggregates: the
    path a GPU takes when predecessors are still running, which the
    interpreter (programs in order) never takes otherwise.
    """
    _tile_scan(x_ptr, f_ptr, y_ptr, state_ptr, agg_ptr, inc_ptr, agg_ptr, cols, sx, sf, sy, tiles_per_row,
               OP, EXCL, REV, SEG, MODE, ACC, IDENT, BLOCK, WINDOW, PUBLISH_INCLUSIVE, INT64, False, 0, False)


@triton.jit
def tile_scan_late_kernel(
    x_ptr, f_ptr, y_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, cols, sx, sf, sy, tiles_per_row,
    OP: tl.constexpr, EXCL: tl.constexpr, REV: tl.constexpr, SEG: tl.constexpr,
    ACC: tl.constexpr, IDENT: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr, SKEW: tl.constexpr, PACK: tl.constexpr,
    ORDERED: tl.constexpr = False,
):
    """The look-back scan (MODE 0) in its LATE form (a kernel of its own, so
    ``tile_scan_kernel``'s specializations, listed in the warmup manifests,
    stay as they were).

    LATE: the tile's loads go out first, at the program's own index (programs
    start in launch order, so it is almost always the tile the counter then
    hands out; a reload when not), instead of after a counter round trip;
    unsegmented, the tile's total (a reduction, cheaper than the scan) is
    published first, the look-back follows, and the tile's own scan runs
    after the inclusive prefix is out: the scan's latency leaves the chain of
    tiles that successors wait on, and the loaded values are the only state
    carried across the wait. SKEW (tests only) makes every guess wrong.
    ORDERED: no tile counter at all, the program id is the tile (programs
    start in launch order, the assumption ``kernels.waves`` and the split
    softmax make too; without it a look-back could wait on a tile whose
    program cannot start).
    PACK (unsegmented, 32-bit accumulator): status and value as one word at
    ``word_ptr`` (``_publish_word``).
    """
    _tile_scan(x_ptr, f_ptr, y_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, cols, sx, sf, sy, tiles_per_row,
               OP, EXCL, REV, SEG, 0, ACC, IDENT, BLOCK, WINDOW, PUBLISH_INCLUSIVE, INT64, True, SKEW, PACK, ORDERED)


@triton.jit
def _tile_scan(
    x_ptr, f_ptr, y_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, cols, sx, sf, sy, tiles_per_row,
    OP: tl.constexpr, EXCL: tl.constexpr, REV: tl.constexpr, SEG: tl.constexpr, MODE: tl.constexpr,
    ACC: tl.constexpr, IDENT: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr, LATE: tl.constexpr, SKEW: tl.constexpr,
    PACK: tl.constexpr, ORDERED: tl.constexpr = False,
):
    if MODE == 0 and not LATE:
        t = tl.atomic_add(state_ptr, 1)
    else:
        t = tl.program_id(0)
        if SKEW != 0:
            t = (t + SKEW) % tl.num_programs(0)  # tests of the reload below
    if INT64:
        t = t.to(tl.int64)
    row, k, j, p, src, lm = _tile_positions(t, cols, tiles_per_row, BLOCK, REV, EXCL)
    x = tl.load(x_ptr + row * sx + src, mask=lm, other=0)
    if MODE == 0 and LATE and not ORDERED:
        # The loads above went out at the program's own index; the counter's
        # order (the one look-back may wait on) confirms it, or the tile is reloaded.
        got = tl.atomic_add(state_ptr, 1, sem="relaxed").to(t.dtype)  # an order, no data
        if got != t:
            t = got
            row, k, j, p, src, lm = _tile_positions(t, cols, tiles_per_row, BLOCK, REV, EXCL)
            x = tl.load(x_ptr + row * sx + src, mask=lm, other=0)
    m = j < cols
    x = tl.where(lm, x.to(ACC), IDENT)
    if SEG:
        # Segment starts in logical order: a reverse scan starts at segment ends.
        if REV:
            fs = tl.load(f_ptr + row * sf + p + 1, mask=m & (p + 1 < cols), other=1).to(tl.int32)
        else:
            fs = tl.load(f_ptr + row * sf + p, mask=m, other=1).to(tl.int32)
        fs = tl.where(j == 0, 1, fs)
        if EXCL:
            x = tl.where(fs != 0, 0, x)
        sf_, sv = tl.associative_scan((fs, x), 0, _seg_add)
        # The tile's total is the scan's last lane (see ``_last``; 1-D here).
        tf = tl.max(fs, 0)
        total = tl.sum(tl.where(tl.arange(0, BLOCK) == BLOCK - 1, sv, 0), 0)
    else:
        total = _total(x, 0, OP)
        if not LATE:
            sv = _scan(x, 0, OP)
    flag_ptr = state_ptr + 1
    if MODE == 0:
        if SEG:
            early = (k == 0) | (tf != 0)
        else:
            early = k == 0
        if PACK:
            if early:
                _publish_word(word_ptr, t, total, 2, ACC)
            else:
                _publish_word(word_ptr, t, total, 1, ACC)
            prefix = _look_back_words(word_ptr, t, row * tiles_per_row, OP, ACC, IDENT, WINDOW)
            if early == 0:
                if PUBLISH_INCLUSIVE:
                    _publish_word(word_ptr, t, _combine(prefix, total, OP), 2, ACC)
        else:
            if early:
                _publish(flag_ptr, inc_ptr, t, total, 2)
            else:
                _publish(flag_ptr, agg_ptr, t, total, 1)
            prefix = _look_back(flag_ptr, agg_ptr, inc_ptr, t, row * tiles_per_row, OP, ACC, IDENT, WINDOW)
            if early == 0:
                if PUBLISH_INCLUSIVE:
                    _publish(flag_ptr, inc_ptr, t, _combine(prefix, total, OP), 2)
    else:
        prefix = tl.load(inc_ptr + t).to(ACC)
    if SEG:
        y = tl.where(sf_ != 0, sv, prefix + sv)
    else:
        if LATE:
            sv = _scan(x, 0, OP)
        y = _combine(prefix, sv, OP)
    tl.store(y_ptr + row * sy + p, y.to(y_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------
# Stream compaction
# ---------------------------------------------------------------------------
@triton.jit
def compact_kernel(
    x_ptr, m_ptr, out_ptr, state_ptr, agg_ptr, inc_ptr, n, out_size,
    INDEX: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr,
):
    """Keep x[i] where mask[i], in order (INDEX: write i instead). Slots >= out_size are dropped."""
    _compact(x_ptr, m_ptr, out_ptr, state_ptr, agg_ptr, inc_ptr, agg_ptr, n, out_size,
             INDEX, ACC, BLOCK, WINDOW, PUBLISH_INCLUSIVE, INT64, False, 0, False)


@triton.jit
def compact_late_kernel(
    x_ptr, m_ptr, out_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, n, out_size,
    INDEX: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr, SKEW: tl.constexpr, PACK: tl.constexpr,
    ORDERED: tl.constexpr = False,
):
    """``compact_kernel`` in its LATE form (a kernel of its own, as ``tile_scan_late_kernel``).

    LATE: the mask's loads go out at the program's own index before the counter
    confirms it, the values are loaded as whole vectors (not per kept element),
    the tile's count is published first and its local scan runs after the
    look-back; PACK: packed status words (see ``tile_scan_late_kernel``)."""
    _compact(x_ptr, m_ptr, out_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, n, out_size,
             INDEX, ACC, BLOCK, WINDOW, PUBLISH_INCLUSIVE, INT64, True, SKEW, PACK, ORDERED)


@triton.jit
def _compact(
    x_ptr, m_ptr, out_ptr, state_ptr, agg_ptr, inc_ptr, word_ptr, n, out_size,
    INDEX: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr, INT64: tl.constexpr, LATE: tl.constexpr, SKEW: tl.constexpr,
    PACK: tl.constexpr, ORDERED: tl.constexpr = False,
):
    if LATE:
        t = tl.program_id(0)  # a guess, confirmed below
        if SKEW != 0:
            t = (t + SKEW) % tl.num_programs(0)
    else:
        t = tl.atomic_add(state_ptr, 1)
    if INT64:
        t = t.to(tl.int64)
    i = t * BLOCK + tl.arange(0, BLOCK)
    keep = tl.load(m_ptr + i, mask=i < n, other=0)
    if LATE and not ORDERED:
        got = tl.atomic_add(state_ptr, 1, sem="relaxed").to(t.dtype)  # an order, no data
        if got != t:
            t = got
            i = t * BLOCK + tl.arange(0, BLOCK)
            keep = tl.load(m_ptr + i, mask=i < n, other=0)
    valid = i < n
    keep = tl.where(valid & (keep.to(tl.int32) != 0), 1, 0).to(ACC)
    total = tl.sum(keep, 0)
    if not LATE:
        local = tl.cumsum(keep, 0) - keep
    if not INDEX:
        # Issued before the look-back, whose latency it then hides: its mask
        # must not wait for the prefix.
        if LATE:
            # Whole 16-byte vectors: with kept elements spread over the tile every
            # sector is fetched anyway, and a per-element mask splits the load
            # into scalar ones.
            v = tl.load(x_ptr + i, mask=valid, other=0)
        else:
            v = tl.load(x_ptr + i, mask=keep != 0, other=0)
    flag_ptr = state_ptr + 1
    if PACK:
        if t == 0:
            _publish_word(word_ptr, t, total, 2, ACC)
        else:
            _publish_word(word_ptr, t, total, 1, ACC)
        prefix = _look_back_words(word_ptr, t, 0, 0, ACC, 0, WINDOW)
        if t != 0:
            if PUBLISH_INCLUSIVE:
                _publish_word(word_ptr, t, prefix + total, 2, ACC)
    else:
        if t == 0:
            _publish(flag_ptr, inc_ptr, t, total, 2)
        else:
            _publish(flag_ptr, agg_ptr, t, total, 1)
        prefix = _look_back(flag_ptr, agg_ptr, inc_ptr, t, 0, 0, ACC, 0, WINDOW)
        if t != 0:
            if PUBLISH_INCLUSIVE:
                _publish(flag_ptr, inc_ptr, t, prefix + total, 2)
    if LATE:
        local = tl.cumsum(keep, 0) - keep
    slot = prefix + local
    w = (keep != 0) & (slot < out_size)
    if INDEX:
        tl.store(out_ptr + slot, i.to(tl.int64), mask=w)
    else:
        tl.store(out_ptr + slot, v, mask=w)


# ---------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------
def acc_dtype(out_dtype, op: int):
    """Triton accumulator for an output dtype: fp64 for fp64, fp32 for other
    floats, int64 for integer sums/products, the type itself for int max/min."""
    import torch

    if out_dtype == torch.float64:
        return tl.float64
    if out_dtype.is_floating_point:
        return tl.float32
    if op in (SUM, PROD):
        return tl.int64
    return {torch.int8: tl.int8, torch.uint8: tl.uint8, torch.int16: tl.int16, torch.int32: tl.int32,
            torch.int64: tl.int64, torch.bool: tl.int8}[out_dtype]


def identity(out_dtype, op: int):
    import torch

    if op == SUM:
        return 0 if not out_dtype.is_floating_point else 0.0
    if op == PROD:
        return 1 if not out_dtype.is_floating_point else 1.0
    if out_dtype.is_floating_point:
        return float("-inf") if op == MAX else float("inf")
    if out_dtype == torch.bool:
        return 0 if op == MAX else 1
    info = torch.iinfo(out_dtype)
    return info.min if op == MAX else info.max


def _reach(tensors, rows: int, cols: int) -> int:
    return max((rows - 1) * abs(t.stride(0)) + cols for t in tensors if t is not None)


def row_default_config(rows: int, cols: int) -> dict:
    bc = min(triton.next_power_of_2(max(cols, 1)), 4096)
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(rows, 1)), 64))
    tile = br * bc
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": 4 if tile <= 2048 else 8}


def row_configs(rows: int, cols: int) -> list[dict]:
    out = []
    cmax = triton.next_power_of_2(max(cols, 1))
    for bc in (256, 1024, 2048, 4096, 8192):
        if bc > max(cmax, 256):
            continue
        for br in (1, 2, 4, 8, 16):
            if br * bc > 8192 or (br > 1 and br > rows):
                continue
            for w in (4, 8):
                out.append({"BLOCK_R": br, "BLOCK_C": bc, "num_warps": w})
    return out or [row_default_config(rows, cols)]


def launch_row_scan(x, y, idx, op: int, exclusive: bool, reverse: bool, config: dict) -> None:
    """x, y (and idx for max/min): [rows, cols] with unit column stride."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 1024)
    row_scan_kernel[(triton.cdiv(rows, br),)](
        x, y, idx if idx is not None else y, rows, cols, x.stride(0), y.stride(0),
        idx.stride(0) if idx is not None else 0,
        OP=op, EXCL=exclusive, REV=reverse, ACC=acc_dtype(y.dtype, op), IDENT=identity(y.dtype, op),
        BLOCK_R=br, BLOCK_C=bc, INT64=_reach((x, y, idx), rows, cols) + br * bc > _INT32_MAX,
        num_warps=config.get("num_warps", 4),
    )


def col_default_config(outer: int, L: int, inner: int) -> dict:
    # Enough programs to fill 132 SMs twice, at least 32 columns (128 B of fp32) a row.
    bn = 128
    while bn > 32 and outer * triton.cdiv(inner, bn) < 264:
        bn //= 2
    bn = min(bn, triton.next_power_of_2(max(inner, 1)))
    bl = max(1, min(4096 // bn, triton.next_power_of_2(max(L, 1))))
    return {"BLOCK_L": bl, "BLOCK_N": bn, "num_warps": 4 if bl * bn <= 2048 else 8}


def col_configs(outer: int, L: int, inner: int) -> list[dict]:
    return [{"BLOCK_L": bl, "BLOCK_N": bn, "num_warps": w}
            for bn in (32, 64, 128) for bl in (16, 32, 64) for w in (4, 8)
            if bl * bn >= 32 * w * 2 and bl * bn <= 8192]


def launch_col_scan(x, y, idx, outer: int, L: int, inner: int, op: int, exclusive: bool, reverse: bool,
                    config: dict) -> None:
    """x, y (and idx): contiguous, viewed as [outer, L, inner], scanned over L."""
    if x.numel() == 0:
        return
    bl, bn = config.get("BLOCK_L", 32), config.get("BLOCK_N", 64)
    col_scan_kernel[(triton.cdiv(inner, bn) * outer,)](
        x, y, idx if idx is not None else y, L, inner,
        OP=op, EXCL=exclusive, REV=reverse, ACC=acc_dtype(y.dtype, op), IDENT=identity(y.dtype, op),
        BLOCK_L=bl, BLOCK_N=bn, INT64=x.numel() + bl * inner + bn > _INT32_MAX,
        num_warps=config.get("num_warps", 4),
    )


def tile_default_config(rows: int, cols: int) -> dict:
    # At least four tiles a row; 8192 elements (32 a thread) at most, no spills.
    block = max(16, min(8192, triton.next_power_of_2(max(cols, 1)) // 4))
    return {"BLOCK": block, "num_warps": 8 if block >= 4096 else 4, "WINDOW": 32}


def tile_late_default_config(rows: int, cols: int) -> dict:
    """The LATE kernel: at least four tiles a row, 4096 elements at most, 64 a
    thread (2 warps at 4096: the fastest at fp32 2^28 on the H200)."""
    block = max(16, min(4096, triton.next_power_of_2(max(cols, 1)) // 4))
    return {"BLOCK": block, "num_warps": max(1, min(2, block // 2048)), "WINDOW": 32, "LATE": 1}


def tile_configs(rows: int, cols: int) -> list[dict]:
    return [{"BLOCK": b, "num_warps": w, "WINDOW": 32} for b in (2048, 4096, 8192, 16384) for w in (4, 8, 16)
            if b // (32 * w) >= 8 and b // (32 * w) <= 64]


def _scratch(num_tiles: int, acc, device):
    """[counter, flags...] zeroed, plus uninitialized aggregate / inclusive arrays."""
    import torch

    tdt = {tl.float32: torch.float32, tl.float64: torch.float64, tl.int64: torch.int64,
           tl.int32: torch.int32}[acc]
    state = torch.zeros(num_tiles + 1, dtype=torch.int32, device=device)
    vals = torch.empty(2, num_tiles, dtype=tdt, device=device)
    return state, vals[0], vals[1]


def _packs(config: dict, acc) -> bool:
    """Packed status words: LATE with a 32-bit accumulator, unless ``PACK: 0``."""
    return bool(config.get("LATE", 0)) and bool(config.get("PACK", 1)) and acc in (tl.float32, tl.int32)


def _words(n_tiles: int, pack: bool, device):
    """The packed status words, zeroed (flag 0: not published); one dummy word when unused."""
    import torch

    return torch.zeros(n_tiles if pack else 1, dtype=torch.int64, device=device)


def launch_lookback_scan(x, y, flags, op: int, exclusive: bool, reverse: bool, config: dict,
                         publish_inclusive: bool = True) -> None:
    """x, y (and flags for a segmented sum): [rows, cols] with unit column stride."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    tpr = triton.cdiv(cols, block)
    n_tiles = rows * tpr
    acc = acc_dtype(y.dtype, op)
    state, agg, inc = _scratch(n_tiles, acc, x.device)
    common = dict(
        OP=op, EXCL=exclusive, REV=reverse, SEG=flags is not None, ACC=acc,
        IDENT=identity(y.dtype, op), BLOCK=block, WINDOW=config.get("WINDOW", 32),
        PUBLISH_INCLUSIVE=publish_inclusive,
        INT64=max(_reach((x, y, flags), rows, cols) + block, n_tiles) > _INT32_MAX,
        num_warps=config.get("num_warps", 8))
    head = (x, flags if flags is not None else x, y, state, agg, inc)
    tail = (cols, x.stride(0), flags.stride(0) if flags is not None else 0, y.stride(0), tpr)
    if config.get("LATE", 0):
        pack = _packs(config, acc) and flags is None
        tile_scan_late_kernel[(n_tiles,)](*head, _words(n_tiles, pack, x.device), *tail,
                                          SKEW=config.get("SKEW", 0), PACK=pack,
                                          ORDERED=bool(config.get("ORDERED", 0)), **common)
    else:
        tile_scan_kernel[(n_tiles,)](*head, *tail, MODE=0, **common)


def launch_reduce_then_scan(x, y, op: int, exclusive: bool, reverse: bool, config: dict) -> None:
    """Three phases: tile totals, exclusive scan of the totals per row, tile scans with those prefixes."""
    import torch

    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    tpr = triton.cdiv(cols, block)
    n_tiles = rows * tpr
    acc = acc_dtype(y.dtype, op)
    ident = identity(y.dtype, op)
    tdt = {tl.float32: torch.float32, tl.float64: torch.float64, tl.int64: torch.int64}[acc]
    int64 = max(_reach((x, y), rows, cols) + block, n_tiles) > _INT32_MAX
    totals = torch.empty(rows, tpr, dtype=tdt, device=x.device)
    tile_reduce_kernel[(n_tiles,)](
        x, totals, cols, x.stride(0), tpr, OP=op, REV=reverse, EXCL=exclusive, ACC=acc, IDENT=ident,
        BLOCK=block, INT64=int64, num_warps=config.get("num_warps", 8),
    )
    prefixes = torch.empty_like(totals)
    launch_row_scan(totals, prefixes, None, op, True, False, row_default_config(rows, tpr))
    tile_scan_kernel[(n_tiles,)](
        x, x, y, prefixes, prefixes, prefixes, cols, x.stride(0), 0, y.stride(0), tpr,
        OP=op, EXCL=exclusive, REV=reverse, SEG=False, MODE=1, ACC=acc, IDENT=ident, BLOCK=block,
        WINDOW=1, PUBLISH_INCLUSIVE=True, INT64=int64, num_warps=config.get("num_warps", 8),
    )


def compact_default_config(n: int) -> dict:
    return {"BLOCK": 4096 if n >= 1 << 20 else 1024, "num_warps": 8 if n >= 1 << 20 else 4, "WINDOW": 32}


def launch_compact(x, mask, out, index: bool, config: dict, publish_inclusive: bool = True) -> None:
    """x, mask: contiguous with n elements; out: 1-D. Writes the first min(count, len(out)) kept."""
    import torch

    n = mask.numel()
    if n == 0 or out.numel() == 0:
        return
    block = config.get("BLOCK", 4096)
    n_tiles = triton.cdiv(n, block)
    int64 = n + block > _INT32_MAX
    acc = tl.int64 if int64 else tl.int32
    state, agg, inc = _scratch(n_tiles, acc, mask.device)
    head = (x if x is not None else mask, mask.view(torch.uint8) if mask.dtype == torch.bool else mask,
            out, state, agg, inc)
    common = dict(INDEX=index, ACC=acc, BLOCK=block, WINDOW=config.get("WINDOW", 32),
                  PUBLISH_INCLUSIVE=publish_inclusive, INT64=int64, num_warps=config.get("num_warps", 8))
    if config.get("LATE", 0):
        pack = _packs(config, acc)
        compact_late_kernel[(n_tiles,)](*head, _words(n_tiles, pack, mask.device), n, out.numel(),
                                        SKEW=config.get("SKEW", 0), PACK=pack,
                                        ORDERED=bool(config.get("ORDERED", 0)), **common)
    else:
        compact_kernel[(n_tiles,)](*head, n, out.numel(), **common)
