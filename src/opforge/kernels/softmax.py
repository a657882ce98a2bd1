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
  fit on chip, so 262144 columns and more work.

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

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
ROW_VERSION = "1"
ONLINE_VERSION = "1"

# Longest row the row-resident kernels take (values are fp32 in registers).
ROW_LIMIT = 16384

_NEG_INF = tl.constexpr(float("-inf"))


# ---------------------------------------------------------------------------
# Row-resident kernels
# ---------------------------------------------------------------------------
@triton.jit
def row_forward_kernel(
    x_ptr, y_ptr, rows, cols, sx, sy,
    LOG: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
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
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    if INT64:
        r = r.to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
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


def launch_row_forward(x, y, log: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    row_forward_kernel[(triton.cdiv(rows, br),)](
        x, y, rows, cols, x.stride(0), y.stride(0),
        LOG=log, COMPUTE=compute_dtype(y.dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=_needs_int64(rows, cols, (x, y), br * bc), num_warps=config.get("num_warps", 4),
    )


def launch_row_backward(g, y, dx, log: bool, config: dict) -> None:
    rows, cols = g.shape
    if rows == 0 or cols == 0:
        return
    bc = triton.next_power_of_2(cols)
    br = config.get("BLOCK_R", 1)
    row_backward_kernel[(triton.cdiv(rows, br),)](
        g, y, dx, rows, cols, g.stride(0), y.stride(0), dx.stride(0),
        LOG=log, COMPUTE=compute_dtype(dx.dtype), BLOCK_R=br, BLOCK_C=bc,
        INT64=_needs_int64(rows, cols, (g, y, dx), br * bc), num_warps=config.get("num_warps", 4),
    )


def launch_online_forward(x, y, log: bool, config: dict) -> None:
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    online_forward_kernel[(rows,)](
        x, y, cols, x.stride(0), y.stride(0),
        LOG=log, COMPUTE=compute_dtype(y.dtype), BLOCK=block,
        INT64=_needs_int64(rows, cols, (x, y), block), num_warps=config.get("num_warps", 8),
    )


def launch_online_backward(g, y, dx, log: bool, config: dict) -> None:
    rows, cols = g.shape
    if rows == 0 or cols == 0:
        return
    block = config.get("BLOCK", 4096)
    online_backward_kernel[(rows,)](
        g, y, dx, cols, g.stride(0), y.stride(0), dx.stride(0),
        LOG=log, COMPUTE=compute_dtype(dx.dtype), BLOCK=block,
        INT64=_needs_int64(rows, cols, (g, y, dx), block), num_warps=config.get("num_warps", 8),
    )
