"""The attention op contract: the public function against torch's own SDPA in
float64 (an independent oracle) and against the plain-torch reference,
autograd, torch.library registration (opcheck), torch.compile, varlen,
errors, empty inputs, NaN, the registry and dispatch decisions.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import API_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.ops import attention as A
from opforge.ops.attention import attention
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
OPS = torch.ops.opforge

pytestmark = API_WARNINGS


def sdpa64(q, k, v, causal=False, scale=None):
    """torch's math SDPA in float64 (GQA by repeating k/v heads)."""
    G = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    return F.scaled_dot_product_attention(q.double(), k, v, is_causal=causal, scale=scale)


def grads_of(fn, q, k, v, do):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(qq, kk, vv)
    out.backward(do.to(out.dtype))
    return out.detach(), (qq.grad, kk.grad, vv.grad)


# ---------------------------------------------------------------------------
# Against SDPA (float64): forward and gradients through the Triton kernels
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_matches_sdpa_with_grads(causal, heads, gen):
    H, Hk = heads
    q, k, v = rand((2, H, 33, 16), gen), rand((2, Hk, 33, 16), gen), rand((2, Hk, 33, 16), gen)
    do = rand(q.shape, gen)
    with force_variant("attention", "triton_flash"), force_variant("attention_backward", "triton_flash"):
        out, grads = grads_of(lambda a, b, c: attention(a, b, c, causal=causal), q, k, v, do)
    ref, rgrads = grads_of(lambda a, b, c: sdpa64(a, b, c, causal), q, k, v, do)
    assert out.dtype == F32 and out.shape == q.shape
    assert rel_err(out, ref) <= 1e-5
    for g, r in zip(grads, rgrads):
        assert rel_err(g, r) <= 1e-5


def test_fp16_and_explicit_scale(gen):
    q, k, v = (rand((1, 2, 40, 32), gen, F16) for _ in range(3))
    do = rand(q.shape, gen, F16)
    out, grads = grads_of(lambda a, b, c: attention(a, b, c, scale=0.3), q, k, v, do)
    ref, rgrads = grads_of(lambda a, b, c: sdpa64(a, b, c, scale=0.3), q, k, v, do)
    assert out.dtype == F16 and rel_err(out, ref) <= 1e-3
    assert all(rel_err(g, r) <= 2e-3 for g, r in zip(grads, rgrads))


def test_negative_scale(gen):
    """The hot loop folds a positive scale into the max; a negative one takes the plain path."""
    q, k, v = (rand((1, 2, 70, 16), gen) for _ in range(3))
    with force_variant("attention", "triton_flash"):
        out = attention(q, k, v, scale=-0.4)
    assert rel_err(out, sdpa64(q, k, v, scale=-0.4)) <= 1e-5


def test_reference_matches_sdpa(gen):
    """The reference (the oracle of the window / varlen cases) agrees with SDPA."""
    q, k, v = rand((1, 2, 9, 16), gen, F64), rand((1, 2, 9, 16), gen, F64), rand((1, 2, 9, 16), gen, F64)
    out, _ = A.attention_reference(q, k, v, 0.25, -1, 0)
    assert rel_err(out, sdpa64(q, k, v, True, 0.25)) <= 1e-12


def test_bottom_right_causal_and_window_semantics(gen):
    """Sq < Sk causal: query i sees keys up to i + Sk - Sq (FlashAttention), not i (SDPA)."""
    q, k, v = rand((1, 1, 3, 16), gen, F64), rand((1, 1, 5, 16), gen, F64), rand((1, 1, 5, 16), gen, F64)
    out = attention(q, k, v, causal=True)
    want = torch.stack([sdpa64(q[:, :, i:i + 1], k[:, :, :i + 3], v[:, :, :i + 3])[0, 0, 0] for i in range(3)])
    assert rel_err(out[0, 0], want) <= 1e-12
    out = attention(q, k, v, window=(1, 0))  # keys i + 2 - 1 .. i + 2
    want = torch.stack([sdpa64(q[:, :, i:i + 1], k[:, :, i + 1:i + 3], v[:, :, i + 1:i + 3])[0, 0, 0]
                        for i in range(3)])
    assert rel_err(out[0, 0], want) <= 1e-12


@pytest.mark.parametrize("window,causal", [((6, 2), False), ((5, None), True), ((None, 3), False)],
                         ids=["both", "left+causal", "right"])
def test_window_against_reference(window, causal, gen):
    q, k, v = rand((1, 2, 40, 16), gen), rand((1, 2, 40, 16), gen), rand((1, 2, 40, 16), gen)
    do = rand(q.shape, gen)
    out, grads = grads_of(lambda a, b, c: attention(a, b, c, window=window, causal=causal), q, k, v, do)
    left, right = A.normalize_window("t", window, causal)
    ref, rgrads = grads_of(lambda a, b, c: A.attention_reference(a, b, c, 0.25, left, right)[0],
                           q.double(), k.double(), v.double(), do.double())
    assert rel_err(out, ref) <= 1e-5
    assert all(rel_err(g, r) <= 1e-5 for g, r in zip(grads, rgrads))


def test_varlen_matches_per_sequence_sdpa(gen):
    lens = [7, 1, 0, 19]
    cu = torch.tensor([0, 7, 8, 8, 27], dtype=torch.int32)
    q, k, v = rand((27, 4, 16), gen), rand((27, 2, 16), gen), rand((27, 2, 16), gen)
    do = rand(q.shape, gen)
    out, grads = grads_of(lambda a, b, c: attention(a, b, c, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu),
                          q, k, v, do)

    def per_seq(a, b, c):
        parts = []
        for i in range(4):
            s = slice(int(cu[i]), int(cu[i + 1]))
            if lens[i]:
                parts.append(sdpa64(*(t[s].transpose(0, 1)[None] for t in (a, b, c)), True)[0].transpose(0, 1))
        return torch.cat(parts)

    ref, rgrads = grads_of(per_seq, q, k, v, do)
    assert rel_err(out, ref) <= 1e-5
    assert all(rel_err(g, r) <= 1e-5 for g, r in zip(grads, rgrads))


def test_varlen_max_seqlen_given_or_computed(gen):
    cu = torch.tensor([0, 5, 12], dtype=torch.int64)
    q, k, v = (rand((12, 2, 16), gen) for _ in range(3))
    a = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    b = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9, max_seqlen_k=7)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------
# Edge values
# ---------------------------------------------------------------------------
def test_large_logits_and_fully_masked_rows(gen):
    q, k, v = rand((1, 2, 20, 16), gen, scale=30.0), rand((1, 2, 12, 16), gen, scale=30.0), rand((1, 2, 12, 16), gen)
    do = rand(q.shape, gen)
    out, grads = grads_of(lambda a, b, c: attention(a, b, c, causal=True, scale=1.0), q, k, v, do)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(out[:, :, :8], torch.zeros_like(out[:, :, :8]))  # Sq > Sk: 8 queries see no key
    ref = A.attention_reference(q.double(), k.double(), v.double(), 1.0, -1, 0)[0]
    assert rel_err(out, ref) <= 1e-5


def test_nan_propagates_like_torch(gen):
    q, k, v = (rand((1, 1, 20, 16), gen) for _ in range(3))
    q[0, 0, 3, 0] = float("nan")
    out = attention(q, k, v)
    want = sdpa64(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(want))


@pytest.mark.parametrize("shape_q,shape_k", [((2, 2, 0, 16), (2, 2, 5, 16)), ((2, 2, 5, 16), (2, 2, 0, 16)),
                                             ((0, 2, 5, 16), (0, 2, 5, 16))], ids=["Sq0", "Sk0", "B0"])
def test_empty(shape_q, shape_k, gen):
    q, k, v = rand(shape_q, gen), rand(shape_k, gen), rand(shape_k, gen)
    do = rand(shape_q, gen)
    out, grads = grads_of(lambda a, b, c: attention(a, b, c), q, k, v, do)
    assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_size_one_and_fp64_through_reference(gen):
    q, k, v = rand((1, 1, 1, 16), gen, F64), rand((1, 1, 1, 16), gen, F64), rand((1, 1, 1, 16), gen, F64)
    assert dispatch.explain("attention", q, k, v, 0.25, -1, 0, None, None, -1, -1).variant.name == "reference"
    assert rel_err(attention(q, k, v, causal=True), v) <= 1e-12  # one key: the output is its value


def test_deterministic_flag_and_repeatable_backward(gen):
    q, k, v = rand((1, 4, 30, 16), gen), rand((1, 1, 30, 16), gen), rand((1, 1, 30, 16), gen)
    do = rand(q.shape, gen)
    fn = lambda a, b, c: attention(a, b, c, causal=True, deterministic=True)  # noqa: E731
    first, second = grads_of(fn, q, k, v, do)[1], grads_of(fn, q, k, v, do)[1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def _qkv(gen, q=(1, 4, 8, 16), k=(1, 2, 8, 16)):
    return rand(q, gen), rand(k, gen), rand(k, gen)


@pytest.mark.parametrize("make,kwargs,exc,match", [
    (lambda g: _qkv(g, k=(1, 2, 8, 32)), {}, ValueError, "head dim mismatch"),
    (lambda g: _qkv(g, q=(1, 4, 8, 24), k=(1, 4, 8, 24)), {}, ValueError, "head dim 24 is not supported"),
    (lambda g: _qkv(g, k=(1, 3, 8, 16)), {}, ValueError, "multiple of k/v heads"),
    (lambda g: _qkv(g, q=(1, 4, 16), k=(1, 4, 16)), {}, ValueError, r"q must be 4-D \(batch, heads, seq"),
    (lambda g: _qkv(g, k=(2, 2, 8, 16)), {}, ValueError, "batch"),
    (lambda g: _qkv(g), {"window": (3,)}, ValueError, "window must be a pair"),
    (lambda g: _qkv(g), {"window": (-2, 0)}, ValueError, "window left must be >= 0"),
    (lambda g: _qkv(g), {"causal": 1}, TypeError, "causal must be a bool"),
    (lambda g: _qkv(g), {"scale": "x"}, TypeError, "scale must be a float"),
    (lambda g: (torch.ones(1, 2, 4, 16, dtype=torch.int32),) * 3, {}, TypeError, "q must be a floating-point"),
    (lambda g: (rand((1, 2, 4, 16), g), rand((1, 2, 4, 16), g, F16), rand((1, 2, 4, 16), g)), {}, TypeError,
     "one dtype"),
])
def test_errors(make, kwargs, exc, match, gen):
    with pytest.raises(exc, match=match) as info:
        attention(*make(gen), **kwargs)
    assert "opforge.attention" in str(info.value)


@pytest.mark.parametrize("cu_q,cu_k,kwargs,match", [
    ([0, 3, 10], [0, 3], {}, "cu_seqlens_q has 3 entries but cu_seqlens_k has 2"),
    ([0, 3, 9], [0, 3, 10], {}, "cu_seqlens_q must rise from 0 to the 10"),
    ([1, 3, 10], [0, 3, 10], {}, "must rise from 0"),
    ([0, 6, 5, 10], [0, 3, 4, 10], {}, "must rise from 0"),
    ([0, 3, 10], None, {}, "pass both"),
    ([0, 3, 10], [0, 3, 10], {"max_seqlen_q": 4}, "max_seqlen_q=4 is below the longest sequence"),
])
def test_cu_seqlens_errors(cu_q, cu_k, kwargs, match, gen):
    q, k, v = (rand((10, 2, 16), gen) for _ in range(3))
    cq = torch.tensor(cu_q, dtype=torch.int32)
    ck = torch.tensor(cu_k, dtype=torch.int32) if cu_k is not None else None
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kwargs)


def test_cu_seqlens_dtype_error(gen):
    q, k, v = (rand((10, 2, 16), gen) for _ in range(3))
    cu = torch.tensor([0.0, 10.0])
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32 or int64"):
        attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)


# ---------------------------------------------------------------------------
# torch.library: opcheck, torch.compile
# ---------------------------------------------------------------------------
def test_opcheck(gen):
    q, k, v = (t.requires_grad_() for t in _qkv(gen, q=(1, 4, 20, 16), k=(1, 2, 20, 16)))
    res = torch.library.opcheck(OPS.attention.default, (q, k, v, 0.25, -1, 0, None, None, -1, -1))
    assert set(res.values()) == {"SUCCESS"}, res


def test_opcheck_varlen_and_backward(gen):
    cu = torch.tensor([0, 5, 17], dtype=torch.int32)
    q, k, v = (rand((17, 2, 16), gen).requires_grad_() for _ in range(3))
    res = torch.library.opcheck(OPS.attention.default, (q, k, v, 0.25, 3, 0, cu, cu, 12, 12))
    assert set(res.values()) == {"SUCCESS"}, res
    q, k, v = _qkv(gen, q=(1, 2, 20, 16), k=(1, 2, 20, 16))
    out, lse = A.attention_reference(q, k, v, 0.25, -1, 0)
    res = torch.library.opcheck(OPS.attention_backward.default,
                                (rand(q.shape, gen), q, k, v, out, lse, 0.25, -1, 0, None, None, -1, -1))
    assert set(res.values()) == {"SUCCESS"}, res


def test_compile_fullgraph_forward_and_backward(gen):
    q, k, v = _qkv(gen, q=(1, 4, 24, 16), k=(1, 2, 24, 16))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)

    def f(a, b, c):
        dense = attention(a, b, c, causal=True)
        packed = attention(a[0].transpose(0, 1), b[0].transpose(0, 1), c[0].transpose(0, 1), window=(4, 4),
                           cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14, max_seqlen_k=14)
        return dense.sum() + packed.square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    compiled(qc, kc, vc).backward()
    qe, ke, ve = (t.clone().requires_grad_() for t in (q, k, v))
    f(qe, ke, ve).backward()
    for a, b in ((qc, qe), (kc, ke), (vc, ve)):
        assert rel_err(a.grad, b.grad) <= 1e-6


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    assert [v.name for v in registry.get("attention").variants] == ["gluon_ws", "triton_flash_tma", "triton_flash",
                                                                     "torch_sdpa", "reference"]
    assert [v.name for v in registry.get("attention_backward").variants] == ["gluon_ws", "triton_flash_tma",
                                                                              "triton_flash", "reference"]
    assert registry.get("attention").variant("triton_flash_tma").min_capability == (9, 0)
    sdpa = registry.get("attention").variant("torch_sdpa")
    assert sdpa.kind == "vendor" and sdpa.devices == ("cuda",)
    assert registry.get("attention").variant("reference").devices == ("cpu", "cuda")


def test_samples_reach_every_case():
    fwd = registry.get("attention").samples(torch.device("cpu"))
    assert {a[0].dtype for a in fwd} == {F32, F16, BF16}
    assert any(a[6] is not None for a in fwd) and any(a[4] >= 0 for a in fwd) and any(a[5] == 0 for a in fwd)
    assert any(a[1].shape[1] < a[0].shape[1] for a in fwd) and any(not a[0].is_contiguous() for a in fwd)
    bwd = registry.get("attention_backward").samples(torch.device("cpu"))
    assert len(bwd) == len(fwd) - 1 and bwd[0][5].dtype == F32  # no one-hot softmax for the backward


def test_dispatch_decisions(gen):
    q, k, v = _qkv(gen)
    args = (q, k, v, 0.25, -1, 0, None, None, -1, -1)
    d = dispatch.explain("attention", *args)
    assert d.variant.name == "triton_flash_tma"  # the interpreter runs the Hopper path too
    assert "device cpu" in d.rejected["torch_sdpa"]
    odd_k, odd_v = (rand((1, 2, 8, 18), gen)[..., :16] for _ in range(2))  # 72-byte rows: no TMA
    d = dispatch.explain("attention", q, odd_k, odd_v, *args[3:])
    assert d.variant.name == "triton_flash" and "16 bytes" in d.rejected["triton_flash_tma"]
    qb, kb, vb = (t.to(BF16) for t in (q, k, v))
    d = dispatch.explain("attention", qb, kb, vb, *args[3:])
    assert d.variant.name == "reference" and "interpreter" in d.rejected["triton_flash"]
    assert "interpreter" in d.rejected["triton_flash_tma"]
    sdpa = registry.get("attention").variant("torch_sdpa")
    assert "top-left" in sdpa.check(qb, kb[:, :, :4], vb[:, :, :4], *args[3:])
    assert "GQA" in sdpa.check(qb, kb, vb, 0.25, -1, -1, None, None, -1, -1)
    assert "window" in sdpa.check(qb, kb, vb, 0.25, 4, 0, None, None, -1, -1)


def test_bucket_and_memo_key_see_the_mask(gen):
    q, k, v = _qkv(gen)
    v_ = registry.get("attention").variant("triton_flash")
    causal = v_.bucket(q, k, v, 0.25, -1, 0, None, None, -1, -1)
    full = v_.bucket(q, k, v, 0.25, -1, -1, None, None, -1, -1)
    assert causal != full and "g2" in causal
    op = registry.get("attention")
    assert op.memo_key(q, k, v, 0.25, -1, 0, None, None, -1, -1) != op.memo_key(q, k, v, 0.25, 3, 0, None, None, -1, -1)
