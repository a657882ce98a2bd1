"""The bias+GELU backward kernel: the input gradient and the bias gradient in
one pass over ``[rows, cols]``.

``dinput = grad * gelu'(input + bias)`` is elementwise; ``dbias`` is its
column sum. Summing with atomics would make ``dbias`` depend on the order
programs run in, so the reduction is two-level and fixed-order: program
``(c, r)`` owns column block ``c`` and a contiguous chunk of rows, walks the
chunk in ``BLOCK_R x BLOCK_C`` tiles (stores each ``dinput`` tile, adds its
values to an fp32 tile accumulator in registers, reduced over rows once at
the end) and writes one row of
partial sums ``partial[r, cols]``; the caller sums ``partial`` over ``r``
(a small tensor: ``row_programs x cols``). Same result on every run.

Traffic is the minimum (grad and input read once, dinput written once, the
bias and the partials are O(cols)). The grid is ``col_blocks x
row_programs`` with enough row programs to give each SM several programs
even when there are few column blocks.

Compute in fp32 (fp64 for fp64 inputs); rounding once at the store.
``INT64`` switches the row offsets to 64-bit when a tensor reaches 2**31
elements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.fusion.device_fns import INV_SQRT_2PI, SQRT1_2, SQRT2_PI, _tanh

VERSION = "1"
_INT32_MAX = 2**31 - 1
_KAPPA = tl.constexpr(0.044715)


@triton.jit
def _gelu_grad(z, APPROX: tl.constexpr):
    # d/dz gelu(z), as torch's gelu_backward computes it.
    if APPROX:
        z2 = z * z
        # Tensor first: in the interpreter, constexpr * tensor stays a constexpr.
        t = _tanh((z + z2 * z * _KAPPA) * SQRT2_PI)
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * (1.0 + z2 * _KAPPA * 3.0) * SQRT2_PI
    else:
        cdf = 0.5 * (1.0 + tl.erf(z * SQRT1_2))
        pdf = tl.exp(-0.5 * z * z) * INV_SQRT_2PI
        d = cdf + z * pdf
    return d


@triton.jit
def bias_gelu_backward_kernel(
    g_ptr, x_ptr, b_ptr, dx_ptr, part_ptr,
    R, C, g_rs, x_rs, dx_rs, rows_per_prog,
    APPROX: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    b = tl.load(b_ptr + cols, mask=cmask).to(COMPUTE)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=COMPUTE)  # reduced over rows once, after the loop
    row0 = pid_r * rows_per_prog
    for r in range(0, rows_per_prog, BLOCK_R):
        rows = row0 + r + tl.arange(0, BLOCK_R)
        if INT64:
            rows = rows.to(tl.int64)
        mask = (rows[:, None] < R) & cmask[None, :]
        g = tl.load(g_ptr + rows[:, None] * g_rs + cols[None, :], mask=mask).to(COMPUTE)
        x = tl.load(x_ptr + rows[:, None] * x_rs + cols[None, :], mask=mask).to(COMPUTE)
        d = g * _gelu_grad(x + b[None, :], APPROX)
        d = tl.where(mask, d, 0.0)
        tl.store(dx_ptr + rows[:, None] * dx_rs + cols[None, :], d.to(dx_ptr.dtype.element_ty), mask=mask)
        acc += d
    if INT64:
        prow = pid_r.to(tl.int64) * C
    else:
        prow = pid_r * C
    tl.store(part_ptr + prow + cols, tl.sum(acc, axis=0), mask=cmask)


def default_config(rows: int, cols: int) -> dict:
    bc = min(256, triton.next_power_of_2(max(cols, 1)))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(rows, 1))))
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": 8 if br * bc >= 4096 else 4}


def configs() -> list[dict]:
    tiles = ((16, 256, 8), (32, 256, 8), (8, 512, 8), (32, 128, 8), (4, 1024, 8), (16, 128, 4), (8, 256, 4))
    return [{"BLOCK_R": r, "BLOCK_C": c, "num_warps": w, "num_stages": st} for r, c, w in tiles for st in (1, 3)]


def row_programs(rows: int, cols: int, config: dict, sms: int = 132) -> int:
    """Row chunks per column block: about 32 programs per SM in all (several
    waves, so the last one's imbalance costs little), each chunk a whole
    number of row tiles. The partial sums stay small: ``programs x cols`` fp32."""
    br, bc = config["BLOCK_R"], config["BLOCK_C"]
    col_blocks = triton.cdiv(cols, bc)
    tiles = triton.cdiv(rows, br)
    want = max(1, min(tiles, triton.cdiv(32 * sms, col_blocks)))
    per = triton.cdiv(tiles, want)
    return triton.cdiv(tiles, per)


def launch(g, x, b, dx, partial_dtype, approximate: bool, config: dict, compute, programs: int | None = None):
    """``g``, ``x``, ``dx``: ``[rows, cols]`` with unit column stride. Returns the
    ``[row_programs, cols]`` partial sums (sum them over dim 0 for dbias).
    ``programs`` overrides the number of row programs (tests)."""
    import torch

    rows, cols = x.shape
    br, bc = config["BLOCK_R"], config["BLOCK_C"]
    progs = programs or row_programs(rows, cols, config)
    per = triton.cdiv(triton.cdiv(rows, br), progs) * br
    part = torch.empty((progs, cols), dtype=partial_dtype, device=x.device)
    reach = max(rows * max(g.stride(0), x.stride(0), dx.stride(0)) + cols, progs * cols)
    bias_gelu_backward_kernel[(triton.cdiv(cols, bc), progs)](
        g, x, b, dx, part, rows, cols, g.stride(0), x.stride(0), dx.stride(0), per,
        APPROX=approximate, COMPUTE=compute, BLOCK_R=br, BLOCK_C=bc,
        INT64=reach + br * bc > _INT32_MAX, num_warps=config.get("num_warps", 8),
        num_stages=config.get("num_stages", 3),
    )
    return part
