"""Attention, decode, FP8/INT8 and grouped GEMM on a real GPU against float64
math and the vendor kernels: the Hopper paths (TMA, wgmma) never run under the
interpreter. Skipped without CUDA; run with
``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu``."""

import os

import pytest
import torch
import torch.nn.functional as F

import opforge

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def sdpa64(q, k, v, causal):
    """Float64 attention on the GPU (the math backend), GQA by repeating K/V heads."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S,D,Hk", [(1000, 128, 8), (2048, 64, 2), (517, 256, 8)])
def test_attention_forward_backward_against_float64(causal, S, D, Hk):
    g = torch.Generator(device="cuda").manual_seed(S + D)
    q = torch.randn(2, 8, S, D, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, Hk, S, D, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, Hk, S, D, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 8, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
    out = opforge.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = sdpa64(q64, k64, v64, causal)
    refs = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    assert rel(out, ref) < 1e-2
    for got, want in zip(grads, refs):
        assert rel(got, want) < 1e-2


def test_attention_varlen_matches_padded_batches():
    g = torch.Generator(device="cuda").manual_seed(3)
    lens = [37, 512, 1, 300]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    out = opforge.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                            max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    for i, n in enumerate(lens):
        s = slice(cu[i].item(), cu[i + 1].item())
        one = sdpa64(*(t[s].transpose(0, 1)[None] for t in (q, k, v)), True)[0].transpose(0, 1)
        assert rel(out[s], one) < 1e-2


@pytest.mark.parametrize("paged", [False, True])
def test_decode_against_float64(paged):
    g = torch.Generator(device="cuda").manual_seed(11)
    B, Hq, Hk, D, ctx, bs = 3, 32, 8, 128, 5000, 64
    seqlens = torch.tensor([5000, 1, 3333], device="cuda", dtype=torch.int32)
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, ctx, Hk, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, ctx, Hk, D, device="cuda", generator=g, dtype=torch.bfloat16)
    table = None
    kc, vc = k, v
    if paged:
        nb = -(-ctx // bs)
        perm = torch.randperm(B * nb, device="cuda", generator=g)
        table = perm.view(B, nb).to(torch.int32)
        kc = torch.empty(B * nb, bs, Hk, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.empty_like(kc)
        pad = nb * bs - ctx
        kc[perm] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(B * nb, bs, Hk, D)
        vc[perm] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(B * nb, bs, Hk, D)
    out = opforge.attention_decode(q, kc, vc, seqlens, block_table=table)
    for b in range(B):
        n = seqlens[b].item()
        want = sdpa64(q[b].transpose(0, 1)[None], k[b, :n].transpose(0, 1)[None],
                      v[b, :n].transpose(0, 1)[None], False)[0].transpose(0, 1)
        assert rel(out[b], want) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_scaled_matmul_rowwise_against_float64(dtype):
    g = torch.Generator(device="cuda").manual_seed(5)
    M, N, K = 1000, 2048, 1536
    a32 = torch.randn(M, K, device="cuda", generator=g)
    w32 = torch.randn(N, K, device="cuda", generator=g)
    qa = opforge.quantize(a32, dtype, "token")
    qw = opforge.quantize(w32, dtype, "token")  # per output channel of w = per column of w.t()
    out = opforge.scaled_matmul(qa.data, qw.data.t(), qa.scale, qw.scale.t(), out_dtype=torch.bfloat16)
    ref = (qa.data.double() * qa.scale.double()) @ (qw.data.double() * qw.scale.double()).t()
    assert rel(out, ref) < 1e-2
    if dtype == torch.float8_e4m3fn:
        peer = torch._scaled_mm(qa.data, qw.data.t(), qa.scale, qw.scale.t(), out_dtype=torch.bfloat16)
        assert rel(out, ref) <= 1.2 * rel(peer, ref) + 1e-4


def test_grouped_matmul_against_a_loop():
    g = torch.Generator(device="cuda").manual_seed(9)
    sizes = [0, 700, 1, 2048, 333]
    a = torch.randn(sum(sizes), 1024, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(len(sizes), 1024, 768, device="cuda", generator=g, dtype=torch.bfloat16)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    out = opforge.grouped_matmul(a, b, offs)
    start = 0
    for i, n in enumerate(sizes):
        if n:
            assert rel(out[start:start + n], a[start:start + n].double() @ b[i].double()) < 1e-2
        start += n
