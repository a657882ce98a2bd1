"""The ``opforge.fuse`` contract: calling, caching, dispatch and registry ops,
broadcasting and layouts, autograd (gradcheck through the generated
kernels), torch.compile, the CPU reference path, errors.

Oracles: the undecorated function in float64 (and torch's own dtypes).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.fusion import FusedFunction, fuse
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


@fuse
def brief_example(x, y, scale):
    return torch.where(x > 0, x * scale, torch.exp(y)).to(torch.bfloat16)


@fuse(name="chain_api")
def chain(x, b, s):
    h = F.gelu(x + b, approximate="tanh")
    return torch.tanh(h * s) + F.silu(x), torch.sigmoid(h) > 0.5


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


def f64(args):
    return [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def test_brief_example_matches_eager_and_reuses_the_kernel_for_new_scalars(gen):
    a, b = rand((6, 10), gen, F16), rand((6, 10), gen, F32)
    out = brief_example(a, b, 0.5)
    assert out.dtype == BF16 and out.shape == (6, 10)
    assert rel_err(out, brief_example.fn(*f64([a, b, 0.5]))) <= BOUND[BF16]
    assert len(brief_example._compiled) == 1
    src = brief_example.source(a, b, 0.5)
    out2 = brief_example(a, b, -3.0)
    assert len(brief_example._compiled) == 1 and brief_example.source(a, b, -3.0) == src
    assert rel_err(out2, brief_example.fn(*f64([a, b, -3.0]))) <= BOUND[BF16]
    brief_example(a.float(), b, 0.5)
    assert len(brief_example._compiled) == 2  # new dtypes: a new trace


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
def test_multiple_outputs_broadcast_bias(dtype, gen):
    x, b = rand((3, 4, 9), gen, dtype), rand((9,), gen, dtype)
    y, mask = chain(x, b, 0.7)
    ry, rmask = chain.fn(*f64([x, b, 0.7]))
    assert y.dtype == dtype and mask.dtype == torch.bool
    assert rel_err(y, ry) <= BOUND[dtype]
    agree = (mask == rmask).float().mean()
    assert agree >= (1.0 if dtype in (F32, F64) else 0.95)


def test_registry_ops_are_named_after_the_function_and_listed():
    op = registry.get("fused.chain_api")
    assert op is chain.op
    assert [v.name for v in op.variants] == ["triton_flat", "triton_strided", "torch_eager", "reference"]
    assert registry.get("fused.chain_api_backward") is chain.backward_op
    assert op.variant("torch_eager").devices == ("cuda",)
    assert brief_example.op.name == "fused.brief_example"


def test_a_second_function_with_the_same_name_gets_a_distinct_op():
    f1 = FusedFunction(lambda x: x + 1, name="dup_name")
    f2 = FusedFunction(lambda x: x + 2, name="dup_name")
    assert f1.op.name == "fused.dup_name" and f2.op.name == "fused.dup_name_2"


def test_dispatch_flat_for_dense_strided_for_broadcast_and_transposed(gen):
    x = rand((8, 16), gen)
    assert dispatch.explain(chain.op.name, x, x.clone(), 0.5).variant.name == "triton_flat"
    assert dispatch.explain(chain.op.name, x, rand((16,), gen), 0.5).variant.name == "triton_strided"
    d = dispatch.explain(chain.op.name, x.t(), x.t().contiguous(), 0.5)
    assert d.variant.name == "triton_strided"
    assert "rejected triton_flat" in str(d)


def test_explain_shows_decision_and_source(gen):
    x = rand((4, 4), gen)
    text = chain.explain(x, x, 0.5)
    assert "opforge::fused.chain_api: runs triton_flat" in text and "def fused_flat(" in text


@pytest.mark.parametrize("variant", ["triton_flat", "triton_strided", "reference"])
def test_every_variant_agrees(variant, gen):
    x, b = rand((5, 12), gen), rand((5, 12), gen)
    with force_variant(chain.op.name, variant):
        y, m = chain(x, b, 1.5)
    ry, rm = chain.fn(*f64([x, b, 1.5]))
    assert rel_err(y, ry) <= 1e-5 and torch.equal(m, rm)


@pytest.mark.parametrize("case", ["noncontiguous", "zero_dim", "empty", "size_one", "channels_last", "sliced"])
def test_layouts_and_edge_shapes(case, gen):
    @fuse(name=f"layout_{case}")
    def f(x, y):
        return x * y + torch.exp(-x)

    if case == "noncontiguous":
        x, y = rand((7, 5), gen).t(), rand((5, 7), gen)
    elif case == "zero_dim":
        x, y = rand((), gen), rand((3, 4), gen)
    elif case == "empty":
        x, y = rand((0, 4), gen), rand((4,), gen)
    elif case == "size_one":
        x, y = rand((1, 5, 1), gen), rand((3, 1, 2), gen)
    elif case == "channels_last":
        x = rand((2, 3, 4, 5), gen).to(memory_format=torch.channels_last)
        y = rand((2, 3, 4, 5), gen).to(memory_format=torch.channels_last)
    else:
        x, y = rand((6, 10), gen)[::2, 1:7], rand((3, 6), gen)
    out = f(x, y)
    ref = f.fn(x.double(), y.double())
    assert out.shape == ref.shape and out.dtype == torch.result_type(x, y)
    assert rel_err(out, ref) <= 1e-5
    if case == "channels_last":
        assert out.is_contiguous(memory_format=torch.channels_last)


def test_0dim_tensor_ranks_below_dimensioned_tensors(gen):
    @fuse
    def f(x, y):
        return x + y

    out = f(rand((3,), gen, BF16), rand((), gen, F32))
    assert out.dtype == BF16


def test_ints_and_kwargs_and_defaults(gen):
    @fuse
    def f(x, k, *, shift=1, mode="a"):
        return (x * k + shift) if mode == "a" else (x - k)

    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert torch.equal(f(x, 3), x * 3 + 1)
    assert torch.equal(f(x, 3, shift=5, mode="b"), x - 3)


def test_cpu_without_interpreter_uses_the_reference(monkeypatch, gen):
    monkeypatch.setenv("OPFORGE_INTERPRET", "0")
    dispatch.reset()
    x = rand((4, 5), gen)
    d = dispatch.explain(chain.op.name, x, x, 0.5)
    assert d.variant.name == "reference"
    y, _ = chain(x, x, 0.5)
    assert rel_err(y, chain.fn(*f64([x, x, 0.5]))[0]) <= 1e-5


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------
@fuse(name="grad_mix")
def grad_mix(x, y, s):
    a = torch.where(x > 0, x * s, torch.exp(y))
    b = torch.maximum(x, y) + torch.clamp(x, -0.3, 0.4) + x ** 3 + torch.erf(y) / (1.5 + x * x)
    return F.gelu(a + y) * torch.sigmoid(x) + b + torch.sqrt(y * y + 1) + torch.log1p(x * x) + y.abs(), x > y


@pytest.mark.parametrize("variant", ["triton_flat", "triton_strided"])
def test_gradcheck_fp64_through_generated_backward(variant, gen):
    x = rand((2, 3), gen, F64).requires_grad_()
    y = rand((2, 3), gen, F64).requires_grad_()
    with force_variant(grad_mix.op.name, variant), force_variant(grad_mix.backward_op.name, variant):
        assert torch.autograd.gradcheck(lambda x, y: grad_mix(x, y, 0.7)[0], (x, y))


def test_gradcheck_broadcast_input_is_reduced(gen):
    x = rand((2, 1, 3), gen, F64).requires_grad_()
    b = rand((3,), gen, F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, b: chain(x, b, 0.3)[0], (x, b))
    assert torch.autograd.gradcheck(lambda x, b: chain(x, b, 0.3)[0], (x.detach(), b))


def test_backward_recomputes_in_one_kernel_and_matches_torch_in_bf16(gen):
    x = rand((4, 8), gen, BF16).requires_grad_()
    b = rand((8,), gen, BF16).requires_grad_()
    y, m = chain(x, b, 0.5)
    assert not m.requires_grad
    g = rand(y.shape, gen, BF16)
    y.backward(g)
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    chain.fn(x64, b64, 0.5)[0].backward(g.double())
    assert x.grad.dtype == BF16 and b.grad.dtype == BF16
    assert rel_err(x.grad, x64.grad) <= 1e-2 and rel_err(b.grad, b64.grad) <= 1e-2
    bwd = chain.compiled_backward(chain._compiled[next(iter(chain._compiled))].program and
                                  tuple(("T", BF16, False) for _ in range(2)) + (("S", float),), (1, 2))
    assert "tl.store(out0" in bwd.source and "tl.store(out1" in bwd.source and "out2" not in bwd.source


def test_unused_and_nondifferentiable_inputs_get_zero_grads(gen):
    @fuse
    def f(x, y, c):
        return torch.where(c > 0, x * 2, 1.0)

    x, y, c = rand((3, 4), gen, F64).requires_grad_(), rand((3, 4), gen, F64).requires_grad_(), rand((3, 4), gen)
    f(x, y, c).sum().backward()
    assert torch.equal(x.grad, torch.where(c > 0, 2.0, 0.0).double())
    assert torch.equal(y.grad, torch.zeros_like(y))


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def test_compile_fullgraph_runs_the_users_function(gen):
    def model(x, b):
        y, _ = chain(x, b, 0.25)
        return y * 2

    x, b = rand((4, 6), gen).requires_grad_(), rand((6,), gen)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x, b)
    out.sum().backward()
    ref_x = x.detach().double().requires_grad_()
    ref = chain.fn(ref_x, b.double(), 0.25)[0] * 2
    ref.sum().backward()
    assert rel_err(out, ref) <= 1e-5 and rel_err(x.grad, ref_x.grad) <= 1e-5


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_errors_name_the_function_and_argument(gen):
    with pytest.raises(ValueError, match=r"opforge.fuse\(chain_api\): tensor shapes .* do not broadcast"):
        chain(rand((3, 4), gen), rand((5,), gen), 0.5)
    with pytest.raises(TypeError, match=r"opforge.fuse\(chain_api\): b has dtype torch.complex64"):
        chain(rand((3, 4), gen), torch.zeros(4, dtype=torch.complex64), 0.5)
    with pytest.raises(TypeError, match=r"opforge.fuse\(chain_api\): .*missing"):
        chain(rand((3, 4), gen))
    with pytest.raises(TypeError, match="neither a tensor, a number"):
        chain(rand((3, 4), gen), rand((4,), gen), [1.0])
    with pytest.raises(TypeError, match="expected a function"):
        fuse(3)

    @fuse
    def reduces(x):
        return x.sum()

    with pytest.raises(TypeError, match=r"opforge.fuse\(.*reduces\): Tensor.sum is not an elementwise"):
        reduces(rand((3,), gen))


def test_backward_program_before_any_forward_call():
    """The backward traces the forward itself (a regression: this used to deadlock)."""
    ff = FusedFunction(lambda x, y: x * torch.sigmoid(y), name="bwd_first", register=False)
    c = ff.compiled_backward((("T", F32, False), ("T", F32, False)), (1, 1))
    assert c.program.out_dtypes == [F32, F32] and ff.op is None
