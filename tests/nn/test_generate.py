"""``opforge.nn.generate``: greedy tokens equal to transformers' own greedy
``generate`` on tiny models built from configs (no downloads), patched and not."""

from __future__ import annotations

import pytest
import torch

import opforge

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attn_implementation="sdpa")


def _greedy_reference(model, ids, new):
    model.generation_config.eos_token_id = None
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                          pad_token_id=0)


def test_llama_through_the_kernels():
    """The Triton kernels under the interpreter (one layer, one row: its cost is
    per program): prefill attention, then decode steps against the static cache."""
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(SMALL, num_hidden_layers=1))).eval()
    ids = torch.randint(0, 64, (1, 4))
    want = _greedy_reference(model, ids, 3)
    assert torch.equal(opforge.nn.generate(model, ids, 3), want)


def test_greedy_wiring(monkeypatch):
    """Two layers, two rows, the ops on their reference path; Qwen3's q / k norms;
    a patched model decodes the same tokens."""
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    torch.manual_seed(4)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL)).eval()
    ids = torch.randint(0, 64, (2, 6))
    want = _greedy_reference(model, ids, 5)
    assert len(set(want[:, 6:].flatten().tolist())) > 1  # not one token repeated: a real comparison
    assert torch.equal(opforge.nn.generate(model, ids, 5), want)
    opforge.nn.patch(model)
    assert torch.equal(opforge.nn.generate(model, ids, 5), want)


def test_rejects_what_it_cannot_do():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    with pytest.raises(ValueError, match="max_new_tokens"):
        opforge.nn.generate(model, torch.zeros((1, 3), dtype=torch.long), 0)
    with pytest.raises(ValueError, match="input_ids"):
        opforge.nn.generate(model, torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(TypeError, match="ForCausalLM"):
        opforge.nn.generate(model.model, torch.zeros((1, 3), dtype=torch.long), 2)
