"""Code generation and compilation: the generated source, the kernel cache,
and each primitive's generated code against torch in float64 (Triton
interpreter).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.fusion import codegen, compiler
from opforge.fusion import function as fuse_mod
from opforge.fusion import expr as E
from opforge.fusion.function import Compiled, launch_flat, launch_strided

F16, BF16, F32, F64, I32, BOOL = torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.bool
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def run_kernel(fn, args, strided=False):
    """Trace ``fn`` for ``args``, launch the generated kernel, return its outputs."""
    spec = tuple(("T", a.dtype, a.dim() == 0) if isinstance(a, torch.Tensor) else ("S", type(a)) for a in args)
    c = Compiled(E.trace(fn, "f", spec), "opforge.fuse(f)")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    scalars = [a for a in args if not isinstance(a, torch.Tensor)]
    outs = fuse_mod.allocate(tensors, c.program.out_dtypes)
    if strided:
        launch_strided(c, tensors, scalars, outs, {"BLOCK_R": 4, "BLOCK_C": 8, "num_warps": 4})
    else:
        launch_flat(c, tensors, scalars, outs, {"BLOCK": 64, "num_warps": 4})
    return outs


def vals(shape, gen, dtype=F32, lo=0.25, hi=2.0, signed=True):
    m = torch.rand(shape, generator=gen, dtype=F64) * (hi - lo) + lo
    if signed:
        m = torch.where(torch.rand(shape, generator=gen) < 0.5, -m, m)
    return m.to(dtype)


def test_source_has_both_kernels_and_scalars_as_arguments():
    program = E.trace(lambda x, s: x * s + 0.125, "f", (("T", F32, False), ("S", float)))
    src = codegen.generate(program)
    assert "def fused_flat(" in src and "def fused_strided(" in src
    assert "do_not_specialize=['s0']" in src
    assert "C" in src and "tl.constexpr(0.125)" in src
    assert "0.75" not in src  # a scalar argument's value is never in the source


def test_sixteen_bit_inputs_compute_in_fp32_and_casts_round():
    program = E.trace(lambda x: (x * 3).to(torch.bfloat16) + 1, "f", (("T", BF16, False),))
    src = codegen.generate(program)
    assert ".to(tl.float32)" in src and ".to(tl.bfloat16).to(tl.float32)" in src


def test_compiler_caches_by_source_on_disk(gen):
    program = E.trace(lambda x: x * 2 + 1, "cache_test", (("T", F32, False),))
    src = codegen.generate(program)
    m1 = compiler.load(src)
    assert compiler.load(src) is m1
    path = compiler.cache_dir() / f"fused_{compiler.digest(src)}.py"
    assert path.read_text() == src
    import inspect

    assert "def fused_flat" in inspect.getsource(m1.fused_flat.fn)


def test_scalar_value_does_not_change_source():
    spec = (("T", F32, False), ("S", float))
    a = codegen.generate(E.trace(lambda x, s: x * s, "f", spec))
    b = codegen.generate(E.trace(lambda x, s: x * s, "f", spec))
    assert a == b


UNARY = {
    "exp": (torch.exp, dict()), "log": (torch.log, dict(signed=False)), "log1p": (torch.log1p, dict(lo=0.0, hi=3.0)),
    "expm1": (torch.expm1, dict(lo=1e-6, hi=3.0)), "sqrt": (torch.sqrt, dict(signed=False)),
    "rsqrt": (torch.rsqrt, dict(signed=False)), "sigmoid": (torch.sigmoid, dict(hi=8.0)),
    "tanh": (torch.tanh, dict(lo=0.01, hi=5.0)), "erf": (torch.erf, dict()), "silu": (F.silu, dict()),
    "gelu": (F.gelu, dict()), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), dict()),
    "relu": (torch.relu, dict()), "abs": (torch.abs, dict()), "neg": (torch.neg, dict()),
    "pow_scalar": (lambda x: x.abs() ** 1.7, dict()), "pow_int": (lambda x: x ** 5, dict()),
    "pow_neg_int": (lambda x: x ** -2, dict()), "pow_half": (lambda x: x.abs() ** 0.5, dict()),
    "sign": (torch.sign, dict()), "clamp": (lambda x: torch.clamp(x, -0.5, 1.0), dict()),
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_primitives_match_float64(name, dtype, gen):
    fn, kw = UNARY[name]
    x = vals((5, 37), gen, dtype, **kw)
    (out,) = run_kernel(fn, [x])
    assert out.dtype == fn(x).dtype
    assert rel_err(out, fn(x.double())) <= BOUND[dtype]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "where", "cmp"])
def test_binary_primitives_broadcast_strided(op, gen):
    a = vals((4, 6, 5), gen)
    b = vals((6, 1), gen, signed=op != "pow")
    fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
           "minimum": torch.minimum, "pow": lambda x, y: y ** x, "where": lambda x, y: torch.where(x > y, x, y * 2),
           "cmp": lambda x, y: (x >= y) ^ (x < 0)}
    fn = fns[op]
    (out,) = run_kernel(fn, [a, b], strided=True)
    ref = fn(a.double(), b.double())
    if ref.dtype == BOOL:
        assert torch.equal(out, ref)
    else:
        assert rel_err(out, ref) <= 1e-5


def test_integer_and_bool_arithmetic_wraps_like_torch(gen):
    a = torch.randint(-50, 50, (4, 9), generator=gen, dtype=I32)
    b = torch.randint(1, 7, (4, 9), generator=gen, dtype=I32)

    def f(a, b, k):
        return a * b + k, a ** 3, torch.maximum(a, b) - (~(a > b)).int(), a / b, (a & b) | 1, (a > 0) + (b > 3)

    outs = run_kernel(f, [a, b, 7])
    for o, r in zip(outs, f(a, b, 7)):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r)


def test_nan_and_infinities_propagate_as_torch():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 1e30, -1e-30])

    def f(x):
        return (torch.exp(x), torch.log1p(x), torch.expm1(x), torch.sigmoid(x), torch.tanh(x), F.gelu(x),
                torch.maximum(x, x * 0.5), torch.clamp(x, -1.0, 1.0), torch.sqrt(x), x ** 2.5, F.silu(x),
                torch.relu(x), 1.0 / x)

    outs = run_kernel(f, [x])
    for i, (o, r) in enumerate(zip(outs, f(x.double()))):
        assert rel_err(o, r) <= 1e-5, i


def test_fp64_scalars_keep_full_precision(gen):
    x = torch.rand(3, 8, generator=gen, dtype=F64) + 1
    s = 1.0 + 1e-12  # not representable in fp32
    (out,) = run_kernel(lambda x, s: x * s - x, [x, s])
    assert rel_err(out, x * s - x) <= 1e-9


def test_int64_offsets_path(monkeypatch, gen):
    """The INT64 branch of both kernels (forced by lowering the 32-bit limit)."""
    monkeypatch.setattr(fuse_mod, "_INT32_MAX", 16)
    a, b = vals((5, 7), gen), vals((7,), gen)
    (flat,) = run_kernel(lambda x, y: x * 2 + 1, [a, a.clone()])
    (strided,) = run_kernel(lambda x, y: x * y + 1, [a, b], strided=True)
    torch.testing.assert_close(flat, a * 2 + 1)
    torch.testing.assert_close(strided, a * b + 1)


def test_outputs_that_read_no_tensor_are_broadcast(gen):
    a = vals((3, 5), gen)
    outs = run_kernel(lambda x, s: (x + 1, torch.zeros_like(x) if False else (x * 0 == 0).float() * s), [a, 2.0])
    torch.testing.assert_close(outs[1], torch.full((3, 5), 2.0))
    zero = E.Graph()
    assert zero.apply("cast", (zero.const(0),), dtype=F32) >= 0  # a 0-dim tensor constant: valid node


def test_math_constants_are_exact():
    from opforge.fusion import device_fns as D

    assert D.SQRT1_2.value == pytest.approx(1 / math.sqrt(2), rel=1e-15)
    assert D.INV_SQRT_2PI.value == pytest.approx(1 / math.sqrt(2 * math.pi), rel=1e-15)
