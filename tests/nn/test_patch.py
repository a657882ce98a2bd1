"""``opforge.nn.patch``: tiny transformers models built from configs (no
downloads), patched and compared with an unpatched copy of themselves: the
logits, the loss and every parameter's gradient; the report; unpatch.

The Llama case runs opforge's Triton kernels under the interpreter; the
Qwen3 and Mixtral cases check the wiring of their modules (q / k norms, the
MoE router and experts) with the ops on their reference path (the kernels
have their own tests, and the interpreter would cost a minute here). The
compile case checks that the body under ``torch.compile`` is one graph with
opforge's attention in it.
"""

from __future__ import annotations

import copy

import pytest
import torch

import opforge

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attn_implementation="sdpa")


def compare(model, ids, labels, tol, logits=True):
    """The patched ``model`` against an unpatched copy: logits without labels,
    then the loss and the gradients with labels."""
    ref = copy.deepcopy(model)
    handle = opforge.nn.patch(model)
    if logits:
        got = model(input_ids=ids, use_cache=False).logits
        want = ref(input_ids=ids, use_cache=False).logits
        assert (got - want).abs().max().item() < tol * want.abs().max().item()
    out = model(input_ids=ids, labels=labels, use_cache=False)
    ref_out = ref(input_ids=ids, labels=labels, use_cache=False)
    assert out.logits is None  # the fused head never builds them
    assert abs(out.loss.item() - ref_out.loss.item()) < tol * ref_out.loss.item()
    out.loss.backward()
    ref_out.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad - q.grad).norm() <= tol * q.grad.norm() + 1e-12, name
    return handle


def test_llama_through_the_kernels():
    """One sequence, 2 / 1 heads: the interpreter's cost is per program."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(SMALL, num_attention_heads=2,
                                                                          num_key_value_heads=1)))
    ids = torch.randint(0, 64, (1, 5))
    labels = ids.clone()
    labels[0, :2] = -100
    handle = compare(model, ids, labels, 1e-5, logits=False)
    assert handle.report.swapped == {"rms_norm": 3, "attention": 1, "mlp": 1, "lm_head_loss": 1}
    assert "1 attention" in str(handle.report)
    with pytest.raises(ValueError, match="already patched"):
        opforge.nn.patch(model)
    mlp = model.model.layers[0].mlp
    assert "forward" in mlp.__dict__
    opforge.nn.unpatch(model)
    assert "forward" not in mlp.__dict__ and "_opforge_gelu" not in mlp.__dict__


@pytest.mark.parametrize("family", ["qwen3", "mixtral"])
def test_qwen3_and_mixtral_wiring(monkeypatch, family):
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    torch.manual_seed(1)
    if family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL))
        expect = {"rms_norm": 5, "attention": 1, "mlp": 1, "lm_head_loss": 1}
    else:
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**SMALL, num_local_experts=4,
                                                                           num_experts_per_tok=2))
        expect = {"rms_norm": 3, "attention": 1, "moe_router": 1, "moe_experts": 1, "lm_head_loss": 1}
    ids = torch.randint(0, 64, (2, 5))
    ref = copy.deepcopy(model)
    handle = compare(model, ids, ids, 1e-5)
    assert handle.report.swapped == expect
    assert not handle.report.fallbacks
    # a mask of all ones (as tokenizers and generate pass) is no mask: opforge's attention
    got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    want = ref(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (got - want).abs().max().item() < 1e-5 * want.abs().max().item()
    assert not handle.report.fallbacks
    # left padding: transformers builds a mask, and the attention takes transformers' own path
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    got, want = model(input_ids=ids, attention_mask=mask).logits, ref(input_ids=ids, attention_mask=mask).logits
    assert (got - want).abs().max().item() < 1e-5 * want.abs().max().item()
    assert handle.report.fallbacks["attention with a mask, window or dropout"] == 1


def test_training_under_compile_reaches_opforge_attention(monkeypatch):
    """The body under torch.compile: one graph for three steps (no recompile:
    the patch mutates no Python state in traced code), opforge's attention in
    it (the "opforge" mask builder says purely causal from shapes, where SDPA's
    would build a mask while tracing), and the loss and gradients of the
    unpatched model step by step."""
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    ref = copy.deepcopy(model)
    handle = opforge.nn.patch(model)
    assert model.config._attn_implementation == "opforge"
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        model.model.compile(backend=backend)
        ids = torch.randint(0, 64, (2, 8))
        for _ in range(3):
            loss, ref_loss = model(input_ids=ids, labels=ids).loss, ref(input_ids=ids, labels=ids).loss
            loss.backward()
            ref_loss.backward()
            assert abs(loss.item() - ref_loss.item()) < 1e-5 * ref_loss.item()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert "opforge.attention.default" in targets
    assert not any("scaled_dot_product" in t for t in targets)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad - q.grad).norm() <= 1e-5 * q.grad.norm() + 1e-12, name
    handle.unpatch()
    assert model.config._attn_implementation == "sdpa"
