"""MoE routing on opforge ops: top-k gating, permute / unpermute of tokens by
expert, and the expert FFN on ``opforge.grouped_matmul``.

The pieces (each differentiable, each made of dispatched opforge ops):

* ``moe_route(router_logits, top_k, normalize=True)`` -> ``(weights,
  experts)``: fp32 ``softmax`` over the experts, ``topk``, and (Mixtral,
  Qwen-MoE with ``norm_topk_prob``) the chosen weights renormalized to sum 1.
* ``moe_permute(x, experts, num_experts)`` -> ``(x_sorted, routing)``: the
  ``T x k`` (token, choice) slots sorted by expert (stable: tokens keep their
  order inside an expert), their rows gathered with ``opforge.embedding``
  (whose backward is the deterministic sorted sum: a token's gradient from its
  k experts adds up in a fixed order). ``routing.offsets`` are the int32
  cumulative end rows ``grouped_matmul`` takes; no host sync anywhere.
* ``moe_unpermute(y_sorted, routing, weights)`` -> ``[T, H]``: each slot's row
  brought back (a gather by the inverse permutation) and the k rows of a
  token combined with its gate weights (one batched ``[1, k] x [k, H]`` GEMM).
* ``moe_experts(x, experts, weights, gate_up_proj, down_proj)``: the SwiGLU
  expert FFN of transformers' ``MixtralExperts`` layout (``gate_up_proj [E,
  2I, H]``, ``down_proj [E, H, I]``): permute, one grouped GEMM for gate and
  up of every expert, ``opforge.swiglu``, one grouped GEMM down, unpermute.
  Transformers' loop runs two GEMMs per expert with a host sync per expert
  (``nonzero``); this runs two launches in all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.ops.embedding import embedding
from opforge.ops.fused import swiglu
from opforge.ops.grouped_matmul import grouped_matmul
from opforge.ops.softmax import softmax
from opforge.ops.topk import topk

WHERE = "opforge.moe"


@dataclass(frozen=True)
class Routing:
    """Where each (token, choice) slot went: ``order[i]`` is the slot at sorted
    row ``i`` (slot ``t * k + j``), ``inverse`` its inverse, ``offsets`` the
    int32 cumulative end row of each expert (``grouped_matmul``'s offsets)."""

    order: torch.Tensor
    inverse: torch.Tensor
    offsets: torch.Tensor
    top_k: int


def moe_route(router_logits: torch.Tensor, top_k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 softmax over the experts, the ``top_k`` best (ties to the lower
    expert), renormalized when ``normalize``; returns fp32 weights and int64 ids."""
    if router_logits.dim() != 2:
        raise ValueError(f"{WHERE}_route: router_logits must be [tokens, experts], got {tuple(router_logits.shape)}")
    probs = softmax(router_logits.float(), -1)
    weights, experts = topk(probs, top_k, -1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts


def moe_permute(x: torch.Tensor, experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, Routing]:
    """The rows of ``x [T, H]`` once per chosen expert, sorted by expert."""
    if x.dim() != 2 or experts.dim() != 2 or experts.shape[0] != x.shape[0]:
        raise ValueError(f"{WHERE}_permute: x must be [T, H] and experts [T, k], got {tuple(x.shape)} and "
                         f"{tuple(experts.shape)}")
    top_k = experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    offsets = torch.bincount(flat, minlength=num_experts).cumsum(0).to(torch.int32)
    return embedding(torch.div(order, top_k, rounding_mode="floor"), x), Routing(order, inverse, offsets, top_k)


def moe_unpermute(y_sorted: torch.Tensor, routing: Routing, weights: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * y[row of slot (t, j)]`` in ``y_sorted``'s dtype."""
    slots = embedding(routing.inverse, y_sorted).view(-1, routing.top_k, y_sorted.shape[-1])
    return torch.bmm(weights.to(y_sorted.dtype).unsqueeze(1), slots).squeeze(1)


def moe_experts(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                down_proj: torch.Tensor) -> torch.Tensor:
    """SwiGLU experts in transformers' layout: ``gate_up_proj [E, 2I, H]``,
    ``down_proj [E, H, I]``; ``x [T, H]``, ``experts`` / ``weights [T, k]``."""
    if gate_up_proj.dim() != 3 or down_proj.dim() != 3 or gate_up_proj.shape[0] != down_proj.shape[0]:
        raise ValueError(f"{WHERE}_experts: gate_up_proj must be [E, 2I, H] and down_proj [E, H, I], got "
                         f"{tuple(gate_up_proj.shape)} and {tuple(down_proj.shape)}")
    x_sorted, routing = moe_permute(x, experts, gate_up_proj.shape[0])
    h = grouped_matmul(x_sorted, gate_up_proj.transpose(1, 2), routing.offsets)
    act = swiglu(h)  # gate, up = h.chunk(2, -1), read as strided halves
    y = grouped_matmul(act, down_proj.transpose(1, 2), routing.offsets)
    return moe_unpermute(y, routing, weights)


__all__ = ["Routing", "moe_experts", "moe_permute", "moe_route", "moe_unpermute"]
