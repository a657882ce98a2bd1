"""MoE routing (``opforge.moe_route``, ``moe_permute``, ``moe_unpermute``,
``moe_experts``) against transformers' per-expert loop written here in torch:
the routing, the block's output and the gradients of x, both expert weights
and the router logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.runtime.dispatch import force_variant

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def loop_reference(x, logits, gate_up, down, k):
    """MixtralTopKRouter + MixtralExperts, token by token."""
    probs = F.softmax(logits.double(), -1)
    w, e = torch.topk(probs, k)
    w = w / w.sum(-1, keepdim=True)
    rows = []
    for t in range(x.shape[0]):
        acc = 0
        for j in range(k):
            gate, up = F.linear(x[t], gate_up[e[t, j]]).chunk(2, -1)
            acc = acc + F.linear(F.silu(gate) * up, down[e[t, j]]) * w[t, j]
        rows.append(acc)
    return torch.stack(rows), e


def test_moe_block_matches_the_expert_loop(gen):
    T, H, I, E, k = 5, 8, 6, 3, 2
    x = torch.randn((T, H), generator=gen).requires_grad_()
    logits = torch.randn((T, E), generator=gen).requires_grad_()
    gate_up = (torch.randn((E, 2 * I, H), generator=gen) / 3).requires_grad_()
    down = (torch.randn((E, H, I), generator=gen) / 3).requires_grad_()
    # the grouped GEMM's and swiglu's kernels have their own tests; here they would cost 20 s of
    # interpreter set-up (swiglu's generated kernels), so this test checks the routing around them
    with force_variant("grouped_matmul", "reference"), force_variant("grouped_matmul_wgrad", "reference"), \
            force_variant("swiglu_packed", "reference"), force_variant("swiglu_packed_backward", "reference"):
        weights, experts = opforge.moe_route(logits, k)
        out = opforge.moe_experts(x, experts, weights, gate_up, down)
        g = torch.randn(out.shape, generator=gen)
        grads = torch.autograd.grad(out, (x, logits, gate_up, down), g)

    leaves = [t.detach().double().requires_grad_() for t in (x, logits, gate_up, down)]
    ref, ref_experts = loop_reference(leaves[0], leaves[1], leaves[2], leaves[3], k)
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    assert torch.equal(experts, ref_experts)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    for got, want in zip(grads, ref_grads):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_permute_groups_rows_by_expert(gen):
    x = torch.arange(12.0).reshape(4, 3)
    experts = torch.tensor([[2, 0], [0, 1], [2, 1], [1, 0]])
    x_sorted, routing = opforge.moe_permute(x, experts, 4)
    assert routing.offsets.tolist() == [3, 6, 8, 8]  # expert 3 is empty
    assert x_sorted[:, 0].tolist() == [0.0, 3.0, 9.0, 3.0, 6.0, 9.0, 0.0, 6.0]
    back = opforge.moe_unpermute(x_sorted, routing, torch.full((4, 2), 0.5))
    assert torch.equal(back, x)
