"""The cross-entropy op contract: registry and dispatch decisions, torch.library
registration (opcheck), torch.compile, autograd (gradcheck in fp64 through the
Triton variants), probability targets, error messages.

Oracles are torch's ``F.cross_entropy`` in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.ops import cross_entropy as CE
from opforge.ops.cross_entropy import cross_entropy
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
OPS = torch.ops.opforge
FWD, BWD, FUSED = "cross_entropy_forward", "cross_entropy_backward", "cross_entropy_fused"

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


def targets(shape, cols, gen, frac=0.2, ignore=-100):
    t = torch.randint(0, cols, shape, generator=gen)
    t[torch.rand(shape, generator=gen) < frac] = ignore
    return t


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    fwd, bwd, fused = registry.get(FWD), registry.get(BWD), registry.get(FUSED)
    assert [v.name for v in fwd.variants] == ["triton_online", "triton_split", "torch_eager", "reference"]
    assert [v.name for v in bwd.variants] == ["triton_tiled", "torch_eager", "reference"]
    assert [v.name for v in fused.variants] == ["triton_fused", "triton_two_pass", "torch_eager", "reference"]
    for op in (fwd, bwd, fused):
        assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
        assert op.variant("reference").kind == "reference"


def test_samples_reach_every_variant_and_match_the_reference():
    """The selftest's inputs: every float dtype, and each Triton variant takes some."""
    fwd, bwd = registry.get(FWD), registry.get(BWD)
    samples = fwd.samples(torch.device("cpu"))
    assert {s[0].dtype for s in samples} == {torch.float16, BF16, F32, F64}
    chosen = {dispatch.explain(FWD, *s).variant.name for s in samples}
    assert chosen == {"triton_online", "triton_split"}
    fused_samples = registry.get(FUSED).samples(torch.device("cpu"))
    assert len(fused_samples) == len(samples)
    assert {dispatch.explain(FUSED, *s).variant.name for s in fused_samples} == {"triton_fused"}
    # The backward samples carry statistics consistent with their logits.
    gs, x, t, stats, ii, eps, *w = bwd.samples(torch.device("cpu"))[0]
    want = CE.cross_entropy_forward_reference(x.double(), t, ii, eps, *(v.double() for v in w))
    torch.testing.assert_close(stats.double(), want, rtol=1e-5, atol=1e-5)


def test_dispatch_online_for_many_rows_split_for_few_long_rows(gen):
    x = rand((300, 50), gen)
    t = targets((300,), 50, gen)
    assert dispatch.explain(FWD, x, t, -100, 0.0).variant.name == "triton_online"
    few = torch.empty(4, 20000)
    d = dispatch.explain(FWD, few, torch.zeros(4, dtype=torch.long), -100, 0.0)
    assert d.variant.name == "triton_split"
    assert "leave SMs idle" in d.rejected["triton_online"]
    assert "torch_eager" in d.rejected  # CPU tensors: the vendor variant is CUDA only
    g = torch.ones(4)
    stats = torch.zeros(3, 4)
    assert dispatch.explain(BWD, g, few, torch.zeros(4, dtype=torch.long), stats, -100, 0.0).variant.name \
        == "triton_tiled"


def test_memo_key_separates_layouts_and_weights(gen):
    op = registry.get(FWD)
    x = rand((4, 6), gen)
    t = targets((4,), 6, gen)
    w = torch.ones(6)
    keys = {op.memo_key(x, t, -100, 0.0), op.memo_key(x, t, -100, 0.0, w), op.memo_key(x, t, -100, 0.1),
            op.memo_key(rand((6, 4), gen).t(), t, -100, 0.0), op.memo_key(x.double(), t, -100, 0.0)}
    assert len(keys) == 5


def test_forward_and_backward_run_through_the_kernel_ops(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        seen.append((op.name, dispatch.explain(op.name, *args).variant.name))
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    x = rand((5, 7), gen).requires_grad_()
    cross_entropy(x, targets((5,), 7, gen), reduction="none").sum().backward()
    assert seen == [(FWD, "triton_online"), (BWD, "triton_tiled")]
    # A mean / sum loss under autograd: one fused pass, no backward kernel.
    seen.clear()
    cross_entropy(x, targets((5,), 7, gen), label_smoothing=0.1).backward()
    assert seen == [(FUSED, "triton_fused")]
    # Without autograd (or for a few long rows) the forward op alone runs.
    seen.clear()
    with torch.no_grad():
        cross_entropy(x, targets((5,), 7, gen))
    assert seen == [(FWD, "triton_online")]


def test_fused_backward_returns_the_saved_gradient_for_a_unit_loss_gradient(gen):
    """loss.backward(): the gradient written by the forward is handed back as is
    (no pass over it); another incoming gradient rescales it, and both are right."""
    x = rand((6, 9), gen).requires_grad_()
    t = targets((6,), 9, gen)
    stats, dx = OPS.cross_entropy_fused(x, t, None, torch.full((1,), 0.25), -100, 0.1)
    (got,) = torch.autograd.grad(stats[0].sum() * 0.25, x, retain_graph=True)
    assert got.data_ptr() == dx.data_ptr()
    (scaled,) = torch.autograd.grad(stats[0].sum() * 0.75, x)
    xr = x.detach().double().requires_grad_()
    F.cross_entropy(xr, t, reduction="sum", label_smoothing=0.1).backward()
    torch.testing.assert_close(got.double(), xr.grad * 0.25, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(scaled.double(), xr.grad * 0.75, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_forward(requires_grad, gen):
    cases = [
        (rand((4, 7), gen), targets((4,), 7, gen), None, -100, 0.0),
        (rand((2, 5, 3), gen), targets((2, 3), 5, gen), torch.rand(5, generator=gen) + 0.5, -100, 0.2),
    ]
    for x, t, w, ii, eps in cases:
        x.requires_grad_(requires_grad)
        result = torch.library.opcheck(OPS.cross_entropy_forward.default, (x, t, w, ii, eps))
        assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_fused(gen):
    x = rand((2, 5, 3), gen).requires_grad_()
    t = targets((2, 3), 5, gen)
    w = torch.rand(5, generator=gen) + 0.5
    result = torch.library.opcheck(OPS.cross_entropy_fused.default, (x, t, w, torch.full((1,), 0.2), -100, 0.1))
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_backward(gen):
    x = rand((3, 2, 6), gen)
    t = targets((3, 6), 2, gen)
    w = torch.rand(2, generator=gen) + 0.5
    stats = CE.cross_entropy_forward_reference(x, t, -100, 0.1, w)
    result = torch.library.opcheck(OPS.cross_entropy_backward.default, (torch.randn(18), x, t, stats, w, -100, 0.1))
    assert set(result.values()) == {"SUCCESS"}, result


# ---------------------------------------------------------------------------
# Autograd: the backward kernel against finite differences
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_online", "triton_split"])
def test_gradcheck_fp64_separate_forward_and_backward(variant, gen):
    """Per-row losses (reduction none): the forward op, then the backward kernel."""
    x3 = rand((2, 5, 2), gen, F64)
    t3 = torch.tensor([[1, 4], [-100, 0]])
    w = torch.rand(5, generator=gen, dtype=F64) + 0.5
    with force_variant(FWD, variant), force_variant(BWD, "triton_tiled"):
        assert torch.autograd.gradcheck(
            lambda a: cross_entropy(a, t3, weight=w, reduction="none", label_smoothing=0.3), (x3.requires_grad_(),),
            fast_mode=True)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradcheck_fp64_fused(reduction, gen):
    """A mean / sum loss: the gradient comes from the fused forward pass."""
    x2 = rand((3, 6), gen, F64).requires_grad_()
    t2 = torch.tensor([0, 5, -100])
    w = torch.rand(6, generator=gen, dtype=F64) + 0.5
    with force_variant(FUSED, "triton_fused"):
        assert torch.autograd.gradcheck(
            lambda a: cross_entropy(a, t2, weight=w, reduction=reduction, label_smoothing=0.1), (x2,), fast_mode=True)
        assert torch.autograd.gradcheck(lambda a: cross_entropy(a, t2, reduction=reduction), (x2,), fast_mode=True)


def test_weight_gets_no_gradient(gen):
    x = rand((4, 5), gen).requires_grad_()
    w = (torch.rand(5, generator=gen) + 0.5).requires_grad_()
    cross_entropy(x, targets((4,), 5, gen, frac=0.0), weight=w).backward()
    assert x.grad is not None and w.grad is None


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()
    w = torch.rand(6, generator=gen) + 0.5

    def f(a, t):
        return cross_entropy(a, t, weight=w, label_smoothing=0.1) + cross_entropy(a, t, reduction="sum")

    x = rand((5, 6), gen)
    t = targets((5,), 6, gen)
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(xc, t)
    out.backward()
    xr = x.double().requires_grad_()
    want = F.cross_entropy(xr, t, weight=w.double(), label_smoothing=0.1) + F.cross_entropy(xr, t, reduction="sum")
    want.backward()
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xc.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Semantics
# ---------------------------------------------------------------------------
def test_dtype_is_preserved_and_matches_torch(gen):
    for dt, tol in ((torch.float16, 1e-3), (BF16, 1e-2), (F32, 1e-5), (F64, 1e-12)):
        x = rand((6, 9), gen, dt)
        t = targets((6,), 9, gen)
        for red in ("none", "mean", "sum"):
            out = cross_entropy(x, t, reduction=red, label_smoothing=0.1)
            want = F.cross_entropy(x.double(), t, reduction=red, label_smoothing=0.1)
            assert out.dtype == dt and out.shape == want.shape
            assert float((out.double() - want).norm() / want.norm()) <= tol


def test_target_dtypes_uint8_and_int32(gen):
    x = rand((5, 7), gen)
    t = targets((5,), 7, gen, frac=0.0)
    want = F.cross_entropy(x.double(), t)
    for dt in (torch.uint8, torch.int32):
        torch.testing.assert_close(cross_entropy(x, t.to(dt)).double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_probability_targets(reduction, gen):
    x = rand((4, 6, 3), gen)
    p = torch.softmax(rand((4, 6, 3), gen), 1)
    w = torch.rand(6, generator=gen) + 0.5
    xo = x.clone().requires_grad_()
    out = cross_entropy(xo, p, weight=w, reduction=reduction, label_smoothing=0.2)
    xr = x.double().requires_grad_()
    want = F.cross_entropy(xr, p.double(), weight=w.double(), reduction=reduction, label_smoothing=0.2)
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(xo.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)


def test_out_of_range_targets_raise_on_cpu():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"opforge.cross_entropy: target 7 is out of range for 4 classes"):
        cross_entropy(x, torch.tensor([0, 7, 1]))
    with pytest.raises(ValueError, match=r"target -1 is out of range"):
        cross_entropy(x.requires_grad_(), torch.tensor([0, -1, 1]))
    with force_variant(FWD, "reference"), pytest.raises(ValueError, match="out of range"):
        cross_entropy(x.detach(), torch.tensor([4, 0, 0]))
    assert torch.isfinite(cross_entropy(x.detach(), torch.tensor([-5, 0, 1]), ignore_index=-5))


def test_clear_errors():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError, match="opforge.cross_entropy: input must be a torch.Tensor, got list"):
        cross_entropy([1.0, 2.0], t)
    with pytest.raises(TypeError, match="opforge.cross_entropy: input must be a floating-point tensor"):
        cross_entropy(torch.ones(3, 4, dtype=torch.long), t)
    with pytest.raises(TypeError, match="opforge.cross_entropy: target must hold class indices"):
        cross_entropy(x, t.to(torch.int16))
    with pytest.raises(ValueError, match=r"opforge.cross_entropy: target has shape \(2,\) but input of shape "
                                         r"\(3, 4\) needs \(3,\)"):
        cross_entropy(x, t[:2])
    with pytest.raises(ValueError, match="input must have at least 1 dim"):
        cross_entropy(torch.tensor(1.0), torch.tensor(0))
    with pytest.raises(ValueError, match=r"opforge.cross_entropy: weight has shape \(3,\); expected \(4,\)"):
        cross_entropy(x, t, weight=torch.ones(3))
    with pytest.raises(TypeError, match="opforge.cross_entropy: weight is torch.float64 but input is torch.float32"):
        cross_entropy(x, t, weight=torch.ones(4, dtype=F64))
    with pytest.raises(ValueError, match="opforge.cross_entropy: reduction must be one of"):
        cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0, got 1.5"):
        cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(TypeError, match="opforge.cross_entropy: ignore_index must be an int, got float"):
        cross_entropy(x, t, ignore_index=1.0)
    with pytest.raises(ValueError, match="input has 0 classes"):
        cross_entropy(torch.randn(3, 0), t)
    with pytest.raises(ValueError, match="probability target has shape"):
        cross_entropy(x, torch.rand(3, 5))
    with pytest.raises(TypeError, match="probability target is torch.float64 but input is torch.float32"):
        cross_entropy(x, torch.rand(3, 4, dtype=F64))
    # The same checks hold on the autograd (torch.library) path.
    with pytest.raises(ValueError, match=r"opforge.cross_entropy: target has shape"):
        cross_entropy(x.clone().requires_grad_(), t[:2])


def test_backward_op_errors():
    x = torch.randn(3, 4)
    t = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"opforge.cross_entropy_backward: grad has shape \(2,\); expected \(3,\)"):
        OPS.cross_entropy_backward(torch.ones(2), x, t, torch.zeros(3, 3), None, -100, 0.0)
    with pytest.raises(ValueError, match=r"opforge.cross_entropy_backward: stats has shape \(2, 3\)"):
        OPS.cross_entropy_backward(torch.ones(3), x, t, torch.zeros(2, 3), None, -100, 0.0)


def test_fused_backward_rescales_in_place_on_the_first_backward_only(gen):
    """A non-unit incoming gradient (a scaled loss, as under AMP's loss scaling) is applied to the
    saved gradient in place, per row, by a kernel that decides on the device; a second backward
    through the retained graph cannot undo that and says so."""
    x = rand((6, 9), gen).requires_grad_()
    t = targets((6,), 9, gen)
    stats, dx = OPS.cross_entropy_fused(x, t, None, torch.full((1,), 0.25), -100, 0.0, True)  # grad_owned
    g = torch.tensor([0.25, 0.5, 0.25, 0.0, 1.0, 0.25])  # some rows equal the scale, some not
    (got,) = torch.autograd.grad(stats[0], x, grad_outputs=g, retain_graph=True)
    assert got.data_ptr() == dx.data_ptr()  # in place, no new gradient tensor
    xr = x.detach().double().requires_grad_()
    rows = F.cross_entropy(xr, t, reduction="none")
    (want,) = torch.autograd.grad(rows, xr, grad_outputs=g.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="second backward through a retained graph"):
        torch.autograd.grad(stats[0], x, grad_outputs=g)
