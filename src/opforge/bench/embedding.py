"""Bench cases for ``opforge.embedding`` (forward gather) and its table
gradient (``embedding_backward``) at the Llama-3 vocabulary.

Bytes: forward, the gathered rows read and written (plus the ids);
backward, the token gradients read and the touched table rows written (the
zero fill of the table counted too: both sides pay it). FLOPs: the backward's
adds. Peer: torch eager (``F.embedding`` / ``embedding_dense_backward``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase
from opforge.ops import embedding as E


def forward_case(tokens: int, vocab: int, hidden: int, dtype) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(1)
        return (torch.randint(0, vocab, (tokens,), generator=g).to(dev),
                torch.randn((vocab, hidden), generator=g).to(dtype).to(dev))

    es = torch.empty((), dtype=dtype).element_size()
    return BenchCase(op="embedding", label=f"{tokens} of {vocab}x{hidden}", dtype=dtype, make_args=make,
                     run=E.embedding, reference=lambda ids, w: F.embedding(ids, w), flops=0,
                     nbytes=2 * tokens * hidden * es + 8 * tokens, peers={"torch eager": F.embedding},
                     op_args=lambda ids, w: (ids, w, -1))


def backward_case(tokens: int, vocab: int, hidden: int, dtype) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(2)
        return (torch.randn((tokens, hidden), generator=g).to(dtype).to(dev),
                torch.randint(0, vocab, (tokens,), generator=g).to(dev))

    def run(grad, ids):
        return torch.ops.opforge.embedding_backward(grad, ids, vocab, -1)

    def peer(grad, ids):
        return torch.ops.aten.embedding_dense_backward(grad, ids, vocab, -1, False)

    es = torch.empty((), dtype=dtype).element_size()
    return BenchCase(op="embedding_backward", label=f"{tokens} into {vocab}x{hidden}", dtype=dtype, make_args=make,
                     run=run, reference=lambda grad, ids: E.embedding_backward_ref(grad, ids, vocab),
                     flops=tokens * hidden, nbytes=(2 * tokens * hidden + vocab * hidden) * es,
                     peers={"torch eager": peer}, op_args=lambda grad, ids: (grad, ids, vocab, -1))


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    if quick or device.type != "cuda":
        return [forward_case(8, 16, 16, torch.float32), backward_case(8, 16, 16, torch.float32)]
    bf16 = torch.bfloat16
    return [forward_case(8192, 128256, 2048, bf16), backward_case(8192, 128256, 2048, bf16)]
