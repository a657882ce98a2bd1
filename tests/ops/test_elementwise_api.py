"""The elementwise op contract: torch.library registration (opcheck), torch.compile,
autograd, error messages, ``opforge.explain`` and the public names.

Oracles are torch in float64 (or plain Python floats), never opforge itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.gradcheck import GradcheckError

import opforge
from opforge.ops import elementwise as E
from opforge.ops.elementwise import BINARY, INT_OK, UNARY
from opforge.runtime.dispatch import force_variant

F32, F64 = torch.float32, torch.float64
OPS = torch.ops.opforge
POSITIVE = frozenset({"log", "sqrt", "rsqrt"})
GRADIENT_OPS = ("gelu_backward", "silu_backward")   # (grad, x): x must be a tensor; no .Scalar
SCALAR_BINARY = tuple(n for n in BINARY if n not in GRADIENT_OPS)
DIFFERENTIABLE_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")

pytestmark = [
    # The interpreter evaluates masked-off lanes too (log(0), 0/0, ...): numpy warns.
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    # opcheck's internals use torch.jit.script_method (deprecated in torch 2.13).
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def mag(shape, gen, dtype=F64, positive=False, lo=0.25, hi=2.0):
    """Non-zero values, |x| in [lo, hi), random signs unless positive."""
    m = torch.rand(shape, generator=gen, dtype=F64) * (hi - lo) + lo
    if not positive:
        m = torch.where(torch.rand(shape, generator=gen) < 0.5, -m, m)
    return m.to(dtype)


def apart(a: torch.Tensor, gen, lo=0.2) -> torch.Tensor:
    """A second operand at least ``lo`` away from ``a`` (no max/min ties, no kinks)."""
    return a + mag(a.shape, gen, a.dtype, lo=lo, hi=1.0)


# ---------------------------------------------------------------------------
# Public names
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", UNARY + BINARY)
def test_every_op_is_reachable_as_opforge_name(name, gen):
    fn = getattr(opforge, name)
    assert callable(fn) and fn.__name__ == name
    assert name in opforge.__all__
    assert fn is getattr(E, name)
    packet = getattr(OPS, name)
    overloads = set(packet.overloads())
    if name in UNARY:
        assert overloads == {"default"}
        x = mag((5, 3), gen, F32, positive=name in POSITIVE)
        want = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
                "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu,
                "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}[name]
        torch.testing.assert_close(fn(x), want(x.double()).float())
    else:
        assert "Tensor" in overloads
        assert ("Scalar" in overloads) == (name not in GRADIENT_OPS)


# ---------------------------------------------------------------------------
# torch.library.opcheck
# ---------------------------------------------------------------------------
def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("name", UNARY)
def test_opcheck_unary(name, requires_grad, gen):
    x = mag((4, 6), gen, F32, positive=name in POSITIVE).requires_grad_(requires_grad)
    _opcheck(getattr(OPS, name).default, (x,))


@pytest.mark.filterwarnings("ignore:.*autograd kernel was not registered:UserWarning")
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("layout", ["same", "broadcast", "broadcast_self", "zero_dim"])
@pytest.mark.parametrize("name", BINARY)
def test_opcheck_binary_tensor(name, layout, requires_grad, gen):
    a_shape, b_shape = {"same": ((3, 5), (3, 5)), "broadcast": ((2, 3, 5), (3, 1)),
                        "broadcast_self": ((5,), (4, 5)), "zero_dim": ((3, 5), ())}[layout]
    a = mag(a_shape, gen, F32).requires_grad_(requires_grad)
    b = mag(b_shape, gen, F32).requires_grad_(requires_grad)
    _opcheck(getattr(OPS, name).Tensor, (a, b))


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("scalar", [1.75, -3], ids=["float", "int"])
@pytest.mark.parametrize("name", SCALAR_BINARY)
def test_opcheck_binary_scalar(name, scalar, requires_grad, gen):
    a = mag((3, 5), gen, F32).requires_grad_(requires_grad)
    _opcheck(getattr(OPS, name).Scalar, (a, scalar))


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def _chain(x, y):
    return opforge.silu(opforge.gelu(opforge.add(opforge.mul(x, y), 0.5)))


def _chain_ref(x, y):
    return F.silu(F.gelu(x * y + 0.5))


def test_compile_fullgraph_inductor_matches_eager(gen):
    torch._dynamo.reset()
    x, y = mag((6, 10), gen, F32), mag((10,), gen, F32)
    compiled = torch.compile(_chain, fullgraph=True, backend="inductor")
    got = compiled(x, y)
    torch.testing.assert_close(got, _chain(x, y))
    torch.testing.assert_close(got, _chain_ref(x.double(), y.double()).float())
    torch._dynamo.reset()


def test_compile_fullgraph_backward_matches_eager(gen):
    torch._dynamo.reset()
    x, y = mag((6, 10), gen, F32), mag((6, 1), gen, F32)
    compiled = torch.compile(_chain, fullgraph=True, backend="aot_eager")
    xc, yc = x.clone().requires_grad_(), y.clone().requires_grad_()
    compiled(xc, yc).sum().backward()
    x64, y64 = x.double().requires_grad_(), y.double().requires_grad_()
    _chain_ref(x64, y64).sum().backward()
    torch.testing.assert_close(xc.grad, x64.grad.float())
    torch.testing.assert_close(yc.grad, y64.grad.float())
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", UNARY)
def test_gradcheck_unary(name, gen):
    x = mag((3, 4), gen, F64, positive=name in POSITIVE).requires_grad_()
    assert torch.autograd.gradcheck(getattr(opforge, name), (x,))


@pytest.mark.parametrize("case", ["same", "broadcast_other", "broadcast_self", "both_broadcast", "zero_dim",
                                  "scalar", "int_scalar"])
@pytest.mark.parametrize("name", DIFFERENTIABLE_BINARY)
def test_gradcheck_binary(name, case, gen):
    fn = getattr(opforge, name)
    if case in ("scalar", "int_scalar"):
        a = mag((3, 4), gen, F64).requires_grad_()
        s = 0.6 if case == "scalar" else 2
        if name in ("maximum", "minimum"):
            a = (a.detach() + torch.where(a.detach() > s, 0.3, -0.3)).requires_grad_()  # no ties
        assert torch.autograd.gradcheck(lambda t: fn(t, s), (a,))
        return
    a_shape, b_shape = {"same": ((3, 4), (3, 4)), "broadcast_other": ((2, 3, 4), (4,)),
                        "broadcast_self": ((3, 1), (2, 3, 4)), "both_broadcast": ((3, 1), (1, 4)),
                        "zero_dim": ((3, 4), ())}[case]
    a = mag(a_shape, gen, F64)
    b = mag(b_shape, gen, F64)
    if name in ("maximum", "minimum"):
        # no ties (the derivative is not defined there): |b| in [2.5, 3) never meets |a| < 2,
        # and in the same-shape case b sits 0.2..1 above a
        b = apart(a, gen) if case == "same" else mag(b_shape, gen, F64, lo=2.5, hi=3.0)
    a.requires_grad_()
    b.requires_grad_()
    assert torch.autograd.gradcheck(fn, (a, b))


def test_grad_shapes_and_values_against_torch_with_broadcasting(gen):
    """The broadcast gradient is summed back to each operand's shape, as torch does."""
    for name, ref in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
                      ("maximum", torch.maximum), ("minimum", torch.minimum)):
        a = mag((2, 1, 4), gen, F32).requires_grad_()
        b = mag((3, 1), gen, F32, lo=2.5, hi=3.0).requires_grad_()
        g = mag((2, 3, 4), gen, F32)
        ga, gb = torch.autograd.grad(getattr(opforge, name)(a, b), (a, b), g)
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        wa, wb = torch.autograd.grad(ref(a64, b64), (a64, b64), g.double())
        assert ga.shape == a.shape and gb.shape == b.shape
        torch.testing.assert_close(ga, wa.float())
        torch.testing.assert_close(gb, wb.float())


def test_grad_of_mixed_dtype_operands_has_each_operands_dtype(gen):
    a = mag((3, 4), gen, F32).requires_grad_()
    b = mag((4,), gen, F64).requires_grad_()
    out = opforge.mul(a, b)
    assert out.dtype == F64
    ga, gb = torch.autograd.grad(out.sum(), (a, b))
    assert ga.dtype == F32 and gb.dtype == F64
    torch.testing.assert_close(ga, b.detach().expand(3, 4).float())
    torch.testing.assert_close(gb, a.detach().double().sum(0))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_gelu_backward_formula_matches_aten(dtype, gen):
    g = mag((5, 7), gen, dtype, lo=0.1, hi=3.0)
    x = mag((5, 7), gen, dtype, lo=0.05, hi=5.0)
    want = torch.ops.aten.gelu_backward(g.double(), x.double())
    tol = 1e-12 if dtype == F64 else 1e-5
    torch.testing.assert_close(opforge.gelu_backward(g, x).double(), want, rtol=tol, atol=tol)
    # broadcasting x over the gradient
    xb = x[:1]
    want_b = torch.ops.aten.gelu_backward(g.double(), xb.double().expand_as(g))
    torch.testing.assert_close(opforge.gelu_backward(g, xb).double(), want_b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_silu_backward_formula_matches_autograd_of_silu(dtype, gen):
    g = mag((6, 5), gen, dtype, lo=0.1, hi=3.0)
    x = mag((6, 5), gen, dtype, lo=0.05, hi=8.0)
    x64 = x.double().requires_grad_()
    (want,) = torch.autograd.grad(F.silu(x64), x64, g.double())
    tol = 1e-12 if dtype == F64 else 1e-5
    torch.testing.assert_close(opforge.silu_backward(g, x).double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activation_grad_matches_torch(name, gen):
    ref = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}[name]
    x = mag((4, 9), gen, F32, lo=0.05, hi=4.0).requires_grad_()
    g = mag((4, 9), gen, F32)
    (got,) = torch.autograd.grad(getattr(opforge, name)(x), x, g)
    x64 = x.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(ref(x64), x64, g.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", GRADIENT_OPS)
def test_gradient_ops_take_x_as_a_tensor_only(name, gen):
    g = mag((3,), gen, F32)
    with pytest.raises(TypeError, match=f"opforge.{name}"):
        getattr(opforge, name)(g, 0.5)


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh", "log", "gelu_tanh"])
def test_gradgradcheck(name, gen):
    x = mag((5,), gen, F64, positive=name in POSITIVE).requires_grad_()
    assert torch.autograd.gradgradcheck(getattr(opforge, name), (x,))


@pytest.mark.parametrize("name", ["gelu", "silu"])
def test_gradgradcheck_gelu_silu(name, gen):
    x = mag((5,), gen, F64).requires_grad_()
    assert torch.autograd.gradgradcheck(getattr(opforge, name), (x,))


def test_direct_and_autograd_paths_agree(gen):
    """With and without requires_grad the same kernels run and give the same values."""
    a, b = mag((4, 5), gen, F32), mag((5,), gen, F32)
    for name in DIFFERENTIABLE_BINARY:
        plain = getattr(opforge, name)(a, b)
        tracked = getattr(opforge, name)(a.clone().requires_grad_(), b)
        assert tracked.requires_grad
        torch.testing.assert_close(tracked.detach(), plain, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, None, "x"], ids=["list", "float", "None", "str"])
@pytest.mark.parametrize("name", UNARY + BINARY)
def test_non_tensor_input_is_a_type_error_naming_the_op(name, bad):
    fn = getattr(opforge, name)
    with pytest.raises(TypeError, match=f"opforge.{name}"):
        fn(bad) if name in UNARY else fn(bad, 2.0)


@pytest.mark.parametrize("name", ["add", "maximum", "gelu_backward"])
def test_non_tensor_input_with_tensor_other_is_a_type_error(name):
    with pytest.raises(TypeError, match=f"opforge.{name}"):
        getattr(opforge, name)([1.0, 2.0], torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("name", [n for n in UNARY + BINARY if n not in INT_OK])
def test_int_tensor_to_float_only_op_is_a_type_error(name, dtype):
    x = torch.ones(3, dtype=dtype)
    fn = getattr(opforge, name)
    with pytest.raises(TypeError, match=rf"opforge.{name}: .*floating-point.*{str(dtype)}"):
        fn(x) if name in UNARY else fn(x, torch.ones(3))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", BINARY)
def test_non_broadcastable_shapes_are_a_value_error_naming_both(name, requires_grad):
    a = torch.ones(2, 3, requires_grad=requires_grad)
    b = torch.ones(4)
    with pytest.raises(ValueError, match=rf"opforge.{name}: .*\(2, 3\).*\(4,\)"):
        getattr(opforge, name)(a, b)
    with pytest.raises(ValueError, match=rf"\(4,\).*\(2, 3\)"):
        getattr(opforge, name)(b, a)
    with pytest.raises(ValueError, match=f"opforge.{name}"):
        getattr(OPS, name).Tensor(a, b)  # the registered op validates too


@pytest.mark.parametrize("name", UNARY + BINARY)
def test_complex_is_a_type_error(name):
    z = torch.ones(3, dtype=torch.complex64)
    fn = getattr(opforge, name)
    with pytest.raises(TypeError, match=f"opforge.{name}: complex"):
        fn(z) if name in UNARY else fn(z, torch.ones(3))
    if name in BINARY:
        with pytest.raises(TypeError, match=f"opforge.{name}"):
            fn(torch.ones(3), z)
        with pytest.raises(TypeError, match=f"opforge.{name}"):
            fn(torch.ones(3), 1 + 2j)


@pytest.mark.parametrize("bad", ["2", None, [1.0], object()], ids=["str", "None", "list", "object"])
@pytest.mark.parametrize("name", BINARY)
def test_bad_other_is_a_type_error(name, bad):
    with pytest.raises(TypeError, match=f"opforge.{name}"):
        getattr(opforge, name)(torch.ones(3), bad)


@pytest.mark.parametrize("name", BINARY)
def test_other_on_another_device_is_a_value_error(name):
    cpu, meta = torch.ones(2, 3), torch.ones(2, 3, device="meta")
    fn = getattr(opforge, name)
    with pytest.raises(ValueError, match=f"opforge.{name}: other is on meta but input is on cpu"):
        fn(cpu, meta)
    with pytest.raises(ValueError, match=f"opforge.{name}: other is on cpu but input is on meta"):
        fn(meta, cpu)


def test_device_check_survives_a_memoized_call():
    a = torch.ones(2, 3)
    torch.testing.assert_close(opforge.add(a, torch.ones(2, 3)), torch.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="opforge.add: other is on meta"):
        opforge.add(a, torch.ones(2, 3, device="meta"))


def test_unknown_variant_name_is_rejected():
    with pytest.raises(KeyError, match="no variant 'triton_nope'"):
        with force_variant("add", "triton_nope"):
            pass


# ---------------------------------------------------------------------------
# explain: float64 with a Python scalar runs the reference
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,pyop", [("add", lambda u, s: u + s), ("sub", lambda u, s: u - s),
                                       ("mul", lambda u, s: u * s), ("div", lambda u, s: u / s),
                                       ("maximum", max), ("minimum", min)])
def test_explain_float64_with_python_scalar(name, pyop, gen):
    x = mag((7, 3), gen, F64)
    s = 0.1  # not representable in fp32: an fp32 scalar would be off by ~1.5e-9
    d = opforge.explain(name, x, s)
    text = str(d)
    assert d.variant.name == "reference"
    for v in ("triton_flat", "triton_strided"):
        assert f"rejected {v}" in text
        assert "Triton passes scalars as fp32" in d.rejected[v]
    out = getattr(opforge, name)(x, s)
    assert out.dtype == F64
    want = torch.tensor([[pyop(u, s) for u in row] for row in x.tolist()], dtype=F64)  # IEEE doubles
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    s32 = float(torch.tensor(s, dtype=F32))
    if name not in ("maximum", "minimum"):
        fp32_scalar = torch.tensor([[pyop(u, s32) for u in row] for row in x.tolist()], dtype=F64)
        assert not torch.equal(out, fp32_scalar)  # the rejection is what keeps it exact


def test_explain_float32_scalar_and_float64_tensor_run_triton(gen):
    x32 = mag((4, 4), gen, F32)
    assert opforge.explain("add", x32, 0.1).variant.name == "triton_flat"
    x64, y64 = mag((4, 4), gen, F64), mag((4, 4), gen, F64)
    assert opforge.explain("add", x64, y64).variant.name == "triton_flat"
    assert opforge.explain("add", x64.t(), y64).variant.name == "triton_strided"
    text = str(opforge.explain("add", x64.t(), y64))
    assert "rejected triton_flat: operands are not dense" in text


# ---------------------------------------------------------------------------
# Scalar semantics across variants
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [
    "triton_flat", "triton_strided",
    "reference"])
def test_int_tensor_with_float_scalar_maximum_minimum(variant):
    a = torch.tensor([1, 3, -2, 7], dtype=torch.int32)
    with force_variant("maximum", variant):
        torch.testing.assert_close(opforge.maximum(a, 2.5), torch.tensor([2.5, 3.0, 2.5, 7.0]))
    with force_variant("minimum", variant):
        torch.testing.assert_close(opforge.minimum(a, -1.5), torch.tensor([-1.5, -1.5, -2.0, -1.5]))


@pytest.mark.parametrize("dtype", [torch.int32, F32])
def test_bool_scalar_other(dtype):
    a = torch.tensor([1, -2, 5], dtype=dtype)
    torch.testing.assert_close(opforge.add(a, True), torch.add(a, True))
