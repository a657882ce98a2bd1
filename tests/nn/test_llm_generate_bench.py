"""benchmarks/llm_generate.py's peer and token check on a tiny model (CPU; the
benchmark itself runs on the device): the peer, transformers' ``generate`` with
its own static cache and the compiled decode forward, compiles in its first call
only, really decodes from its cache, and gives the tokens of eager ``generate``;
the divergence measure on hand-made logits."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "llm_generate.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_llm_generate", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_divergence_by_hand(bench):
    expect = torch.tensor([[1, 2, 3], [1, 2, 3]])
    tokens = torch.tensor([[1, 2, 3], [1, 0, 3]])  # row 1 leaves the reference at step 1
    logits = torch.zeros(2, 3, 4)
    logits[1, 1] = torch.tensor([0.75, 0.0, 1.0, 0.0])  # the reference's 2 by 0.25 over the mode's 0
    leads, gap = bench.first_divergence(tokens, expect, logits)
    assert leads == [3, 1]
    assert gap == pytest.approx(0.25)
    assert bench.first_divergence(expect, expect, logits) == ([3, 3], 0.0)


def test_peer_compiles_once_and_decodes_from_its_cache(bench):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    args = argparse.Namespace(vocab=128, hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, seq=24,
                              untied=False, dtype="fp32")
    model = bench.generation_model(args, torch.device("cpu"))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = bench._hf_generate(model, ids, 8)  # eager, the dynamic cache
    config = bench._compile_config(torch.device("cpu"))
    config.backend = "eager"  # dynamo's guards and graphs are the compiled peer's; no inductor build here
    cache = bench._peer_cache(bench.PEER, model, 24)
    graphs = []
    for _ in range(3):
        with torch.no_grad():
            out = bench._hf_generate(model, ids, 8, None, cache, config)
        graphs.append(counters["stats"]["unique_graphs"])
        assert torch.equal(out, want)
        assert int(cache.layers[0].cumulative_length) == 16 + 8 - 1  # prefill, then 7 decode steps in the cache
    assert graphs[0] >= 1 and graphs[1] == graphs[0] and graphs[2] == graphs[0], graphs
