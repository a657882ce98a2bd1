"""``opforge.topk``: the register kernel against ``torch.topk`` (values,
indices, gradient) on distinct values, largest and smallest, another dim."""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge.runtime import registry
from opforge.runtime.dispatch import force_variant


def test_registered():
    assert [v.name for v in registry.get("topk").variants] == ["triton_row", "torch_eager", "reference"]


@pytest.mark.parametrize("shape,k,dim,largest", [((37, 8), 2, -1, True), ((3, 50, 4), 5, 1, False)])
def test_matches_torch(gen, shape, k, dim, largest):
    n = torch.Size(shape).numel()
    x = (torch.randperm(n, generator=gen).reshape(shape).float() / n).requires_grad_()
    with force_variant("topk", "triton_row"):
        v, i = opforge.topk(x, k, dim, largest)
    rv, ri = torch.topk(x, k, dim, largest)
    assert torch.equal(v, rv) and torch.equal(i, ri)
    g = torch.randn(v.shape, generator=gen)
    assert torch.equal(torch.autograd.grad(v, x, g)[0], torch.autograd.grad(rv, x, g)[0])


def test_errors():
    with pytest.raises(ValueError, match="opforge.topk: k must be in \\[0, 4\\]"):
        opforge.topk(torch.randn(3, 4), 5)
