"""The scan ops' contract: registry and dispatch decisions, torch.library
registration (opcheck), torch.compile, autograd (gradcheck through the Triton
variants), torch semantics (dtype promotion, 0-dim, empty, size-1, negative
dims, non-contiguous) and error messages.

Oracles are torch in float64 (or exact integer torch), never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.kernels import scan as K
from opforge.ops import compact as C
from opforge.ops import scan as S
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F32, F64 = torch.float32, torch.float64
OPS = torch.ops.opforge

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


@pytest.fixture
def short_tiles(monkeypatch):
    """Rows of a few hundred elements take the tile scans (several tiles each)."""
    monkeypatch.setattr(K, "TILE_MIN_COLS", 16)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
EXPECTED = {
    "cumsum": ["triton_lookback", "triton_reduce_scan", "triton_columns", "triton_row", "torch_eager", "reference"],
    "cumprod": ["triton_lookback", "triton_reduce_scan", "triton_columns", "triton_row", "torch_eager", "reference"],
    "cummax": ["triton_columns", "triton_row", "torch_eager", "reference"],
    "cummin": ["triton_columns", "triton_row", "torch_eager", "reference"],
    "segmented_cumsum": ["triton_lookback", "torch_eager", "reference"],
    "compact": ["triton_lookback", "torch_eager", "reference"],
    "nonzero": ["triton_lookback", "torch_eager", "reference"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_registered_with_all_variants(name):
    op = registry.get(name)
    assert [v.name for v in op.variants] == EXPECTED[name]
    eager = op.variant("torch_eager")
    assert eager.kind == "vendor" and eager.devices == ("cuda",)
    assert op.variant("reference").kind == "reference"
    assert all(v.version for v in op.variants if v.kind == "triton")


def test_samples_reach_every_triton_variant():
    cpu = torch.device("cpu")
    for name in EXPECTED:
        op = registry.get(name)
        samples = op.samples(cpu)
        for v in op.variants:
            if v.kind == "triton":
                assert any(dispatch.reject_reason(op, v, a) is None for a in samples), (name, v.name)


def test_dispatch_decisions(gen):
    def picks(name, *args):
        return dispatch.explain(name, *args).variant.name

    assert picks("cumsum", rand((4, 100), gen), -1, False, False) == "triton_row"
    assert picks("cumsum", rand((K.TILE_MIN_COLS,), gen), 0, False, False) == "triton_lookback"
    assert picks("cumsum", rand((2, K.TILE_MIN_COLS), gen), 1, True, True) == "triton_lookback"
    assert picks("cumsum", rand((K.TILE_MIN_COLS, 32), gen), 0, False, False) == "triton_columns"
    assert picks("cumsum", rand((K.TILE_MIN_COLS, 4), gen), 0, False, False) == "triton_lookback"  # few columns
    assert picks("cumsum", rand((4, 100), gen).t(), 0, False, False) == "triton_row"  # unit stride
    assert picks("cumsum", rand((6, 4, 5), gen).transpose(1, 2), 1, False, False) == "triton_row"
    assert picks("cummax", rand((30, 4), gen), 0) == "triton_columns"
    assert picks("cummin", rand((4, 30), gen), -1) == "triton_row"
    d = dispatch.explain("cumsum", rand((4, 100), gen), -1, False, False)
    assert "rows of 100" in d.rejected["triton_lookback"] and "cpu" in d.rejected["torch_eager"]
    # one long row never goes to the one-program row kernel, whatever entry stands in (issue 24)
    d = dispatch.explain("cumsum", rand((4 * K.TILE_MIN_COLS + 1,), gen), 0, True, False)
    assert d.variant.name == "triton_lookback" and "serially" in d.rejected["triton_row"]


def test_memo_key_separates_flags_and_dtype(gen):
    x = rand((3, 9), gen)
    a = S.cumsum(x, 1)
    b = S.cumsum(x, 1, exclusive=True)
    c = S.cumsum(x, 1, reverse=True)
    d = S.cumsum(x, 1, dtype=F64)
    torch.testing.assert_close(a, torch.cumsum(x, 1))
    torch.testing.assert_close(b, torch.cumsum(x, 1) - x)
    torch.testing.assert_close(c, x.flip(1).cumsum(1).flip(1))
    assert d.dtype == F64


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_scans(requires_grad, gen):
    for name, args in (("cumsum", (1, True, True, None)), ("cumprod", (0, False, False, torch.float64))):
        x = rand((3, 5), gen).requires_grad_(requires_grad)
        r = torch.library.opcheck(getattr(OPS, name).default, (x, *args))
        assert set(r.values()) == {"SUCCESS"}, (name, r)
    for name in ("cummax", "cummin"):
        x = rand((3, 5), gen).requires_grad_(requires_grad)
        r = torch.library.opcheck(getattr(OPS, name).default, (x, 0))
        assert set(r.values()) == {"SUCCESS"}, (name, r)
    x = rand((20,), gen).requires_grad_(requires_grad)
    flags = torch.rand(20, generator=gen) < 0.2
    r = torch.library.opcheck(OPS.segmented_cumsum.default, (x, flags, True, False))
    assert set(r.values()) == {"SUCCESS"}, r


def test_opcheck_compact_and_nonzero(gen):
    x = rand((5, 6), gen).requires_grad_()
    m = torch.rand((5, 6), generator=gen) < 0.5
    r = torch.library.opcheck(OPS.compact.default, (x, m, 20, 0.0))
    assert set(r.values()) == {"SUCCESS"}, r
    r = torch.library.opcheck(OPS.nonzero.default, (m, 8, -1))
    assert set(r.values()) == {"SUCCESS"}, r


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_row", "triton_columns", "triton_lookback"])
def test_gradcheck_cumsum_fp64(variant, gen, short_tiles):
    # fast_mode: a few random directions instead of one forward per input element
    # (each forward is an interpreted kernel launch).
    shape, dim = ((2, 40), 1) if variant != "triton_columns" else ((6, 4), 0)
    with force_variant("cumsum", variant):
        for exclusive, reverse in ((False, False), (True, True)):
            x = rand(shape, gen, F64).requires_grad_()
            assert torch.autograd.gradcheck(lambda t: S.cumsum(t, dim, exclusive=exclusive, reverse=reverse), (x,),
                                            fast_mode=True)


def test_gradcheck_cumprod_with_zeros(gen):
    x = rand((3, 6), gen, F64)
    x[0, 2] = 0.0
    x[1, 1] = x[1, 4] = 0.0
    x.requires_grad_()
    with force_variant("cumprod", "triton_row"):
        assert torch.autograd.gradcheck(lambda t: S.cumprod(t, 1), (x,), fast_mode=True)
        assert torch.autograd.gradcheck(lambda t: S.cumprod(t, 1, exclusive=True, reverse=True), (x,),
                                        fast_mode=True)


@pytest.mark.parametrize("variant", ["triton_row", "triton_columns"])
def test_gradcheck_cummax_cummin(variant, gen):
    dim = 1 if variant == "triton_row" else 0
    for name in ("cummax", "cummin"):
        with force_variant(name, variant):
            x = rand((5, 6), gen, F64).requires_grad_()
            assert torch.autograd.gradcheck(lambda t: getattr(S, name)(t, dim)[0], (x,), fast_mode=True)


def test_gradcheck_segmented_and_compact(gen):
    flags = torch.rand(30, generator=gen) < 0.2
    for exclusive, reverse in ((False, False), (True, True)):
        x = rand((30,), gen, F64).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda t: S.segmented_cumsum(t, flags=flags, exclusive=exclusive, reverse=reverse), (x,), fast_mode=True)
    m = torch.rand((4, 5), generator=gen) < 0.5
    x = rand((4, 5), gen, F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: C.compact(t, m), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda t: C.compact(t, m[:, 0]), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda t: C.compact(t, m, size=3), (x,), fast_mode=True)


def test_backward_runs_through_the_kernel_ops(gen, monkeypatch):
    seen = []
    real = dispatch.call

    def spy(op, *args):
        seen.append((op.name, args[3] if op.name == "cumsum" else None))  # reverse
        return real(op, *args)

    monkeypatch.setattr(dispatch, "call", spy)
    x = rand((3, 5), gen).requires_grad_()
    S.cumsum(x, 1).sum().backward()
    assert ("cumsum", False) in seen and ("cumsum", True) in seen  # forward, then the reverse scan
    torch.testing.assert_close(x.grad, torch.arange(5, 0, -1, dtype=F32).expand(3, 5))
    flat = x.detach().reshape(-1).requires_grad_()
    S.segmented_cumsum(flat, flags=torch.zeros(15, dtype=torch.bool)).sum().backward()
    assert [n for n, _ in seen].count("segmented_cumsum") == 2


def test_integer_inputs_have_no_grad_path(gen):
    y = S.cumsum(torch.arange(6), 0)
    assert y.dtype == torch.int64 and not y.requires_grad


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def test_compile_fullgraph_forward_and_backward(gen):
    torch._dynamo.reset()
    flags = torch.rand(24, generator=gen) < 0.3

    def f(t):
        a = S.cumsum(t, 1, exclusive=True)
        b = S.cummax(t, 0)[0]
        c = S.segmented_cumsum(t.reshape(-1), flags=flags).reshape(4, 6)
        return a * b + c

    x = rand((4, 6), gen)
    xc = x.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(xc).sum().backward()
    xr = x.double().requires_grad_()
    seg = torch.cat([s.cumsum(0) for s in xr.reshape(-1).tensor_split(
        torch.nonzero(flags[1:]).flatten() + 1)]).reshape(4, 6)
    want = (torch.cumsum(xr, 1) - xr) * torch.cummax(xr, 0).values + seg
    want.sum().backward()
    torch.testing.assert_close(compiled(x), want.detach().float())
    torch.testing.assert_close(xc.grad, xr.grad.float())
    torch._dynamo.reset()


def test_compile_compact_with_size(gen):
    torch._dynamo.reset()
    m = torch.rand(20, generator=gen) < 0.5
    x = rand((20,), gen)
    compiled = torch.compile(lambda t, mm: C.compact(t * 2, mm, size=20), fullgraph=True, backend="eager")
    out = compiled(x, m)
    k = int(m.sum())
    torch.testing.assert_close(out[:k], (x * 2)[m])
    assert (out[k:] == 0).all()
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Semantics
# ---------------------------------------------------------------------------
def test_dtype_promotion_like_torch(gen):
    for dt in (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64):
        x = torch.randint(0, 2, (3, 9), generator=gen).to(dt)
        for name in ("cumsum", "cumprod"):
            out = getattr(S, name)(x, 1)
            want = getattr(torch, name)(x, 1)
            assert out.dtype == want.dtype == torch.int64 and torch.equal(out, want)
    x = torch.randint(-3, 4, (2, 8), generator=gen, dtype=torch.int32)
    out = S.cumsum(x, 1, dtype=torch.int32)
    assert out.dtype == torch.int32 and torch.equal(out, torch.cumsum(x, 1, dtype=torch.int32))
    xf = rand((2, 8), gen, torch.bfloat16)
    out = S.cumsum(xf, 1, dtype=F32)
    assert out.dtype == F32
    torch.testing.assert_close(out, torch.cumsum(xf.double(), 1).float())
    assert S.cumsum(xf, 1).dtype == torch.bfloat16


def test_zero_dim_empty_and_size_one(gen):
    s = torch.tensor(2.5)
    for dim in (0, -1):
        assert S.cumsum(s, dim).shape == () and float(S.cumsum(s, dim)) == 2.5
        assert float(S.cumsum(s, dim, exclusive=True)) == 0.0
        assert float(S.cumprod(s, dim, exclusive=True)) == 1.0
        v, i = S.cummax(s, dim)
        assert v.shape == () and float(v) == 2.5 and int(i) == 0
    for shape, dim in (((0,), 0), ((3, 0), 1), ((0, 4), 1), ((3, 0), 0)):
        e = torch.empty(shape)
        assert S.cumsum(e, dim).shape == shape and S.cumprod(e, dim, exclusive=True).shape == shape
        assert S.cummin(e, dim)[1].shape == shape
    x = rand((5, 1), gen)
    torch.testing.assert_close(S.cumsum(x, 1), x)
    torch.testing.assert_close(S.cumsum(x, 1, exclusive=True), torch.zeros_like(x))
    torch.testing.assert_close(S.cumsum(x.t(), 0), x.t())
    assert C.compact(torch.empty(0), torch.empty(0, dtype=torch.bool)).shape == (0,)
    assert S.segmented_cumsum(torch.empty(0), flags=torch.empty(0, dtype=torch.bool)).shape == (0,)


def test_negative_dims_and_non_contiguous(gen):
    x = rand((4, 5, 6), gen)
    xt = x.permute(2, 0, 1)  # non-contiguous
    for dim in (-1, -2, -3, 0, 1, 2):
        torch.testing.assert_close(S.cumsum(xt, dim), torch.cumsum(xt.double(), dim).float())
        v, i = S.cummax(xt, dim)
        want = torch.cummax(xt, dim)
        assert torch.equal(v, want.values) and torch.equal(i, want.indices)
    y = S.cumsum(x, -1)
    assert y.is_contiguous()
    assert S.cumsum(x, 0).is_contiguous()  # the in-place column scan keeps torch's layout


def test_compact_rows_mode_and_nonzero_match_torch(gen):
    x = rand((6, 3, 2), gen)
    rows = torch.tensor([True, False, True, True, False, False])
    assert torch.equal(C.compact(x, rows), x[rows])
    m = torch.rand((6, 3, 2), generator=gen) < 0.5
    assert torch.equal(C.compact(x, m), x[m])
    assert torch.equal(C.nonzero(m), torch.nonzero(m))
    assert torch.equal(C.compact(torch.tensor(3.0), torch.tensor(True)), torch.tensor([3.0]))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_clear_errors(gen):
    x = rand((2, 3), gen)
    with pytest.raises(TypeError, match="opforge.cumsum: input must be a torch.Tensor, got list"):
        S.cumsum([1.0, 2.0], 0)
    with pytest.raises(ValueError, match=r"opforge.cumsum: dim 2 is out of range for a tensor with 2 dims"):
        S.cumsum(x, 2)
    with pytest.raises(TypeError, match="opforge.cumprod: dim must be an int, got float"):
        S.cumprod(x, 1.0)
    with pytest.raises(TypeError, match="opforge.cumsum: dtype must be a torch.dtype or None, got str"):
        S.cumsum(x, 0, dtype="float")
    with pytest.raises(TypeError, match="opforge.cumsum: dtype torch.complex64 is not supported"):
        S.cumsum(x, 0, dtype=torch.complex64)
    with pytest.raises(TypeError, match="opforge.cumsum: complex tensors are not supported"):
        S.cumsum(torch.zeros(3, dtype=torch.complex64), 0)
    with pytest.raises(TypeError, match="opforge.cumsum: exclusive must be a bool, got int"):
        S.cumsum(x, 0, exclusive=1)
    with pytest.raises(ValueError, match=r"opforge.cummax: dim -3 is out of range"):
        S.cummax(x, -3)
    f = torch.zeros(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="opforge.segmented_cumsum: give exactly one of flags= and offsets="):
        S.segmented_cumsum(torch.zeros(3))
    with pytest.raises(ValueError, match="opforge.segmented_cumsum: give exactly one of"):
        S.segmented_cumsum(torch.zeros(3), flags=f, offsets=torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="opforge.segmented_cumsum: flags must be a bool tensor, got torch.int64"):
        S.segmented_cumsum(torch.zeros(3), flags=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"opforge.segmented_cumsum: flags has shape \(4,\) but input has \(3,\)"):
        S.segmented_cumsum(torch.zeros(3), flags=torch.zeros(4, dtype=torch.bool))
    with pytest.raises(TypeError, match="opforge.segmented_cumsum: offsets must be int32 or int64, got torch.float32"):
        S.segmented_cumsum(torch.zeros(3), offsets=torch.tensor([0.0, 3.0]))
    with pytest.raises(ValueError, match="opforge.segmented_cumsum: offsets need a 1-D input, got 2 dims"):
        S.segmented_cumsum(torch.zeros(2, 3), offsets=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="opforge.segmented_cumsum: input must be 1-D or 2-D"):
        S.segmented_cumsum(torch.zeros(2, 3, 4), flags=torch.zeros(2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="opforge.compact: mask must be a bool tensor, got torch.uint8"):
        C.compact(x, torch.ones(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"opforge.compact: mask has shape \(3,\); expected input's shape \(2, 3\)"):
        C.compact(x, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="opforge.compact: size must be >= 0, got -1"):
        C.compact(x, torch.ones(2, 3, dtype=torch.bool), size=-1)
    with pytest.raises(TypeError, match="opforge.nonzero: mask must be a bool tensor, got torch.float32"):
        C.nonzero(x)


# ---------------------------------------------------------------------------
# Bench cases (CPU: the interpreter)
# ---------------------------------------------------------------------------
def test_bench_cases_count_bytes_and_match_reference():
    from opforge.bench import scan as B

    cases = B.cases(torch.device("cpu"), True)
    assert 2 <= len(cases) <= 4 and all(not c.peers.get("torch.compile") for c in cases)
    c = cases[0]
    args = c.make_args(torch.device("cpu"))
    x = args[0]
    assert c.nbytes == x.numel() * x.element_size() * 2
    out = c.run(*args)
    ref = c.reference(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-3)
    # The GPU grid (built, not run): the peer shape, >= 256 MiB shapes, one graph-timed shape.
    grid = B.cases(torch.device("cuda"), False)
    assert grid[0].label == str(1 << 30) and grid[0].nbytes == 8 * (1 << 30)
    assert all("torch eager" in c.peers for c in grid)
    assert sum(c.graph for c in grid) == 1
    assert all(c.nbytes >= 256 * 2**20 for c in grid if not c.graph)
    assert {c.op for c in grid} == {"cumsum", "cummax", "segmented_cumsum", "compact"}
    assert {c.variant for c in B.crossover_cases(torch.device("cuda"), False)} >= {"triton_lookback",
                                                                                  "triton_reduce_scan"}


def test_segmented_offsets_are_checked():
    """Issue 25: offsets past the end, negative or decreasing raise (before:
    clamped into flags silently)."""
    x = torch.arange(6, dtype=torch.float32)
    assert S.segmented_cumsum(x, offsets=torch.tensor([0, 2, 2, 6])).tolist() == [0, 1, 2, 5, 9, 14]
    with pytest.raises(ValueError, match=r"opforge.segmented_cumsum: offsets must be non-decreasing and within "
                                         r"\[0, 6\] \(the input's length\), got .*7"):
        S.segmented_cumsum(x, offsets=torch.tensor([0, 3, 7]))
    with pytest.raises(ValueError, match=r"opforge.segmented_cumsum: offsets must be non-decreasing"):
        S.segmented_cumsum(x, offsets=torch.tensor([0, 4, 2, 6]))
    with pytest.raises(ValueError, match=r"opforge.segmented_cumsum: offsets must be non-decreasing"):
        S.segmented_cumsum(x, offsets=torch.tensor([-1, 2, 6], dtype=torch.int32))


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int16])
def test_long_integer_row_in_tiles(name, dtype, gen, monkeypatch):
    """A few long integer rows take the two-level scan (tiles, then the tiles' carries): values and
    indices as torch's, ties to the later index, the dtype's extremes included (sizes shrunk so the
    interpreter runs it in seconds)."""
    monkeypatch.setattr(S, "ROW_KERNEL_MAX_COLS", 1000)
    monkeypatch.setattr(S, "MINMAX_TILE", 256)
    x = torch.randint(-20, 20, (2, 3001), generator=gen).to(dtype)
    x[0, 5], x[1, -3] = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    got = getattr(S, name)(x, 1)
    want = getattr(torch, name)(x, 1)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    flat = getattr(S, name)(x[0], 0)
    assert torch.equal(flat[1], getattr(torch, name)(x[0], 0).indices)
