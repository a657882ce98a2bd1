"""``opforge.nn.generate`` on the paged KV cache with continuous batching:
each request's greedy tokens equal transformers' own greedy ``generate`` of
that request alone (fp32, tiny models built from configs, no downloads), and
the static-cache path's tokens."""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge.nn.batching import bucket_sizes
from opforge.nn.kv_blocks import BlockAllocator

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attn_implementation="sdpa")


def _hf_greedy(model, prompt, new, eos=None):
    """transformers' greedy generate of one request (stops after ``eos``)."""
    model.generation_config.eos_token_id = eos
    ids = prompt.view(1, -1)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                         pad_token_id=0)
    return out[0]


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(5)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()


def test_continuous_batching_matches_transformers(llama, monkeypatch):
    """Five requests of different lengths and budgets through four decode rows
    (admissions as rows finish, a padding row when one runs alone), blocks of
    4 tokens (prompts cross blocks), one request stopped early by its eos."""
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    g = torch.Generator().manual_seed(0)
    lengths, news = [5, 9, 3, 7, 5], [6, 4, 7, 5, 3]
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in lengths]
    full = [_hf_greedy(llama, p, m) for p, m in zip(prompts, news)]
    eos = [int(full[0][lengths[0] + 2]), None, None, None, None]  # request 0 stops at its third new token
    want = [_hf_greedy(llama, p, m, e) if e is not None else f for p, m, e, f in zip(prompts, news, eos, full)]
    assert want[0].numel() == lengths[0] + 3  # it did stop early (its eos id is not among its first two)
    assert len(set(torch.cat([w[n:] for w, n in zip(want, lengths)]).tolist())) > 3  # a real comparison
    got = opforge.nn.generate(llama, prompts, news, eos_token_id=eos, max_batch=4, block_size=4)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"request {i}: {a.tolist()} != {b.tolist()}"
    # a tight pool: requests wait for blocks, not only for rows
    got = opforge.nn.generate(llama, [p.tolist() for p in prompts], news, eos_token_id=eos, max_batch=4,
                              block_size=4, num_blocks=7)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_paged_equals_static(monkeypatch):
    """Qwen3 (q / k norms), rows of one length: the paged path (blocks of 3
    tokens, two rows at a time) gives the static path's tokens."""
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    torch.manual_seed(6)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL)).eval()
    ids = torch.randint(0, 64, (3, 5))
    static = opforge.nn.generate(model, ids, 4)
    assert torch.equal(opforge.nn.generate(model, ids, 4, paged=True, block_size=3, max_batch=2), static)


def test_through_the_kernels():
    """The Triton kernels under the interpreter (one layer: the cost is per
    program), the paged attention_decode among them."""
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(SMALL, num_hidden_layers=1))).eval()
    prompts = [torch.randint(0, 64, (n,)) for n in (3, 6)]
    want = [_hf_greedy(model, p, 3) for p in prompts]
    got = opforge.nn.generate(model, prompts, 3, block_size=4)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_allocator_and_buckets():
    pool = BlockAllocator(5)
    a = pool.allocate(3)
    assert 0 not in a and pool.free_count == 1  # block 0 is the scratch block
    with pytest.raises(RuntimeError, match="2 KV blocks asked, 1 free"):
        pool.allocate(2)
    pool.free(a)
    assert pool.free_count == 4
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free(a[:1])
    assert bucket_sizes(1) == [1] and bucket_sizes(6) == [1, 2, 4, 6] and bucket_sizes(8) == [1, 2, 4, 8]


def test_rejects_bad_requests(llama):
    p = [torch.zeros(3, dtype=torch.long), [1, 2]]
    with pytest.raises(ValueError, match="max_new_tokens has 3 entries for 2 prompts"):
        opforge.nn.generate(llama, p, [1, 2, 3])
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        opforge.nn.generate(llama, p, [1, 0])
    with pytest.raises(ValueError, match=r"prompts\[1\] must be"):
        opforge.nn.generate(llama, [[1], []], 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        opforge.nn.generate(llama, [[1, 64]], 2)
    with pytest.raises(ValueError, match="eos_token_id must be None or an int"):
        opforge.nn.generate(llama, p, 2, eos_token_id=-1)
    with pytest.raises(ValueError, match="eos_token_id needs a list"):
        opforge.nn.generate(llama, torch.zeros((2, 3), dtype=torch.long), 2, eos_token_id=1)
    with pytest.raises(ValueError, match="request 0 needs 2 KV blocks"):
        opforge.nn.generate(llama, p, 4, block_size=4, num_blocks=2)
    with pytest.raises(ValueError, match="block_size must be"):
        opforge.nn.generate(llama, p, 2, block_size=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        opforge.nn.generate(llama, torch.full((1, 2), 99), 2)
