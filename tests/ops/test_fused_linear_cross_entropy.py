"""``opforge.fused_linear_cross_entropy``: loss and gradients (hidden, weight,
bias) of the chunked variant against float64 torch (``F.linear`` then
``F.cross_entropy``), ignored rows, label smoothing, a non-unit incoming
gradient, the no-grad path, and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import registry
from opforge.runtime.dispatch import force_variant

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def inputs(gen, dtype, rows=(2, 10), hidden=16, vocab=37):
    h = torch.randn((*rows, hidden), generator=gen).to(dtype)
    w = (torch.randn((vocab, hidden), generator=gen) / 4).to(dtype)
    b = torch.randn(vocab, generator=gen).to(dtype)
    t = torch.randint(0, vocab, rows, generator=gen)
    t[0, :3] = -100
    return h, w, b, t


def torch_loss(h, w, b, t, **kw):
    return F.cross_entropy(F.linear(h, w, b).reshape(-1, w.shape[0]), t.reshape(-1), **kw)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def test_registered():
    assert [v.name for v in registry.get("fused_linear_cross_entropy").variants] == ["chunked", "reference"]


@pytest.mark.parametrize("variant", ["chunked", "reference"])
def test_loss_and_gradients(gen, variant):
    h, w, b, t = inputs(gen, torch.float32)
    params = [x.clone().requires_grad_() for x in (h, w, b)]
    with force_variant("fused_linear_cross_entropy", variant):
        loss = opforge.fused_linear_cross_entropy(params[0], params[1], t, bias=params[2], label_smoothing=0.1,
                                                  chunk_rows=8)
    (3.0 * loss).backward()
    ref_params = [x.double().requires_grad_() for x in (h, w, b)]
    ref = torch_loss(*ref_params, t, label_smoothing=0.1)
    (3.0 * ref).backward()
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 1e-5 * abs(ref.item())
    for got, want in zip(params, ref_params):
        assert rel(got.grad, want.grad) < 1e-5


def test_weight_gradient_in_vocabulary_slices(gen, monkeypatch):
    """The d weight accumulator in slices of 10 vocabulary rows (37: three full, one ragged)."""
    from opforge.ops import fused_linear_cross_entropy as flce

    monkeypatch.setattr(flce, "DW_SLICE_BYTES", 10 * 16 * 4)
    assert flce.vocab_slices(37, 16, 4) == [(0, 10), (10, 20), (20, 30), (30, 37)]
    h, w, _, t = inputs(gen, torch.float32)
    params = [x.clone().requires_grad_() for x in (h, w)]
    with force_variant("fused_linear_cross_entropy", "chunked"):
        opforge.fused_linear_cross_entropy(*params, t, chunk_rows=8).backward()
    ref_params = [x.double().requires_grad_() for x in (h, w)]
    torch_loss(*ref_params, None, t).backward()
    for got, want in zip(params, ref_params):
        assert rel(got.grad, want.grad) < 1e-5


def test_bf16_sum_and_no_grad(gen):
    h, w, _, t = inputs(gen, torch.bfloat16)
    ref = torch_loss(h.double(), w.double(), None, t, reduction="sum")
    with force_variant("fused_linear_cross_entropy", "chunked"), torch.no_grad():
        loss = opforge.fused_linear_cross_entropy(h, w, t, reduction="sum", chunk_rows=16)
    assert abs(loss.item() - ref.item()) < 1e-2 * abs(ref.item())


def test_errors(gen):
    h, w, b, t = inputs(gen, torch.float32)
    with pytest.raises(ValueError, match="opforge.fused_linear_cross_entropy: reduction must be"):
        opforge.fused_linear_cross_entropy(h, w, t, reduction="none")
    with pytest.raises(ValueError, match="weight must be \\[V, H\\]"):
        opforge.fused_linear_cross_entropy(h, w.t(), t)
    with pytest.raises(ValueError, match="target has shape"):
        opforge.fused_linear_cross_entropy(h, w, t[0])
    with pytest.raises(ValueError, match="target 99 is out of range"):
        opforge.fused_linear_cross_entropy(h, w, torch.full_like(t, 99))


def test_opcheck(gen, monkeypatch):
    """The schema, the autograd registration and the fake (torch.compile's view of the op) against
    the op itself, on its reference path (the kernels' interpreter cost is not what is checked)."""
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    h, w, b, t = inputs(gen, torch.float32, rows=(2, 3), vocab=10)
    args = (h.requires_grad_(), w.requires_grad_(), t, b.requires_grad_(), -100, 0.1, "sum", True, 4)
    result = torch.library.opcheck(torch.ops.opforge.fused_linear_cross_entropy.default, args,
                                   test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result
