"""Normalization kernels: LayerNorm and RMSNorm over the last dim of a 2-D view.

Every input is viewed as a contiguous ``[rows, cols]`` matrix (``cols`` = the
product of ``normalized_shape``). One kernel body serves both norms, chosen by
the ``IS_RMS`` constexpr:

* LayerNorm: ``y = (x - mean) * rstd * w + b``, ``rstd = 1/sqrt(var + eps)``,
  ``var`` the biased variance.
* RMSNorm: ``y = x * rstd * w``, ``rstd = 1/sqrt(mean(x^2) + eps)``.

Two strategies, each with a forward and a backward kernel:

* ``row`` (row-resident): a program owns a ``[BLOCK_R, BLOCK_C]`` tile of
  whole rows (``BLOCK_C = next_pow2(cols)``), so each row is read from HBM
  once. Mean and variance are a shifted two-pass in registers: the row's first
  element ``K`` is subtracted (exact for nearby values), then the mean of
  ``x - K``, then the sum of squared deviations from the mean. So
  ``1e4 + N(0, 1)`` inputs keep their variance (no ``E[x^2] - E[x]^2``
  cancellation) and their mean (no large-magnitude fp32 sum).
* ``looped`` (rows longer than a register tile, ``cols > ROW_MAX``): one
  program per row walks it in ``BLOCK_C`` column blocks. Mean and variance are
  the same shifted two-pass, done as two sweeps over the row (sum of ``x - K``,
  then sum of squared deviations from the mean), then a third sweep normalizes. The row is
  re-read from L2 (a 64K-element bf16 row is 128 KB), not re-fetched from HBM
  in the common case.

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

Offsets are 64-bit (``INT64``) when ``rows * cols`` reaches 2^31.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROW_VERSION = "1"
LOOPED_VERSION = "1"

# Longest row the row-resident kernels hold in registers (elements).
ROW_MAX = 16384
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


# ---------------------------------------------------------------------------
# Row-resident kernels: a [BLOCK_R, BLOCK_C] tile of whole rows per program.
# ---------------------------------------------------------------------------
@triton.jit
def norm_fwd_row_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STATS: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    if INT64:
        r = r.to(tl.int64)
    rmask = r < rows
    cmask = c < cols
    mask = rmask[:, None] & cmask[None, :]
    offs = r[:, None] * cols + c[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    if IS_RMS:
        xc = x
    else:
        # Shifted two-pass: subtract the row's first element (exact for close
        # values), then the mean of the shifted row, so a large common offset
        # costs no digits in the mean either.
        shift = tl.sum(tl.where(c[None, :] == 0, x, 0.0), axis=1)
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
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_part_ptr, db_part_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
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
        mask = (r < rows)[:, None] & cmask[None, :]
        offs = r[:, None] * cols + c[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
        if IS_RMS:
            xc = x
        else:
            shift = tl.sum(tl.where(c[None, :] == 0, x, 0.0), axis=1)
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
# Looped kernels: one row per program, walked in BLOCK_C column blocks.
# ---------------------------------------------------------------------------
@triton.jit
def _row_stats(x_ptr, row_off, cols, eps, IS_RMS: tl.constexpr, COMPUTE: tl.constexpr,
               BLOCK_C: tl.constexpr):
    # Shifted two-pass over the row, as in the row kernel: returns (shift K,
    # mean of x - K, rstd). Callers centre as (x - K) - mean_shifted, never
    # x - (K + mean_shifted): the rounded fp32 mean of 1e4-scale data would
    # cost digits.
    c = tl.arange(0, BLOCK_C)
    shift = tl.sum(tl.zeros([BLOCK_C], dtype=COMPUTE), axis=0)
    ms = shift
    if not IS_RMS:
        shift = tl.load(x_ptr + row_off).to(COMPUTE)
        acc = tl.zeros([BLOCK_C], dtype=COMPUTE)
        for start in range(0, cols, BLOCK_C):
            m = start + c < cols
            acc += tl.where(m, tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE) - shift, 0.0)
        ms = tl.sum(acc, axis=0) / cols
    acc2 = tl.zeros([BLOCK_C], dtype=COMPUTE)
    for start in range(0, cols, BLOCK_C):
        m = start + c < cols
        x = tl.load(x_ptr + row_off + start + c, mask=m, other=0.0).to(COMPUTE)
        xc = tl.where(m, (x - shift) - ms, 0.0)
        acc2 += xc * xc
    rstd = _inv_sqrt(tl.sum(acc2, axis=0) / cols + eps)
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
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_part_ptr, db_part_ptr, rows, cols, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
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
            tl.store(dx_ptr + row_off + start + c, dx.to(dx_ptr.dtype.element_ty), mask=m)
            if HAS_W:
                p = tl.load(dw_part_ptr + part + start + c, mask=m, other=0.0)
                tl.store(dw_part_ptr + part + start + c, p + dy * xhat, mask=m)
            if HAS_B:
                p = tl.load(db_part_ptr + part + start + c, mask=m, other=0.0)
                tl.store(db_part_ptr + part + start + c, p + dy, mask=m)


# ---------------------------------------------------------------------------
# Launch helpers. All tensors are contiguous; x/dy/y/dx are [rows, cols].
# ---------------------------------------------------------------------------
def compute_dtype(dtype):
    """The dtype arithmetic (and the saved stats, and dw/db partials) use."""
    import torch

    return tl.float64 if dtype == torch.float64 else tl.float32


def torch_compute_dtype(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def row_default_config(rows: int, cols: int) -> dict:
    bc = triton.next_power_of_2(max(cols, 1))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(rows, 1)), 16))
    tile = br * bc
    warps = 16 if tile >= 16384 else 8 if tile >= 4096 else 4 if tile >= 1024 else 2 if tile >= 256 else 1
    return {"BLOCK_R": br, "num_warps": warps}


def looped_default_config(rows: int, cols: int) -> dict:
    return {"BLOCK_C": 4096, "num_warps": 8}


def _int64(rows: int, cols: int, block: int) -> bool:
    return rows * cols + block >= _INT32_MAX


def launch_fwd_row(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    stats = rstd is not None
    norm_fwd_row_kernel[(triton.cdiv(rows, br),)](
        x, y, w if w is not None else x, b if b is not None else x,
        mean if mean is not None else (rstd if stats else y), rstd if stats else y,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=b is not None, STATS=stats,
        COMPUTE=compute_dtype(x.dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=_int64(rows, cols, br * bc), num_warps=config.get("num_warps", 4),
    )


def launch_fwd_looped(x, y, w, b, mean, rstd, eps: float, is_rms: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    bc = min(config.get("BLOCK_C", 4096), triton.next_power_of_2(cols))
    stats = rstd is not None
    norm_fwd_looped_kernel[(rows,)](
        x, y, w if w is not None else x, b if b is not None else x,
        mean if mean is not None else (rstd if stats else y), rstd if stats else y,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=b is not None, STATS=stats,
        COMPUTE=compute_dtype(x.dtype), BLOCK_C=bc,
        INT64=_int64(rows, cols, bc), num_warps=config.get("num_warps", 8),
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
                   programs: int, config: dict) -> None:
    """``dw_part``/``db_part``: [programs, cols] in the compute dtype (or None)."""
    rows, cols = x.shape
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    norm_bwd_row_kernel[(programs,)](
        dy, x, w if w is not None else x, dx,
        dw_part if dw_part is not None else dx, db_part if db_part is not None else dx,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=has_b,
        COMPUTE=compute_dtype(x.dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=_int64(max(rows, programs), cols, br * bc), num_warps=config.get("num_warps", 4),
    )


def launch_bwd_looped(dy, x, w, dx, dw_part, db_part, eps: float, is_rms: bool, has_b: bool,
                      programs: int, config: dict) -> None:
    """``dw_part``/``db_part`` must be zero-initialized: programs accumulate into them."""
    rows, cols = x.shape
    bc = min(config.get("BLOCK_C", 4096), triton.next_power_of_2(cols))
    norm_bwd_looped_kernel[(programs,)](
        dy, x, w if w is not None else x, dx,
        dw_part if dw_part is not None else dx, db_part if db_part is not None else dx,
        rows, cols, eps,
        IS_RMS=is_rms, HAS_W=w is not None, HAS_B=has_b,
        COMPUTE=compute_dtype(x.dtype), BLOCK_C=bc,
        INT64=_int64(max(rows, programs), cols, bc), num_warps=config.get("num_warps", 8),
    )
