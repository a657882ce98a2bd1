"""The transpose/permute op contract: torch.library registration (opcheck),
torch.compile, autograd (gradcheck through the kernels), error messages,
registry and selftest inputs, torch semantics at the edges.

Oracles are torch's own transpose/permute, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.ops import transpose as T
from opforge.ops.transpose import permute, transpose
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64 = torch.float32, torch.float64
OPS = torch.ops.opforge
VARIANTS = ("triton_tiled", "triton_gather")

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32):
    return (torch.randn(shape, generator=gen, dtype=F64) * 2).to(dtype)


# ---------------------------------------------------------------------------
# Registry and selftest inputs
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["transpose", "permute"])
def test_registered_with_all_variants(name):
    op = registry.get(name)
    assert [v.name for v in op.variants] == ["triton_tiled", "triton_gather", "torch_eager", "reference"]
    assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
    assert op.variant("reference").kind == "reference"
    assert all(op.variant(v).version for v in VARIANTS)


@pytest.mark.parametrize("name", ["transpose", "permute"])
def test_samples_reach_every_kernel_and_dtype(name):
    op = registry.get(name)
    samples = op.samples(torch.device("cpu"))
    for v in VARIANTS:
        taken = [a for a in samples if dispatch.reject_reason(op, op.variant(v), a) is None]
        dtypes = {a[0].dtype for a in taken}
        assert {torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool} <= dtypes, (v, dtypes)
    assert max(a[0].numel() for a in samples) >= 10**6   # a few larger shapes for the GPU selftest
    for a in samples:
        op.validate(*a)


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_transpose(requires_grad, gen):
    for shape, d0, d1 in (((32, 32), 0, 1), ((2, 3, 5), 0, 2), ((4, 5), 1, 1)):
        x = rand(shape, gen).requires_grad_(requires_grad)
        result = torch.library.opcheck(OPS.transpose.default, (x, d0, d1))
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_permute(requires_grad, gen):
    for shape, dims in (((32, 32), [1, 0]), ((2, 3, 5), [2, 0, 1]), ((3, 4), [0, -1])):
        x = rand(shape, gen).requires_grad_(requires_grad)
        result = torch.library.opcheck(OPS.permute.default, (x, dims))
        assert set(result.values()) == {"SUCCESS"}, result


# ---------------------------------------------------------------------------
# Autograd: through the kernels, against finite differences
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck_fp64(variant, gen):
    # fast_mode: a random projection of the Jacobian (the full one is 1320^2
    # interpreter launches away; the tiled kernel needs a plane of >= 1024).
    x = rand((33, 40), gen, F64).requires_grad_()
    y = rand((2, 3, 4), gen, F64).requires_grad_()
    z = rand((2, 33, 40), gen, F64).requires_grad_()
    with force_variant("transpose", variant), force_variant("permute", variant):
        assert torch.autograd.gradcheck(lambda t: transpose(t, 0, 1), (x,), fast_mode=True)
        assert torch.autograd.gradcheck(lambda t: permute(t, (2, 0, 1)), (z,), fast_mode=True)
    with force_variant("transpose", "triton_gather"):
        assert torch.autograd.gradcheck(lambda t: transpose(t, 0, -1), (y,))


def test_gradgradcheck(gen):
    y = rand((2, 3, 2), gen, F64).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: transpose(t, 0, 2) ** 2, (y,), fast_mode=True)
    assert torch.autograd.gradgradcheck(lambda t: permute(t, (1, 2, 0)) ** 2, (y,), fast_mode=True)


def test_backward_runs_through_the_ops(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        seen.append((op.name, args[1:]))
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    x = rand((3, 4, 5), gen).requires_grad_()
    g = rand((5, 4, 3), gen)
    transpose(x, 0, -1).backward(g)
    torch.testing.assert_close(x.grad, g.transpose(0, 2), rtol=0, atol=0)
    x.grad = None
    permute(x, (1, 2, 0)).backward(g.reshape(4, 5, 3))
    torch.testing.assert_close(x.grad, g.reshape(4, 5, 3).permute(2, 0, 1), rtol=0, atol=0)
    assert ("transpose", (0, -1)) in seen and seen.count(("transpose", (0, -1))) == 2
    assert ("permute", ((1, 2, 0),)) in seen and ("permute", ((2, 0, 1),)) in seen   # the inverse


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(t):
        return transpose(t, 0, 1) * 2 + permute(t, (1, 0))

    x = rand((33, 40), gen)
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(xc)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(compiled(x), 3 * x.t(), rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, torch.full_like(x, 3.0), rtol=0, atol=0)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Semantics
# ---------------------------------------------------------------------------
def test_matches_torch_for_every_dtype(gen):
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for dt in (torch.float16, torch.bfloat16, F32, F64, torch.int8, torch.uint8, torch.int16, torch.int32,
               torch.int64, torch.bool, torch.float8_e4m3fn):
        x = rand((33, 40), gen).to(dt)
        want = x.t().contiguous().view(ints[dt.itemsize])
        for out in (transpose(x, 0, 1), permute(x, [1, 0])):
            assert out.dtype == dt and out.is_contiguous() and out.shape == (40, 33)
            assert torch.equal(out.view(ints[dt.itemsize]), want), dt


def test_always_a_new_contiguous_tensor(gen):
    x = rand((4, 5), gen)
    for out in (transpose(x, 0, 0), transpose(x, 1, -1), permute(x, (0, 1)), transpose(rand((1, 5), gen), 0, 1)):
        assert out.is_contiguous() and out.data_ptr() != x.data_ptr()
    y = transpose(x, 0, 0)
    y.add_(1)
    assert not torch.equal(y, x)


def test_zero_dim_and_empty(gen):
    s = torch.tensor(2.5)
    for d0, d1 in ((0, 0), (-1, 0), (0, -1)):
        out = transpose(s, d0, d1)
        assert out.shape == () and float(out) == 2.5 and out.data_ptr() != s.data_ptr()
    assert float(permute(s, ())) == 2.5
    for shape, d0, d1 in (((0, 3), 0, 1), ((2, 0, 4), 1, 2)):
        x = torch.empty(shape)
        assert transpose(x, d0, d1).shape == x.transpose(d0, d1).shape


def test_direct_path_and_library_path_agree(gen):
    x = rand((40, 33), gen)
    a = transpose(x, 0, 1)                              # direct dispatch
    b = transpose(x.clone().requires_grad_(), 0, 1)     # through torch.library (autograd)
    c = OPS.transpose(x, 0, 1)
    assert torch.equal(a, b.detach()) and torch.equal(a, c) and torch.equal(a, x.t())
    assert torch.equal(permute(x, [1, 0]), permute(x.requires_grad_(), (1, 0)).detach())


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_transpose_errors():
    with pytest.raises(TypeError, match="opforge.transpose: input must be a torch.Tensor, got list"):
        transpose([1.0, 2.0], 0, 1)
    with pytest.raises(ValueError, match=r"opforge.transpose: dim1 2 is out of range for a tensor with 2 dims "
                                         r"\(expected -2 <= dim1 < 2\)"):
        transpose(torch.ones(2, 3), 0, 2)
    with pytest.raises(ValueError, match=r"opforge.transpose: dim0 -3 is out of range"):
        transpose(torch.ones(2, 3), -3, 0)
    with pytest.raises(ValueError, match=r"opforge.transpose: dim0 1 is out of range for a tensor with 0 dims"):
        transpose(torch.tensor(1.0), 1, 0)
    with pytest.raises(TypeError, match="opforge.transpose: dim1 must be an int, got float"):
        transpose(torch.ones(2, 3), 0, 1.0)
    with pytest.raises(TypeError, match="opforge.transpose: dim0 must be an int, got bool"):
        transpose(torch.ones(2, 3), True, 1)
    with pytest.raises(ValueError, match="opforge.transpose: dim1 5"):
        transpose(torch.ones(2, 3, requires_grad=True), 0, 5)
    with pytest.raises(TypeError, match="opforge.transpose: complex"):
        transpose(torch.ones(2, 3, dtype=torch.complex64), 0, 1)
    with pytest.raises(ValueError, match="opforge.transpose: dim0 2"):
        OPS.transpose(torch.ones(2, 3), 2, 0)


def test_permute_errors():
    with pytest.raises(ValueError, match="opforge.permute: dims has 1 entries but the input has 2 dims"):
        permute(torch.ones(2, 3), (0,))
    with pytest.raises(ValueError, match=r"opforge.permute: dims \(0, -2\) repeats dim 0"):
        permute(torch.ones(2, 3), (0, -2))
    with pytest.raises(ValueError, match="opforge.permute: dims entry 2 is out of range"):
        permute(torch.ones(2, 3), (0, 2))
    with pytest.raises(TypeError, match="opforge.permute: dims must be a list or tuple of ints, got int"):
        permute(torch.ones(2, 3), 1)
    with pytest.raises(TypeError, match="opforge.permute: dims entry must be an int, got str"):
        permute(torch.ones(2, 3), (0, "1"))
    with pytest.raises(TypeError, match="opforge.permute: input must be a torch.Tensor"):
        permute(3.0, ())
    with pytest.raises(ValueError, match=r"opforge.permute: dims \(1, 1\) repeats"):
        permute(torch.ones(2, 3, requires_grad=True), [1, 1])
