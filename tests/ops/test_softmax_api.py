"""The softmax op contract: torch.library registration (opcheck), torch.compile,
autograd (gradcheck through the backward kernels), error messages, registry.

Oracles are torch in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.ops import softmax as S
from opforge.ops.softmax import log_softmax, softmax
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64 = torch.float32, torch.float64
OPS = torch.ops.opforge
FNS = {"softmax": softmax, "log_softmax": log_softmax}
REF = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward"])
def test_registered_with_all_variants(name):
    op = registry.get(name)
    assert [v.name for v in op.variants] == ["triton_col_split", "triton_col", "triton_row", "triton_wave", "triton_split", "triton_online", "torch_eager", "reference"]
    assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
    assert op.samples(torch.device("cpu"))


def test_dispatch_picks_row_kernel_for_short_rows(gen):
    d = dispatch.explain("softmax", rand((4, 100), gen), -1)
    assert d.variant.name == "triton_row"


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("name", FNS)
def test_opcheck(name, requires_grad, gen):
    for shape, dim in (((3, 7), -1), ((2, 3, 5), 1)):
        x = rand(shape, gen).requires_grad_(requires_grad)
        result = torch.library.opcheck(getattr(OPS, name).default, (x, dim))
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("name", ["softmax_backward", "log_softmax_backward"])
def test_opcheck_backward_ops(name, gen):
    x = rand((3, 7), gen)
    y = REF[name[: -len("_backward")]](x, -1)
    g = rand((3, 7), gen)
    result = torch.library.opcheck(getattr(OPS, name).default, (g, y, -1))
    assert set(result.values()) == {"SUCCESS"}, result


# ---------------------------------------------------------------------------
# Autograd: the backward kernels, against finite differences
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_row", "triton_split", "triton_online"])
@pytest.mark.parametrize("name", FNS)
def test_gradcheck_fp64(name, variant, gen):
    fn = FNS[name]
    with force_variant(name, variant), force_variant(f"{name}_backward", variant):
        for shape, dim in (((3, 6), -1), ((4, 3, 2), 1)):
            x = rand(shape, gen, F64).requires_grad_()
            assert torch.autograd.gradcheck(lambda t: fn(t, dim), (x,))


def test_backward_runs_through_the_kernel_ops(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        seen.append(op.name)
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    x = rand((3, 5), gen).requires_grad_()
    log_softmax(x).sum().backward()
    softmax(x.detach().requires_grad_(), 0).pow(2).sum().backward()
    assert {"log_softmax", "log_softmax_backward", "softmax", "softmax_backward"} <= set(seen)


@pytest.mark.parametrize("name", FNS)
def test_double_backward(name, gen):
    x = rand((3, 5), gen, F64).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: FNS[name](t, -1), (x,))


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(t):
        return softmax(t, -1) * log_softmax(t, 0)

    x = rand((4, 6), gen)
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(xc).sum().backward()
    xr = x.double().requires_grad_()
    want = torch.softmax(xr, -1) * torch.log_softmax(xr, 0)
    want.sum().backward()
    torch.testing.assert_close(compiled(x), want.detach().float())
    torch.testing.assert_close(xc.grad, xr.grad.float())
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Semantics and errors
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", FNS)
def test_default_dim_is_last_and_dtype_is_preserved(name, gen):
    for dt in (torch.float16, torch.bfloat16, F32, F64):
        x = rand((3, 4, 5), gen, dt)
        out = FNS[name](x)
        assert out.dtype == dt and out.shape == x.shape
        torch.testing.assert_close(out, REF[name](x.double(), -1).to(dt))


@pytest.mark.parametrize("name", FNS)
def test_last_dim_output_is_contiguous(name, gen):
    assert FNS[name](rand((3, 5), gen)).is_contiguous()
    assert FNS[name](rand((5, 3), gen).t()).is_contiguous()


@pytest.mark.parametrize("name", FNS)
def test_clear_errors(name):
    fn = FNS[name]
    with pytest.raises(TypeError, match=f"opforge.{name}: input must be a torch.Tensor, got list"):
        fn([1.0, 2.0])
    with pytest.raises(TypeError, match=f"opforge.{name}: input must be a floating-point tensor, got torch.int64"):
        fn(torch.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match=rf"opforge.{name}: dim 2 is out of range for a tensor with 2 dims"):
        fn(torch.ones(2, 3), 2)
    with pytest.raises(ValueError, match=rf"opforge.{name}: dim -3 is out of range for a tensor with 2 dims"):
        fn(torch.ones(2, 3), -3)
    with pytest.raises(ValueError, match=rf"opforge.{name}: dim 1 is out of range for a tensor with 0 dims"):
        fn(torch.tensor(1.0), 1)
    with pytest.raises(TypeError, match=f"opforge.{name}: dim must be an int, got float"):
        fn(torch.ones(2, 3), 1.0)
    with pytest.raises(ValueError, match=rf"opforge.{name}: dim 5"):
        fn(torch.ones(2, 3, requires_grad=True), 5)
    with pytest.raises(TypeError, match=f"opforge.{name}: complex"):
        fn(torch.ones(2, 3, dtype=torch.complex64))


def test_backward_op_errors():
    with pytest.raises(ValueError, match="opforge.softmax_backward: grad has shape"):
        OPS.softmax_backward(torch.ones(2, 3), torch.ones(3, 2), -1)
    with pytest.raises(TypeError, match="opforge.log_softmax_backward: grad is torch.float32 but output"):
        OPS.log_softmax_backward(torch.ones(2, 3), torch.ones(2, 3, dtype=F64), -1)
