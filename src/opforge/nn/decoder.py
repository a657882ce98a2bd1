"""The decoder stack of a transformers Llama / Mistral / Qwen2 / Qwen3 / Mixtral
causal LM, run module by module for ``opforge.nn.generate``.

The embedding, norms, projections, MLP / MoE block and LM head are the
model's own modules (patched or not); what a generation loop changes is only
where keys and values go and what attention reads. So ``next_tokens`` takes
that as a callback, ``attend(layer, attn, q, k, v)``: the static cache
(``nn/generate.py``) and the paged one (``nn/batching.py``) are two such
callbacks over one forward.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from opforge.ops.rope import rope

WHERE = "opforge.nn.generate"

# attend(layer index, attention module, q [B, Hq, S, D], k [B, H_kv, S, D], v [B, S, H_kv, D]) -> [B, S, Hq, D]
Attend = Callable[[int, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_model(model: nn.Module) -> None:
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(model, "lm_head"):
        raise TypeError(f"{WHERE}: expected a transformers *ForCausalLM (with .model.layers and .lm_head), "
                        f"got {type(model).__name__}")


def window(attn: nn.Module) -> int | None:
    own = getattr(attn, "sliding_window", None)
    if own is not None:
        return own
    cfg = attn.config
    return getattr(cfg, "sliding_window", None) if type(attn).__name__.startswith("Mistral") else None


def check_window(model: nn.Module, total: int) -> None:
    """Sliding-window layers only while a whole sequence fits the window (where it changes nothing)."""
    for layer in model.model.layers:
        w = window(layer.self_attn)
        if w is not None and total > w:
            raise ValueError(f"{WHERE}: {total} tokens exceed the sliding window ({w}); not supported")


def cache_geometry(model: nn.Module) -> tuple[int, int, torch.dtype]:
    """KV heads, head dim and dtype of the model's cache."""
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return kv_heads, model.model.layers[0].self_attn.head_dim, model.lm_head.weight.dtype


def _project(attn: nn.Module, x: torch.Tensor, cos, sin):
    B, S, _ = x.shape
    shape = (B, S, -1, attn.head_dim)
    q, k = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm over the head dim, before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    v = attn.v_proj(x).view(shape)
    q, k = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q, k, v


def next_tokens(model: nn.Module, ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                last: torch.Tensor | None = None) -> torch.Tensor:
    """The greedy next token of each row (``[B]``) after ``ids`` ``[B, S]`` at
    ``positions`` (``[1, S]`` or ``[B, S]``); with ``last`` (``B == 1``, packed
    sequences), the next token after each of the tokens ``last`` (``[N]``)."""
    body = model.model
    x = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(x, positions)
    B, S = ids.shape
    for i, layer in enumerate(body.layers):
        attn = layer.self_attn
        q, k, v = _project(attn, layer.input_layernorm(x), cos, sin)
        x = x + attn.o_proj(attend(i, attn, q, k, v).reshape(B, S, -1))
        mlp_out = layer.mlp(layer.post_attention_layernorm(x))
        x = x + (mlp_out[0] if isinstance(mlp_out, tuple) else mlp_out)
    ends = x[:, -1:] if last is None else x[0, last][:, None]
    return model.lm_head(body.norm(ends))[:, 0].argmax(-1)


__all__ = ["Attend", "cache_geometry", "check_model", "check_window", "next_tokens", "window"]
