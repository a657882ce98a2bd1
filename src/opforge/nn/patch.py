"""``opforge.nn.patch(model)``: run a transformers Llama, Mistral, Qwen2, Qwen3
or Mixtral model on opforge's ops, reversibly.

What is swapped, module by module (each module's ``forward`` is replaced on
the *instance*, so other models of the same class are untouched and
``unpatch`` restores the class's own forward; parameters, ``state_dict``
and optimizers are unaffected):

* ``*RMSNorm`` -> ``opforge.rms_norm`` (Qwen3's q / k norms too).
* attention -> ``opforge.rope`` (q and k in one kernel) and
  ``opforge.attention`` (FlashAttention, GQA, causal bottom-right: training,
  prefill and a decode step after a cache update alike), through the
  attention implementation ``"opforge"`` that ``patch`` registers with
  transformers and sets on the model's config (``nn/hf_attention.py``: its
  mask builder says "purely causal" from shapes alone, so it holds under
  ``torch.compile``). A padding mask, a sliding window or dropout runs
  transformers' SDPA path with the mask: correctness first, counted in the
  report's ``fallbacks`` (eager calls only: compiled code mutates no Python
  state). A head dim the kernels do not take keeps the layer as it was.
* MLP -> ``opforge.swiglu`` (``silu``) or ``opforge.geglu`` (``gelu`` /
  ``gelu_pytorch_tanh``) between the same three projections.
* Mixtral MoE: the router -> ``opforge.moe_route``; the experts ->
  ``opforge.moe_experts`` (one grouped GEMM up, one down, no host sync).
* ``*ForCausalLM`` with ``labels``: the LM head and the loss ->
  ``opforge.fused_linear_cross_entropy`` on the shifted labels (transformers'
  ``ForCausalLMLoss``: mean over non-ignored tokens, or sum divided by
  ``num_items_in_batch``); the logits are not materialized and the output's
  ``logits`` is ``None`` (as Liger-Kernel does). Without labels the logits
  are computed as before. Mixtral with ``output_router_logits`` keeps its own
  forward (the auxiliary loss needs the router logits of every layer).

Usage::

    handle = opforge.nn.patch(model)      # handle.report says what was swapped
    ...
    opforge.nn.unpatch(model)             # or handle.unpatch()
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from opforge.ops.fused import geglu, swiglu
from opforge.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from opforge.ops.moe import moe_experts, moe_route
from opforge.ops.norm import rms_norm
from opforge.ops.rope import rope

FAMILIES = ("Llama", "Mistral", "Qwen2", "Qwen3", "Mixtral")
HEAD_DIMS = (16, 32, 64, 128, 256)  # what opforge.attention's kernels take
GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
_ATTR = "_opforge_patch"
PACKED_FLAG = "_opforge_packed_sequences"  # the config flag nn/hf_attention.py reads


@dataclass
class PatchReport:
    """What ``patch`` swapped (module kind -> count), what it left and why, and
    how many calls took transformers' own path since (``fallbacks``: eager
    calls only; code compiled by ``torch.compile`` is not counted, since a
    counter bumped in traced code makes dynamo guard on it and recompile)."""

    swapped: Counter = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)
    fallbacks: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        lines = ["opforge.nn.patch: " + (", ".join(f"{n} {k}" for k, n in sorted(self.swapped.items())) or "nothing")]
        lines += [f"  left as is: {s}" for s in self.skipped]
        lines += [f"  fell back {n}x: {k}" for k, n in sorted(self.fallbacks.items())]
        return "\n".join(lines)


class Patch:
    """The handle ``patch`` returns: ``report`` and ``unpatch()``."""

    def __init__(self, model: nn.Module, report: PatchReport, modules: list[nn.Module]):
        self.model, self.report, self._modules = model, report, modules
        self._configs: list[tuple[object, str | None]] = []  # (config, its attention implementation before)

    def unpatch(self) -> None:
        """Give every swapped module its class's own forward back, and each config its attention."""
        for m in self._modules:
            for attr in ("forward", "_opforge_report", "_opforge_gelu"):
                m.__dict__.pop(attr, None)
        for config, implementation in self._configs:
            config._attn_implementation = implementation
            config.__dict__.pop(PACKED_FLAG, None)
        self._modules, self._configs = [], []
        self.model.__dict__.pop(_ATTR, None)


# ---------------------------------------------------------------------------
# The replacement forwards (bound to each instance)
# ---------------------------------------------------------------------------
def _rms_norm_forward(self, hidden_states):
    return rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight.to(hidden_states.dtype),
                    float(self.variance_epsilon))


def _mlp_forward(self, x):
    gate, up = self.gate_proj(x), self.up_proj(x)
    act = swiglu(gate, up) if self._opforge_gelu is None else geglu(gate, up, self._opforge_gelu)
    return self.down_proj(act)


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
    """transformers' attention forward (5.x: Llama, Qwen2/3, Mistral, Mixtral) with
    opforge's RoPE; the attention core is the config's (``"opforge"`` once patched)."""
    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape)
    k = self.k_proj(hidden_states).view(hidden_shape)
    if getattr(self, "q_norm", None) is not None:  # Qwen3: RMSNorm over the head dim, before RoPE
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = rope(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    dropout = self.attention_dropout if self.training else 0.0
    window = getattr(self, "sliding_window", None)
    extra = {"sliding_window": window} if window is not None else {}
    home = sys.modules[type(self).__module__]  # the model's modeling file: its registry and eager path
    interface = home.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                           home.eager_attention_forward)
    out, weights = interface(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling, **extra, **kwargs)
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _router_forward(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden_states, self.weight)
    weights, experts = moe_route(logits, self.top_k, normalize=True)
    return logits, weights, experts


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """The LM head and the loss in one chunked op when labels are given."""
    router_logits = kwargs.get("output_router_logits", getattr(self.config, "output_router_logits", False))
    if labels is None or router_logits:
        if labels is not None and not torch.compiler.is_compiling():
            self._opforge_report.fallbacks["causal LM loss with router logits"] += 1
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                                  labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast
    num_items = kwargs.pop("num_items_in_batch", None)
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:].to(hidden.device)
    head = self.lm_head
    if num_items is None:
        loss = fused_linear_cross_entropy(hidden, head.weight, shift, bias=head.bias)
    else:
        loss = fused_linear_cross_entropy(hidden, head.weight, shift, bias=head.bias, reduction="sum")
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)


# ---------------------------------------------------------------------------
# Which modules are which
# ---------------------------------------------------------------------------
def _family(module: nn.Module) -> str | None:
    name = type(module).__name__
    return next((f for f in FAMILIES if name.startswith(f)), None)


def _kind(module: nn.Module) -> str | None:
    name = type(module).__name__
    fam = _family(module)
    if fam is None:
        return None
    rest = name[len(fam):]
    return {"RMSNorm": "rms_norm", "MLP": "mlp", "Attention": "attention", "TopKRouter": "moe_router",
            "Experts": "moe_experts", "ForCausalLM": "lm_head_loss"}.get(rest)


def _why_not(kind: str, module: nn.Module) -> str | None:
    """None when ``module`` can take opforge's forward, else the reason it keeps its own."""
    if kind == "mlp":
        act = getattr(getattr(module, "config", None), "hidden_act", None)
        if act != "silu" and act not in GELU:
            return f"activation {act!r}"
    if kind == "attention" and getattr(module, "head_dim", None) not in HEAD_DIMS:
        return f"head dim {getattr(module, 'head_dim', None)} (opforge.attention takes {HEAD_DIMS})"
    if kind == "moe_experts":
        act = getattr(module, "act_fn", None)
        if not isinstance(act, nn.SiLU) and type(act).__name__ != "SiLUActivation":
            return f"expert activation {type(act).__name__}"
    return None


_FORWARDS = {"rms_norm": _rms_norm_forward, "mlp": _mlp_forward, "attention": _attention_forward,
             "moe_router": _router_forward, "moe_experts": _experts_forward, "lm_head_loss": _causal_lm_forward}


def patch(model: nn.Module, *, rms_norm: bool = True, attention: bool = True, mlp: bool = True, moe: bool = True,
          lm_head_loss: bool = True, packed_sequences: bool = False) -> Patch:
    """Swap the modules of a transformers Llama / Mistral / Qwen2 / Qwen3 /
    Mixtral model for opforge's ops (see the module doc); returns the handle
    (``.report``, ``.unpatch()``). Patching a patched model raises.

    ``packed_sequences=True``: rows may pack several sequences (position ids
    restarting inside a row) in compiled code, where transformers cannot see
    the restarts; the mask is then built and attention takes the SDPA path.
    Eager calls detect packing either way."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"opforge.nn.patch: expected a torch.nn.Module, got {type(model).__name__}")
    if _ATTR in model.__dict__:
        raise ValueError("opforge.nn.patch: this model is already patched (opforge.nn.unpatch(model) first)")
    wanted = {"rms_norm": rms_norm, "attention": attention, "mlp": mlp, "moe_router": moe, "moe_experts": moe,
              "lm_head_loss": lm_head_loss}
    report, done = PatchReport(), []
    for name, module in model.named_modules():
        kind = _kind(module)
        if kind is None or not wanted[kind]:
            continue
        reason = _why_not(kind, module)
        if reason is not None:
            report.skipped.append(f"{name or type(module).__name__} ({kind}): {reason}")
            continue
        if kind == "mlp":
            act = module.config.hidden_act
            module._opforge_gelu = None if act == "silu" else GELU[act]
        module._opforge_report = report
        module.forward = types.MethodType(_FORWARDS[kind], module)
        report.swapped[kind] += 1
        done.append(module)
    handle = Patch(model, report, done)
    if report.swapped["attention"]:
        from opforge.nn import hf_attention

        hf_attention.register()
        for config in {id(m.config): m.config for m in done if _kind(m) == "attention"}.values():
            handle._configs.append((config, config._attn_implementation))
            config._attn_implementation = hf_attention.NAME
            if packed_sequences:
                config.__dict__[PACKED_FLAG] = True
    model.__dict__[_ATTR] = handle
    return handle


def unpatch(model: nn.Module) -> None:
    """Undo :func:`patch` on ``model`` (a no-op on a model that is not patched)."""
    handle = model.__dict__.get(_ATTR)
    if handle is not None:
        handle.unpatch()


__all__ = ["Patch", "PatchReport", "patch", "unpatch"]
