"""A GPU check of ``opforge.nn.generate``'s paged, continuously batched loop
(the CPU tests cannot capture CUDA graphs):

    python benchmarks/llm_generate_check.py

A small Llama built from a config (fp32, random weights), twelve prompts of
mixed lengths and budgets, two with an eos id, at most four decoding at once
(admissions as rows finish, padding rows in the buckets), blocks of 16
tokens. Checks that the loop replayed from CUDA graphs gives exactly the
tokens of the same loop run eagerly (the same kernels and shapes: only the
graphs differ), and prints how many requests also equal transformers' greedy
``generate`` of that request alone (opforge's fp32 kernels may use TF32 dots,
so an argmax tie can differ from transformers' there). Exits 1 on a mismatch
of the first kind.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import opforge  # noqa: E402


def main() -> int:
    import transformers

    device = torch.device("cuda")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=512, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).to(device).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 200, (12,), generator=g).tolist()
    news = torch.randint(1, 40, (12,), generator=g).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=g).to(device) for n in lengths]
    eager = opforge.nn.generate(model, prompts, news, max_batch=4, block_size=16, cuda_graph=False)
    eos = [None] * 12
    for i in (2, 7):  # stop two requests at their fifth new token (when they have one)
        if news[i] >= 5:
            eos[i] = int(eager[i][lengths[i] + 4])
    eager = opforge.nn.generate(model, prompts, news, eos_token_id=eos, max_batch=4, block_size=16,
                                cuda_graph=False)
    graph = opforge.nn.generate(model, prompts, news, eos_token_id=eos, max_batch=4, block_size=16)
    bad = [i for i, (a, b) in enumerate(zip(graph, eager)) if not torch.equal(a, b)]
    same_hf = 0
    for i, p in enumerate(prompts):
        model.generation_config.eos_token_id = eos[i]
        want = model.generate(input_ids=p[None], attention_mask=torch.ones_like(p[None]), max_new_tokens=news[i],
                              do_sample=False, pad_token_id=0)[0]
        same_hf += int(torch.equal(graph[i], want))
    print(f"CUDA graphs vs eager: {12 - len(bad)}/12 requests equal" + (f" (differ: {bad})" if bad else ""))
    print(f"equal to transformers' greedy generate: {same_hf}/12")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
