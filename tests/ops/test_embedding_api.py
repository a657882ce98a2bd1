"""``opforge.embedding``: the gather and the sorted, deterministic table
gradient against torch (``F.embedding`` and its autograd), padding_idx,
repeated ids, int32 ids, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import registry
from opforge.runtime.dispatch import force_variant


def test_registered():
    assert [v.name for v in registry.get("embedding").variants] == ["triton_gather", "torch_eager", "reference"]
    assert [v.name for v in registry.get("embedding_backward").variants] == \
        ["triton_sorted", "torch_eager", "reference"]


@pytest.mark.parametrize("dtype,padding_idx", [(torch.float64, 2), (torch.bfloat16, None)])
def test_forward_and_gradient(gen, dtype, padding_idx):
    ids = torch.randint(0, 5, (2, 6), generator=gen)  # 12 tokens over 5 ids: repeats
    w = torch.randn((5, 20), generator=gen).to(dtype).requires_grad_()
    with force_variant("embedding", "triton_gather"), force_variant("embedding_backward", "triton_sorted"):
        y = opforge.embedding(ids.int(), w, padding_idx=padding_idx)
        g = torch.randn(y.shape, generator=gen).to(dtype)
        (dw,) = torch.autograd.grad(y, w, g)
    w64 = w.detach().double().requires_grad_()
    ref = F.embedding(ids, w64, padding_idx=padding_idx)
    (ref_dw,) = torch.autograd.grad(ref, w64, g.double())
    assert torch.equal(y, ref.to(dtype))
    tol = 1e-12 if dtype == torch.float64 else 1e-2
    assert ((dw.double() - ref_dw).norm() / ref_dw.norm()).item() < tol
    if padding_idx is not None:
        assert not dw[padding_idx].any()


def test_errors():
    w = torch.randn(5, 4)
    with pytest.raises(TypeError, match="opforge.embedding: input must be an int32 or int64"):
        opforge.embedding(torch.zeros(3), w)
    with pytest.raises(ValueError, match="opforge.embedding: ids must lie in \\[0, 5\\)"):
        opforge.embedding(torch.tensor([0, 5]), w)
