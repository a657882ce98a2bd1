"""Cross-entropy with class-index targets over a 2-D ``[rows, cols]`` logits view.

Per row ``i`` with target ``t`` (not ``ignore_index``), label smoothing ``eps``,
optional class weights ``w`` (``W = sum(w)``; no weights: ``w = 1``, ``W = C``)
and ``lse = logsumexp(x_i)``, torch's loss is

    loss_i = (1 - eps) * w_t * (lse - x_t) + eps / C * sum_c w_c * (lse - x_c)

and its gradient is

    dx_c = g_i * (p_c * ((1 - eps) * w_t + eps / C * W) - (1 - eps) * w_t * [c == t] - eps / C * w_c)

with ``p = softmax(x_i)``. Ignored rows have loss 0 and gradient 0: their
logits are never read, and their saved statistics are 0.

Forward (``forward_kernel``). A program owns ``BLOCK_R`` rows (several short
rows, or one long one) and walks its columns in blocks of ``BLOCK_C``, keeping
a running max ``m`` and a running sum ``s`` of ``exp(x - m)`` (rescaled when
the max grows, as in ``kernels/softmax.py``'s online kernel): the logits are
read once. For label smoothing it also sums ``w_c * (x_c - k)`` with
``k = x_t`` (when finite): centring on the target logit keeps
``W * (lse - x_t) - sum w_c (x_c - x_t)`` free of cancellation for logits near
1e4. The row's loss and its statistics ``m`` and ``log(s)`` are stored in fp32
(fp64 for fp64 input): ``lse = m + log(s)`` is kept as two numbers because an
fp32 ``lse`` near 1e4 is off by 5e-4, which ``exp(x - lse)`` would turn into a
5e-4 relative gradient error.

Split forward (``SPLITS > 1``). When rows are too few to fill the GPU (a long
vocabulary and a few rows), program ``(i, j)`` reduces chunk ``j`` of row
block ``i`` to partial ``(m, s, acc)`` in a ``[3, rows, SPLITS]`` workspace,
and ``combine_kernel`` merges the partials of each row (max of the maxes,
rescaled sums, summed accumulators) and finishes the loss. No inter-program
synchronisation: the second launch is the barrier.

Fused forward + gradient (``GRAD``, ``SPLITS == 1``). After the row's
statistics, the same program sweeps the row again, last block first (the end
of the row, read last, is the likeliest still in L2), and writes ``dx`` for a
row scale ``g`` read from the device (1 for a sum, 1 / denominator for a
mean): one HBM read of the logits when L2 holds the rows in flight, one write.

Backward (``backward_kernel``). One pass: a 2-D grid of ``[BLOCK_R, CHUNK]``
tiles reads the logits once, recomputes ``p = exp((x - m) - log(s))`` from the
saved statistics, and writes ``dx`` once. The probability matrix is never
stored.

Targets outside ``[0, C)`` that are not ``ignore_index`` are clamped into
range for the loads (no memory fault); the ops layer rejects them on CPU
tensors, on CUDA tensors their loss is unspecified (a device-side check would
cost a synchronisation).

Arithmetic is fp32 (fp64 for fp64 inputs); results are rounded once, at the
store. ``eps`` travels as an fp32 pair ``hi + lo`` so that fp64 runs see it
exactly. Offsets are 64-bit when any tensor reaches 2^31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.shapes import pow2

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ONLINE_VERSION = "2"
SPLIT_VERSION = "1"
BACKWARD_VERSION = "2"

# Programs that keep an H200 busy (132 SMs, a few resident programs each).
TARGET_PROGRAMS = 528
# Most elements one program holds per column block (fp32 values in registers).
MAX_TILE = 8192
MAX_SPLITS = 256

_NEG_INF = tl.constexpr(float("-inf"))


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------
@triton.jit
def _row_setup(x_ptr, t_ptr, w_ptr, r, rows, cols, sx, st, ignore_index,
               HAS_W: tl.constexpr, COMPUTE: tl.constexpr):
    """Targets, the active mask, the target logit, its finite shift and weight."""
    rmask = r < rows
    tgt = tl.load(t_ptr + r * st, mask=rmask, other=0).to(tl.int64)
    active = rmask & (tgt != ignore_index)
    tcl = tl.minimum(tl.maximum(tgt, 0), cols - 1)
    xt = tl.load(x_ptr + r * sx + tcl, mask=active, other=0.0).to(COMPUTE)
    k = tl.where((xt == xt) & (tl.abs(xt) < float("inf")), xt, 0.0)
    if HAS_W:
        wt = tl.load(w_ptr + tcl, mask=active, other=0.0).to(COMPUTE)
    else:
        wt = tl.where(active, 1.0, 0.0).to(COMPUTE)
    return active, tcl, xt, k, wt


@triton.jit
def _smoothing(like, eps_hi, eps_lo, wsum_ptr, cols, HAS_W: tl.constexpr):
    """eps (from its fp32 pair) and W = sum of the class weights (C without weights),
    broadcast to ``like`` (a per-row COMPUTE vector) so that fp64 runs stay fp64."""
    z = tl.zeros_like(like)
    eps = (z + eps_hi) + eps_lo
    if HAS_W:
        wsum = z + tl.load(wsum_ptr).to(like.dtype)
    else:
        wsum = z + cols
    return eps, wsum


@triton.jit
def _finish(m, s, acc, xt, k, wt, active, cols, eps_hi, eps_lo, wsum_ptr,
            HAS_W: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE: tl.constexpr):
    """Per-row loss and statistics (m, log s) from the reduced row; 0 for ignored rows."""
    ls = tl.log(s)
    nll = (m - xt) + ls  # lse - x_t
    if SMOOTH:
        eps, wsum = _smoothing(m, eps_hi, eps_lo, wsum_ptr, cols, HAS_W)
        # sum_c w_c (lse - x_c) = W (lse - k) - sum_c w_c (x_c - k)
        smooth = wsum * ((m - k) + ls) - acc
        loss = (1.0 - eps) * (wt * nll) + (eps / cols) * smooth
    else:
        loss = wt * nll
    loss = tl.where(active, loss, 0.0)
    m = tl.where(active, m, 0.0)
    ls = tl.where(active, ls, 0.0)
    return loss, m, ls


@triton.jit
def _grad_coefs(g, wt, cols, eps_hi, eps_lo, wsum_ptr, HAS_W: tl.constexpr, SMOOTH: tl.constexpr):
    """Per-row coefficients of dx = p * a - b * [c == t] - d * w_c (g = 0 on ignored rows)."""
    if SMOOTH:
        eps, wsum = _smoothing(g, eps_hi, eps_lo, wsum_ptr, cols, HAS_W)
        b = g * ((1.0 - eps) * wt)
        a = b + g * (eps / cols * wsum)
        d = g * (eps / cols)
    else:
        b = g * wt
        a = b
        d = b * 0.0
    return a, b, d


@triton.jit
def _grad_block(x, c, cmask, m, ls, tcl, a, b, d, w_ptr,
                HAS_W: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE: tl.constexpr):
    """dx of a [rows, BLOCK_C] tile: softmax recomputed as exp((x - m) - log s)."""
    p = tl.exp((x - m[:, None]) - ls[:, None])
    dx = p * a[:, None] - tl.where(c[None, :] == tcl[:, None], b[:, None], 0.0)
    if SMOOTH:
        if HAS_W:
            wc = tl.load(w_ptr + c, mask=cmask, other=0.0).to(COMPUTE)
            dx -= d[:, None] * wc[None, :]
        else:
            dx -= d[:, None]
    return dx


@triton.jit
def _grad_sweep(x_rows, dx_rows, active, rmask, lo, hi, first, step, n, m, ls, tcl, a, b, d, w_ptr,
                HAS_W: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx over ``n`` column blocks starting at ``first``, ``step`` apart (negative:
    right to left), clipped to ``[lo, hi)``. Ignored rows are not read: x = -inf
    gives p = 0 and a = b = d = 0. Blocks are loaded two iterations ahead (a
    register ring of two): left to itself, ptxas issued one 16-byte load a thread
    and waited for it before the exps, and it sinks a one-ahead prefetch to the
    end of the iteration, where it hides nothing."""
    offs = tl.arange(0, BLOCK_C)
    c = first + offs
    ahead1 = tl.load(x_rows + c[None, :], mask=active[:, None] & ((c >= lo) & (c < hi))[None, :], other=_NEG_INF)
    c = c + step
    ahead2 = tl.load(x_rows + c[None, :], mask=active[:, None] & ((c >= lo) & (c < hi))[None, :], other=_NEG_INF)
    for i in range(0, n):
        c = first + i * step + offs
        cmask = (c >= lo) & (c < hi)
        x = ahead1.to(COMPUTE)
        ahead1 = ahead2
        cn = c + 2 * step
        ahead2 = tl.load(x_rows + cn[None, :], mask=active[:, None] & ((cn >= lo) & (cn < hi))[None, :],
                         other=_NEG_INF)
        dx = _grad_block(x, c, cmask, m, ls, tcl, a, b, d, w_ptr, HAS_W, SMOOTH, COMPUTE)
        tl.store(dx_rows + c[None, :], dx.to(dx_rows.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


# ---------------------------------------------------------------------------
# Forward: online over column blocks; SPLITS > 1 writes partials for combine
# ---------------------------------------------------------------------------
@triton.jit
def forward_kernel(
    x_ptr, t_ptr, w_ptr, wsum_ptr, out_ptr, part_ptr, dx_ptr, scale_ptr,
    rows, cols, sx, st, so, sdx, chunk, plane, ignore_index, eps_hi, eps_lo,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, SPLITS: tl.constexpr, GRAD: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    active, tcl, xt, k, wt = _row_setup(x_ptr, t_ptr, w_ptr, r, rows, cols, sx, st, ignore_index,
                                        HAS_W, COMPUTE)
    c_lo = pid_s * chunk
    c_hi = tl.minimum(c_lo + chunk, cols)
    offs = tl.arange(0, BLOCK_C)
    x_rows = x_ptr + r[:, None] * sx
    m = tl.full([BLOCK_R], float("-inf"), COMPUTE)
    s = tl.zeros([BLOCK_R], dtype=COMPUTE)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=COMPUTE)
    for start in range(c_lo, c_hi, BLOCK_C):
        c = start + offs
        cmask = c < c_hi
        mask = active[:, None] & cmask[None, :]
        x = tl.load(x_rows + c[None, :], mask=mask, other=_NEG_INF).to(COMPUTE)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        # All -inf so far: subtract 0 instead (exp(-inf - -inf) would be NaN).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub[:, None]), axis=1)
        m = m_new
        if SMOOTH:
            d = tl.where(mask, x - k[:, None], 0.0)
            if HAS_W:
                d = d * tl.load(w_ptr + c, mask=cmask, other=0.0).to(COMPUTE)[None, :]
            acc += d
    if SPLITS == 1:
        loss, m, ls = _finish(m, s, tl.sum(acc, axis=1), xt, k, wt, active, cols,
                              eps_hi, eps_lo, wsum_ptr, HAS_W, SMOOTH, COMPUTE)
        rmask = r < rows
        tl.store(out_ptr + r, loss.to(out_ptr.dtype.element_ty), mask=rmask)
        tl.store(out_ptr + so + r, m.to(out_ptr.dtype.element_ty), mask=rmask)
        tl.store(out_ptr + so + so + r, ls.to(out_ptr.dtype.element_ty), mask=rmask)
        if GRAD:
            # Fused gradient of the reduced loss (row scale g: 1 for sum, 1 / denominator
            # for mean). Blocks run last to first: the end of the row, read last,
            # is the likeliest still in L2.
            g = tl.where(active, tl.load(scale_ptr).to(COMPUTE), 0.0)
            a, b, d = _grad_coefs(g, wt, cols, eps_hi, eps_lo, wsum_ptr, HAS_W, SMOOTH)
            nblk = tl.cdiv(cols, BLOCK_C)
            _grad_sweep(x_rows, dx_ptr + r[:, None] * sdx, active, rmask, 0, cols, (nblk - 1) * BLOCK_C, -BLOCK_C,
                        nblk, m, ls, tcl, a, b, d, w_ptr, HAS_W, SMOOTH, COMPUTE, BLOCK_C)
    else:
        rmask = r < rows
        p = part_ptr + r * SPLITS + pid_s
        tl.store(p, m, mask=rmask)
        tl.store(p + plane, s, mask=rmask)
        tl.store(p + plane + plane, tl.sum(acc, axis=1), mask=rmask)


@triton.jit
def combine_kernel(
    x_ptr, t_ptr, w_ptr, wsum_ptr, out_ptr, part_ptr,
    rows, cols, sx, st, so, plane, ignore_index, eps_hi, eps_lo,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, SPLITS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    active, tcl, xt, k, wt = _row_setup(x_ptr, t_ptr, w_ptr, r, rows, cols, sx, st, ignore_index,
                                        HAS_W, COMPUTE)
    j = tl.arange(0, SPLITS)
    rmask = r < rows
    mask = rmask[:, None] & (j[None, :] < SPLITS)
    p = part_ptr + r[:, None] * SPLITS + j[None, :]
    mj = tl.load(p, mask=mask, other=float("-inf"))
    sj = tl.load(p + plane, mask=mask, other=0.0)
    aj = tl.load(p + plane + plane, mask=mask, other=0.0)
    m = tl.max(mj, axis=1)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(sj * tl.exp(mj - m_sub[:, None]), axis=1)
    loss, m, ls = _finish(m, s, tl.sum(aj, axis=1), xt, k, wt, active, cols,
                          eps_hi, eps_lo, wsum_ptr, HAS_W, SMOOTH, COMPUTE)
    tl.store(out_ptr + r, loss.to(out_ptr.dtype.element_ty), mask=rmask)
    tl.store(out_ptr + so + r, m.to(out_ptr.dtype.element_ty), mask=rmask)
    tl.store(out_ptr + so + so + r, ls.to(out_ptr.dtype.element_ty), mask=rmask)


# ---------------------------------------------------------------------------
# Backward: dx from the saved statistics, one read and one write
# ---------------------------------------------------------------------------
@triton.jit
def backward_kernel(
    g_ptr, x_ptr, t_ptr, w_ptr, wsum_ptr, st_ptr, dx_ptr,
    rows, cols, sg, sx, st, sst, sdx, chunk, ignore_index, eps_hi, eps_lo,
    HAS_W: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    rmask = r < rows
    tgt = tl.load(t_ptr + r * st, mask=rmask, other=0).to(tl.int64)
    active = rmask & (tgt != ignore_index)
    tcl = tl.minimum(tl.maximum(tgt, 0), cols - 1)
    g = tl.load(g_ptr + r * sg, mask=active, other=0.0).to(COMPUTE)
    g = tl.where(active, g, 0.0)
    m = tl.load(st_ptr + r, mask=active, other=0.0).to(COMPUTE)
    ls = tl.load(st_ptr + sst + r, mask=active, other=0.0).to(COMPUTE)
    if HAS_W:
        wt = tl.load(w_ptr + tcl, mask=active, other=0.0).to(COMPUTE)
    else:
        wt = 1.0
    a, b, d = _grad_coefs(g, wt, cols, eps_hi, eps_lo, wsum_ptr, HAS_W, SMOOTH)
    c_lo = pid_c * chunk
    c_hi = tl.minimum(c_lo + chunk, cols)
    _grad_sweep(x_ptr + r[:, None] * sx, dx_ptr + r[:, None] * sdx, active, rmask, c_lo, c_hi, c_lo, BLOCK_C,
                tl.cdiv(c_hi - c_lo, BLOCK_C), m, ls, tcl, a, b, d, w_ptr, HAS_W, SMOOTH, COMPUTE, BLOCK_C)


# ---------------------------------------------------------------------------
# Configs and launch helpers. Logits are 2-D [rows, cols] with stride(1) == 1.
# ---------------------------------------------------------------------------
_INT32_MAX = 2**31 - 1


def compute_dtype(dtype):
    """fp32 for 16-bit floats and fp32, fp64 for fp64."""
    import torch

    return tl.float64 if dtype == torch.float64 else tl.float32


def needs_int64(rows: int, cols: int, tensors, tile: int) -> bool:
    reach = max((rows - 1) * abs(t.stride(0)) for t in tensors) + cols
    return reach + tile > _INT32_MAX


def _eps_pair(eps: float) -> tuple[float, float]:
    import numpy as np

    hi = float(np.float32(eps))
    return hi, float(eps) - hi


def _warps(tile: int) -> int:
    return 4 if tile <= 1024 else (8 if tile <= 4096 else 16)


def _block_r(rows: int, cols: int) -> int:
    """Short rows share a program (tile of about 2K elements); long rows have one each."""
    bc = pow2(cols)
    if bc >= 2048:
        return 1
    return max(1, min(2048 // bc, pow2(rows), 64))


def online_default_config(rows: int, cols: int) -> dict:
    br = _block_r(rows, cols)
    bc = min(pow2(cols), 4096 if br == 1 else pow2(cols))
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": _warps(br * bc)}


def online_configs(rows: int, cols: int) -> list[dict]:
    bcols = pow2(cols)
    out = []
    if bcols < 2048:
        for br in (1, 2, 4, 8, 16, 32, 64):
            tile = br * bcols
            if 128 <= tile <= MAX_TILE or (br == 1 and tile < 128):
                for w in (2, 4, 8):
                    if tile // (32 * w) >= 2 or w == 2:
                        out.append({"BLOCK_R": br, "BLOCK_C": bcols, "num_warps": w})
    else:
        for bc in (1024, 2048, 4096, 8192):
            if bc > bcols:
                continue
            for w in (4, 8, 16):
                if bc // (32 * w) >= 4:
                    out.append({"BLOCK_R": 1, "BLOCK_C": bc, "num_warps": w})
    return out or [online_default_config(rows, cols)]


def fused_default_config(rows: int, cols: int) -> dict:
    """As the online forward, but long rows get fewer, wider programs (8K-column
    blocks, 16 warps): fewer rows in flight per SM keeps more of each row in L2
    for the gradient sweep, with 32 KB of loads in flight per SM still."""
    if cols >= 65536:
        return {"BLOCK_R": 1, "BLOCK_C": 8192, "num_warps": 16}
    return online_default_config(rows, cols)


def split_parts(cols: int, chunk: int) -> int:
    return triton.cdiv(cols, chunk)


def split_default_config(rows: int, cols: int) -> dict:
    """Enough chunks per row that rows x chunks fills the GPU, chunks of at least
    2048 columns (or half the row, for short rows: always two parts or more)."""
    want = max(1, triton.cdiv(TARGET_PROGRAMS, max(rows, 1)))
    floor = min(2048, pow2(triton.cdiv(cols, 2)))
    chunk = max(floor, pow2(triton.cdiv(cols, want)))
    while split_parts(cols, chunk) > MAX_SPLITS:
        chunk *= 2
    bc = min(4096, chunk)
    return {"CHUNK": chunk, "BLOCK_C": bc, "num_warps": _warps(bc)}


def split_pays(rows: int, cols: int) -> bool:
    """Rows alone leave SMs idle and each row is long enough to cut."""
    return rows < 132 and cols >= 4096


def split_configs(rows: int, cols: int) -> list[dict]:
    base = split_default_config(rows, cols)
    out = []
    for f in (1, 2, 4):
        chunk = base["CHUNK"] * f
        if f > 1 and split_parts(cols, chunk) < 2:
            continue
        for bc in (2048, 4096):
            if bc <= chunk:
                for w in (8, 16):
                    out.append({"CHUNK": chunk, "BLOCK_C": bc, "num_warps": w})
    return out or [base]


def backward_default_config(rows: int, cols: int) -> dict:
    br = _block_r(rows, cols)
    bc = min(pow2(cols), 4096 if br == 1 else pow2(cols))
    # Chunk the row when rows alone do not fill the GPU.
    row_programs = triton.cdiv(rows, br)
    chunk = max(bc, pow2(cols))
    while row_programs * split_parts(cols, chunk) < TARGET_PROGRAMS and chunk > bc:
        chunk //= 2
    return {"BLOCK_R": br, "BLOCK_C": bc, "CHUNK": chunk, "num_warps": _warps(br * bc)}


def backward_configs(rows: int, cols: int) -> list[dict]:
    base = backward_default_config(rows, cols)
    out = []
    for cfg in online_configs(rows, cols):
        for chunk in sorted({base["CHUNK"], max(cfg["BLOCK_C"], base["CHUNK"] // 4)}):
            if chunk >= cfg["BLOCK_C"]:
                out.append({**cfg, "CHUNK": chunk})
    return out or [base]


def _common(x, w, wsum, eps):
    hi, lo = _eps_pair(eps)
    # Unused pointer arguments (no weight, no smoothing) get x: never read.
    w_arg = w if w is not None else x
    ws_arg = wsum if wsum is not None else x
    return hi, lo, w_arg, ws_arg, w is not None, eps > 0.0, compute_dtype(x.dtype)


def launch_forward(x, t, w, wsum, out, ignore_index: int, eps: float, config: dict,
                   dx=None, scale=None) -> None:
    """``out`` is a dense ``[3, rows]`` (loss, max, log-sum); one row block per program.
    With ``dx`` (dense ``[rows, cols]``) and ``scale`` (a 1-element tensor: the row
    scale of the reduced loss), the same pass also writes the gradient."""
    rows, cols = x.shape
    if rows == 0:
        return
    hi, lo, w_arg, ws_arg, has_w, smooth, comp = _common(x, w, wsum, eps)
    br = config.get("BLOCK_R", 1)
    bc = config.get("BLOCK_C", min(4096, pow2(cols)))
    grad = dx is not None
    tensors = (x, dx) if grad else (x,)
    forward_kernel[(triton.cdiv(rows, br), 1)](
        x, t, w_arg, ws_arg, out, out, dx if grad else out, scale if grad else out,
        rows, cols, x.stride(0), t.stride(0), out.stride(0), dx.stride(0) if grad else 0, cols, 0,
        ignore_index, hi, lo,
        HAS_W=has_w, SMOOTH=smooth, SPLITS=1, GRAD=grad, COMPUTE=comp, BLOCK_R=br, BLOCK_C=bc,
        INT64=needs_int64(rows, cols, tensors, br * bc) or 3 * rows > _INT32_MAX,
        num_warps=config.get("num_warps", 8),
    )


def launch_split_forward(x, t, w, wsum, out, ignore_index: int, eps: float, config: dict) -> None:
    """Row chunks reduced by separate programs into a ``[3, rows, SPLITS]`` workspace, then combined."""
    import torch

    rows, cols = x.shape
    if rows == 0:
        return
    hi, lo, w_arg, ws_arg, has_w, smooth, comp = _common(x, w, wsum, eps)
    chunk = config["CHUNK"]
    bc = min(config.get("BLOCK_C", 4096), chunk)
    splits = pow2(split_parts(cols, chunk))  # a power of two for the combine tile; extras see no columns
    if splits == 1:
        launch_forward(x, t, w, wsum, out, ignore_index, eps, {"BLOCK_R": 1, "BLOCK_C": bc,
                                                               "num_warps": config.get("num_warps", 8)})
        return
    part = torch.empty((3, rows, splits), dtype=out.dtype, device=x.device)
    i64 = needs_int64(rows, cols, (x,), bc) or 3 * rows * splits > _INT32_MAX
    forward_kernel[(rows, splits)](
        x, t, w_arg, ws_arg, out, part, out, out, rows, cols, x.stride(0), t.stride(0), out.stride(0), 0, chunk,
        part.stride(0), ignore_index, hi, lo,
        HAS_W=has_w, SMOOTH=smooth, SPLITS=splits, GRAD=False, COMPUTE=comp, BLOCK_R=1, BLOCK_C=bc,
        INT64=i64, num_warps=config.get("num_warps", 8),
    )
    br = max(1, min(64, 2048 // splits, pow2(rows)))
    combine_kernel[(triton.cdiv(rows, br),)](
        x, t, w_arg, ws_arg, out, part, rows, cols, x.stride(0), t.stride(0), out.stride(0), part.stride(0),
        ignore_index, hi, lo,
        HAS_W=has_w, SMOOTH=smooth, SPLITS=splits, COMPUTE=comp, BLOCK_R=br, INT64=i64, num_warps=4,
    )


def launch_backward(g, x, t, w, wsum, stats, dx, ignore_index: int, eps: float, config: dict) -> None:
    """``stats`` is the forward's ``[3, rows]`` (rows 1 and 2 are read); ``dx`` is ``[rows, cols]``."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    hi, lo, w_arg, ws_arg, has_w, smooth, comp = _common(x, w, wsum, eps)
    br = config.get("BLOCK_R", 1)
    bc = config.get("BLOCK_C", min(4096, pow2(cols)))
    chunk = max(config.get("CHUNK", pow2(cols)), bc)
    stats1 = stats[1:]
    backward_kernel[(triton.cdiv(rows, br), split_parts(cols, chunk))](
        g, x, t, w_arg, ws_arg, stats1, dx, rows, cols, g.stride(0), x.stride(0), t.stride(0),
        stats.stride(0), dx.stride(0), chunk, ignore_index, hi, lo,
        HAS_W=has_w, SMOOTH=smooth, COMPUTE=comp, BLOCK_R=br, BLOCK_C=bc,
        INT64=needs_int64(rows, cols, (x, dx), br * bc) or 3 * rows > _INT32_MAX,
        num_warps=config.get("num_warps", 8),
    )


@triton.jit
def rescale_rows_kernel(dx_ptr, g_ptr, scale_ptr, changed_ptr, cols, stride, big, BLOCK_C: tl.constexpr):
    """Row r of the fused pass's saved gradient times ``g[r] / scale``, in place; a row whose
    incoming gradient equals ``scale`` (every row under ``loss.backward()``) is left alone and
    costs two scalar loads. The ratio follows ``nan_to_num(nan=0)`` (infinities to +-``big``) in
    ``g``'s dtype; a row that changes sets ``changed[0]``."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(scale_ptr)
    gr = tl.load(g_ptr + row)
    if gr != s:
        r = gr / s
        r = tl.where(r != r, 0.0, r)
        r = tl.minimum(tl.maximum(r, -big), big)
        tl.store(changed_ptr, 1)
        for c0 in range(0, cols, BLOCK_C):
            offs = c0 + tl.arange(0, BLOCK_C)
            m = offs < cols
            x = tl.load(dx_ptr + row * stride + offs, mask=m)
            tl.store(dx_ptr + row * stride + offs, (x.to(r.dtype) * r).to(x.dtype), mask=m)


def rescale_rows(dx, g, scale, changed, big: float) -> None:
    """``dx`` ``[rows, cols]`` (unit column stride) scaled in place by ``g / scale`` per row, where
    it differs from 1 (see :func:`rescale_rows_kernel`); ``changed``: one int32, set when any row
    was; ``big``: the largest finite value of ``g``'s dtype."""
    rows, cols = dx.shape
    if rows == 0 or cols == 0:
        return
    rescale_rows_kernel[(rows,)](dx, g, scale, changed, cols, dx.stride(0), big,
                                 BLOCK_C=min(4096, pow2(cols)), num_warps=8)
