"""``opforge.rope`` / ``opforge.rope_``: the Triton kernel against a float64
torch oracle written here (transformers' rotate_half formula), both layouts,
gathered positions, the gradient, in place, opcheck and errors."""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge.runtime import registry
from opforge.runtime.dispatch import force_variant

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
BOUND = {F64: 1e-12, F32: 1e-5, BF16: 1e-2}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def oracle(x, cos, sin, unsqueeze_dim=1):
    c, s = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    x = x.double()
    return x * c + rotate_half(x) * s


def tables(gen, batch, seq, dim, dtype):
    angle = torch.rand((batch, seq, dim // 2), generator=gen, dtype=F64) * 6
    emb = torch.cat([angle, angle], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def test_registered():
    assert [v.name for v in registry.get("rope").variants] == ["triton_token", "torch_eager", "reference"]
    assert registry.get("rope_backward").samples(torch.device("cpu"))


@pytest.mark.parametrize("dtype,unsqueeze_dim", [(F32, 1), (BF16, 1), (F64, 2)])
def test_forward_and_gradient(gen, dtype, unsqueeze_dim):
    B, HQ, HK, S, D = 2, 4, 2, 5, 16
    shape = (lambda h: (B, h, S, D)) if unsqueeze_dim == 1 else (lambda h: (B, S, h, D))
    q = torch.randn(shape(HQ), generator=gen, dtype=F64).to(dtype).requires_grad_()
    k = torch.randn(shape(HK), generator=gen, dtype=F64).to(dtype).requires_grad_()
    cos, sin = tables(gen, B, S, D, dtype)
    with force_variant("rope", "triton_token"), force_variant("rope_backward", "triton_token"):
        qo, ko = opforge.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        gq, gk = torch.randn(qo.shape, generator=gen).to(dtype), torch.randn(ko.shape, generator=gen).to(dtype)
        dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    assert qo.dtype == dtype and qo.shape == q.shape
    assert rel(qo, oracle(q.detach(), cos, sin, unsqueeze_dim)) < BOUND[dtype]
    assert rel(ko, oracle(k.detach(), cos, sin, unsqueeze_dim)) < BOUND[dtype]
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref = torch.autograd.grad((oracle(q64, cos, sin, unsqueeze_dim), oracle(k64, cos, sin, unsqueeze_dim)),
                              (q64, k64), (gq.double(), gk.double()))
    assert rel(dq, ref[0]) < BOUND[dtype] and rel(dk, ref[1]) < BOUND[dtype]


def test_position_ids_transposed_input_and_in_place(gen):
    """Tables indexed by position_ids in the kernel; q as transformers makes it
    (a transposed view of [B, S, H, D]); rope_ writes into q and k."""
    B, H, S, D, P = 2, 3, 4, 8, 11
    q = torch.randn((B, S, H, D), generator=gen, dtype=F64).transpose(1, 2)
    k = torch.randn((B, 1, S, D), generator=gen, dtype=F64)
    table_c, table_s = (t.reshape(-1, D)[:P] for t in tables(gen, 2, 6, D, F64))
    pos = torch.randint(0, P, (B, S), generator=gen)
    expect_q = oracle(q, table_c[pos], table_s[pos])
    expect_k = oracle(k, table_c[pos], table_s[pos])
    with force_variant("rope", "triton_token"):
        qo, ko = opforge.rope(q, k, table_c, table_s, position_ids=pos)
        assert rel(qo, expect_q) < 1e-12 and rel(ko, expect_k) < 1e-12
        q2, k2 = q.clone(), k.clone()
        q_ptr = q2.data_ptr()
        out = opforge.rope_(q2, k2, table_c, table_s, position_ids=pos.int())
    assert out[0] is q2 and q2.data_ptr() == q_ptr
    assert rel(q2, expect_q) < 1e-12 and rel(k2, expect_k) < 1e-12


def test_opcheck(gen):
    B, S, D = 1, 3, 8
    q = torch.randn((B, 2, S, D), generator=gen).requires_grad_()
    k = torch.randn((B, 1, S, D), generator=gen).requires_grad_()
    cos, sin = tables(gen, B, S, D, F32)
    # the schema, the autograd registration and the fake against the real op (aot_dispatch would rerun
    # the op under the interpreter: 20 s)
    result = torch.library.opcheck(torch.ops.opforge.rope.default, (q, k, cos, sin, None, 1),
                                   test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_errors(gen):
    q = torch.randn(1, 2, 3, 8)
    cos, sin = tables(gen, 1, 3, 8, F32)
    with pytest.raises(ValueError, match="opforge.rope: the head dim must be even"):
        opforge.rope(q[..., :7], q[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="opforge.rope: cos of shape"):
        opforge.rope(q, q, cos[:, :2], sin[:, :2])
    with pytest.raises(ValueError, match="opforge.rope: position_ids must lie in"):
        opforge.rope(q, q, cos[0], sin[0], position_ids=torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="opforge.rope_: q or k requires grad"):
        opforge.rope_(q.clone().requires_grad_(), q.clone(), cos, sin)
