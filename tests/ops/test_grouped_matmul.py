"""The grouped GEMM contract (packed MoE form and list form): registry and
dispatch decisions, every Triton kernel under the interpreter against a
float64 torch oracle (empty groups, odd sizes, K not a multiple of 16,
strided and transposed operands, epilogues, out_dtype, NaN/Inf), autograd
through opforge's own kernels, opcheck, torch.compile, error messages.

Oracles are per-group torch matmuls in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import API_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.kernels import grouped_gemm as GK
from opforge.ops import grouped_matmul as GM
from opforge.ops.grouped_matmul import LIST_OP, OP, WGRAD_OP, grouped_matmul
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
OPS = torch.ops.opforge
ACT = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu,
       "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}
TOL = {F32: 1e-5, F64: 1e-12, F16: 1e-3, BF16: 1e-2}
SIZES = [0, 5, 17, 1]

pytestmark = API_WARNINGS


def offs(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)


def oracle(a, b, sizes, bias=None, activation=None):
    """Per-group float64 matmuls (independent of opforge)."""
    outs, s = [], 0
    for g, m in enumerate(sizes):
        z = a[s:s + m].double() @ b[g].double()
        if bias is not None:
            z = z + bias[g].double()
        outs.append(ACT[activation](z))
        s += m
    return torch.cat(outs) if outs else torch.zeros(0, b.shape[2], dtype=F64)


def packed(gen, sizes=SIZES, K=32, N=16, dtype=F32, bias=False):
    G = len(sizes)
    a, b = rand((sum(sizes), K), gen, dtype), rand((G, K, N), gen, dtype, 0.3)
    return a, b, offs(sizes), (rand((G, N), gen, dtype) if bias else None)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    op = registry.get("grouped_matmul")
    assert [v.name for v in op.variants] == ["triton_persistent", "triton_grouped", "torch_grouped_mm",
                                             "torch_loop", "reference"]
    assert op.variant("triton_persistent").min_capability == (9, 0)
    assert all(op.variant(n).kind == "vendor" and op.variant(n).devices == ("cuda",)
               for n in ("torch_grouped_mm", "torch_loop"))
    assert op.variant("reference").kind == "reference"
    assert F64 not in op.variant("triton_persistent").dtypes and F64 in op.variant("triton_grouped").dtypes
    assert [v.name for v in registry.get("grouped_matmul_wgrad").variants] == ["triton_grouped", "torch_loop",
                                                                              "reference"]
    assert [v.name for v in registry.get("grouped_matmul_list").variants] == ["triton_grouped", "torch_loop",
                                                                             "reference"]


def test_samples_reach_every_triton_variant_and_dtype():
    cpu = torch.device("cpu")
    for op, want in ((OP, {"triton_persistent": {F16, BF16, F32}, "triton_grouped": {F16, BF16, F32, F64}}),
                     (WGRAD_OP, {"triton_grouped": {F16, BF16, F32, F64}}),
                     (LIST_OP, {"triton_grouped": {F16, BF16, F32, F64}})):
        seen = {}
        for args in op.samples(cpu):
            op.validate(*args)
            for v in op.variants:
                if v.kind == "triton" and dispatch.reject_reason(op, v, args) is None:
                    seen.setdefault(v.name, set()).add(op.tensors(*args)[0].dtype)
        assert seen == want, op.name
    # the packed samples include a gradient epilogue, a K-major b and odd sizes
    samples = OP.samples(cpu)
    assert any(s[5].activation and s[5].activation.endswith("_grad") for s in samples)
    assert any(s[1].stride(1) == 1 for s in samples)
    assert any(dispatch.reject_reason(OP, OP.variant("triton_persistent"), s) is not None for s in samples)


def test_dispatch_decisions(gen):
    def chosen(a, b, o):
        return dispatch.explain("grouped_matmul", a, b, o, None, None, GM.make_epilogue(a)).variant.name

    a, b, o, _ = packed(gen)
    assert chosen(a, b, o) == "triton_persistent"
    assert chosen(a, rand((4, 16, 32), gen).transpose(1, 2), o) == "triton_persistent"  # K-major b
    assert chosen(rand((23, 13), gen), rand((4, 13, 16), gen), o) == "triton_grouped"  # 52-byte rows
    assert chosen(a, rand((4, 32, 32), gen)[:, :, ::2], o) == "triton_grouped"  # no unit stride
    assert chosen(rand((23, 32), gen, F64), rand((4, 32, 16), gen, F64), o) == "triton_grouped"
    shifted = torch.empty(23 * 32 + 1)[1:].view(23, 32)  # 4-byte offset: not 16-byte aligned
    assert OP.memo_key(shifted, b, o, None, None, GM.make_epilogue(a)) != OP.memo_key(a, b, o, None, None,
                                                                                    GM.make_epilogue(a))
    assert chosen(shifted, b, o) == "triton_grouped"
    text = str(dispatch.explain("grouped_matmul", shifted, b, o, None, None, GM.make_epilogue(a)))
    assert "rejected triton_persistent: TMA needs" in text and "rejected torch_loop" in text


def test_direct_and_library_paths_agree(gen):
    a, b, o, bias = packed(gen, bias=True)
    direct = grouped_matmul(a, b, o, bias=bias, activation="silu")
    via_library = OPS.grouped_matmul(a, b, o, bias, None, "silu", None)
    assert torch.equal(direct, via_library)
    assert rel_err(direct, oracle(a, b, SIZES, bias, "silu")) <= 1e-5


# ---------------------------------------------------------------------------
# Packed form: kernels against the oracle
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_persistent", "triton_grouped"])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_packed_fp32_epilogues(variant, activation, gen):
    a, b, o, bias = packed(gen, bias=activation is not None)
    with force_variant("grouped_matmul", variant):
        out = grouped_matmul(a, b, o, bias=bias, activation=activation)
    assert out.shape == (23, 16) and out.dtype == F32 and out.is_contiguous()
    assert rel_err(out, oracle(a, b, SIZES, bias, activation)) <= 1e-5


@pytest.mark.parametrize("variant,dtype", [("triton_persistent", F16), ("triton_grouped", F16),
                                           ("triton_grouped", BF16), ("reference", BF16)])
def test_packed_16bit(variant, dtype, gen):
    a, b, o, bias = packed(gen, dtype=dtype, bias=True)
    with force_variant("grouped_matmul", variant):
        out = grouped_matmul(a, b, o, bias=bias, activation="gelu")
        wide = grouped_matmul(a, b, o, out_dtype=F32)
    want = oracle(a, b, SIZES, bias, "gelu")
    assert out.dtype == dtype and rel_err(out, want) <= TOL[dtype]
    assert wide.dtype == F32 and rel_err(wide, oracle(a, b, SIZES)) <= 1e-5  # fp32 accumulator, one rounding


@pytest.mark.parametrize("variant", ["triton_grouped", "reference"])
def test_odd_sizes_and_fp64(variant, gen):
    sizes = [3, 0, 11, 1, 0, 6]
    for dtype, K, N in ((F32, 13, 7), (F64, 21, 9), (F32, 1, 5)):
        a, b, o, bias = packed(gen, sizes, K, N, dtype, bias=True)
        with force_variant("grouped_matmul", variant):
            out = grouped_matmul(a, b, o, bias=bias, activation="gelu_tanh")
        assert rel_err(out, oracle(a, b, sizes, bias, "gelu_tanh")) <= TOL[dtype]


@pytest.mark.parametrize("variant", ["triton_persistent", "triton_grouped"])
def test_strided_operands(variant, gen):
    # b as the transpose of a [G, N, K] tensor (K-major, what the backward's B^T is)
    a, _, o, _ = packed(gen)
    bt = rand((4, 16, 32), gen).transpose(1, 2)
    with force_variant("grouped_matmul", variant):
        out = grouped_matmul(a, bt, o)
    assert rel_err(out, oracle(a, bt, SIZES)) <= 1e-5
    if variant == "triton_grouped":  # no unit stride anywhere, and a non-contiguous a
        a2 = rand((23, 64), gen)[:, ::2]
        b2 = rand((4, 32, 32), gen)[:, :, ::2]
        with force_variant("grouped_matmul", variant):
            out = grouped_matmul(a2, b2, o)
        assert rel_err(out, oracle(a2, b2, SIZES)) <= 1e-5


def test_empty_problems(gen):
    with force_variant("grouped_matmul", "triton_grouped"):
        out = grouped_matmul(rand((0, 8), gen), rand((3, 8, 4), gen), offs([0, 0, 0]))
        assert out.shape == (0, 4)
        out = grouped_matmul(rand((5, 8), gen), rand((2, 8, 0), gen), offs([2, 3]))
        assert out.shape == (5, 0)
        # K = 0: the product is zero, the epilogue still applies
        bias = rand((2, 4), gen)
        out = grouped_matmul(rand((5, 0), gen), rand((2, 0, 4), gen), offs([2, 3]), bias=bias, activation="relu")
    want = torch.cat([torch.relu(bias[0]).expand(2, 4), torch.relu(bias[1]).expand(3, 4)])
    assert torch.allclose(out, want)
    reason = dispatch.explain("grouped_matmul", rand((5, 0), gen), rand((2, 0, 4), gen), offs([2, 3]), None,
                              None, GM.Epilogue()).rejected["triton_persistent"]
    assert "K = 0" in reason


@pytest.mark.parametrize("variant", ["triton_persistent", "triton_grouped"])
def test_nan_and_inf_stay_in_their_group(variant, gen):
    a, b, o, _ = packed(gen)
    a[7, 3] = float("nan")
    a[20, 0] = float("inf")
    with force_variant("grouped_matmul", variant):
        out = grouped_matmul(a, b, o)
    want = oracle(a, b, SIZES)
    assert out[7].isnan().all() and not out[:7].isnan().any() and not out[8:20].isnan().any()
    assert rel_err(out, want) <= 1e-5  # rel_err compares the non-finite pattern too


def test_malformed_offsets_never_fault(gen):
    # On CUDA the host does not read the offsets: the kernels clamp them.
    a, b, _, _ = packed(gen)
    bad = torch.tensor([5, 3, 30, -2], dtype=torch.int32)
    for variant in ("triton_persistent", "triton_grouped"):
        v = OP.variant(variant)
        out = v.run(v.default_config(a, b, bad), a, b, bad, None, None, GM.Epilogue())
        # group 1 (5 -> 3) is empty; group 2 is rows 3:23 (clamped), overlapping
        # group 0's rows 3:5; group 3 (30 -> -2) is empty
        assert rel_err(out[:3], a[:3].double() @ b[0].double()) <= 1e-5
        assert rel_err(out[5:23], a[5:23].double() @ b[2].double()) <= 1e-5


def test_kernel_schedule_uses_few_programs(gen):
    # Persistent: more tiles than programs, so each program walks several tiles and groups.
    a, b, o, _ = packed(gen, [7, 0, 9, 13, 2], K=16, N=32)
    out = torch.empty(31, 32)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
    GK.launch_grouped(a, b, o, out, None, None, 0, False, cfg, sms=3)
    assert rel_err(out, oracle(a, b, [7, 0, 9, 13, 2])) <= 1e-5


# ---------------------------------------------------------------------------
# Weight gradient op
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F64])
def test_wgrad_kernel(dtype, gen):
    sizes = [4, 0, 19, 1]
    a, d = rand((24, 13), gen, dtype), rand((24, 10), gen, dtype)
    with force_variant("grouped_matmul_wgrad", "triton_grouped"):
        out = OPS.grouped_matmul_wgrad(a, d, offs(sizes))
    s, want = 0, []
    for m in sizes:
        want.append(a[s:s + m].double().t() @ d[s:s + m].double())
        s += m
    assert out.shape == (4, 13, 10) and torch.equal(out[1], torch.zeros(13, 10, dtype=dtype))
    assert rel_err(out, torch.stack(want)) <= TOL[dtype]


# ---------------------------------------------------------------------------
# Autograd (packed)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [None, "triton_grouped"])
@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_fp32_gradients_match_float64_autograd(variant, activation, gen):
    a, b, o, bias = packed(gen, bias=True)
    g = rand((23, 16), gen)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    if variant:
        with force_variant("grouped_matmul", variant):
            grouped_matmul(leaves[0], leaves[1], o, bias=leaves[2], activation=activation).backward(g)
    else:
        grouped_matmul(leaves[0], leaves[1], o, bias=leaves[2], activation=activation).backward(g)
    refs = [t.double().requires_grad_() for t in (a, b, bias)]
    oracle(*refs[:2], SIZES, refs[2], activation).backward(g.double())
    for got, ref in zip(leaves, refs):
        assert got.grad.dtype == F32 and got.grad.shape == ref.shape
        assert rel_err(got.grad, ref.grad) <= 1e-5


def test_gradcheck_fp64_through_kernels(gen):
    sizes = [2, 0, 3]
    a, b, o, bias = packed(gen, sizes, K=5, N=4, dtype=F64, bias=True)
    with force_variant("grouped_matmul", "triton_grouped"), force_variant("grouped_matmul_wgrad", "triton_grouped"):
        # silu: the gradient epilogue, dA, the weight-gradient kernel and dbias
        fn = lambda x, y, z: grouped_matmul(x, y, o, bias=z, activation="silu")
        args = tuple(t.clone().requires_grad_() for t in (a, b, bias))
        assert torch.autograd.gradcheck(fn, args, fast_mode=True)


def test_backward_runs_through_opforge_kernels(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        seen.append((op.name, getattr(args[-1], "activation", None)))
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    a, b, o, bias = packed(gen, bias=True)
    a.requires_grad_(), b.requires_grad_(), bias.requires_grad_()
    grouped_matmul(a, b, o, bias=bias, activation="gelu").sum().backward()
    assert seen == [("grouped_matmul", "gelu"), ("grouped_matmul", "gelu_grad"), ("grouped_matmul", None),
                    ("grouped_matmul_wgrad", None)]
    assert torch.equal(bias.grad[0], torch.zeros(16))  # the empty group's bias gets no gradient


def test_bf16_gradients_and_out_dtype(gen):
    a, b, o, _ = packed(gen, dtype=BF16)
    bias = rand((4, 16), gen)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    out = grouped_matmul(*leaves[:2], o, bias=leaves[2], activation="gelu", out_dtype=F32)
    assert out.dtype == F32
    out.sum().backward()
    refs = [t.double().requires_grad_() for t in (a, b, bias)]
    oracle(*refs[:2], SIZES, refs[2], "gelu").sum().backward()
    assert [t.grad.dtype for t in leaves] == [BF16, BF16, F32]
    for got, ref in zip(leaves, refs):
        assert rel_err(got.grad, ref.grad) <= 1e-2


# ---------------------------------------------------------------------------
# List form
# ---------------------------------------------------------------------------
LIST_SHAPES = [(3, 5, 6), (0, 4, 3), (9, 13, 8), (4, 0, 5), (2, 6, 0)]  # (M, K, N)


def list_inputs(gen, dtype=F32, transposed=False):
    a = [rand((m, k), gen, dtype) for m, k, n in LIST_SHAPES]
    b = [rand((n, k), gen, dtype).t() if transposed else rand((k, n), gen, dtype) for m, k, n in LIST_SHAPES]
    return a, b


@pytest.mark.parametrize("variant", ["triton_grouped", "reference"])
def test_list_form(variant, gen):
    a, b = list_inputs(gen, transposed=True)
    bias = [rand((n,), gen) for _, _, n in LIST_SHAPES]
    with force_variant("grouped_matmul_list", variant):
        outs = grouped_matmul(a, b, bias=bias, activation="gelu")
        wide = grouped_matmul([t.half() for t in a], [t.half() for t in b], out_dtype=F64)
    assert isinstance(outs, list) and [o.shape for o in outs] == [(m, n) for m, _, n in LIST_SHAPES]
    for o, x, y, z in zip(outs, a, b, bias):
        assert rel_err(o, F.gelu(x.double() @ y.double() + z.double())) <= 1e-5
    for o, x, y in zip(wide, a, b):
        assert o.dtype == F64 and rel_err(o, x.half().double() @ y.half().double()) <= 1e-6  # fp32 accumulator


def test_list_form_gradients(gen):
    a, b = list_inputs(gen)
    bias = [rand((n,), gen) for _, _, n in LIST_SHAPES]
    la, lb, lbias = ([t.clone().requires_grad_() for t in ts] for ts in (a, b, bias))
    outs = grouped_matmul(la, lb, bias=lbias, activation="silu")
    sum((o * o).sum() for o in outs).backward()
    ra, rb, rbias = ([t.double().requires_grad_() for t in ts] for ts in (a, b, bias))
    sum((F.silu(x @ y + z) ** 2).sum() for x, y, z in zip(ra, rb, rbias)).backward()
    for got, ref in zip(la + lb + lbias, ra + rb + rbias):
        assert got.grad.shape == ref.shape and rel_err(got.grad, ref.grad) <= 1e-5


# ---------------------------------------------------------------------------
# opcheck and torch.compile
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_packed(requires_grad, gen):
    a, b, o, bias = packed(gen, [2, 0, 5], K=8, N=8, bias=True)
    args = (a, b, o, bias, None, "gelu", None) if requires_grad else (a, b, o, None, None, None, F64)
    args = tuple(t.clone().requires_grad_(requires_grad) if isinstance(t, torch.Tensor) and t.dtype == F32
                 else t for t in args)
    result = torch.library.opcheck(OPS.grouped_matmul.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_list_and_wgrad(requires_grad, gen):
    la = [rand((3, 4), gen).requires_grad_(requires_grad), rand((2, 6), gen).requires_grad_(requires_grad)]
    lb = [rand((4, 5), gen).requires_grad_(requires_grad), rand((6, 3), gen).requires_grad_(requires_grad)]
    result = torch.library.opcheck(OPS.grouped_matmul_list.default, (la, lb, None, "relu", None))
    assert set(result.values()) == {"SUCCESS"}, result
    if not requires_grad:
        a, _, o, _ = packed(gen, [2, 0, 5], K=8, N=8)
        result = torch.library.opcheck(OPS.grouped_matmul_wgrad.default, (a, rand((7, 8), gen), o))
        assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()

    def f(x, w, o, bias):
        return grouped_matmul(x, w, o, bias=bias, activation="gelu")

    def f_list(xs, ws):
        return grouped_matmul(xs, ws)

    a, b, o, bias = packed(gen, bias=True)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(ac, bc, o, bias).pow(2).sum().backward()
    ar, br = a.double().requires_grad_(), b.double().requires_grad_()
    oracle(ar, br, SIZES, bias, "gelu").pow(2).sum().backward()
    assert rel_err(compiled(a, b, o, bias), oracle(a, b, SIZES, bias, "gelu")) <= 1e-5
    assert rel_err(ac.grad, ar.grad) <= 1e-5 and rel_err(bc.grad, br.grad) <= 1e-5
    xs, ws = list_inputs(gen)
    outs = torch.compile(f_list, fullgraph=True, backend="aot_eager")(xs, ws)
    for out, x, w in zip(outs, xs, ws):
        assert rel_err(out, x.double() @ w.double()) <= 1e-5
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_clear_errors(gen):
    a, b, o, _ = packed(gen)
    where = "opforge.grouped_matmul"
    with pytest.raises(TypeError, match=f"{where}: offsets must be int32"):
        grouped_matmul(a, b, o.long())
    with pytest.raises(ValueError, match=rf"{where}: offsets must be non-decreasing .* offsets\[1\] = 5 > "
                                         rf"offsets\[2\] = 3"):
        grouped_matmul(a, b, torch.tensor([0, 5, 3, 23], dtype=torch.int32))
    with pytest.raises(ValueError, match=rf"{where}: the last offset must equal the rows of a \(M_total = 23\), "
                                         rf"got offsets\[-1\] = 22"):
        grouped_matmul(a, b, torch.tensor([0, 5, 21, 22], dtype=torch.int32))
    with pytest.raises(ValueError, match=rf"{where}: offsets must be >= 0"):
        grouped_matmul(a, b, torch.tensor([-1, 5, 22, 23], dtype=torch.int32))
    with pytest.raises(ValueError, match=rf"{where}: offsets must have shape \(4,\), one end row per group"):
        grouped_matmul(a, b, offs([5, 18]))
    with pytest.raises(ValueError, match=rf"{where}: a has K=32 \(its last dim\) but b has K=16"):
        grouped_matmul(a, rand((4, 16, 16), gen), o)
    with pytest.raises(ValueError, match=f"{where}: offsets is required for the packed form"):
        grouped_matmul(a, b)
    with pytest.raises(ValueError, match=f"{where}: b must be 3-D"):
        grouped_matmul(a, b[0], o)
    with pytest.raises(ValueError, match=f"{where}: a must be 2-D"):
        grouped_matmul(a[None], b, o)
    with pytest.raises(TypeError, match=f"{where}: a is torch.float32 but b is torch.float16"):
        grouped_matmul(a, b.half(), o)
    with pytest.raises(TypeError, match=f"{where}: a must be a floating-point tensor, got torch.int64"):
        grouped_matmul(a.long(), b.long(), o)
    with pytest.raises(ValueError, match=rf"{where}: bias must have shape \(4, 16\), got \(16,\)"):
        grouped_matmul(a, b, o, bias=rand((16,), gen))
    with pytest.raises(TypeError, match=f"{where}: bias is torch.float16; expected torch.float32"):
        grouped_matmul(a, b, o, bias=rand((4, 16), gen, F16))
    with pytest.raises(ValueError, match=f"{where}: activation must be None or one of 'gelu'"):
        grouped_matmul(a, b, o, activation="tanh")
    with pytest.raises(ValueError, match=f"{where}: activation must be None"):
        grouped_matmul(a, b, o, activation="gelu_grad")  # internal gradient epilogues are not public
    with pytest.raises(TypeError, match=f"{where}: out_dtype must be None"):
        grouped_matmul(a, b, o, out_dtype=torch.int32)
    with pytest.raises(TypeError, match=f"{where}: offsets must be an int32 torch.Tensor"):
        grouped_matmul(a, b, [0, 5, 22, 23])
    # the library op validates too (the path autograd and torch.compile take)
    with pytest.raises(ValueError, match=f"{where}: offsets must be non-decreasing"):
        OPS.grouped_matmul(a.requires_grad_(), b, torch.tensor([0, 5, 3, 23], dtype=torch.int32))


def test_list_errors(gen):
    where = r"opforge.grouped_matmul \(list form\)"
    x, y = rand((3, 4), gen), rand((4, 5), gen)
    with pytest.raises(ValueError, match=f"{where}: a has 2 groups but b has 1"):
        grouped_matmul([x, x], [y])
    with pytest.raises(ValueError, match=f"{where}, group 1: a has K=4 but b has K=5"):
        grouped_matmul([x, x], [y, rand((5, 2), gen)])
    with pytest.raises(ValueError, match=f"{where}: offsets belong to the packed form"):
        grouped_matmul([x], [y], offs([3]))
    with pytest.raises(TypeError, match=f"{where}: group 1 is torch.float64 but group 0 is torch.float32"):
        grouped_matmul([x, x.double()], [y, y.double()])
    with pytest.raises(ValueError, match=rf"{where}: bias\[0\] must have shape \(5,\)"):
        grouped_matmul([x], [y], bias=[rand((4,), gen)])
    with pytest.raises(TypeError, match=f"{where}: a is a list, so b must be a list of tensors too"):
        grouped_matmul([x], y)
    with pytest.raises(ValueError, match=f"{where}: no groups"):
        grouped_matmul([], [])


# ---------------------------------------------------------------------------
# Vendor paths (plain torch, so they run here) and the bench cases
# ---------------------------------------------------------------------------
def test_vendor_paths_match_the_oracle(gen):
    a, b, o, bias = packed(gen, bias=True)
    epi = GM.make_epilogue(a, bias, None, "gelu", None)
    want = oracle(a, b, SIZES, bias, "gelu")
    assert rel_err(GM.loop_run(a, b, o, bias, None, epi), want) <= 1e-5
    # torch._grouped_mm where this torch runs it, else its fallback (the loop)
    a16, b16, bias16 = a.to(BF16), b.to(BF16), bias.to(BF16)
    got = GM.grouped_mm_run(a16, b16, o, bias16, None, GM.make_epilogue(a16, bias16, None, "gelu", None))
    assert got.dtype == BF16 and rel_err(got, oracle(a16, b16, SIZES, bias16, "gelu")) <= 1e-2
    wgrad_loop = WGRAD_OP.variant("torch_loop")
    d = rand((23, 16), gen)
    assert rel_err(wgrad_loop.run({}, a, d, o), GM.wgrad_reference(a.double(), d.double(), o)) <= 1e-5
    check = OP.variant("torch_grouped_mm").check
    assert check(a16, b16, o) is None
    assert "bf16" in check(a, b, o)
    assert "16-byte" in check(rand((23, 13), gen, BF16), rand((4, 13, 16), gen, BF16), o)  # 26-byte rows
    assert "16-byte" in check(a16, rand((4, 32, 12), gen, BF16), o)  # N = 12


def test_bench_cases_run_and_are_correct():
    from opforge.bench import grouped_gemm as bench
    from opforge.bench.case import run_case
    from opforge.runtime.roofline import Ceilings

    sizes = bench.moe_sizes(16384, 8, 0)
    assert sum(sizes) == 16384 and sizes.count(0) == 1 and len(set(sizes)) == 8
    ceilings = Ceilings(1.0, 1.0, "test", "test")
    cpu = torch.device("cpu")
    for case in bench.cases(cpu, quick=True):
        entry = run_case(case, cpu, ceilings, quick=True)
        assert entry["correct"], entry
        assert entry["variant"] in ("triton_persistent", "triton_grouped")
    assert {c.variant for c in bench.crossover_cases(cpu, quick=True)} == {"triton_persistent", "triton_grouped"}
