"""Elementwise kernels: one formula table, two memory-access strategies.

Every unary or binary op is a branch of ``_apply`` chosen at compile time by
the ``OP`` constexpr, so each (op, strategy, dtype) compiles to its own small
kernel. Two launch strategies read the operands:

* ``flat``: operands dense with identical strides (contiguous, or e.g. the
  same channels-last layout). The tensor is one 1-D range; each program owns
  ``BLOCK`` consecutive elements, so Triton can emit 16-byte vector loads and
  stores (pointers are 16-byte aligned in the common case and it specializes on that).
* ``strided``: any strides, with broadcasting as stride 0. The index space is
  collapsed to at most 4 dims; a program owns a 2-D tile of the last two, so
  per-element index arithmetic is two multiply-adds, and a unit stride along
  either tile axis is known to the compiler (Triton specializes ints equal to
  1) and coalesced.

Arithmetic happens in fp32 for 16-bit floats, natively otherwise; results
are rounded once, at the store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.runtime.launch import launch

# Op codes: the order is the ABI between ops.elementwise and these kernels.
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "gelu", "gelu_tanh", "silu")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "gelu_backward", "silu_backward")
CODES = {name: i for i, name in enumerate(UNARY + BINARY)}

# Bump when a kernel's code changes: it invalidates tuned entries of that kernel.
FLAT_VERSION = "3"
STRIDED_VERSION = "3"

# Globals read inside @triton.jit must be constexpr.
_SQRT1_2 = tl.constexpr(0.7071067811865476)
_SQRT2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _tanh(x):
    # Triton has no portable tanh. Small |x|: Taylor series to x^13; elsewhere
    # (1 - e^-2|x|) / (1 + e^-2|x|). The switch point keeps both pieces at the
    # dtype's precision: 0.4 for fp32 (series error < 2e-9, and e^-2|x| <= 0.45
    # so no cancellation), 0.05 for fp64 (series error < 1e-18, at most one
    # digit lost to cancellation above it).
    if x.dtype == tl.float64:
        lim = 0.05
    else:
        lim = 0.4
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    big = (1.0 - t) / (1.0 + t)
    x2 = x * x
    p = 21844.0 / 6081075.0
    p = p * x2 - 1382.0 / 155925.0
    p = p * x2 + 62.0 / 2835.0
    p = p * x2 - 17.0 / 315.0
    p = p * x2 + 2.0 / 15.0
    p = p * x2 - 1.0 / 3.0
    small = x + x * x2 * p
    return tl.where(a < lim, small, tl.where(x < 0, -big, big))


@triton.jit
def _sqrt(x):
    # Correctly rounded: sqrt_rn for fp32 (plain sqrt is approximate there);
    # fp64 sqrt is always correctly rounded.
    if x.dtype == tl.float64:
        r = tl.sqrt(x)
    else:
        r = tl.sqrt_rn(x)
    return r


@triton.jit
def _sigmoid(x):
    # 1 / (1 + e^-x) overflows e^-x for x << 0 but the quotient is still 0.
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _apply(a, b, OP: tl.constexpr):
    if OP == 0:
        r = -a
    elif OP == 1:
        r = tl.abs(a)
    elif OP == 2:
        r = tl.exp(a)
    elif OP == 3:
        r = tl.log(a)
    elif OP == 4:
        r = _sqrt(a)
    elif OP == 5:
        r = 1.0 / _sqrt(a)
    elif OP == 6:
        r = _sigmoid(a)
    elif OP == 7:
        r = _tanh(a)
    elif OP == 8:
        r = tl.where(a > 0, a, tl.where(a != a, a, 0))
    elif OP == 9:
        r = 0.5 * a * (1.0 + tl.erf(a * _SQRT1_2))
    elif OP == 10:
        # 0.5 x (1 + tanh u) == x * sigmoid(2u): one exp, no cancellation.
        r = a * _sigmoid(2.0 * _SQRT2_PI * (a + 0.044715 * a * a * a))
    elif OP == 11:
        r = a * _sigmoid(a)
    elif OP == 12:
        r = a + b
    elif OP == 13:
        r = a - b
    elif OP == 14:
        r = a * b
    elif OP == 15:
        r = a / b
    elif OP == 16:
        r = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 17:
        r = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 18:
        # d/dx gelu(x) = Phi(x) + x * phi(x); a is the incoming gradient, b is x.
        cdf = 0.5 * (1.0 + tl.erf(b * _SQRT1_2))
        pdf = tl.exp(-0.5 * b * b) * _INV_SQRT_2PI
        r = a * (cdf + b * pdf)
    else:
        # d/dx silu(x) = s(x) * (1 + x * (1 - s(x))); a is the gradient, b is x.
        s = _sigmoid(b)
        r = a * (s * (1.0 + b * (1.0 - s)))
    return r


@triton.jit
def _load_operand(ptr, scalar, offs, mask, MODE: tl.constexpr, COMPUTE: tl.constexpr):
    # MODE 0: no operand (unary op); 1: a tensor; 2: a scalar kernel argument.
    if MODE == 1:
        v = tl.load(ptr + offs, mask=mask).to(COMPUTE)
    elif MODE == 2:
        v = tl.full([1], scalar, COMPUTE)
    else:
        v = tl.zeros([1], dtype=COMPUTE)
    return v


@triton.jit
def flat_kernel(
    a_ptr, b_ptr, b_scalar, out_ptr, n,
    OP: tl.constexpr, B_MODE: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    if INT64:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(COMPUTE)
    b = _load_operand(b_ptr, b_scalar, offs, mask, B_MODE, COMPUTE)
    r = _apply(a, b, OP)
    tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def strided_kernel(
    a_ptr, b_ptr, b_scalar, out_ptr,
    D1, D2, D3,
    as0, as1, as2, as3,
    bs0, bs1, bs2, bs3,
    os0, os1, os2, os3,
    OP: tl.constexpr, B_MODE: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):
    # One program per tile, column tiles fastest, so neighbouring programs
    # touch neighbouring memory. Grid: D0 * D1 * cdiv(D2, BLOCK_R) * cdiv(D3, BLOCK_C).
    pid = tl.program_id(0)
    tiles_c = tl.cdiv(D3, BLOCK_C)
    tiles_r = tl.cdiv(D2, BLOCK_R)
    pid_c = pid % tiles_c
    t = pid // tiles_c
    tile_r = t % tiles_r
    rest = t // tiles_r
    i1 = rest % D1
    i0 = rest // D1
    if INT64:
        i0 = i0.to(tl.int64)
        i1 = i1.to(tl.int64)
    rows = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    if INT64:
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
    mask = (rows[:, None] < D2) & (cols[None, :] < D3)
    a_off = i0 * as0 + i1 * as1 + rows[:, None] * as2 + cols[None, :] * as3
    o_off = i0 * os0 + i1 * os1 + rows[:, None] * os2 + cols[None, :] * os3
    a = tl.load(a_ptr + a_off, mask=mask).to(COMPUTE)
    if B_MODE == 1:
        b_off = i0 * bs0 + i1 * bs1 + rows[:, None] * bs2 + cols[None, :] * bs3
        b = tl.load(b_ptr + b_off, mask=mask).to(COMPUTE)
    else:
        b = _load_operand(b_ptr, b_scalar, a_off, mask, B_MODE, COMPUTE)
    r = _apply(a, b, OP)
    tl.store(out_ptr + o_off, r.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Launch helpers. ``b`` is a tensor, a Python scalar, or None (unary op).
# ---------------------------------------------------------------------------
_INT32_MAX = 2**31 - 1


def compute_dtype(dtype):
    """The dtype arithmetic runs in: fp32 for 16-bit floats, else the result dtype."""
    import torch

    return {torch.float16: tl.float32, torch.bfloat16: tl.float32, torch.float32: tl.float32,
            torch.float64: tl.float64, torch.int32: tl.int32, torch.int64: tl.int64}[dtype]


def scalar_arg(b):
    """A Python scalar as the kernel takes it (a bool is the int 0 or 1, as in torch)."""
    return int(b) if isinstance(b, bool) else b


def b_mode(b) -> int:
    if b is None:
        return 0
    return 1 if hasattr(b, "data_ptr") else 2


def flat_options(op: str, mode: int, out_dtype, n: int, config: dict) -> tuple[tuple, dict]:
    """The grid and keyword arguments of ``flat_kernel`` (``mode``: ``b_mode(b)``):
    all fixed by the op, dtypes and size, so a pre-bound launcher
    (``ops.elementwise``) computes them once."""
    block = config.get("BLOCK", 4096)
    return (triton.cdiv(n, block),), dict(
        OP=CODES[op], B_MODE=mode, COMPUTE=compute_dtype(out_dtype),
        BLOCK=block, INT64=n + block > _INT32_MAX, num_warps=config.get("num_warps", 8))


def launch_flat(op: str, a, b, out, config: dict) -> None:
    n = out.numel()
    if n == 0:
        return
    mode = b_mode(b)
    grid, kw = flat_options(op, mode, out.dtype, n, config)
    launch(flat_kernel, grid, a, b if mode == 1 else a, scalar_arg(b) if mode == 2 else 0, out, n, **kw)


def collapse(shape, strides_list):
    """Merge dims that every operand walks contiguously; drop size-1 dims.

    Returns (shape, [strides per operand]) with as few dims as the layout allows.
    """
    keep = [i for i, s in enumerate(shape) if s != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides_list]
    for i in keep:
        n = shape[i]
        if out_shape and all(st[-1] == src[i] * n for st, src in zip(out_strides, strides_list)):
            out_shape[-1] *= n
            for st, src in zip(out_strides, strides_list):
                st[-1] = src[i]
        else:
            out_shape.append(n)
            for st, src in zip(out_strides, strides_list):
                st.append(src[i])
    return out_shape, out_strides


def strided_default_config(d2: int, d3: int) -> dict:
    bc = min(1024, triton.next_power_of_2(max(d3, 1)))
    br = max(1, min(4096 // bc, triton.next_power_of_2(max(d2, 1))))
    return {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": 8 if br * bc >= 4096 else 4}


def launch_strided(op: str, a, b, out, config: dict, geometry) -> None:
    """``geometry``: (4 dims, [strides of a, b, out]) as ops.elementwise.geometry gives."""
    if out.numel() == 0:
        return
    dims, (sa, sb, so) = geometry
    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 1024)
    mode = b_mode(b)
    reach = max(sum((d - 1) * abs(s) for d, s in zip(dims, st)) for st in (sa, sb, so))
    programs = dims[0] * dims[1] * triton.cdiv(dims[2], br) * triton.cdiv(dims[3], bc)
    launch(strided_kernel, (programs,),
        a, b if mode == 1 else a, scalar_arg(b) if mode == 2 else 0, out,
        dims[1], dims[2], dims[3], *sa, *sb, *so,
        OP=CODES[op], B_MODE=mode, COMPUTE=compute_dtype(out.dtype),
        BLOCK_R=br, BLOCK_C=bc, INT64=reach + br * bc > _INT32_MAX,
        num_warps=config.get("num_warps", 4),
    )
