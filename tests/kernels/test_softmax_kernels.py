"""Softmax kernels under the Triton interpreter: each variant forced and called
through the public functions (or run directly with a small column block, so a
few hundred columns take several online blocks); the oracle is torch in float64.
"""

from __future__ import annotations

import pytest
import torch

from opforge.bench.case import rel_err
from opforge.ops.softmax import OPS, log_softmax, softmax
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
FNS = {"softmax": softmax, "log_softmax": log_softmax}
REF = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}
VARIANTS = ("triton_row", "triton_split", "triton_online")

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked lanes: -inf - -inf
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),  # interpreter loop bounds
]


def rand(shape, gen, dtype=F32, scale=3.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


def ref(name, x, dim=-1):
    return REF[name](x.double(), dim)


def check(out, want, dtype):
    assert out.dtype == dtype and out.shape == want.shape
    err = rel_err(out, want)
    assert err <= BOUND[dtype], err


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_forward_matches_float64(name, variant, dtype, gen):
    x = rand((13, 97), gen, dtype)
    with force_variant(name, variant):
        check(FNS[name](x), ref(name, x), dtype)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_short_rows_several_per_program(name, variant, gen):
    x = rand((37, 5), gen)
    with force_variant(name, variant):
        check(FNS[name](x), ref(name, x), F32)


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("name", FNS)
def test_online_forward_many_blocks(name, dtype, block, gen):
    x = rand((5, 333), gen, dtype)
    v = OPS[name].variant("triton_online")
    check(v.run({"BLOCK": block, "num_warps": 1}, x, -1), ref(name, x), dtype)


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("name", FNS)
def test_online_backward_many_blocks(name, block, gen):
    x = rand((4, 301), gen, F64)
    y = REF[name](x, -1)
    g = rand(x.shape, gen, F64, 1.0)
    v = OPS[f"{name}_backward"].variant("triton_online")
    xr = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(REF[name](xr, -1), xr, g)
    check(v.run({"BLOCK": block, "num_warps": 1}, g, y, -1), want, F64)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_backward_kernels_match_torch_grad(name, variant, gen):
    x = rand((6, 77), gen, F32)
    g = rand(x.shape, gen, F32, 1.0)
    xr = x.double().requires_grad_()
    (want,) = torch.autograd.grad(REF[name](xr, -1), xr, g.double())
    xo = x.clone().requires_grad_()
    with force_variant(name, variant), force_variant(f"{name}_backward", variant):
        out = FNS[name](xo)
        (got,) = torch.autograd.grad(out, xo, g)
    check(got, want, F32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_large_magnitudes_do_not_overflow(name, variant, gen):
    x = rand((4, 50), gen, F32, 1.0) + 1e4
    x[1] = rand((50,), gen, F32, 1e4)
    with force_variant(name, variant):
        out = FNS[name](x)
    assert torch.isfinite(out).all()
    check(out, ref(name, x), F32)
    block = OPS[name].variant("triton_online").run({"BLOCK": 16, "num_warps": 1}, x, -1)
    check(block, ref(name, x), F32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_nan_and_inf_rows_behave_as_torch(name, variant, gen):
    inf, nan = float("inf"), float("nan")
    x = rand((6, 40), gen, F32)
    x[0, 3] = nan
    x[1, 7] = inf
    x[2, :] = -inf
    x[3, :20] = -inf            # masked leading positions, finite later
    x[4, 5] = -inf
    want = REF[name](x, -1)
    with force_variant(name, variant):
        got = FNS[name](x)
    torch.testing.assert_close(got, want, equal_nan=True)
    small = OPS[name].variant("triton_online").run({"BLOCK": 8, "num_warps": 1}, x, -1)
    torch.testing.assert_close(small, want, equal_nan=True)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_other_dims_and_noncontiguous(name, variant, gen):
    x = rand((3, 11, 6), gen, F32)
    t = rand((40, 9), gen, F32).t()              # stride(-1) != 1: copied
    s = rand((7, 30), gen, F32)[:, ::2]          # row stride 30, col stride 2
    v = rand((10, 8, 12), gen, F32)[:, 2:6, :]   # leading dims do not collapse
    with force_variant(name, variant):
        for dim in (0, 1, -2, 2):
            check(FNS[name](x, dim), ref(name, x, dim), F32)
        check(FNS[name](t), ref(name, t), F32)
        check(FNS[name](t, 0), ref(name, t, 0), F32)
        check(FNS[name](s), ref(name, s), F32)
        check(FNS[name](v), ref(name, v), F32)
        check(FNS[name](v, 1), ref(name, v, 1), F32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", FNS)
def test_empty_and_size_one(name, variant):
    with force_variant(name, variant):
        for shape, dim in (((0, 5), -1), ((5, 0), -1), ((5, 0), 0), ((4, 1), -1), ((1, 4), 0), ((), 0), ((), -1)):
            x = torch.linspace(-1, 1, max(1, torch.Size(shape).numel())).reshape(-1)[: torch.Size(shape).numel()]
            x = x.reshape(shape)
            out = FNS[name](x, dim)
            want = REF[name](x, dim)
            assert out.shape == want.shape
            torch.testing.assert_close(out, want)


def test_row_variant_rejects_long_rows_wave_takes_them(gen):
    from opforge.kernels.softmax import ROW_LIMIT
    from opforge.runtime import dispatch

    x = rand((1, ROW_LIMIT + 1), gen, F32)
    d = dispatch.explain("softmax", x, -1)
    # The wave kernel (measured ahead on the H200, 2026-12-02) takes them; online still could.
    assert d.variant.name == "triton_wave" and "triton_online" not in d.rejected
    assert "triton_row" in d.rejected and str(ROW_LIMIT) in d.rejected["triton_row"]
    check(softmax(x), ref("softmax", x), F32)


def test_int64_offsets_flag():
    from opforge.kernels.softmax import _needs_int64

    small, big = torch.empty(4, 8), torch.empty_strided((2, 8), (2**31, 1), device="meta")
    assert not _needs_int64(4, 8, (small,), 32)
    assert _needs_int64(2, 8, (big,), 32)


def test_split_variant_cuts_long_rows_into_parts(gen):
    """The interpreter runs one program at a time, so there the split kernel takes
    rows that fit one chunk; longer rows are named as the reason it steps aside."""
    from opforge.kernels import softmax as K
    from opforge.runtime import dispatch

    assert K.split_parts(70000, K.split_default_config(512, 70000)["CHUNK"]) > 1
    cfg = K.split_default_config(512, 262144)
    assert K.split_parts(262144, cfg["CHUNK"]) <= K.SPLIT_MAX_PARTS and cfg["CHUNK"] <= 16384
    d = dispatch.explain("softmax", rand((2, 20000), gen, F32), -1)
    assert "interpreter" in d.rejected["triton_split"]
    with pytest.raises(RuntimeError, match="interpreter"):
        OPS["softmax"].variant("triton_split").run({"CHUNK": 16, "num_warps": 1}, rand((2, 40), gen), -1)
    x = rand((3, 40), gen)
    one = OPS["softmax"].variant("triton_split").run({"CHUNK": 64, "num_warps": 1}, x, -1)
    check(one, ref("softmax", x), F32)


@pytest.mark.parametrize("dtype", [F32, BF16, F64], ids=str)
@pytest.mark.parametrize("name", FNS)
def test_column_kernel_over_outer_dims(name, dtype, gen):
    """Contiguous input, dim not innermost: the column kernel, output contiguous
    like the input; several row blocks and column tiles, a NaN column, a column of
    all -inf, and the backward kernel."""
    from opforge.runtime import dispatch

    x = rand((3, 37, 20), gen, dtype)
    x[1, 4, 2] = float("nan")
    x[2, :, 5] = float("-inf")
    for dim in (0, 1, -2):
        assert dispatch.explain(name, x, dim).variant.name == "triton_col_split"
        out = FNS[name](x, dim)
        assert out.is_contiguous()
        torch.testing.assert_close(out.double(), ref(name, x, dim), equal_nan=True,
                                   atol=BOUND[dtype], rtol=BOUND[dtype])
    for variant, cfg in (("triton_col", {"BLOCK_R": 4, "BLOCK_I": 8, "num_warps": 1}),
                         ("triton_col_split", {"CHUNK_R": 64, "BLOCK_I": 8, "num_warps": 1})):
        small = OPS[name].variant(variant).run(cfg, x, 1)
        torch.testing.assert_close(small.double(), ref(name, x, 1), equal_nan=True,
                                   atol=BOUND[dtype], rtol=BOUND[dtype])
    y = REF[name](x.double(), 1)
    g = rand(x.shape, gen, F64)
    back = OPS[f"{name}_backward"]
    assert dispatch.explain(f"{name}_backward", g, y, 1).variant.name == "triton_col_split"
    want = back.reference(g, y, 1)
    for variant, cfg in (("triton_col", {"BLOCK_R": 4, "BLOCK_I": 8, "num_warps": 1}),
                         ("triton_col_split", {"CHUNK_R": 64, "BLOCK_I": 8, "num_warps": 1})):
        torch.testing.assert_close(back.variant(variant).run(cfg, g, y, 1), want, equal_nan=True)
    big = rand((5000, 2), gen, dtype)
    assert "interpreter" in dispatch.explain(name, big, 0).rejected["triton_col_split"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_row_kernels_write_the_column_case_through_a_buffer(variant, gen):
    x = rand((30, 6), gen)
    with force_variant("softmax", variant):
        out = softmax(x, 0)
    assert out.is_contiguous()
    check(out, ref("softmax", x, 0), F32)
