"""opforge's attention as a transformers attention implementation named ``"opforge"``.

transformers picks the attention core and the mask builder of a model by
``config._attn_implementation`` (``AttentionInterface`` /
``AttentionMaskInterface``). ``opforge.nn.patch`` registers both under
``"opforge"`` and points the patched model's config at them, so the decision
"purely causal, no mask" is made from the mask builder's *arguments* (shapes,
offsets, whether a padding mask exists), never from a tensor's values: it
holds under ``torch.compile`` as in eager mode, with no graph break.

* The mask builder returns ``None`` when the mask is purely causal with the
  diagonal bottom-right (no padding mask, or in eager mode one of all ones as
  tokenizers and ``generate`` pass, which SDPA's own skip reads too; no
  sliding window; the queries are the last ``q_length`` keys): what
  ``opforge.attention(causal=True)`` does. Under ``torch.compile`` a padding
  mask is always built (its values cannot be read while tracing).
  Otherwise it returns SDPA's boolean mask, always materialized
  (``allow_is_causal_skip=False``: SDPA's skip means a *top-left* diagonal,
  which is not opforge's).
* Under tracing, transformers cannot tell from ``position_ids`` whether a row
  packs several sequences, and composes a packed-sequence mask function
  (eager mode only does so when it has seen a restart). opforge then treats
  each row as one sequence unless the model was patched with
  ``packed_sequences=True`` (the mask is then built, exact and slower).
* The attention function runs ``opforge.attention`` when it got no mask, no
  dropout and no window; anything else runs transformers' SDPA path with the
  mask (correctness first), counted in the patch report's ``fallbacks`` in
  eager calls. Compiled code never mutates Python state (dynamo would guard
  on it and recompile every step), so calls inside ``torch.compile`` are not
  counted.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, prepare_padding_mask, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from opforge.nn.patch import PACKED_FLAG
from opforge.ops.attention import attention

NAME = "opforge"


def purely_causal(q_length: int, kv_length: int, q_offset, kv_offset: int, mask_function, attention_mask,
                  local_size, config) -> bool:
    """True when the mask transformers asks for is the bottom-right causal one and nothing else."""
    if local_size is not None:
        return False
    if isinstance(q_offset, torch.Tensor) or q_offset + q_length != kv_length + kv_offset:
        return False  # a static cache: keys beyond the written ones must be masked
    if attention_mask is not None:  # a 2-D padding mask: all ones is no mask (eager only: it reads the values)
        if torch.compiler.is_compiling() or attention_mask.dim() != 2:
            return False
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length]
        return mask_function is causal_mask_function and bool(padding.all())
    if mask_function is causal_mask_function:
        return True
    # Traced position_ids: transformers composed a packed-sequence mask function it cannot evaluate here.
    return torch.compiler.is_compiling() and q_offset == 0 and not getattr(config, PACKED_FLAG, False)


def opforge_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                 mask_function=causal_mask_function, attention_mask=None, local_size=None, config=None, **kwargs):
    """``None`` for a purely causal mask (opforge's kernel), else SDPA's boolean mask."""
    if purely_causal(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, local_size, config):
        return None
    kwargs.pop("allow_is_causal_skip", None)
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, config=config, **kwargs)


def opforge_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                              sliding_window=None, **kwargs):
    """transformers' attention-function contract: ``(B, H, S, D)`` in, ``(B, S, H, D)`` and no weights out."""
    if attention_mask is None and not dropout and sliding_window is None and not kwargs.get("output_attentions") \
            and kwargs.get("softcap") is None:
        out = attention(query, key, value, causal=True, scale=None if scaling is None else float(scaling))
        return out.transpose(1, 2), None
    report = getattr(module, "_opforge_report", None)
    if report is not None and not torch.compiler.is_compiling():
        report.fallbacks["attention with a mask, window or dropout"] += 1
    if sliding_window is not None:
        kwargs["sliding_window"] = sliding_window
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def register() -> None:
    """Make ``"opforge"`` a valid ``attn_implementation`` (idempotent; the registries are global)."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, opforge_attention_forward)
        AttentionMaskInterface.register(NAME, opforge_mask)


__all__ = ["NAME", "opforge_attention_forward", "opforge_mask", "purely_causal", "register"]
