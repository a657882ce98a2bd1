"""The fused residual-add + norm contract: ``add_rms_norm`` / ``add_layer_norm``
against torch in float64 (``x + r`` then ``F.rms_norm`` / ``F.layer_norm``),
for both outputs and every gradient; the Triton variants forced through
dispatch; torch.library opcheck, torch.compile, errors and dispatch decisions.

The interpreter rounds fp32 -> bf16 by truncation (the GPU rounds to nearest
even), so ``new_residual`` is compared exactly for fp32 / fp64 / fp16 and
within one bf16 ulp for bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.kernels import norm as K
from opforge.ops import norm as N
from opforge.ops import residual_norm as R
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
TOL = {F32: 1e-5, F64: 1e-12, F16: 1e-3, BF16: 1e-2}
OPS = torch.ops.opforge
NAMES = ["add_rms_norm", "add_layer_norm"]

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _ours(name, x, r, shape, w, b, eps=None):
    if name == "add_rms_norm":
        return R.add_rms_norm(x, r, shape, w, eps)
    return R.add_layer_norm(x, r, shape, w, b, 1e-5 if eps is None else eps)


def _torch(name, x, r, shape, w, b, eps=None):
    """The oracle: torch's own ops in whatever dtype the arguments have."""
    s = x + r
    if name == "add_rms_norm":
        return F.rms_norm(s, shape, w, eps), s
    return F.layer_norm(s, shape, w, b, 1e-5 if eps is None else eps), s


def _params(shape, dtype, gen, name):
    w = (torch.rand(shape, generator=gen, dtype=F64) + 0.5).to(dtype)
    b = torch.randn(shape, generator=gen, dtype=F64).to(dtype) if name == "add_layer_norm" else None
    return w, b


def _eps(name, dtype):
    return N.default_rms_eps(dtype) if name == "add_rms_norm" else 1e-5


def _check_new_residual(s, x, r):
    want = x + r  # torch's rounding of the add, in x's dtype
    assert s.dtype == x.dtype and s.shape == x.shape and s.is_contiguous()
    if x.dtype == BF16:
        torch.testing.assert_close(s, want, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(s, want)


def _up(t):
    return None if t is None else t.double()


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64])
@pytest.mark.parametrize("variant", ["triton_row", "triton_split"])
@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_float64(name, variant, dtype, gen):
    x = (torch.randn((2, 3, 40), generator=gen, dtype=F64) + 2).to(dtype)
    r = torch.randn((2, 3, 40), generator=gen, dtype=F64).to(dtype)
    w, b = _params((40,), dtype, gen, name)
    if variant == "triton_split":  # dispatch would not split 40 columns: run it with pieces of 16
        packed = registry.get(name).variant(variant).run({"CHUNK": 16, "num_warps": 4}, x, r, (40,),
                                                         _eps(name, dtype), w, b)
        out, s = packed[0], packed[1]
    else:
        with force_variant(name, variant):
            out, s = _ours(name, x, r, 40, w, b)
    _check_new_residual(s, x, r)
    # The norm of the rounded sum, as torch computes it in float64 from x + r in x's dtype.
    want, _ = _torch(name, (x + r).double(), torch.zeros((), dtype=F64), (40,), _up(w), _up(b), _eps(name, dtype))
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, want) <= TOL[dtype]


@pytest.mark.parametrize("name", NAMES)
def test_split_pieces_and_long_rows(name, gen):
    # Several ragged pieces (CHUNK 16 over 50 columns) and the split's default on a long row.
    x = torch.randn((3, 50), generator=gen) * 2 + 4
    r = torch.randn((3, 50), generator=gen)
    w, b = _params((50,), F32, gen, name)
    op = registry.get(name)
    args = (x, r, (50,), 1e-5, w, b)
    packed = op.variant("triton_split").run({"CHUNK": 16, "num_warps": 4}, *args)
    want_y, want_s = _torch(name, x.double(), r.double(), (50,), w.double(), _up(b), 1e-5)
    assert rel_err(packed[0], want_y) <= 1e-5 and torch.equal(packed[1], x + r)
    long = torch.randn((1, K.ROW_MAX + 3), generator=gen)
    lr = torch.randn((1, K.ROW_MAX + 3), generator=gen)
    d = dispatch.explain(name, long, lr, (K.ROW_MAX + 3,), 1e-5)
    assert d.variant.name == "triton_split" and "row-resident limit" in d.rejected["triton_row"]
    out, s = _ours(name, long, lr, K.ROW_MAX + 3, None, None, 1e-5)
    assert rel_err(out, _torch(name, long.double(), lr.double(), (K.ROW_MAX + 3,), None, None, 1e-5)[0]) <= 1e-5


def test_non_contiguous_and_multi_dim_shape(gen):
    x = torch.randn((12, 9), generator=gen).t()  # (9, 12), column-major
    r = torch.randn((9, 24), generator=gen)[:, ::2]  # strided residual
    w, b = _params((12,), F32, gen, "add_layer_norm")
    out, s = R.add_layer_norm(x, r, 12, w, b)
    want, _ = _torch("add_layer_norm", x.double(), r.double(), (12,), w.double(), b.double())
    assert rel_err(out, want) <= 1e-5 and out.is_contiguous()
    _check_new_residual(s, x, r)
    x3 = torch.randn((2, 3, 4), generator=gen)
    r3 = torch.randn((2, 3, 4), generator=gen)
    out, s = R.add_rms_norm(x3, r3, (3, 4), None, 1e-6)
    assert rel_err(out, F.rms_norm((x3 + r3).double(), (3, 4), None, 1e-6)) <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_empty_size_one_nan_inf(name, gen):
    e = torch.empty((0, 3, 5))
    out, s = _ours(name, e, e, 5, None, None)
    assert out.shape == s.shape == (0, 3, 5)
    one = torch.randn((4, 1), generator=gen)
    out, s = _ours(name, one, one, 1, None, None, 1e-5)
    torch.testing.assert_close(out, _torch(name, one, one, (1,), None, None, 1e-5)[0])
    x = torch.randn((4, 6), generator=gen)
    r = torch.randn((4, 6), generator=gen)
    x[1, 2] = float("nan")
    r[2, 0] = float("inf")
    out, s = _ours(name, x, r, 6, None, None, 1e-5)
    want, want_s = _torch(name, x, r, (6,), None, None, 1e-5)
    torch.testing.assert_close(s, want_s, equal_nan=True)
    torch.testing.assert_close(out, want, equal_nan=True)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 3]]).all()


# ---------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("bwd_variant", ["triton_row", "triton_looped"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_vs_float64_autograd(name, bwd_variant, dtype, gen):
    # Both outputs feed the loss: d_input = d_residual = norm_backward(d_out) + d_new_residual.
    shape = (5, 24)
    x = (torch.randn(shape, generator=gen, dtype=F64) + 1).to(dtype)
    r = torch.randn(shape, generator=gen, dtype=F64).to(dtype)
    dy, ds = (torch.randn(shape, generator=gen, dtype=F64).to(dtype) for _ in range(2))
    w, b = _params((24,), dtype, gen, name)
    leaves = [t.clone().requires_grad_() for t in (x, r, w, b) if t is not None]
    with force_variant(name, "triton_row"), force_variant(name + "_backward", bwd_variant):
        out, s = _ours(name, leaves[0], leaves[1], 24, leaves[2], leaves[3] if len(leaves) > 3 else None, 1e-5)
        got = torch.autograd.grad((out, s), leaves, (dy, ds))
    ref = [t.double().requires_grad_() for t in (x, r, w, b) if t is not None]
    yr, sr = _torch(name, ref[0], ref[1], (24,), ref[2], ref[3] if len(ref) > 3 else None, 1e-5)
    want = torch.autograd.grad((yr, sr), ref, (dy.double(), ds.double()))
    for g, wnt in zip(got, want):
        assert g.dtype == dtype and g.shape == wnt.shape
        assert rel_err(g, wnt) <= TOL[dtype]
    torch.testing.assert_close(got[0], got[1])


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_fp64_through_triton(name, gen):
    x = torch.randn((3, 5), generator=gen, dtype=F64, requires_grad=True)
    r = torch.randn((3, 5), generator=gen, dtype=F64, requires_grad=True)
    w = (torch.rand(5, generator=gen, dtype=F64) + 0.5).requires_grad_()
    b = torch.randn(5, generator=gen, dtype=F64, requires_grad=True) if name == "add_layer_norm" else None
    with force_variant(name, "triton_row"), force_variant(name + "_backward", "triton_row"):
        if b is None:
            assert torch.autograd.gradcheck(lambda x, r, w: R.add_rms_norm(x, r, 5, w, 1e-6), (x, r, w))
        else:
            assert torch.autograd.gradcheck(lambda x, r, w, b: R.add_layer_norm(x, r, 5, w, b), (x, r, w, b))


def test_grad_only_residual_and_unused_new_residual(gen):
    # new_residual unused: its gradient arrives as zeros; input needs no grad.
    x = torch.randn((4, 8), generator=gen)
    r = torch.randn((4, 8), generator=gen, requires_grad=True)
    out, _ = R.add_rms_norm(x, r, 8)
    out.sum().backward()
    r64 = r.detach().double().requires_grad_()
    F.rms_norm(x.double() + r64, (8,), None, torch.finfo(F32).eps).sum().backward()
    assert rel_err(r.grad, r64.grad) <= 1e-5 or float(r64.grad.abs().max()) < 1e-6


# ---------------------------------------------------------------------------
# torch.library
# ---------------------------------------------------------------------------
def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_forward_ops(requires_grad, gen):
    x, r = (torch.randn((3, 6), generator=gen).requires_grad_(requires_grad) for _ in range(2))
    w = (torch.rand(6, generator=gen) + 0.5).requires_grad_(requires_grad)
    b = torch.randn(6, generator=gen).requires_grad_(requires_grad)
    _opcheck(OPS.add_rms_norm.default, (x, r, [6], w, None))
    _opcheck(OPS.add_layer_norm.default, (x, r, [6], w, b, 1e-5))


def test_opcheck_backward_ops(gen):
    g, gr, s = (torch.randn((3, 6), generator=gen) for _ in range(3))
    w, b = torch.rand(6, generator=gen) + 0.5, torch.randn(6, generator=gen)
    _opcheck(OPS.add_rms_norm_backward.default, (g, gr, s, [6], w, 1e-5))
    _opcheck(OPS.add_layer_norm_backward.default, (g, gr, s, [6], None, b, 1e-5))


def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def block(x, r, w, b):
        h, r = R.add_layer_norm(x, r, 8, w, b)
        h2, r = R.add_rms_norm(h, r, 8, w, 1e-6)
        return h2 * 2 + r

    x, r = torch.randn((4, 8), generator=gen), torch.randn((4, 8), generator=gen)
    w, b = torch.rand(8, generator=gen) + 0.5, torch.randn(8, generator=gen)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    xc = x.clone().requires_grad_()
    compiled(xc, r, w, b).sum().backward()
    x64 = x.double().requires_grad_()
    s1 = x64 + r.double()
    h = F.layer_norm(s1, (8,), w.double(), b.double(), 1e-5)
    s2 = h + s1
    ref = F.rms_norm(s2, (8,), w.double(), 1e-6) * 2 + s2
    ref.sum().backward()
    assert rel_err(compiled(x, r, w, b), ref) <= 1e-5
    assert rel_err(xc.grad, x64.grad) <= 1e-5
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Errors, registry, dispatch
# ---------------------------------------------------------------------------
def test_clear_errors(gen):
    x = torch.randn((4, 6), generator=gen)
    with pytest.raises(TypeError, match=r"opforge\.add_rms_norm: residual must be a torch\.Tensor"):
        R.add_rms_norm(x, [1.0], 6)
    with pytest.raises(TypeError, match=r"opforge\.add_layer_norm: residual has dtype torch\.float64 but input"):
        R.add_layer_norm(x, x.double(), 6)
    with pytest.raises(ValueError, match=r"opforge\.add_rms_norm: residual of shape \(6,\) must match input of "
                                         r"shape \(4, 6\) \(no broadcasting\)"):
        R.add_rms_norm(x, torch.ones(6), 6)
    with pytest.raises(ValueError, match=r"opforge\.add_layer_norm: normalized_shape \(5,\) does not match"):
        R.add_layer_norm(x, x, 5)
    with pytest.raises(TypeError, match=r"opforge\.add_rms_norm: weight has dtype torch\.float16"):
        R.add_rms_norm(x, x, 6, torch.ones(6, dtype=F16))
    with pytest.raises(TypeError, match=r"opforge\.add_layer_norm: bias must be a torch\.Tensor or None"):
        R.add_layer_norm(x, x, 6, None, [0.0] * 6)
    with pytest.raises(TypeError, match=r"opforge\.add_rms_norm: input must be float16, bfloat16, float32"):
        R.add_rms_norm(torch.ones((2, 3), dtype=torch.int64), torch.ones((2, 3), dtype=torch.int64), 3)
    with pytest.raises(TypeError, match=r"opforge\.add_layer_norm: eps must be a real number"):
        R.add_layer_norm(x, x, 6, eps="tiny")
    with pytest.raises(ValueError, match=r"opforge\.add_rms_norm_backward: grad_residual"):
        OPS.add_rms_norm_backward(x, torch.ones(3), x, [6], None, 1e-5)


def test_registry_variants_and_dispatch():
    fwd = [v.name for v in registry.get("add_rms_norm").variants]
    bwd = [v.name for v in registry.get("add_layer_norm_backward").variants]
    assert fwd == ["triton_row", "triton_split", "torch_eager", "reference"]
    assert bwd == ["triton_row", "triton_looped", "torch_eager", "reference"]
    x = torch.empty((300, 64))
    d = dispatch.explain("add_layer_norm", x, x, (64,), 1e-5)
    assert d.variant.name == "triton_row" and d.source == "default"
    assert "nothing to split" in d.rejected["triton_split"]
    # The memo key separates dtypes, shapes and strides.
    op = registry.get("add_rms_norm")
    assert op.memo_key(x, x, (64,), 1e-5) != op.memo_key(x.double(), x.double(), (64,), 1e-5)
    assert op.memo_key(x, x, (64,), 1e-5) != op.memo_key(x, x.t().contiguous().t(), (64,), 1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_vendor_variant_matches_reference(name, gen):
    # torch_eager is CUDA-only in dispatch; its code runs on CPU tensors too.
    x, r, g, gr = (torch.randn((5, 12), generator=gen, dtype=F64) for _ in range(4))
    w, b = _params((12,), F64, gen, name)
    args = (x, r, (12,), 1e-5, w, b)
    op, bop = registry.get(name), registry.get(name + "_backward")
    assert rel_err(op.variant("torch_eager").run({}, *args), op.reference(*args)) <= 1e-12
    bargs = (g, gr, x + r, (12,), 1e-5, w, b)
    assert rel_err(bop.variant("torch_eager").run({}, *bargs), bop.reference(*bargs)) <= 1e-12


def test_selftest_samples_pass_triton_variants():
    from opforge import selftest

    for name, variants in (("add_rms_norm", ("triton_row",)), ("add_layer_norm_backward", ("triton_row",))):
        op = registry.get(name)
        for v in variants:
            res = selftest.check_variant(op, op.variant(v), torch.device("cpu"))
            assert res.failed == 0 and res.passed > 0, res
