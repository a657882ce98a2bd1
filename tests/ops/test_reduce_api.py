"""The reduction ops' contract: torch.library registration (opcheck),
torch.compile, autograd (gradcheck through the Triton variants), torch
semantics (dtypes, dims, keepdim, empty and 0-dim inputs), error messages,
registry, dispatch decisions and the deterministic mode.

Oracles are torch in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.ops import reduce as R
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
OPS = torch.ops.opforge

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", R.NAMES)
def test_registered_with_all_variants(name):
    op = registry.get(name)
    want = ["triton_split_two_pass"] + (["triton_split_atomic"] if name in ("sum", "mean", "amax", "amin") else [])
    want += ["triton_rows", "triton_cols", "torch_eager", "reference"]
    assert [v.name for v in op.variants] == want
    assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
    samples = op.samples(torch.device("cpu"))
    for v in op.variants[:-2]:  # every Triton variant takes some sample
        assert any(dispatch.reject_reason(op, v, a) is None for a in samples), v.name


def test_dispatch_decisions(gen):
    x = rand((4, 100), gen)
    assert dispatch.explain("sum", x, (1,), False, None).variant.name == "triton_rows"
    assert dispatch.explain("sum", x, (0,), False, None).variant.name == "triton_cols"
    big = torch.empty(1 << 20)
    d = dispatch.explain("sum", big, (), False, None)
    assert d.variant.name == "triton_split_two_pass" and d.config["SPLIT"] > 1
    long_rows = torch.empty(8, 1 << 16)
    assert dispatch.explain("var", long_rows, (1,), 1.0, False).variant.name == "triton_split_two_pass"
    wide = torch.empty(1 << 13, 64)  # x.sum(0) of a narrow matrix: few column programs
    assert dispatch.explain("amax", wide, (0,), False).variant.name == "triton_split_two_pass"
    many = torch.empty(16384, 256)
    d = dispatch.explain("sum", many, (1,), False, None)
    assert d.variant.name == "triton_rows" and "fill the GPU" in d.rejected["triton_split_two_pass"]
    d = dispatch.explain("sum", big.to(BF16), (), False, None)
    assert "fp32" in d.rejected["triton_split_atomic"]


def test_deterministic_mode_rejects_atomics_and_changes_the_memo_key(gen):
    op = registry.get("sum")
    big = torch.empty(1 << 20)
    args = (big, (), False, None)
    assert dispatch.reject_reason(op, op.variant("triton_split_atomic"), args) is None
    key = op.memo_key(*args)
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert op.memo_key(*args) != key
        d = dispatch.explain("sum", *args)
        assert d.rejected["triton_split_atomic"] == "not deterministic (torch.use_deterministic_algorithms is on)"
        x = rand((2, 40000), gen)  # long enough for the default split to cut rows in chunks
        assert R.OPS["sum"].variant("triton_split_two_pass").default_config(x, (1,), False, None)["SPLIT"] > 1
        with force_variant("sum", "triton_split_atomic"), pytest.raises(ValueError, match="not deterministic"):
            R.sum(x, 1)
        with force_variant("sum", "triton_split_two_pass"):
            outs = [R.sum(x, 1) for _ in range(3)] + [R.sum(x.clone(), 1)]  # same layout, new memory
    finally:
        torch.use_deterministic_algorithms(old)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])  # bitwise
    torch.testing.assert_close(outs[0].double(), x.double().sum(1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# opcheck and torch.compile
# ---------------------------------------------------------------------------
OPCHECK = [
    ("sum", lambda x: (x, [1], False, None)), ("sum", lambda x: (x, [], True, F64)),
    ("mean", lambda x: (x, [0, 2], False, None)), ("amax", lambda x: (x, [1], True)),
    ("amin", lambda x: (x, [], False)), ("argmax", lambda x: (x, 1, False)), ("argmin", lambda x: (x, None, False)),
    ("max_dim", lambda x: (x, 0, True)), ("min_dim", lambda x: (x, -1, False)),
    ("var", lambda x: (x, [2], 1.0, False)), ("std", lambda x: (x, [0, 1], 0.0, True)),
]


@pytest.mark.parametrize("name,make", OPCHECK, ids=[f"{n}{i}" for i, (n, _) in enumerate(OPCHECK)])
def test_opcheck(name, make, gen):
    grad = name not in ("argmax", "argmin")
    x = rand((3, 4, 5), gen).requires_grad_(grad)
    result = torch.library.opcheck(getattr(OPS, name).default, make(x))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(t):
        m = R.max(t, 1)
        return (R.sum(t, 0) * R.mean(t, 0) + R.amax(t, 0) + R.std(t, 0) + m.values.sum()
                + R.argmin(t, 0).to(t.dtype))

    x = rand((5, 6), gen)
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(xc).sum().backward()
    xr = x.double().requires_grad_()

    def ref(t):
        return (t.sum(0) * t.mean(0) + t.amax(0) + t.std(0) + t.max(1).values.sum() + t.argmin(0).to(t.dtype))

    want = ref(xr)
    want.sum().backward()
    torch.testing.assert_close(compiled(x), want.detach().float())
    torch.testing.assert_close(xc.grad, xr.grad.float())
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Autograd through the Triton variants
# ---------------------------------------------------------------------------
GRAD_FNS = {
    "mean": lambda t, d: R.mean(t, d, keepdim=True) + R.sum(t, d, keepdim=True),
    "amax": lambda t, d: R.amax(t, d),
    "std": lambda t, d: R.std(t, d, correction=0),
    "argmax": lambda t, d: R.max(t, d).values,  # max with dim runs the argmax op
}
WITH = {"mean": ("mean", "sum"), "amax": ("amax",), "std": ("std",), "argmax": ("argmax",)}


@pytest.mark.parametrize("variant", ["triton_rows", "triton_cols"])
@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_gradcheck_fp64(name, variant, gen):
    dims = 0 if variant == "triton_cols" else 1
    x = rand((2, 3), gen, F64).requires_grad_()
    with force_variant(WITH[name][0], variant), force_variant(WITH[name][-1], variant):
        assert torch.autograd.gradcheck(lambda t: GRAD_FNS[name](t, dims), (x,))


def test_amax_gradient_is_split_among_ties():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    R.amax(x, 1).sum().backward()
    xr = x.detach().clone().requires_grad_()
    torch.amax(xr, 1).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    x.grad = None
    R.max(x, 1).values.sum().backward()  # max with dim: all of it to the (first) index
    assert x.grad.tolist() == [[0, 1, 0], [1, 0, 0]]


# ---------------------------------------------------------------------------
# Semantics
# ---------------------------------------------------------------------------
def test_shapes_dims_keepdim_and_return_types(gen):
    x = rand((2, 3, 4), gen)
    for dim in (None, 0, -1, (0, 2), [2, 0], (), [-1, -2, -3]):
        for keepdim in (False, True):
            tdim = tuple(range(3)) if dim in (None, ()) else dim
            torch.testing.assert_close(R.sum(x, dim, keepdim), torch.sum(x.double(), tdim, keepdim).float())
            want = torch.var(x.double(), tdim, keepdim=keepdim).float()
            torch.testing.assert_close(R.var(x, dim, keepdim=keepdim), want)
    m = R.max(x, 1)
    assert isinstance(m, torch.return_types.max) and m.values.shape == (2, 4) and m.indices.dtype == torch.int64
    assert isinstance(R.min(x, 1, True), torch.return_types.min)
    assert R.max(x).shape == () and R.max(x) == x.max()
    assert R.argmax(x, keepdim=True).shape == (1, 1, 1) and int(R.argmax(x)) == int(torch.argmax(x))
    assert R.sum(x).shape == () and R.sum(x, 1).is_contiguous()


def test_dtype_rules_as_torch(gen):
    i = torch.randint(-50, 50, (4, 6), generator=gen, dtype=torch.int32)
    assert R.sum(i).dtype == torch.int64 and int(R.sum(i)) == int(i.sum())
    assert R.sum(i.to(torch.uint8), 0).dtype == torch.int64
    b = i > 0
    assert R.sum(b, 1).tolist() == b.sum(1).tolist() and R.sum(b).dtype == torch.int64
    assert R.amax(b, 1).dtype == torch.bool and R.amax(b, 1).tolist() == b.amax(1).tolist()
    assert R.max(b, 1).values.dtype == torch.bool
    assert R.amin(i, 0).dtype == torch.int32 and torch.equal(R.amin(i, 0), i.amin(0))
    assert torch.equal(R.argmax(i, 1), i.argmax(1))
    x = rand((4, 6), gen, BF16)
    assert R.sum(x, 1).dtype == BF16 and R.sum(x, 1, dtype=F32).dtype == F32
    assert R.mean(i, 1, dtype=F64).dtype == F64
    torch.testing.assert_close(R.mean(i, 1, dtype=F64), i.double().mean(1))


def test_empty_size_one_and_zero_dim(gen):
    e = torch.empty(0, 3)
    assert R.sum(e).item() == 0 and R.sum(e, 0).tolist() == [0, 0, 0]
    assert R.mean(e, 0).isnan().all() and R.var(e).isnan()
    assert R.amax(e, 1).shape == (0,) and R.argmax(e, 1).shape == (0,)
    assert R.max(e, 1).values.shape == (0,)
    s = torch.tensor(2.5)
    for fn in (R.sum, R.mean, R.amax, R.amin):
        assert fn(s).shape == () and fn(s).item() == 2.5
        assert fn(s, 0, keepdim=True).shape == ()
    assert R.max(s, 0).indices.item() == 0 and R.argmax(s).item() == 0
    assert R.var(s).isnan() and R.var(s, correction=0).item() == 0
    one = rand((5, 1, 3), gen)
    torch.testing.assert_close(R.sum(one, 1), one.sum(1))
    torch.testing.assert_close(R.std(one, (0, 1)), one.std((0, 1)))
    assert R.argmin(one, 1).tolist() == one.argmin(1).tolist()


def test_nan_semantics_through_the_public_api():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [float("-inf")] * 4])
    m = R.max(x, 1)
    assert m.values[0].isnan() and m.indices.tolist() == [1, 0]
    assert R.argmin(x, 1).tolist() == torch.argmin(x, 1).tolist()
    assert R.amin(x).isnan() and R.sum(x, 1)[1] == float("-inf")


def test_clear_errors():
    x = torch.ones(2, 3)
    with pytest.raises(TypeError, match="opforge.sum: input must be a torch.Tensor, got list"):
        R.sum([1.0, 2.0])
    with pytest.raises(ValueError, match=r"opforge.sum: dim 2 is out of range for a tensor with 2 dims"):
        R.sum(x, 2)
    with pytest.raises(ValueError, match=r"opforge.amax: dim -3 is out of range"):
        R.amax(x, (0, -3))
    with pytest.raises(ValueError, match=r"opforge.mean: dim 1 appears more than once"):
        R.mean(x, (1, -1))
    with pytest.raises(TypeError, match="opforge.argmax: dim must be an int or None, got tuple"):
        R.argmax(x, (0,))
    with pytest.raises(TypeError, match="opforge.sum: dim must be an int, a tuple of ints or None, got float"):
        R.sum(x, 1.0)
    with pytest.raises(TypeError, match="opforge.var: input must be a floating-point tensor, got torch.int64"):
        R.var(torch.arange(4))
    with pytest.raises(TypeError, match="opforge.mean: could not infer a floating output dtype"):
        R.mean(torch.arange(4))
    with pytest.raises(TypeError, match="opforge.argmax: bool input is not supported"):
        R.argmax(x > 0)
    with pytest.raises(TypeError, match="opforge.sum: complex"):
        R.sum(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"opforge.amax: cannot reduce over dim 0 of size 0"):
        R.amax(torch.empty(0, 3), 0)
    with pytest.raises(ValueError, match=r"opforge.max: cannot reduce an empty tensor over every dim"):
        R.max(torch.empty(0, 3))
    with pytest.raises(ValueError, match=r"opforge.max: cannot reduce over dim 0 of size 0"):
        R.max(torch.empty(0, 3), 0)
    with pytest.raises(TypeError, match="opforge.std: keepdim must be a bool"):
        R.std(x, 1, keepdim=1)
    with pytest.raises(TypeError, match="opforge.var: correction must be a number"):
        R.var(x, 1, correction="1")
    with pytest.raises(ValueError, match=r"opforge.sum: dim 5"):
        R.sum(x.clone().requires_grad_(), 5)
    with pytest.raises(TypeError, match="opforge.sum: dtype must be a real torch.dtype"):
        R.sum(x, 1, dtype=torch.complex64)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_interleaved_dims_reduce_in_two_steps_without_a_copy(name, dtype, keepdim, gen, monkeypatch):
    """[reduced, kept, reduced] (dims (0, 2)) and [kept, reduced, kept, reduced, kept]:
    the innermost reduced dims first, then the rest; no step needs the permuted copy."""
    import opforge

    seen = []
    real = dispatch.call

    def spy(op, x, dims, *rest):
        seen.append(R.plan_of(x, dims, op.name).copy_perm)
        return real(op, x, dims, *rest)

    monkeypatch.setattr(dispatch, "call", spy)
    for shape, dims in (((4, 6, 40), (0, 2)), ((3, 4, 5, 6, 7), (1, 3, 4)), ((3, 4, 5, 6, 7), (0, 2, 4))):
        x = rand(shape, gen, dtype)
        got = getattr(opforge, name)(x, dims, keepdim=keepdim)
        want = getattr(torch, name)(x.double(), dims, keepdim=keepdim)
        assert got.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2)
    assert seen and all(p is None for p in seen)
