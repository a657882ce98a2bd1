"""Elementwise Triton kernels under the interpreter, against float64 torch.

Every op of ``opforge.ops.elementwise`` is pinned to each Triton variant with
``force_variant`` and called through its public function; the oracle is torch
evaluated in float64 on the same (upcast) inputs, then rounded to the output
dtype. Bounds are relative Frobenius errors ||out - ref|| / ||ref||:

  float32 1e-5, float64 1e-12, float16 1e-3, bfloat16 1e-2, ints exact.

Note on bfloat16 under the interpreter: triton 3.6's interpreter converts
fp32 -> bf16 by truncation (``_convert_float`` with no rounding mode), not
round-to-nearest-even as the GPU does, so bf16 outputs here sit up to one bf16
ulp (2**-8 relative) below the correctly rounded value; the 1e-2 bound holds
with margin (observed ~4e-3) but cannot check bf16 rounding itself.

Sizes are kept small (<= ~300 elements a call; a few multi-tile cases up to a
few thousand) because the interpreter runs every program in numpy.
"""

from __future__ import annotations

import itertools
import math
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.kernels import elementwise as K
from opforge.kernels.elementwise import collapse
from opforge.ops import elementwise as E
from opforge.ops.elementwise import BINARY, INT_OK, UNARY
from opforge.runtime.dispatch import force_variant

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64 = torch.int32, torch.int64
FLOAT_DTYPES = (F32, F16, BF16, F64)
INT_DTYPES = (I32, I64)
VARIANTS = ("triton_flat", "triton_strided")
TOL = {F32: 1e-5, F64: 1e-12, F16: 1e-3, BF16: 1e-2}
POSITIVE = frozenset({"log", "sqrt", "rsqrt"})
GRADIENT_OPS = ("gelu_backward", "silu_backward")  # (grad, x): x must be a tensor

pytestmark = pytest.mark.filterwarnings(
    # The interpreter evaluates masked-off lanes too (log(0), 0/0, ...): numpy warns.
    "ignore::RuntimeWarning",
)

# ---------------------------------------------------------------------------
# Known src bugs (reported to the lead; see the final report).
# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# The oracle: torch in float64 (independent of opforge's own REFERENCE table).
# ---------------------------------------------------------------------------
def _scalar_like(x: torch.Tensor, s) -> torch.Tensor:
    return torch.full_like(x, s) if not isinstance(s, torch.Tensor) else s


REF64 = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": lambda a, b: torch.maximum(a, _scalar_like(a, b)),
    "minimum": lambda a, b: torch.minimum(a, _scalar_like(a, b)),
    "gelu_backward": lambda g, x: torch.ops.aten.gelu_backward(g, _scalar_like(g, x)),
    "silu_backward": lambda g, x: torch.ops.aten.silu_backward(g, _scalar_like(g, x)),
}

# torch's own op, in the operands' dtypes (for special values and dtype promotion).
TORCH_NATIVE = {
    **{n: REF64[n] for n in UNARY},
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": lambda a, b: torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp_min(a, b),
    "minimum": lambda a, b: torch.minimum(a, b) if isinstance(b, torch.Tensor) else torch.clamp_max(a, b),
    "gelu_backward": lambda g, x: torch.ops.aten.gelu_backward(g, x),
    "silu_backward": lambda g, x: torch.ops.aten.silu_backward(g, x),
}


def _up(x):
    return x.to(F64) if isinstance(x, torch.Tensor) else x


def reference(name: str, a, b=None, out_dtype=None) -> torch.Tensor:
    """float64 result from the upcast operands, rounded to ``out_dtype``."""
    r = REF64[name](_up(a)) if b is None else REF64[name](_up(a), _up(b))
    return r.to(out_dtype) if out_dtype is not None else r


def run(name: str, variant: str | None, a, b=None) -> torch.Tensor:
    fn = getattr(opforge, name)
    if variant is None:
        return fn(a) if b is None else fn(a, b)
    with force_variant(name, variant):
        return fn(a) if b is None else fn(a, b)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.to(F64), ref.to(F64)
    denom = r.norm().item()
    return (o - r).norm().item() / denom if denom else (o - r).norm().item()


def check(name: str, out: torch.Tensor, a, b=None, tol: float | None = None) -> None:
    """out matches the float64 oracle: shape, dtype, and the per-dtype bound (ints exact)."""
    want_dtype = expected_dtype(name, a, b)
    assert out.dtype == want_dtype, f"{name}: dtype {out.dtype}, torch gives {want_dtype}"
    want_shape = a.shape if not isinstance(b, torch.Tensor) else torch.broadcast_shapes(a.shape, b.shape)
    assert out.shape == want_shape
    ref = reference(name, a, b, out.dtype)
    if not out.dtype.is_floating_point:
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        return
    assert torch.isfinite(out).all(), f"{name}: non-finite output for finite inputs"
    bound = tol if tol is not None else TOL[out.dtype]
    err = rel_err(out, ref)
    assert err <= bound, f"{name} {out.dtype}: relative error {err:.3g} > {bound:g}"


def expected_dtype(name: str, a, b) -> torch.dtype:
    """torch's result dtype (true division of integers gives the default float)."""
    dt = a.dtype if b is None else torch.result_type(a, b)
    if name == "div" and not dt.is_floating_point:
        dt = torch.get_default_dtype()
    return dt


# ---------------------------------------------------------------------------
# Inputs: random, non-zero, seeded per test.
# ---------------------------------------------------------------------------
def rng_for(*key) -> random.Random:
    return random.Random(zlib.crc32(repr(key).encode()))


def gen_for(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def random_shape(rng: random.Random, max_numel: int = 300) -> tuple[int, ...]:
    nd = rng.randint(1, 4)
    hi = {1: max_numel, 2: 24, 3: 9, 4: 6}[nd]
    while True:
        shape = tuple(rng.randint(1, hi) for _ in range(nd))
        if math.prod(shape) <= max_numel:
            return shape


def values(shape, dtype, g: torch.Generator, positive: bool = False) -> torch.Tensor:
    """Non-zero values: magnitudes log-uniform in [0.05, 4] (both tanh branches), random signs.

    Ints: non-zero in [-60, 60].
    """
    if dtype.is_floating_point:
        mag = torch.exp(torch.empty(shape, dtype=F64).uniform_(math.log(0.05), math.log(4.0), generator=g))
        if not positive:
            mag = torch.where(torch.rand(shape, generator=g) < 0.5, -mag, mag)
        return mag.to(dtype)
    mag = torch.randint(1, 61, shape, generator=g)
    if not positive:
        mag = torch.where(torch.rand(shape, generator=g) < 0.5, -mag, mag)
    return mag.to(dtype)


def operands(name: str, shape, dtype, g, b_shape=None):
    a = values(shape, dtype, g, positive=name in POSITIVE)
    if name in UNARY:
        return a, None
    b = values(b_shape if b_shape is not None else shape, dtype, g)
    return a, b


def _param(name, variant, dtype):
    return pytest.param(name, variant, dtype, id=f"{name}-{variant}-{str(dtype)[6:]}")


DENSE_CASES = [_param(n, v, dt) for n in UNARY + BINARY for v in VARIANTS for dt in FLOAT_DTYPES]
DENSE_CASES += [_param(n, v, dt) for n in UNARY + BINARY if n in INT_OK for v in VARIANTS for dt in INT_DTYPES]


# ---------------------------------------------------------------------------
# 1. Dense operands, every op x variant x dtype.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,variant,dtype", DENSE_CASES)
def test_dense_matches_float64_reference(name, variant, dtype):
    rng, g = rng_for(name, variant, dtype), gen_for(name, variant, dtype)
    for _ in range(2):
        shape = random_shape(rng)
        a, b = operands(name, shape, dtype, g)
        out = run(name, variant, a, b)
        check(name, out, a, b)


def test_int_ops_are_rejected_for_float_only_ops():
    """Ops outside INT_OK have no integer semantics: the public op refuses ints."""
    x = torch.arange(1, 7, dtype=I32)
    for name in UNARY + BINARY:
        if name in INT_OK:
            continue
        with pytest.raises(TypeError, match=f"opforge.{name}"):
            run(name, None, x) if name in UNARY else run(name, None, x, x)


# ---------------------------------------------------------------------------
# 2. Strided layouts, broadcasting, 0-dim and Python scalar operands.
# ---------------------------------------------------------------------------
def _layout(case: str, name: str, dtype, g):
    """(a, b) for a named layout; b is None for unary ops."""
    pos = name in POSITIVE
    unary = name in UNARY

    def v(*shape, positive=False):
        return values(shape, dtype, g, positive=positive)

    if case == "transposed":
        a = v(13, 7, positive=pos).t()                      # (7, 13), strides (1, 7)
        b = None if unary else v(7, 13)
    elif case == "both_transposed":                         # same strides, but not contiguous
        a = v(9, 11, positive=pos).t()
        b = None if unary else v(9, 11).t()
    elif case == "step_slice":
        a = v(10, 25, positive=pos)[1::2, 3::3]             # (5, 8), offset, strides (50, 3)
        b = None if unary else v(15, 16)[::3, ::2]          # (5, 8), strides (48, 2)
    elif case == "expand_4d":
        a = v(4, 1, positive=pos).expand(2, 3, 4, 5)        # stride-0 view
        b = None if unary else v(2, 3, 4, 5)
    elif case == "broadcast_4d":
        a = v(3, 1, 5, positive=pos)
        b = None if unary else v(2, 1, 4, 1)                # -> (2, 3, 4, 5)
    elif case == "broadcast_other_bigger":
        a = v(1, 7, positive=pos)
        b = None if unary else v(3, 6, 7)
    elif case == "zero_dim_other":
        a = v(3, 4, 5, positive=pos)
        b = None if unary else v()
    elif case == "zero_dim_input":
        a = v(positive=pos)
        b = None if unary else v(6, 7)
    elif case == "python_scalar":
        a = v(5, 6, 7, positive=pos)
        b = None if unary else (3 if not dtype.is_floating_point else -1.375)
    elif case == "channels_last":
        a = v(2, 3, 5, 4, positive=pos).to(memory_format=torch.channels_last)
        b = None if unary else v(2, 3, 5, 4).to(memory_format=torch.channels_last)
    elif case == "mixed_layout":
        a = v(2, 3, 5, 4, positive=pos).to(memory_format=torch.channels_last)
        b = None if unary else v(2, 3, 5, 4)
    elif case == "permuted_3d":
        a = v(4, 5, 6, positive=pos).permute(2, 0, 1)       # (6, 4, 5)
        b = None if unary else v(5, 6, 4).permute(1, 2, 0)  # (6, 4, 5), another order
    else:
        raise AssertionError(case)
    return a, b


BINARY_LAYOUTS = ("transposed", "both_transposed", "step_slice", "expand_4d", "broadcast_4d",
                  "broadcast_other_bigger", "zero_dim_other", "zero_dim_input", "python_scalar",
                  "channels_last", "mixed_layout", "permuted_3d")
UNARY_LAYOUTS = ("transposed", "step_slice", "expand_4d", "zero_dim_input", "channels_last", "permuted_3d")
FLAT_OK = frozenset({"python_scalar", "channels_last"})  # dense alike: the flat kernel takes them


def _layout_cases():
    """Every op x layout, each with one dtype drawn from a fixed seed (not a full cross product)."""
    rng = random.Random(20240611)
    cases = []
    for name in UNARY + BINARY:
        for case in (UNARY_LAYOUTS if name in UNARY else BINARY_LAYOUTS):
            if case == "python_scalar" and name in GRADIENT_OPS:
                continue  # x must be a tensor (tests/ops checks the TypeError)
            pool = list(FLOAT_DTYPES) + (list(INT_DTYPES) if name in INT_OK else [])
            if case == "python_scalar":  # float64 + Python scalar runs the reference (see test_ops)
                pool = [dt for dt in pool if dt != F64]
            dtype = rng.choice(pool)
            variants = VARIANTS if case in FLAT_OK else ("triton_strided",)
            for variant in variants:
                cases.append(pytest.param(name, case, variant, dtype,
                                          id=f"{name}-{case}-{variant}-{str(dtype)[6:]}"))
    return cases


@pytest.mark.parametrize("name,case,variant,dtype", _layout_cases())
def test_layouts_match_float64_reference(name, case, variant, dtype):
    a, b = _layout(case, name, dtype, gen_for(name, case, dtype))
    out = run(name, variant, a, b)
    check(name, out, a, b)
    if case == "channels_last":
        # dense alike: the output keeps the operands' layout (like torch's TensorIterator)
        assert out.stride() == a.stride()


@pytest.mark.parametrize("name", ["add", "mul", "exp", "gelu_backward"])
def test_flat_variant_refuses_operands_that_are_not_dense_alike(name):
    g = gen_for(name)
    a = values((6, 5), F32, g).t()
    b = None if name in UNARY else values((5, 6), F32, g)
    with pytest.raises(ValueError, match="forced variant triton_flat"):
        run(name, "triton_flat", a, b)
    if b is not None:  # broadcasting is not dense alike either
        with pytest.raises(ValueError, match="not dense"):
            run(name, "triton_flat", values((5, 6), F32, g), values((6,), F32, g))


@pytest.mark.parametrize("dtype", [F32, F16, I32])
def test_python_int_and_float_scalars(dtype):
    g = gen_for("scalars", dtype)
    for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
        a = values((4, 9), dtype, g)
        for s in (2, -3, 0.75, -2.5):
            for variant in VARIANTS:
                out = run(name, variant, a, s)
                check(name, out, a, s)


def test_scalar_at_fp32_boundary_is_rounded_like_torch():
    """Triton passes Python floats as fp32: fine for fp32/16-bit results, and the result
    equals torch's (torch also rounds the wrapped scalar to the fp32 opmath type)."""
    a = torch.linspace(-3, 3, 97, dtype=F32)
    for variant in VARIANTS:
        for s in (0.1, 1.0 / 3.0, 1e-30, 3e38):
            torch.testing.assert_close(run("add", variant, a, s), torch.add(a, s))
            torch.testing.assert_close(run("mul", variant, a, s), torch.mul(a, s))


# ---------------------------------------------------------------------------
# 3. Output dtype follows torch.result_type (int div -> default float).
# ---------------------------------------------------------------------------
def _z(dtype, v=1.5):
    return torch.tensor(v, dtype=dtype)


PROMOTION_CASES = [
    # (a dtype, other: dtype for a same-shape tensor, or a ('0d', dtype) tensor, or a Python number)
    (F16, F32), (BF16, F16), (F32, F64), (BF16, F32), (I32, F16), (I64, F32), (I32, BF16),
    (I32, I64), (I64, I32), (F32, ("0d", F64)), (F16, ("0d", F32)), (I32, ("0d", F64)),
    (I64, ("0d", I32)), (I32, 2.5), (I64, 3), (I32, 7), (F16, 0.3), (BF16, -2), (F32, 4),
]


def _promotion_params():
    out = []
    rng = random.Random(77)
    for a_dt, other in PROMOTION_CASES:
        for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
            if isinstance(other, tuple) or isinstance(other, (int, float)):
                variants = ("triton_strided",) if isinstance(other, tuple) else VARIANTS
            else:
                variants = VARIANTS
            variant = rng.choice(variants)
            out.append(pytest.param(name, a_dt, other, variant, id=f"{name}-{str(a_dt)[6:]}-{other}-{variant}"))
    return out


@pytest.mark.parametrize("name,a_dtype,other,variant", _promotion_params())
def test_result_dtype_is_torch_result_type(name, a_dtype, other, variant):
    g = gen_for("promote", name, a_dtype, repr(other))
    a = values((5, 7), a_dtype, g)
    if isinstance(other, tuple):
        b = _z(other[1], 3.0 if not other[1].is_floating_point else -1.75)
    elif isinstance(other, torch.dtype):
        b = values((5, 7), other, g)
    else:
        b = other
    out = run(name, variant, a, b)
    want = torch.result_type(a, b)
    if name == "div" and not want.is_floating_point:
        want = torch.float32
    assert out.dtype == want
    native = TORCH_NATIVE[name](a, b)
    assert native.dtype == want  # our expectation agrees with torch's own op
    if not (want in (F16, BF16) and not isinstance(b, torch.Tensor)):
        # torch's default tolerance for the dtype; ints exact. (Skipped for a 16-bit result with a
        # Python scalar: torch's CPU add/sub round the scalar to fp16/bf16 first -- e.g.
        # fp16 -0.2998 + 0.3 gives 2.44e-4 on CPU, 1.95e-4 exactly -- while the kernel, like
        # torch on CUDA, keeps it in fp32; the float64 check below is the oracle there.)
        torch.testing.assert_close(out, native)
    check(name, out, a, b, tol=TOL[want] if want.is_floating_point else None)


# ---------------------------------------------------------------------------
# 4. Empty tensors and size-1 dims.
# ---------------------------------------------------------------------------
EMPTY_SHAPES = [((0,), None), ((3, 0), None), ((2, 0, 4), None), ((0, 3), (3,)), ((1, 3), (0, 3)),
                ((4, 0, 1), (1, 5))]
SIZE1_SHAPES = [((1,), None), ((1, 1, 1), None), ((1, 7, 1), None), ((1, 7, 1), (4, 1, 3)),
                ((1, 1, 1, 1), (1,)), ((), ())]


def _edge_params():
    out = []
    for name in ("add", "div", "maximum", "silu_backward", "exp", "gelu", "relu"):
        for a_shape, b_shape in EMPTY_SHAPES + SIZE1_SHAPES:
            if name in UNARY and b_shape is not None:
                continue
            for variant in VARIANTS:
                out.append(pytest.param(name, variant, a_shape, b_shape, id=f"{name}-{variant}-{a_shape}-{b_shape}"))
    return out


@pytest.mark.parametrize("name,variant,a_shape,b_shape", _edge_params())
def test_empty_and_size1_dims(name, variant, a_shape, b_shape):
    g = gen_for("edge", name, a_shape, b_shape)
    a = values(a_shape, F32, g, positive=name in POSITIVE)
    b = None
    if name in BINARY:
        b = values(b_shape if b_shape is not None else a_shape, F32, g)
    dense_alike = b is None or (b.shape == a.shape and b.stride() == a.stride())
    if variant == "triton_flat" and not dense_alike:
        with pytest.raises(ValueError, match="not dense"):
            run(name, variant, a, b)
        return
    out = run(name, variant, a, b)
    want_shape = a.shape if b is None else torch.broadcast_shapes(a.shape, b.shape)
    assert out.shape == want_shape and out.dtype == F32
    if out.numel():
        check(name, out, a, b)


# ---------------------------------------------------------------------------
# 5. NaN and +-Inf propagate as in torch.
# ---------------------------------------------------------------------------
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 30.0, -30.0, 1e-3,
            100.0, -100.0]


# Caveat: triton 3.6's interpreter implements tl.maximum/tl.minimum with np.maximum/np.minimum,
# which propagate NaN whatever ``propagate_nan`` says; the NaN cases of maximum/minimum therefore
# check the kernels' contract only on a GPU run of these tests (``opforge selftest``).
def _special_expected(name, args):
    want = TORCH_NATIVE[name](*args)
    if name == "gelu":
        # torch's CPU *vectorized* fp32/bf16 gelu returns NaN at +inf (its scalar path, float64 and
        # float16 return +inf, as does the math); we hold the kernel to +inf.
        want = torch.where(args[0] == math.inf, torch.full_like(want, math.inf), want)
    return want


def _special_params():
    out = []
    for name in UNARY + BINARY:
        for variant in VARIANTS:
            for dtype in FLOAT_DTYPES:
                out.append(pytest.param(name, variant, dtype, id=f"{name}-{variant}-{str(dtype)[6:]}"))
    return out


@pytest.mark.parametrize("name,variant,dtype", _special_params())
def test_nan_inf_propagate_like_torch(name, variant, dtype):
    if name in UNARY:
        args = (torch.tensor(SPECIALS, dtype=dtype),)
    else:
        a, b = torch.meshgrid(torch.tensor(SPECIALS), torch.tensor(SPECIALS), indexing="ij")
        args = (a.to(dtype).contiguous(), b.to(dtype).contiguous())
    with force_variant(name, variant):
        out = getattr(opforge, name)(*args)
    torch.testing.assert_close(out, _special_expected(name, args), equal_nan=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_and_inf_scalar_operands(variant):
    a = torch.tensor([1.0, -2.0, math.inf, math.nan, 0.0])
    for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
        for s in (math.nan, math.inf, -math.inf):
            torch.testing.assert_close(run(name, variant, a, s), TORCH_NATIVE[name](a, s), equal_nan=True)


# ---------------------------------------------------------------------------
# 6. Large magnitudes: no NaN from exp overflow in the saturating ops.
# ---------------------------------------------------------------------------
LARGE = [1e4, -1e4, 3e3, -3e3, 1e2, -1e2, 88.5, -88.5, 89.0, -89.0, 20.0, -20.0, 11.0, -11.0]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["sigmoid", "silu", "tanh", "gelu", "gelu_tanh", "gelu_backward",
                                  "silu_backward"])
def test_large_magnitudes_saturate_without_nan(name, variant, dtype):
    x = torch.tensor(LARGE, dtype=dtype)
    if name in UNARY:
        a, b = x, None
    else:
        a, b = torch.full_like(x, 0.75), x  # gradient 0.75 at large x
    out = run(name, variant, a, b)
    assert not torch.isnan(out).any(), f"{name}({x.tolist()}) -> {out.tolist()}"
    ref = reference(name, a, b, dtype)
    tol = {F64: 1e-9, F32: 1e-5, F16: 1e-3, BF16: 1e-2}[dtype]
    torch.testing.assert_close(out.to(F64), ref.to(F64), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------
# 7. The ``collapse`` helper.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,strides,want", [
    # contiguous 3-D: one dim
    ((2, 3, 4), [[12, 4, 1]], ([24], [[1]])),
    # transposed 2-D: nothing merges
    ((3, 4), [[1, 3]], ([3, 4], [[1, 3]])),
    # size-1 dims are dropped, then the rest merges
    ((1, 5, 1, 2), [[10, 2, 2, 1]], ([10], [[1]])),
    # x[:, ::2] of a (3, 8): uniform stride 2 over 12 elements
    ((3, 4), [[8, 2]], ([12], [[2]])),
    # a row pitch that is not 4 * 2: no merge
    ((3, 4), [[10, 2]], ([3, 4], [[10, 2]])),
    # broadcast along dim 0 in the second operand blocks that merge only
    ((2, 3, 4), [[12, 4, 1], [0, 4, 1], [12, 4, 1]], ([2, 12], [[12, 1], [0, 1], [12, 1]])),
    # broadcast in every operand along a dim still merges (0 == 0 * n)
    ((3, 4), [[0, 1], [0, 1]], ([3, 4], [[0, 1], [0, 1]])),
    # ... so a fully broadcast leading block merges while the next dim does not
    ((4, 3, 5), [[0, 0, 1], [15, 5, 1]], ([12, 5], [[0, 1], [5, 1]])),
    ((2, 3), [[0, 0], [3, 1]], ([6], [[0], [1]])),
    # channels-last NCHW (2,3,4,5) vs a contiguous output: H,W merge for both
    ((2, 3, 4, 5), [[60, 1, 15, 3], [60, 20, 5, 1]], ([2, 3, 20], [[60, 1, 3], [60, 20, 1]])),
    # all dims size 1, and a 0-dim shape
    ((1, 1), [[7, 3]], ([], [[]])),
    ((), [[], []], ([], [[], []])),
])
def test_collapse_hand_computed(shape, strides, want):
    assert collapse(list(shape), [list(s) for s in strides]) == (want[0], [list(s) for s in want[1]])


def _offsets(shape, strides):
    return [sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*(range(n) for n in shape))]


def test_collapse_preserves_every_operands_offset_sequence():
    """Property: walking the collapsed dims in row-major order visits the same addresses."""
    rng = random.Random(5)
    for _ in range(200):
        nd = rng.randint(1, 5)
        shape = [rng.choice([1, 1, 2, 3, 4, 5]) for _ in range(nd)]
        ops = []
        for _k in range(rng.randint(1, 3)):
            kind = rng.random()
            base = torch.empty(shape)
            if kind < 0.3:
                st = list(base.stride())
            elif kind < 0.6:
                perm = list(range(nd))
                rng.shuffle(perm)
                t = torch.empty([shape[p] for p in perm]).permute(*[perm.index(i) for i in range(nd)])
                st = list(t.stride())
            else:
                st = [0 if rng.random() < 0.3 else s * rng.choice([1, 2]) for s in base.stride()]
            ops.append(st)
        dims, cstr = collapse(list(shape), [list(s) for s in ops])
        assert len(dims) <= sum(1 for n in shape if n != 1)
        assert all(n != 1 for n in dims)
        for st, cst in zip(ops, cstr):
            assert _offsets(dims, cst) == _offsets(shape, st), (shape, st, dims, cst)


def test_more_than_four_dims_after_collapse_falls_back():
    g = gen_for("5d")
    x = values((2, 3, 2, 3, 2), F32, g).permute(4, 2, 0, 3, 1)  # no two dims merge
    assert E.geometry(x, None) is None
    with pytest.raises(ValueError, match="more than 4 dims"):
        run("exp", "triton_strided", x)
    with pytest.raises(ValueError, match="not dense"):
        run("exp", "triton_flat", x)
    out = run("exp", None, x)  # dispatch falls back to the reference
    assert opforge.explain("exp", x).variant.name == "reference"
    check("exp", out, x)
    # a 5-D tensor whose dims do collapse still runs the strided kernel
    y = values((2, 3, 2, 3, 2), F32, g).transpose(3, 4)
    assert E.geometry(y, None) is not None
    check("exp", run("exp", "triton_strided", y), y)


# ---------------------------------------------------------------------------
# 8. Every element is written: direct launches with small tiles into a poisoned output.
# ---------------------------------------------------------------------------
def _poisoned(out: torch.Tensor) -> torch.Tensor:
    return out.fill_(math.nan) if out.dtype.is_floating_point else out.fill_(-12345)


FLAT_LAUNCHES = [("exp", None, 100, 32), ("add", "tensor", 257, 64), ("mul", "scalar", 129, 32),
                 ("maximum", "tensor", 1000, 128), ("gelu_backward", "tensor", 77, 16), ("neg", None, 65, 16)]


@pytest.mark.parametrize("name,b_kind,n,block,dtype", [
    pytest.param(*case, dt, id=f"{case[0]}-{case[2]}-{case[3]}-{str(dt)[6:]}")
    for case in FLAT_LAUNCHES for dt in (F32, F16, I32) if dt != I32 or case[0] in INT_OK
])
def test_flat_launch_writes_every_element(name, b_kind, n, block, dtype):
    g = gen_for("flat", name, n, dtype)
    a = values((n,), dtype, g)
    b = None if b_kind is None else (values((n,), dtype, g) if b_kind == "tensor" else 3)
    out = _poisoned(E.allocate_out(name, a, b))
    K.launch_flat(name, a, b, out, {"BLOCK": block, "num_warps": 1})
    check(name, out, a, b)


@pytest.mark.parametrize("a_shape,b_shape,tile", [
    ((3, 5, 7, 9), (5, 1, 9), (2, 4)),       # broadcast b; no dim a multiple of the tile
    ((6, 37), (37,), (4, 8)),
    ((2, 3, 11, 13), (2, 3, 11, 13), (4, 4)),
    ((45, 3), (45, 1), (8, 2)),
    ((1, 300), None, (1, 64)),
])
@pytest.mark.parametrize("transpose_a", [False, True])
def test_strided_launch_writes_every_element(a_shape, b_shape, tile, transpose_a):
    g = gen_for("strided", a_shape, b_shape, transpose_a)
    name = "sub" if b_shape is not None else "silu"
    if transpose_a:
        a = values(tuple(reversed(a_shape)), F32, g).permute(*reversed(range(len(a_shape))))
    else:
        a = values(a_shape, F32, g)
    b = None if b_shape is None else values(b_shape, F32, g)
    geo = E.geometry(a, b)
    assert geo is not None
    out = _poisoned(E.allocate_out(name, a, b))
    K.launch_strided(name, a, b, out, {"BLOCK_R": tile[0], "BLOCK_C": tile[1], "num_warps": 1}, geo)
    check(name, out, a, b)


@pytest.mark.parametrize("variant", VARIANTS)
def test_more_than_one_tile_through_dispatch(variant):
    """Default configs cap a tile at 1024 columns: 2500 and 1100 columns take several."""
    g = gen_for("big", variant)
    a = values((2500,), F32, g)
    check("gelu", run("gelu", variant, a), a)
    b = values((2500,), F32, g)
    check("div", run("div", variant, a, b), a, b)
    if variant == "triton_strided":
        c = values((1100, 3), F32, g).t()  # (3, 1100), column stride 3
        check("silu", run("silu", variant, c), c)
        d = values((1100,), F32, g)
        check("add", run("add", variant, c, d), c, d)
