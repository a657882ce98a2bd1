"""``opforge.nn.generate(model, input_ids, max_new_tokens)``: greedy decoding of a
transformers Llama / Mistral / Qwen2 / Qwen3 / Mixtral causal LM on opforge's ops.

The loop is opforge's own, over the model's modules (embedding, norms, q / k /
v / o projections, MLP or MoE block, LM head): transformers' ``generate``
rebuilds masks, caches and logits processors every step, and its static
cache needs ``torch.compile`` to be fast. Here:

* The KV cache is static and contiguous, ``[B, max_ctx, H_kv, D]`` per layer
  (``max_ctx = prompt + max_new_tokens``), written in place.
* The prefill is ``opforge.rope`` + ``opforge.attention`` (causal) over the
  prompt; each decode step is ``opforge.attention_decode`` of the new token
  against the cache (``seqlens`` a device tensor: no host sync).
* On CUDA the decode step is captured once in a CUDA graph and replayed
  (its inputs live in static buffers: the token, its position); the first
  eager steps warm the dispatch caches so that nothing is chosen or compiled
  during capture.

Rows are prompts of one length (no padding) and every row decodes
``max_new_tokens`` tokens (no end-of-sequence stop): a throughput loop, and
greedy tokens equal to transformers' ``generate(do_sample=False)`` on the same
model. Sliding-window layers are accepted only while the whole sequence fits
in the window (where the window changes nothing).
"""

from __future__ import annotations

import torch
from torch import nn

from opforge.ops.attention import attention
from opforge.ops.attention_decode import attention_decode
from opforge.ops.rope import rope

WARMUP_STEPS = 2  # eager decode steps before a CUDA graph is captured


class StaticKV:
    """One layer's keys and values for ``batch`` rows of up to ``max_ctx`` tokens."""

    def __init__(self, batch: int, max_ctx: int, kv_heads: int, head_dim: int, dtype, device):
        shape = (batch, max_ctx, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


def _window(attn: nn.Module) -> int | None:
    own = getattr(attn, "sliding_window", None)
    if own is not None:
        return own
    cfg = attn.config
    return getattr(cfg, "sliding_window", None) if type(attn).__name__.startswith("Mistral") else None


def _check(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    where = "opforge.nn.generate"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(model, "lm_head"):
        raise TypeError(f"{where}: expected a transformers *ForCausalLM (with .model.layers and .lm_head), "
                        f"got {type(model).__name__}")
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64) or input_ids.shape[1] == 0:
        raise ValueError(f"{where}: input_ids must be int32/int64 [batch, prompt >= 1], got "
                         f"{input_ids.dtype} {tuple(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"{where}: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    total = input_ids.shape[1] + max_new_tokens
    for layer in body.layers:
        window = _window(layer.self_attn)
        if window is not None and total > window:
            raise ValueError(f"{where}: {total} tokens exceed the sliding window ({window}); not supported")


def _attend(attn: nn.Module, x: torch.Tensor, cos, sin, kv: StaticKV, pos: torch.Tensor | None) -> torch.Tensor:
    """One attention block: the prompt (``pos`` None: causal over it, cache rows
    ``[0, S)`` written) or one new token at position ``pos`` (a 1-element tensor)."""
    B, S, _ = x.shape
    shape = (B, S, -1, attn.head_dim)
    q, k = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm over the head dim, before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    v = attn.v_proj(x).view(shape)
    q, k = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    scale = float(attn.scaling)
    if pos is None:
        kv.k[:, :S] = k.transpose(1, 2)
        kv.v[:, :S] = v
        out = attention(q, k, v.transpose(1, 2), causal=True, scale=scale).transpose(1, 2)
    else:
        kv.k.index_copy_(1, pos, k.transpose(1, 2))
        kv.v.index_copy_(1, pos, v)
        seqlens = (pos + 1).to(torch.int32).expand(B)
        out = attention_decode(q.transpose(1, 2), kv.k, kv.v, seqlens, scale=scale)
    return attn.o_proj(out.reshape(B, S, -1))


def _forward(model: nn.Module, ids: torch.Tensor, positions: torch.Tensor, caches: list[StaticKV],
             pos: torch.Tensor | None) -> torch.Tensor:
    """The greedy next token of each row (``[B]``) after ``ids`` at ``positions``."""
    body = model.model
    x = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(x, positions)
    for layer, kv in zip(body.layers, caches):
        x = x + _attend(layer.self_attn, layer.input_layernorm(x), cos, sin, kv, pos)
        mlp_out = layer.mlp(layer.post_attention_layernorm(x))
        x = x + (mlp_out[0] if isinstance(mlp_out, tuple) else mlp_out)
    last = body.norm(x[:, -1:])
    return model.lm_head(last)[:, 0].argmax(-1)


class _DecodeStep:
    """The decode step with its inputs in static buffers; replayed from a CUDA graph on CUDA."""

    def __init__(self, model, caches, batch: int, device, use_graph: bool):
        self.model, self.caches = model, caches
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.graph, self.out, self.use_graph, self.steps = None, None, use_graph, 0

    def _eager(self) -> torch.Tensor:
        return _forward(self.model, self.ids, self.pos.view(1, 1), self.caches, self.pos)

    def __call__(self, token: torch.Tensor, position: int) -> torch.Tensor:
        self.ids.copy_(token.view(-1, 1))
        self.pos.fill_(position)
        if not self.use_graph or self.steps < WARMUP_STEPS:
            self.steps += 1
            return self._eager()
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self._eager()
        self.graph.replay()
        return self.out


@torch.no_grad()
def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *,
             cuda_graph: bool | None = None) -> torch.Tensor:
    """Greedy decoding: ``[B, prompt + max_new_tokens]`` token ids (the prompt first).

    ``cuda_graph``: replay the decode step from a CUDA graph (default: on CUDA)."""
    _check(model, input_ids, max_new_tokens)
    device, (B, S) = input_ids.device, input_ids.shape
    cuda_graph = device.type == "cuda" if cuda_graph is None else cuda_graph
    if cuda_graph and device.type != "cuda":
        raise ValueError("opforge.nn.generate: cuda_graph needs CUDA tensors")
    attn0 = model.model.layers[0].self_attn
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    dtype = model.lm_head.weight.dtype
    caches = [StaticKV(B, S + max_new_tokens, kv_heads, attn0.head_dim, dtype, device) for _ in model.model.layers]
    out = torch.empty((B, S + max_new_tokens), dtype=input_ids.dtype, device=device)
    out[:, :S] = input_ids
    ids = input_ids.long()
    token = _forward(model, ids, torch.arange(S, device=device).view(1, S), caches, None)
    out[:, S] = token
    step = _DecodeStep(model, caches, B, device, cuda_graph)
    for i in range(1, max_new_tokens):
        token = step(token, S + i - 1)
        out[:, S + i] = token
    return out


__all__ = ["StaticKV", "generate"]
