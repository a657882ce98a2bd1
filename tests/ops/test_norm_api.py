"""The norm op contract: public functions vs torch, autograd (dx, dweight, dbias
vs float64 autograd of torch, gradcheck), torch.library opcheck, torch.compile
and error messages. Oracles are torch in float64, never opforge itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.ops import norm as N
from opforge.runtime.dispatch import force_variant

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
TOL = {F32: 1e-5, F64: 1e-12, F16: 1e-3, BF16: 1e-2}
OPS = torch.ops.opforge

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _torch(name, x, shape, w, b, eps):
    if name == "rms_norm":
        return F.rms_norm(x, shape, w, eps)
    return F.layer_norm(x, shape, w, b, 1e-5 if eps is None else eps)


def _ours(name, x, shape, w, b, eps):
    if name == "rms_norm":
        return N.rms_norm(x, shape, w, eps)
    return N.layer_norm(x, shape, w, b, 1e-5 if eps is None else eps)


def _params(shape, dtype, gen, name):
    w = (torch.rand(shape, generator=gen, dtype=F64) + 0.5).to(dtype)
    b = torch.randn(shape, generator=gen, dtype=F64).to(dtype) if name == "layer_norm" else None
    return w, b


NAMES = ["layer_norm", "rms_norm"]


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64])
@pytest.mark.parametrize("name", NAMES)
def test_public_forward_leading_shapes(name, dtype, gen):
    x = torch.randn((2, 3, 4, 10), generator=gen, dtype=F64).to(dtype)
    w, b = _params((4, 10), dtype, gen, name)
    y = _ours(name, x, (4, 10), w, b, None)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    want = _torch(name, x.double(), (4, 10), w.double(), None if b is None else b.double(),
                  N.default_rms_eps(dtype) if name == "rms_norm" else 1e-5)
    assert rel_err(y, want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [F16, BF16, F32])
def test_rms_default_eps_matches_torch(dtype, gen):
    # Tiny inputs make eps matter: torch uses finfo(opmath dtype).eps, not finfo(x.dtype).eps.
    x = (torch.randn((4, 16), generator=gen) * 1e-3).to(dtype)
    torch.testing.assert_close(N.rms_norm(x, 16), F.rms_norm(x, (16,)), rtol=TOL[dtype] * 4, atol=1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_input(name, gen):
    x = torch.randn((12, 9), generator=gen).t()  # (9, 12), stride (1, 9)
    w, b = _params((12,), F32, gen, name)
    y = _ours(name, x, 12, w, b, 1e-6)
    assert rel_err(y, _torch(name, x.double(), (12,), w.double(), None if b is None else b.double(), 1e-6)) <= 1e-5
    xs = torch.randn((4, 20), generator=gen)[:, ::2]
    assert rel_err(_ours(name, xs, 10, None, None, 1e-6), _torch(name, xs.double(), (10,), None, None, 1e-6)) <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_nan(name, gen):
    e = torch.empty((0, 3, 5))
    assert _ours(name, e, 5, None, None, None).shape == (0, 3, 5)
    x = torch.randn((3, 6), generator=gen)
    x[0, 0] = float("nan")
    y, want = _ours(name, x, 6, None, None, 1e-5), _torch(name, x, (6,), None, None, 1e-5)
    torch.testing.assert_close(y, want, equal_nan=True)


# ---------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_row", "triton_looped"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_vs_float64_autograd(name, dtype, variant, gen):
    shape = (3, 7, 24)
    x = (torch.randn(shape, generator=gen, dtype=F64) + 2).to(dtype)
    dy = torch.randn(shape, generator=gen, dtype=F64).to(dtype)
    w, b = _params((24,), dtype, gen, name)
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    with force_variant(name, variant), force_variant(name + "_backward", variant):
        y = _ours(name, leaves[0], 24, leaves[1], leaves[2] if len(leaves) > 2 else None, 1e-5)
        got = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    yr = _torch(name, ref_leaves[0], (24,), ref_leaves[1], ref_leaves[2] if len(ref_leaves) > 2 else None, 1e-5)
    want = torch.autograd.grad(yr, ref_leaves, dy.double())
    assert rel_err(y, yr) <= TOL[dtype]
    for g, r in zip(got, want):
        assert g.dtype == dtype and g.shape == r.shape
        assert rel_err(g, r) <= TOL[dtype]


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_fp64(name, gen):
    x = torch.randn((3, 5), generator=gen, dtype=F64, requires_grad=True)
    w = (torch.rand(5, generator=gen, dtype=F64) + 0.5).requires_grad_()
    if name == "layer_norm":
        b = torch.randn(5, generator=gen, dtype=F64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, w, b: N.layer_norm(x, 5, w, b), (x, w, b))
    else:
        assert torch.autograd.gradcheck(lambda x, w: N.rms_norm(x, 5, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x: _ours(name, x, 5, None, None, 1e-5), (x,))


def test_grad_only_some_inputs(gen):
    x = torch.randn((4, 8), generator=gen, requires_grad=True)
    w = torch.rand(8, generator=gen) + 0.5
    b = torch.randn(8, generator=gen, requires_grad=True)
    N.layer_norm(x, 8, w, b).sum().backward()
    assert x.grad is not None and b.grad is not None
    torch.testing.assert_close(b.grad, torch.full((8,), 4.0))


# ---------------------------------------------------------------------------
# torch.library
# ---------------------------------------------------------------------------
def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_layer_norm(requires_grad, gen):
    x = torch.randn((3, 2, 6), generator=gen).requires_grad_(requires_grad)
    w = (torch.rand(6, generator=gen) + 0.5).requires_grad_(requires_grad)
    b = torch.randn(6, generator=gen).requires_grad_(requires_grad)
    _opcheck(OPS.layer_norm.default, (x, [6], w, b, 1e-5))
    _opcheck(OPS.layer_norm.default, (x, [2, 6], None, None, 1e-3))


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_rms_norm(requires_grad, gen):
    x = torch.randn((3, 6), generator=gen).requires_grad_(requires_grad)
    w = (torch.rand(6, generator=gen) + 0.5).requires_grad_(requires_grad)
    _opcheck(OPS.rms_norm.default, (x, [6], w, None))
    _opcheck(OPS.rms_norm.default, (x, [6], None, 1e-5))


def test_opcheck_backward_ops(gen):
    x, g = torch.randn((3, 6), generator=gen), torch.randn((3, 6), generator=gen)
    w, b = torch.rand(6, generator=gen) + 0.5, torch.randn(6, generator=gen)
    _opcheck(OPS.layer_norm_backward.default, (g, x, [6], w, b, 1e-5))
    _opcheck(OPS.rms_norm_backward.default, (g, x, [6], None, 1e-5))


def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(x, w, b):
        return N.rms_norm(N.layer_norm(x, 8, w, b), 8, w, 1e-6)

    x = torch.randn((4, 8), generator=gen)
    w, b = torch.rand(8, generator=gen) + 0.5, torch.randn(8, generator=gen)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xc = x.clone().requires_grad_()
    compiled(xc, w, b).sum().backward()
    x64 = x.double().requires_grad_()
    ref = F.rms_norm(F.layer_norm(x64, (8,), w.double(), b.double(), 1e-5), (8,), w.double(), 1e-6)
    ref.sum().backward()
    torch.testing.assert_close(compiled(x, w, b), ref.float().detach())
    torch.testing.assert_close(xc.grad, x64.grad.float(), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_clear_errors(gen):
    x = torch.randn((4, 6), generator=gen)
    with pytest.raises(TypeError, match=r"opforge\.layer_norm: input must be a torch\.Tensor"):
        N.layer_norm([1.0, 2.0], 2)
    with pytest.raises(ValueError, match=r"opforge\.layer_norm: normalized_shape \(5,\) does not match .*\(4, 6\)"):
        N.layer_norm(x, 5)
    with pytest.raises(ValueError, match=r"opforge\.rms_norm: normalized_shape \(2, 4, 6\)"):
        N.rms_norm(x, (2, 4, 6))
    with pytest.raises(ValueError, match=r"opforge\.layer_norm: weight of shape \(5,\) does not match normalized_shape \(6,\)"):
        N.layer_norm(x, 6, torch.ones(5))
    with pytest.raises(ValueError, match=r"opforge\.layer_norm: bias of shape \(3,\)"):
        N.layer_norm(x, 6, torch.ones(6), torch.ones(3))
    with pytest.raises(TypeError, match=r"opforge\.rms_norm: weight has dtype torch\.float64 but input has torch\.float32"):
        N.rms_norm(x, 6, torch.ones(6, dtype=F64))
    with pytest.raises(TypeError, match=r"opforge\.rms_norm: input must be float16, bfloat16, float32 or float64"):
        N.rms_norm(torch.ones((2, 3), dtype=torch.int32), 3)
    with pytest.raises(TypeError, match=r"opforge\.layer_norm: weight must be a torch\.Tensor or None"):
        N.layer_norm(x.requires_grad_(), 6, [1.0] * 6)
    with pytest.raises(TypeError, match=r"opforge\.layer_norm: eps must be a real number"):
        N.layer_norm(x, 6, eps="small")
    with pytest.raises(TypeError, match=r"opforge\.rms_norm: normalized_shape must"):
        N.rms_norm(x, 6.0)
