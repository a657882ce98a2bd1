"""FlashAttention kernels under the Triton interpreter, launched directly with
16-wide blocks so that a few dozen tokens take several key/query blocks and
every loop of the three-way split (masked edge, unmasked middle, masked
diagonal / tail) runs. The oracle is an independent float64 torch
computation with an explicit mask matrix (``naive`` below), and its autograd.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import INTERPRETER_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.kernels import attention as K

F16, F32 = torch.float16, torch.float32
BOUND = {F32: 1e-5, F16: 1e-3}

pytestmark = INTERPRETER_WARNINGS


def naive(q, k, v, scale, left, right):
    """(B, H, Sq, D) float64 attention, FlashAttention's mask conventions;
    rows that see no key are 0. Returns the output and the natural-log lse."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    Sq, Sk = q.shape[2], k.shape[2]
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + Sk - Sq - left
    if right >= 0:
        keep &= j <= i + Sk - Sq + right
    s = s.masked_fill(~keep, -math.inf)
    mx = s.amax(-1, keepdim=True).detach()
    mx = mx.masked_fill(torch.isinf(mx), 0.0)  # a row with no key: any finite shift
    w = torch.exp(s - mx)
    denom = w.sum(-1, keepdim=True)
    p = w / torch.where(denom == 0, 1.0, denom)
    lse = torch.where(keep.any(-1), torch.log(denom[..., 0]) + mx[..., 0], math.inf)
    return p @ v, lse


CFG_F = [{"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 32, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 32}]
CFG_B = [dict(KV_BLOCK_M=16, KV_BLOCK_N=16, Q_BLOCK_M=16, Q_BLOCK_N=16),
         dict(KV_BLOCK_M=16, KV_BLOCK_N=32, Q_BLOCK_M=32, Q_BLOCK_N=16)]


def run_dense(q, k, v, scale, left, right, cfg_f, cfg_b, do, tma=False):
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    geom = (B, H, Hk, Sq, Sk, None, None)
    o = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty((B, H, Sq), dtype=F32)
    K.launch_forward(q, k, v, o, lse, geom, scale, left, right, cfg_f, tma=tma)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
    K.launch_backward(do, q, k, v, o, lse, dq, dk, dv, geom, scale, left, right, cfg_b, tma=tma)
    return o, lse, (dq, dk, dv)


def oracle(q, k, v, scale, left, right, do):
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = naive(qq, kk, vv, scale, left, right)
    grads = torch.autograd.grad(o, (qq, kk, vv), do.double())
    return o.detach(), lse, grads


def check_all(got, want, dtype):
    (o, lse, grads), (ro, rlse, rgrads) = got, want
    assert rel_err(o, ro) <= BOUND[dtype], rel_err(o, ro)
    assert torch.equal(torch.isinf(lse), torch.isinf(rlse.float()))
    assert rel_err(lse, rlse) <= 1e-5
    for g, r in zip(grads, rgrads):
        assert torch.isfinite(g).all()
        assert rel_err(g, r) <= 2 * BOUND[dtype], rel_err(g, r)


# (B, H, Hk, Sq, Sk, left, right): full, causal square / Sq < Sk / Sq > Sk (queries with no key),
# windows both sides, left only, right only, and GQA / MQA groups.
CASES = [
    (1, 2, 2, 50, 50, -1, -1),
    (2, 2, 2, 50, 50, -1, 0),
    (1, 2, 1, 23, 61, -1, 0),
    (1, 4, 2, 61, 23, -1, 0),
    (1, 2, 2, 64, 64, 7, 3),
    (1, 2, 2, 41, 57, 9, -1),
    (1, 2, 2, 57, 41, -1, 5),
    (1, 4, 1, 48, 48, 0, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}Hk{}_{}x{}_w{},{}".format(*c))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_dense_forward_backward(case, dtype, gen):
    """Pointer loads in fp32, TMA descriptors in fp16 (the Hopper path)."""
    B, H, Hk, Sq, Sk, left, right = case
    D = 16 if dtype == F32 else 32
    q, k, v = rand((B, H, Sq, D), gen, dtype), rand((B, Hk, Sk, D), gen, dtype), rand((B, Hk, Sk, D), gen, dtype)
    do = rand(q.shape, gen, dtype)
    i = CASES.index(case)
    assert K.tma_ok(q, k, v, do, varlen=False)
    got = run_dense(q, k, v, D ** -0.5, left, right, CFG_F[i % 3], CFG_B[i % 2], do, tma=dtype == F16)
    check_all(got, oracle(q, k, v, D ** -0.5, left, right, do), dtype)


def test_strided_views_and_head_dim_64(gen):
    """(B, S, H, D) storage seen as (B, H, S, D): the kernels take the strides as they are."""
    B, S, H, D = 2, 37, 2, 64
    q, k, v, do = (rand((B, S, H, D), gen, F32).transpose(1, 2) for _ in range(4))
    assert not q.is_contiguous()
    got = run_dense(q, k, v, 0.3, -1, 0, CFG_F[0], CFG_B[1], do)
    check_all(got, oracle(q, k, v, 0.3, -1, 0, do), F32)


def test_large_logits_do_not_overflow(gen):
    """q·k around 1e4: exp2 of the running max difference, never of a raw score."""
    q, k, v = rand((1, 2, 40, 16), gen, F32, 30.0), rand((1, 2, 40, 16), gen, F32, 30.0), rand((1, 2, 40, 16), gen, F32)
    do = rand(q.shape, gen, F32)
    got = run_dense(q, k, v, 1.0, -1, 0, CFG_F[0], CFG_B[0], do)
    assert got[0].abs().max() < 10 and float(got[1].abs().max()) > 1e3
    o, lse, _ = oracle(q, k, v, 1.0, -1, 0, do)
    assert rel_err(got[0], o) <= 1e-5 and rel_err(got[1], lse) <= 1e-5
    assert all(torch.isfinite(g).all() for g in got[2])


def test_rows_without_keys_are_zero_not_nan(gen):
    """Sq > Sk under causal: the first Sq - Sk queries see nothing."""
    q, k, v = rand((1, 2, 40, 16), gen, F32), rand((1, 2, 8, 16), gen, F32), rand((1, 2, 8, 16), gen, F32)
    do = rand(q.shape, gen, F32)
    o, lse, grads = run_dense(q, k, v, 0.25, -1, 0, CFG_F[0], CFG_B[0], do)
    assert torch.equal(o[:, :, :32], torch.zeros_like(o[:, :, :32]))
    assert torch.isinf(lse[:, :, :32]).all() and (lse[:, :, :32] > 0).all()
    assert torch.equal(grads[0][:, :, :32], torch.zeros_like(grads[0][:, :, :32]))
    check_all((o, lse, grads), oracle(q, k, v, 0.25, -1, 0, do), F32)


def test_empty_key_sequence_gives_zero_output(gen):
    q, k, v = rand((1, 2, 20, 16), gen, F32), rand((1, 2, 0, 16), gen, F32), rand((1, 2, 0, 16), gen, F32)
    o = torch.empty(q.shape)
    lse = torch.empty((1, 2, 20))
    K.launch_forward(q, k, v, o, lse, (1, 2, 2, 20, 0, None, None), 0.25, -1, -1, CFG_F[0])
    assert torch.equal(o, torch.zeros_like(o)) and torch.isinf(lse).all()


@pytest.mark.parametrize("window,tma", [((-1, 0), False), ((4, 2), True)], ids=["causal", "window-tma"])
def test_varlen_packed(window, tma, gen):
    """Sequences of 17, 1, 0 and 30 queries against 20, 5, 3 and 30 keys, GQA 4:2."""
    lq, lk, H, Hk, D = [17, 1, 0, 30], [20, 5, 3, 30], 4, 2, 16
    cq = torch.tensor([0, 17, 18, 18, 48], dtype=torch.int32)
    ck = torch.tensor([0, 20, 25, 28, 58], dtype=torch.int64)
    q, do = rand((48, H, D), gen, F32), rand((48, H, D), gen, F32)
    k, v = rand((58, Hk, D), gen, F32), rand((58, Hk, D), gen, F32)
    left, right = window
    geom = (4, H, Hk, 30, 30, cq, ck)
    o = torch.full(q.shape, float("nan"))
    lse = torch.full((H, 48), float("nan"))
    assert K.tma_ok(q, k, v, do, varlen=True)
    K.launch_forward(q, k, v, o, lse, geom, 0.25, left, right, CFG_F[1], tma=tma)
    dq, dk, dv = (torch.full(t.shape, float("nan")) for t in (q, k, v))
    K.launch_backward(do, q, k, v, o, lse, dq, dk, dv, geom, 0.25, left, right, CFG_B[1], tma=tma)
    for b in range(4):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lq[b] == 0:
            continue
        sub = [t[s].transpose(0, 1)[None] for t, s in ((q, qs), (k, ks), (v, ks), (do, qs))]
        ro, rlse, rg = oracle(*sub[:3], 0.25, left, right, sub[3])
        assert rel_err(o[qs].transpose(0, 1)[None], ro) <= 1e-5
        assert rel_err(lse[:, qs][None], rlse) <= 1e-5
        for got, want in zip((dq[qs], dk[ks], dv[ks]), rg):
            assert rel_err(got.transpose(0, 1)[None], want) <= 2e-5
    # The key tokens of the sequence with no queries get zero gradients, not garbage.
    assert torch.equal(dk[25:28], torch.zeros_like(dk[25:28]))


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
def test_int64_offsets_branch(tma, gen, monkeypatch):
    """The 64-bit offset code (taken for tensors of 2^31+ elements) forced on a small case."""
    monkeypatch.setattr(K, "_int64", lambda *tensors: True)
    q, k, v, do = (rand((1, 4, 37, 16), gen, F32) for _ in range(4))
    k, v = k[:, :2], v[:, :2]
    got = run_dense(q, k, v, 0.25, 6, 0, CFG_F[0], CFG_B[1], do, tma=tma)
    check_all(got, oracle(q, k, v, 0.25, 6, 0, do), F32)


def test_tma_ok_rejects_unaligned(gen):
    q = rand((1, 2, 8, 16), gen, F16)
    assert K.tma_ok(q, varlen=False)
    assert not K.tma_ok(q[:, :, :, 1:9], varlen=False)  # base off by 2 bytes
    assert not K.tma_ok(rand((1, 2, 8, 20), gen, F16)[..., :16], varlen=False)  # 40-byte rows


@pytest.mark.parametrize("itemsize", [2, 4])
def test_configs_are_sane(itemsize):
    for D in K.HEAD_DIMS:
        for Sq, Sk in ((8192, 8192), (1, 37), (300, 5)):
            fwd = K.forward_configs(D, Sq, Sk, itemsize)
            assert K.forward_default_config(D, Sq, Sk, itemsize) in fwd
            assert K.backward_default_config(D, Sq, Sk, itemsize) in K.backward_configs(D, Sq, Sk, itemsize)
            for cfg in fwd:
                assert cfg["BLOCK_M"] >= 16 and cfg["BLOCK_N"] >= 16
                assert cfg["BLOCK_M"] * D <= 128 * 256  # query tile (fp32 acc) stays in registers
                if itemsize == 4:  # exact-fp32 dots hold their operands in registers: small tiles
                    assert cfg["BLOCK_M"] * cfg["BLOCK_N"] <= 32 * 64 and cfg["num_stages"] == 1
