"""``opforge.nn.generate(model, prompts, max_new_tokens)``: greedy decoding of a
transformers Llama / Mistral / Qwen2 / Qwen3 / Mixtral causal LM on opforge's ops.

The loop is opforge's own, over the model's modules (``nn/decoder.py``):
transformers' ``generate`` rebuilds masks, caches and logits processors every
step, and its static cache needs ``torch.compile`` to be fast. Two caches:

* **Static** (a ``[B, S]`` tensor of prompts, the default for a tensor): one
  contiguous cache ``[B, S + max_new_tokens, H_kv, D]`` per layer written in
  place; prefill ``opforge.rope`` + ``opforge.attention`` (causal) over the
  prompts, then each step ``opforge.attention_decode`` of the new tokens
  against the cache (``seqlens`` a device tensor: no host sync). Every row
  decodes ``max_new_tokens`` tokens. On CUDA the decode step is captured once
  in a CUDA graph and replayed (its inputs in static buffers); the first
  eager steps warm the dispatch caches so nothing is chosen during capture.
* **Paged** with continuous batching (a list of prompts of any lengths, or
  ``paged=True``): KV block pools ``[num_blocks, block_size, H_kv, D]`` per
  layer, each request with its own ``max_new_tokens`` and eos stop, up to
  ``max_batch`` decoding at once, waiting requests admitted as rows finish;
  the decode step in one CUDA graph a bucket of batch sizes
  (``nn/batching.py``, ``nn/kv_blocks.py``).

Greedy tokens equal transformers' ``generate(do_sample=False)`` on the same
model (per request for a list). Sliding-window layers are accepted only while
a whole sequence fits in the window (where the window changes nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from opforge.nn import batching
from opforge.nn.decoder import WHERE, cache_geometry, check_model, check_window, next_tokens
from opforge.ops.attention import attention
from opforge.ops.attention_decode import attention_decode

WARMUP_STEPS = 2  # eager decode steps before a CUDA graph is captured
DEFAULT_BLOCK_SIZE = 64  # one block a 64-token tile of attention_decode: one table load a tile
MAX_DEFAULT_BATCH = 256


class StaticKV:
    """One layer's keys and values for ``batch`` rows of up to ``max_ctx`` tokens."""

    def __init__(self, batch: int, max_ctx: int, kv_heads: int, head_dim: int, dtype, device):
        shape = (batch, max_ctx, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


def _positive_int(value, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{WHERE}: {arg} must be an int >= 1, got {value!r}")
    return value


def _check_ids(model: nn.Module, ids: torch.Tensor, arg: str) -> None:
    """Token ids in ``[0, vocab)`` (an out-of-range id would be a device assert in the embedding)."""
    vocab = model.model.embed_tokens.num_embeddings
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"{WHERE}: {arg} holds token id {low if low < 0 else high}, outside the vocabulary "
                         f"[0, {vocab})")


def _static_attend(caches: list[StaticKV], pos: torch.Tensor | None):
    """Attention over the static cache: the prompt (``pos`` None: causal over
    it, cache rows ``[0, S)`` written) or one new token at ``pos`` (1 element)."""

    def attend(i, attn, q, k, v):
        kv, scale = caches[i], float(attn.scaling)
        if pos is None:
            S = q.shape[2]
            kv.k[:, :S] = k.transpose(1, 2)
            kv.v[:, :S] = v
            return attention(q, k, v.transpose(1, 2), causal=True, scale=scale).transpose(1, 2)
        kv.k.index_copy_(1, pos, k.transpose(1, 2))
        kv.v.index_copy_(1, pos, v)
        seqlens = (pos + 1).to(torch.int32).expand(q.shape[0])
        return attention_decode(q.transpose(1, 2), kv.k, kv.v, seqlens, scale=scale)

    return attend


class _DecodeStep:
    """The static-cache decode step with its inputs in static buffers; replayed from a CUDA graph on CUDA."""

    def __init__(self, model, caches, batch: int, device, use_graph: bool):
        self.model, self.caches = model, caches
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.graph, self.out, self.use_graph, self.steps = None, None, use_graph, 0

    def _eager(self) -> torch.Tensor:
        return next_tokens(self.model, self.ids, self.pos.view(1, 1), _static_attend(self.caches, self.pos))

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


def _generate_static(model, input_ids: torch.Tensor, max_new_tokens: int, cuda_graph: bool) -> torch.Tensor:
    device, (B, S) = input_ids.device, input_ids.shape
    kv_heads, head_dim, dtype = cache_geometry(model)
    caches = [StaticKV(B, S + max_new_tokens, kv_heads, head_dim, dtype, device) for _ in model.model.layers]
    out = torch.empty((B, S + max_new_tokens), dtype=input_ids.dtype, device=device)
    out[:, :S] = input_ids
    token = next_tokens(model, input_ids.long(), torch.arange(S, device=device).view(1, S),
                        _static_attend(caches, None))
    out[:, S] = token
    step = _DecodeStep(model, caches, B, device, cuda_graph)
    for i in range(1, max_new_tokens):
        token = step(token, S + i - 1)
        out[:, S + i] = token
    return out


def _per_request(value, n: int, arg: str, check) -> list:
    """One value for every request, or a sequence of ``n``, each passing ``check``."""
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value] * n
    if len(values) != n:
        raise ValueError(f"{WHERE}: {arg} has {len(values)} entries for {n} prompts")
    return [check(v, arg) for v in values]


def _eos(value, arg: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{WHERE}: {arg} must be None or an int >= 0, got {value!r}")
    return value


def _prompt(model, p, i: int, device) -> torch.Tensor:
    if isinstance(p, torch.Tensor):
        if p.dim() != 1 or p.dtype not in (torch.int32, torch.int64) or p.numel() == 0:
            raise ValueError(f"{WHERE}: prompts[{i}] must be a 1-D int32/int64 tensor of >= 1 token, got "
                             f"{p.dtype} {tuple(p.shape)}")
        if p.device != device:
            raise ValueError(f"{WHERE}: prompts[{i}] is on {p.device} but the model is on {device}")
        return p.long()
    if not isinstance(p, Sequence) or not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        raise ValueError(f"{WHERE}: prompts[{i}] must be a 1-D int tensor or a non-empty list of ints, got "
                         f"{type(p).__name__}")
    return torch.tensor(p, dtype=torch.long, device=device)


def _generate_paged(model, prompts: list, max_new_tokens, eos_token_id, max_batch, block_size, num_blocks,
                    cuda_graph: bool) -> list[torch.Tensor]:
    device = model.lm_head.weight.device
    n = len(prompts)
    news = _per_request(max_new_tokens, n, "max_new_tokens", _positive_int)
    eoss = _per_request(eos_token_id, n, "eos_token_id", _eos)
    ids = [_prompt(model, p, i, device) for i, p in enumerate(prompts)]
    _check_ids(model, torch.cat(ids), "prompts")
    check_window(model, max(p.numel() + m for p, m in zip(ids, news)))
    max_batch = min(n, MAX_DEFAULT_BATCH) if max_batch is None else _positive_int(max_batch, "max_batch")
    if num_blocks is not None:
        _positive_int(num_blocks, "num_blocks")
    requests = [batching.Request(p, m, e) for p, m, e in zip(ids, news, eoss)]
    batching.run(model, requests, max_batch=max_batch, block_size=_positive_int(block_size, "block_size"),
                 num_blocks=num_blocks, use_graph=cuda_graph)
    dtypes = [p.dtype if isinstance(p, torch.Tensor) else torch.long for p in prompts]
    return [torch.cat((r.prompt, torch.tensor(r.tokens, device=device))).to(dt) for r, dt in zip(requests, dtypes)]


@torch.no_grad()
def generate(model: nn.Module, prompts, max_new_tokens, *, eos_token_id=None, max_batch: int | None = None,
             block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int | None = None, paged: bool | None = None,
             cuda_graph: bool | None = None):
    """Greedy decoding.

    ``prompts``: an int ``[B, S]`` tensor (returns ``[B, S + max_new_tokens]``,
    the prompts first; static cache unless ``paged=True``), or a list of
    prompts of any lengths (1-D int tensors or lists of ints; returns a list
    of 1-D tensors, each its prompt then its generated tokens, ending at its
    eos token when it emits one; paged cache with continuous batching).
    For a list, ``max_new_tokens`` and ``eos_token_id`` may be one value or
    one a prompt. ``max_batch``: requests decoding at once (default: all, up
    to 256); ``block_size``, ``num_blocks``: the paged pool's block size and
    blocks (default: room for ``max_batch`` of the longest requests).
    ``cuda_graph``: replay decode steps from CUDA graphs (default: on CUDA)."""
    check_model(model)
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.dtype not in (torch.int32, torch.int64) or 0 in prompts.shape:
            raise ValueError(f"{WHERE}: input_ids must be int32/int64 [batch >= 1, prompt >= 1], got "
                             f"{prompts.dtype} {tuple(prompts.shape)}")
        if eos_token_id is not None:
            raise ValueError(f"{WHERE}: eos_token_id needs a list of prompts (rows that stop early have different "
                             f"lengths, which a tensor cannot return)")
        new = _positive_int(max_new_tokens, "max_new_tokens")
    elif not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError(f"{WHERE}: prompts must be an int [batch, prompt] tensor or a non-empty list of prompts, "
                         f"got {type(prompts).__name__}")
    device = prompts.device if isinstance(prompts, torch.Tensor) else model.lm_head.weight.device
    cuda_graph = device.type == "cuda" if cuda_graph is None else cuda_graph
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"{WHERE}: cuda_graph needs CUDA tensors")
    if not isinstance(prompts, torch.Tensor):
        if paged is False:
            raise ValueError(f"{WHERE}: a list of prompts runs on the paged cache (paged=False needs a tensor)")
        return _generate_paged(model, list(prompts), max_new_tokens, eos_token_id, max_batch, block_size,
                               num_blocks, cuda_graph)
    if paged:
        return torch.stack(_generate_paged(model, list(prompts), new, None, max_batch, block_size, num_blocks,
                                           cuda_graph))
    _check_ids(model, prompts, "input_ids")
    check_window(model, prompts.shape[1] + new)
    return _generate_static(model, prompts, new, cuda_graph)


__all__ = ["StaticKV", "generate"]
