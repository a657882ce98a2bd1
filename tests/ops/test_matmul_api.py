"""The matmul op contract: registry and dispatch decisions, torch.library
registration (opcheck), torch.compile, autograd through opforge's own GEMMs
(gradcheck in fp64 through the tiled kernel, fp32 gradients against float64
torch autograd), torch.matmul shape semantics, error messages.

Oracles are torch in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import API_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.ops import matmul as MM
from opforge.ops.matmul import OP, Epilogue, matmul
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
OPS = torch.ops.opforge
ACT = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu,
       "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}

pytestmark = API_WARNINGS


def epi(**kw):
    return Epilogue(**kw)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    op = registry.get("matmul")
    assert [v.name for v in op.variants] == ["triton_splitk", "triton_tma_persistent", "triton_tiled",
                                             "torch_eager", "reference"]
    assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
    assert op.variant("reference").kind == "reference"
    assert op.variant("triton_tma_persistent").min_capability == (9, 0)
    assert F64 not in op.variant("triton_tma_persistent").dtypes and F64 in op.variant("triton_tiled").dtypes


def test_samples_reach_every_triton_variant_and_dtype():
    samples = OP.samples(torch.device("cpu"))
    seen = {}
    for args in samples:
        OP.validate(*args)
        for v in OP.variants:
            if v.kind == "triton" and dispatch.reject_reason(OP, v, args) is None:
                seen.setdefault(v.name, set()).add(args[0].dtype)
    assert seen["triton_tma_persistent"] == {F16, BF16, F32}
    assert seen["triton_splitk"] >= {F16, BF16, F32, F64}
    assert seen["triton_tiled"] == {F16, BF16, F32, F64}


def test_dispatch_decisions(gen):
    def chosen(a, b):
        return dispatch.explain("matmul", a, b, None, None, MM.make_epilogue(a)).variant.name

    assert chosen(rand((64, 64), gen, BF16), rand((64, 64), gen, BF16)) == "triton_tma_persistent"
    assert chosen(rand((37, 45), gen, BF16), rand((45, 29), gen, BF16)) == "triton_tiled"  # unaligned rows
    assert chosen(rand((2, 32, 64), gen), rand((2, 64, 32), gen)) == "triton_tiled"  # batched
    assert chosen(rand((2, 2048), gen), rand((2048, 64), gen)) == "triton_splitk"  # decode
    assert chosen(rand((2, 8, 64), gen), rand((64, 32), gen)) == "triton_tma_persistent"  # collapses to 2-D
    text = str(dispatch.explain("matmul", rand((37, 45), gen), rand((45, 29), gen), None, None, epi()))
    assert "rejected triton_tma_persistent" in text and "rejected triton_splitk" in text


def test_memo_key_sees_tf32_alignment_and_epilogue(gen):
    a, b = rand((32, 32), gen), rand((32, 32), gen)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        e_off = MM.make_epilogue(a)
        torch.backends.cuda.matmul.allow_tf32 = True
        e_on = MM.make_epilogue(a)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert e_on.tf32 and not e_off.tf32
    assert OP.memo_key(a, b, None, None, e_on) != OP.memo_key(a, b, None, None, e_off)
    assert OP.dtype_key(a, b, None, None, e_on) == "float32+tf32"
    shifted = torch.empty(32 * 32 + 1)[1:].view(32, 32)  # 4-byte offset: not 16-byte aligned
    assert OP.memo_key(shifted, b, None, None, e_off) != OP.memo_key(a, b, None, None, e_off)
    assert dispatch.explain("matmul", shifted, b, None, None, e_off).variant.name == "triton_tiled"
    assert OP.memo_key(a, b, None, None, e_off) != OP.memo_key(a, b, None, None, epi(activation="gelu"))


def test_direct_and_library_paths_agree(gen):
    a, b, bias = rand((9, 24), gen), rand((24, 16), gen), rand(16, gen)
    direct = matmul(a, b, bias=bias, activation="silu")
    via_library = OPS.matmul(a, b, bias, None, "silu", None)
    assert torch.equal(direct, via_library)
    want = F.silu(a.double() @ b.double() + bias.double())
    assert rel_err(direct, want) <= 1e-5


# ---------------------------------------------------------------------------
# opcheck and torch.compile
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck(requires_grad, gen):
    cases = [
        (rand((5, 24), gen), rand((24, 16), gen), rand(16, gen), None, "gelu", None),
        (rand((2, 3, 16), gen), rand((16, 8), gen), None, rand((2, 3, 8), gen), "relu", F64),
        (rand((2, 4, 16), gen), rand((2, 16, 8), gen), None, None, None, None),
    ]
    for args in cases:
        args = tuple(t.requires_grad_(requires_grad) if isinstance(t, torch.Tensor) and t.dtype == F32 else t
                     for t in args)
        result = torch.library.opcheck(OPS.matmul.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(x, w, bias, r):
        return matmul(x, w.t(), bias=bias, activation="gelu", residual=r)

    x, w, bias, r = rand((2, 5, 16), gen), rand((8, 16), gen), rand(8, gen), rand((2, 5, 8), gen)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(xc, wc, bias, r).pow(2).sum().backward()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    want = F.gelu(xr @ wr.t() + bias.double()) + r.double()
    want.pow(2).sum().backward()
    assert rel_err(compiled(x, w, bias, r), want) <= 1e-5
    assert rel_err(xc.grad, xr.grad) <= 1e-5 and rel_err(wc.grad, wr.grad) <= 1e-5
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------
def test_gradcheck_fp64_through_tiled(gen):
    cases = [((6, 9), (9, 5), "gelu"), ((2, 3, 9), (9, 5), "silu"), ((2, 4, 9), (9, 5), None)]
    with force_variant("matmul", "triton_tiled"):
        for sa, sb, act in cases:
            a = rand(sa, gen, F64).requires_grad_()
            b = rand(sb, gen, F64).requires_grad_()
            bias = rand(sb[-1], gen, F64).requires_grad_()
            res = rand(torch.Size(sa[:-1]) + (sb[-1],), gen, F64).requires_grad_()
            fn = lambda a, b, bias, res, act=act: matmul(a, b, bias=bias, activation=act, residual=res)
            assert torch.autograd.gradcheck(fn, (a, b, bias, res), fast_mode=True)
        a3, b3 = rand((2, 4, 7), gen, F64).requires_grad_(), rand((2, 7, 3), gen, F64).requires_grad_()
        assert torch.autograd.gradcheck(lambda x, y: matmul(x, y, activation="gelu_tanh"), (a3, b3), fast_mode=True)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_fp32_gradients_match_float64_autograd(activation, gen):
    # Default dispatch: the TMA kernel for the forward, the gradient epilogue
    # and both backward GEMMs (the transposed views keep unit strides).
    x, w = rand((3, 8, 32), gen), rand((24, 32), gen)
    bias, res, g = rand(24, gen), rand((8, 24), gen), rand((3, 8, 24), gen)
    leaves = [t.clone().requires_grad_() for t in (x, w, bias, res)]
    out = matmul(leaves[0], leaves[1].t(), bias=leaves[2], activation=activation, residual=leaves[3])
    out.backward(g)
    refs = [t.double().requires_grad_() for t in (x, w, bias, res)]
    want = ACT[activation](refs[0] @ refs[1].t() + refs[2]) + refs[3]
    want.backward(g.double())
    assert rel_err(out, want) <= 1e-5
    for got, ref in zip(leaves, refs):
        assert got.grad.dtype == F32
        assert rel_err(got.grad, ref.grad) <= 1e-5


def test_bf16_gradients_and_out_dtype(gen):
    a, b, bias = rand((12, 40), gen, BF16), rand((40, 16), gen, BF16), rand(16, gen, F32)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    out = matmul(*leaves[:2], bias=leaves[2], activation="gelu", out_dtype=F32)
    assert out.dtype == F32
    out.sum().backward()
    refs = [t.double().requires_grad_() for t in (a, b, bias)]
    F.gelu(refs[0] @ refs[1] + refs[2]).sum().backward()
    assert [t.grad.dtype for t in leaves] == [BF16, BF16, F32]
    for got, ref in zip(leaves, refs):
        assert rel_err(got.grad, ref.grad) <= 1e-2


def test_backward_runs_through_opforge_gemms(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        if op.name == "matmul":
            seen.append(args[-1].activation)
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    a, b = rand((6, 16), gen).requires_grad_(), rand((16, 8), gen).requires_grad_()
    bias = rand(8, gen).requires_grad_()
    matmul(a, b, bias=bias, activation="relu").sum().backward()
    # forward, the recomputed GEMM with the gradient epilogue, dA and dB
    assert seen == ["relu", "relu_grad", None, None]


def test_broadcast_gradients(gen):
    a = rand((5, 7), gen).requires_grad_()
    b = rand((3, 7, 4), gen).requires_grad_()
    res = rand((4,), gen).requires_grad_()
    out = matmul(a, b, residual=res)
    out.backward(torch.ones_like(out))
    ar, br, rr = (t.detach().double().requires_grad_() for t in (a, b, res))
    (torch.matmul(ar, br) + rr).backward(torch.ones(3, 5, 4, dtype=F64))
    for got, ref in ((a, ar), (b, br), (res, rr)):
        assert got.grad.shape == got.shape and rel_err(got.grad, ref.grad) <= 1e-5


# ---------------------------------------------------------------------------
# Semantics and errors
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((7,), (7, 5)), ((4, 7), (7,)), ((7,), (7,)), ((2, 3, 4, 7), (7, 5)),
                                   ((7,), (2, 7, 5)), ((2, 4, 7), (7,)), ((1, 4, 7), (3, 7, 5))])
def test_shapes_follow_torch_matmul(sa, sb, gen):
    a, b = rand(sa, gen), rand(sb, gen)
    out = matmul(a, b)
    want = torch.matmul(a.double(), b.double())
    assert out.shape == want.shape and out.is_contiguous()
    assert rel_err(out, want) <= 1e-5


def test_non_contiguous_batch_and_dtype_preserved(gen):
    for dt in (F16, BF16, F32, F64):
        a = rand((6, 3, 20), gen, dt).transpose(0, 1)  # [3, 6, 20], batch dims do not collapse
        b = rand((20, 9), gen, dt)
        out = matmul(a, b, bias=rand(9, gen, dt))
        assert out.dtype == dt and out.shape == (3, 6, 9)


def test_clear_errors(gen):
    a, b = rand((4, 8), gen), rand((8, 5), gen)
    with pytest.raises(TypeError, match="opforge.matmul: a must be a torch.Tensor, got list"):
        matmul([1.0], b)
    with pytest.raises(TypeError, match="opforge.matmul: b must be a floating-point tensor, got torch.int64"):
        matmul(a, torch.ones(8, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match="opforge.matmul: a is torch.float32 but b is torch.bfloat16"):
        matmul(a, b.to(BF16))
    with pytest.raises(ValueError, match=r"opforge.matmul: a has K=8 \(its last dim\) but b has K=5"):
        matmul(a, rand((5, 8), gen))
    with pytest.raises(ValueError, match="opforge.matmul: activation must be None or one of 'gelu'"):
        matmul(a, b, activation="tanh")
    with pytest.raises(ValueError, match="opforge.matmul: activation must be None"):
        matmul(a, b, activation="gelu_grad")  # internal gradient epilogues are not public
    with pytest.raises(ValueError, match=r"opforge.matmul: bias must have shape \(5,\)"):
        matmul(a, b, bias=rand(4, gen))
    with pytest.raises(TypeError, match="opforge.matmul: bias is torch.float16; expected torch.float32"):
        matmul(a, b, bias=rand(5, gen, F16))
    with pytest.raises(ValueError, match=r"opforge.matmul: residual of shape \(3, 5\) does not broadcast"):
        matmul(a, b, residual=rand((3, 5), gen))
    with pytest.raises(ValueError, match="opforge.matmul: a is 0-dim"):
        matmul(torch.tensor(1.0), b)
    with pytest.raises(ValueError, match="opforge.matmul: b has 4 dims"):
        matmul(a, rand((1, 1, 8, 5), gen))
    with pytest.raises(ValueError, match="opforge.matmul: batch sizes 2 .a. and 3 .b. differ"):
        matmul(rand((2, 4, 8), gen), rand((3, 8, 5), gen))
    with pytest.raises(TypeError, match="opforge.matmul: out_dtype must be None"):
        matmul(a, b, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="opforge.matmul: bias needs a b with an N dim"):
        matmul(a, rand((8,), gen), bias=rand(1, gen))
