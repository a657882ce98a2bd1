"""The fused ops ``bias_gelu`` and ``swiglu``: accuracy against float64 torch,
gradients (gradcheck through the Triton variants), the deterministic bias
gradient, torch.library (opcheck), torch.compile, errors, registry and dispatch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.fusion import bias_grad
from opforge.ops import fused as FU
from opforge.ops.fused import bias_gelu, swiglu
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
OPS = torch.ops.opforge

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,variants", [
    ("bias_gelu", ["triton_fused", "torch_eager", "reference"]),
    ("bias_gelu_backward", ["triton_fused", "torch_eager", "reference"]),
    ("swiglu", ["triton_flat", "triton_strided", "torch_eager", "reference"]),
    ("swiglu_backward", ["triton_flat", "triton_strided", "torch_eager", "reference"]),
    ("swiglu_packed", ["triton_strided", "torch_eager", "reference"]),
    ("swiglu_packed_backward", ["triton_strided", "torch_eager", "reference"]),
    ("geglu", ["triton_flat", "triton_strided", "torch_eager", "reference"]),
    ("geglu_backward", ["triton_flat", "triton_strided", "torch_eager", "reference"]),
])
def test_registered(name, variants):
    op = registry.get(name)
    assert [v.name for v in op.variants] == variants
    assert op.samples(torch.device("cpu"))


def test_dispatch_decisions(gen):
    x = rand((4, 8), gen)
    assert dispatch.explain("swiglu", x, x.clone()).variant.name == "triton_flat"
    assert dispatch.explain("swiglu", x.t(), x.t()).variant.name == "triton_strided"
    assert dispatch.explain("bias_gelu", x, rand((8,), gen), "none").variant.name == "triton_fused"
    assert dispatch.explain("swiglu_packed", x).variant.name == "triton_strided"


# ---------------------------------------------------------------------------
# Forward accuracy
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
def test_bias_gelu_matches_float64(dtype, approximate, gen):
    x, b = rand((3, 5, 37), gen, dtype), rand((37,), gen, dtype)
    y = bias_gelu(x, b, approximate)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, F.gelu(x.double() + b.double(), approximate=approximate)) <= BOUND[dtype]


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
def test_swiglu_both_forms_match_float64(dtype, gen):
    g, u = rand((4, 19), gen, dtype), rand((4, 19), gen, dtype)
    assert rel_err(swiglu(g, u), F.silu(g.double()) * u.double()) <= BOUND[dtype]
    x = rand((2, 3, 38), gen, dtype)
    out = swiglu(x)
    assert out.shape == (2, 3, 19) and out.dtype == dtype
    a, c = x.double().chunk(2, -1)
    assert rel_err(out, F.silu(a) * c) <= BOUND[dtype]


@pytest.mark.parametrize("case", ["transposed", "broadcast", "mixed_dtype", "empty", "size_one", "special"])
def test_layouts_and_edges(case, gen):
    if case == "transposed":
        x, b, g, u = rand((9, 6), gen).t(), rand((9,), gen), rand((9, 6), gen).t(), rand((6, 9), gen)
    elif case == "broadcast":
        x, b, g, u = rand((2, 3, 4), gen), rand((4,), gen), rand((2, 3, 4), gen), rand((4,), gen)
    elif case == "mixed_dtype":
        x, b, g, u = rand((3, 4), gen, BF16), rand((4,), gen, F32), rand((3, 4), gen, BF16), rand((3, 4), gen, F32)
    elif case == "empty":
        x, b, g, u = rand((0, 4), gen), rand((4,), gen), rand((0, 4), gen), rand((0, 4), gen)
    elif case == "size_one":
        x, b, g, u = rand((1, 1), gen), rand((1,), gen), rand((1, 1, 1), gen), rand((1,), gen)
    else:
        s = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 50.0, -50.0])
        x, b, g, u = s.repeat(2, 1), torch.zeros(6), s, s.flip(0)
    y = bias_gelu(x, b)
    ry = F.gelu(x.double() + b.double())
    assert y.dtype == torch.result_type(x, b) and y.shape == ry.shape and rel_err(y, ry) <= 1e-5
    z = swiglu(g, u)
    rz = F.silu(g.double()) * u.double()
    assert z.dtype == torch.result_type(g, u) and z.shape == rz.shape and rel_err(z, rz) <= 1e-5


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_gradcheck_through_kernels(approximate, gen):
    x = rand((3, 2, 5), gen, F64).requires_grad_()
    b = rand((5,), gen, F64).requires_grad_()
    with force_variant("bias_gelu", "triton_fused"), force_variant("bias_gelu_backward", "triton_fused"):
        assert torch.autograd.gradcheck(lambda x, b: bias_gelu(x, b, approximate), (x, b))


@pytest.mark.parametrize("form", ["pair", "packed", "broadcast"])
def test_swiglu_gradcheck_through_kernels(form, gen):
    if form == "packed":
        x = rand((3, 6), gen, F64).requires_grad_()
        with force_variant("swiglu_packed_backward", "triton_strided"):
            assert torch.autograd.gradcheck(lambda x: swiglu(x), (x,))
        return
    g = rand((3, 4), gen, F64).requires_grad_()
    u = rand((3, 4) if form == "pair" else (4,), gen, F64).requires_grad_()
    assert torch.autograd.gradcheck(swiglu, (g, u))


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_bias_gelu_backward_bf16_and_dbias_is_deterministic(dtype, gen):
    x, b = rand((37, 24), gen, dtype), rand((24,), gen, dtype)
    g = rand((37, 24), gen, dtype, 1.0)
    dx, db = OPS.bias_gelu_backward(g, x, b, "tanh")
    rdx, rdb = FU.bias_gelu_backward_ref(g.double(), x.double(), b.double(), "tanh")
    assert dx.dtype == dtype and db.dtype == dtype
    assert rel_err(dx, rdx) <= BOUND[dtype] and rel_err(db, rdb) <= BOUND[dtype]
    assert torch.equal(OPS.bias_gelu_backward(g, x, b, "tanh")[1], db)


def test_bias_grad_partial_sums_over_several_row_chunks(gen):
    """Several row programs, each looping over several tiles: partials sum to the column sums."""
    x, b, g = rand((45, 20), gen), rand((20,), gen), rand((45, 20), gen, scale=1.0)
    dx = torch.empty_like(x)
    cfg = {"BLOCK_R": 4, "BLOCK_C": 16, "num_warps": 4}
    from opforge.kernels.elementwise import compute_dtype

    part = bias_grad.launch(g, x, b, dx, F32, False, cfg, compute_dtype(F32), programs=3)
    assert part.shape == (3, 20)
    rdx, rdb = FU.bias_gelu_backward_ref(g.double(), x.double(), b.double(), "none")
    assert rel_err(dx, rdx) <= 1e-5 and rel_err(part.sum(0), rdb) <= 1e-5


def test_bias_grad_int64_path(monkeypatch, gen):
    monkeypatch.setattr(bias_grad, "_INT32_MAX", 8)
    x, b, g = rand((6, 10), gen), rand((10,), gen), rand((6, 10), gen)
    dx, db = OPS.bias_gelu_backward(g, x, b, "none")
    rdx, rdb = FU.bias_gelu_backward_ref(g.double(), x.double(), b.double(), "none")
    assert rel_err(dx, rdx) <= 1e-5 and rel_err(db, rdb) <= 1e-5


def test_row_programs_fill_the_gpu():
    cfg = bias_grad.default_config(32768, 8192)
    progs = bias_grad.row_programs(32768, 8192, cfg)
    assert progs * (8192 // cfg["BLOCK_C"]) >= 4 * 132
    assert bias_grad.row_programs(3, 8192, cfg) == 1


# ---------------------------------------------------------------------------
# torch.library and torch.compile
# ---------------------------------------------------------------------------
def test_opcheck(gen):
    x, b = rand((3, 8), gen).requires_grad_(), rand((8,), gen).requires_grad_()
    for packet, args in (
        (OPS.bias_gelu.default, (x, b, "tanh")),
        (OPS.swiglu.default, (x, rand((3, 8), gen).requires_grad_())),
        (OPS.swiglu_packed.default, (x,)),
        (OPS.bias_gelu_backward.default, (rand((3, 8), gen), x.detach(), b.detach(), "none")),
        (OPS.swiglu_backward.default, (rand((3, 8), gen), x.detach(), rand((3, 8), gen))),
        (OPS.swiglu_packed_backward.default, (rand((3, 4), gen), x.detach())),
    ):
        result = torch.library.opcheck(packet, args)
        assert set(result.values()) == {"SUCCESS"}, (packet, result)


def test_compile_fullgraph_forward_and_backward(gen):
    def f(x, b):
        return swiglu(bias_gelu(x, b, "tanh")).sum()

    x, b = rand((4, 8), gen).requires_grad_(), rand((8,), gen).requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(x, b).backward()
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    h = F.gelu(x64 + b64, approximate="tanh")
    a, c = h.chunk(2, -1)
    (F.silu(a) * c).sum().backward()
    assert rel_err(x.grad, x64.grad) <= 1e-5 and rel_err(b.grad, b64.grad) <= 1e-5


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_errors(gen):
    x = rand((3, 4), gen)
    with pytest.raises(ValueError, match=r"opforge.bias_gelu: bias must be 1-D with input.shape\[-1\] = 4"):
        bias_gelu(x, rand((5,), gen))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        bias_gelu(x, rand((4,), gen), "fast")
    with pytest.raises(TypeError, match="opforge.bias_gelu: input must be a floating-point tensor"):
        bias_gelu(torch.ones(3, 4, dtype=torch.int32), rand((4,), gen))
    with pytest.raises(TypeError, match="opforge.bias_gelu: bias must be a torch.Tensor"):
        bias_gelu(x, 1.0)
    with pytest.raises(ValueError, match="opforge.bias_gelu: input must have at least 1 dim"):
        bias_gelu(rand((), gen), rand((1,), gen))
    with pytest.raises(ValueError, match="opforge.swiglu: .* must be even"):
        swiglu(rand((3, 5), gen))
    with pytest.raises(ValueError, match="opforge.swiglu: gate of shape .* do not broadcast"):
        swiglu(x, rand((5,), gen))
    with pytest.raises(TypeError, match="opforge.swiglu: up must be a torch.Tensor"):
        swiglu(x, 2.0)


@pytest.mark.parametrize("variant,approximate", [("triton_flat", "tanh"), ("triton_strided", "none")])
def test_geglu_forward_and_gradient(gen, variant, approximate):
    """gelu(gate) * up against float64 torch, through each generated kernel (forward and backward)."""
    gate, up = rand((6, 10), gen).requires_grad_(), rand((6, 10), gen).requires_grad_()
    if variant == "triton_strided":
        gate = rand((10, 6), gen).t().requires_grad_()
    with force_variant("geglu", variant), force_variant("geglu_backward", variant):
        y = FU.geglu(gate, up, approximate)
        gy = rand(y.shape, gen)
        dg, du = torch.autograd.grad(y, (gate, up), gy)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    ref = F.gelu(g64, approximate=approximate) * u64
    rg, ru = torch.autograd.grad(ref, (g64, u64), gy.double())
    assert rel_err(y, ref) < BOUND[F32] and rel_err(dg, rg) < BOUND[F32] and rel_err(du, ru) < BOUND[F32]
    with pytest.raises(ValueError, match="opforge.geglu: approximate must be"):
        FU.geglu(gate, up, "exact")
