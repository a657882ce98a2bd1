"""Scan kernels under the Triton interpreter: each variant forced through the
public functions, or a launch helper run directly with small tiles so a few
hundred elements take several tiles and several look-back windows. Oracles
are torch in float64 (or exact integer torch), never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.bench.case import rel_err
from opforge.kernels import scan as K
from opforge.ops import compact as C
from opforge.ops import scan as S
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
SCAN_VARIANTS = ("triton_lookback", "triton_reduce_scan", "triton_row")

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


def oracle(fn, x, dim, exclusive=False, reverse=False, ident=0):
    """Independent float64 oracle: flip / shift / torch scan."""
    t = x.double() if x.is_floating_point() else x.long()
    if reverse:
        t = t.flip(dim)
    if exclusive:
        head = torch.full_like(t.narrow(dim, 0, 1), ident)
        t = torch.cat([head, t.narrow(dim, 0, t.shape[dim] - 1)], dim)
    y = fn(t, dim)
    return y.flip(dim) if reverse else y


def check(out, want, dtype):
    assert out.dtype == dtype and out.shape == want.shape
    if dtype.is_floating_point:
        err = rel_err(out, want)
        assert err <= BOUND[dtype], err
    else:
        assert torch.equal(out, want)


def seg_oracle(x, flags, exclusive=False, reverse=False):
    """Segment by segment in Python: the plainest statement of the semantics."""
    t = x.double() if x.is_floating_point() else x.long()
    out = torch.empty_like(t)
    rows = t.reshape(-1, t.shape[-1])
    frows = flags.reshape(-1, t.shape[-1])
    orows = out.view(-1, t.shape[-1])
    for r in range(rows.shape[0]):
        starts = [0] + [i for i in range(1, rows.shape[1]) if frows[r, i]] + [rows.shape[1]]
        for a, b in zip(starts[:-1], starts[1:]):
            seg = rows[r, a:b]
            y = seg.flip(0).cumsum(0).flip(0) if reverse else seg.cumsum(0)
            orows[r, a:b] = y - seg if exclusive else y
    return out


# ---------------------------------------------------------------------------
# Device-wide tile scans: look-back and reduce-then-scan, run with small tiles
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("publish", [True, False], ids=["inclusive", "aggregates-only"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_lookback_all_directions(op, publish, gen):
    # publish=False: no tile but a row's first publishes its inclusive prefix, so
    # each look-back walks windows of aggregates back to the row start (the GPU
    # path when predecessors are still running).
    kop, fn, ident = (K.SUM, torch.cumsum, 0) if op == "sum" else (K.PROD, torch.cumprod, 1)
    x = rand((2, 150), gen) if op == "sum" else 1 + 0.05 * rand((2, 150), gen)
    for exclusive in (False, True):
        for reverse in (False, True):
            y = torch.empty_like(x)
            K.launch_lookback_scan(x, y, None, kop, exclusive, reverse, {"BLOCK": 16, "WINDOW": 4},
                                   publish_inclusive=publish)
            check(y, oracle(fn, x, 1, exclusive, reverse, ident), F32)


def test_reduce_then_scan_all_directions(gen):
    x = rand((2, 120), gen)
    for exclusive in (False, True):
        for reverse in (False, True):
            y = torch.empty_like(x)
            K.launch_reduce_then_scan(x, y, K.SUM, exclusive, reverse, {"BLOCK": 16})
            check(y, oracle(torch.cumsum, x, 1, exclusive, reverse), F32)


def test_lookback_int64_accumulation_is_exact(gen):
    x = torch.randint(-(2**40), 2**40, (1, 200), generator=gen)
    y = torch.empty_like(x)
    K.launch_lookback_scan(x, y, None, K.SUM, False, False, {"BLOCK": 32, "WINDOW": 2}, publish_inclusive=False)
    assert torch.equal(y, torch.cumsum(x, 1))


def test_lookback_strided_rows(gen):
    base = rand((3, 200), gen)
    x = base[:, 30:150]  # row stride 200, unit column stride
    y = torch.empty(3, 120)
    K.launch_lookback_scan(x, y, None, K.SUM, False, False, {"BLOCK": 32, "WINDOW": 2})
    check(y, oracle(torch.cumsum, x, 1), F32)


@pytest.fixture
def short_tiles(monkeypatch):
    """Rows of a few hundred elements take the tile scans (several tiles each)."""
    monkeypatch.setattr(K, "TILE_MIN_COLS", 64)


@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64, torch.int32], ids=str)
@pytest.mark.parametrize("variant", SCAN_VARIANTS)
def test_long_rows_through_public_cumsum(variant, dtype, gen, short_tiles):
    x = rand((2, 200), gen, dtype) if dtype.is_floating_point else torch.randint(-5, 6, (2, 200), generator=gen,
                                                                               dtype=dtype)
    out_dt = dtype if dtype.is_floating_point else torch.int64
    with force_variant("cumsum", variant):
        check(S.cumsum(x, -1), oracle(torch.cumsum, x, 1).to(out_dt), out_dt)


# ---------------------------------------------------------------------------
# Row and column scans
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
@pytest.mark.parametrize("variant", ["triton_row", "triton_columns"])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_short_scans_match_float64(name, variant, dtype, gen):
    fn, ident = (torch.cumsum, 0) if name == "cumsum" else (torch.cumprod, 1)
    x = rand((4, 21, 5), gen, dtype) if name == "cumsum" else (1 + 0.05 * rand((4, 21, 5), gen)).to(dtype)
    dim = 2 if variant == "triton_row" else 1
    with force_variant(name, variant):
        for exclusive, reverse in ((False, False), (True, True), (True, False)):
            out = getattr(S, name)(x, dim, exclusive=exclusive, reverse=reverse)
            check(out, oracle(fn, x, dim, exclusive, reverse, ident).to(dtype), dtype)


def test_row_kernel_block_walk_and_several_rows_per_program(gen):
    x = rand((5, 150), gen)
    for exclusive in (False, True):
        for reverse in (False, True):
            y = torch.empty_like(x)
            K.launch_row_scan(x, y, None, K.SUM, exclusive, reverse, {"BLOCK_R": 4, "BLOCK_C": 64})
            check(y, oracle(torch.cumsum, x, 1, exclusive, reverse), F32)


def test_column_kernel_tiles_and_carry(gen):
    x = rand((2, 40, 20), gen)
    y = torch.empty_like(x)
    K.launch_col_scan(x, y, None, 2, 40, 20, K.SUM, True, True, {"BLOCK_L": 16, "BLOCK_N": 16})
    check(y, oracle(torch.cumsum, x, 1, True, True), F32)


@pytest.mark.parametrize("variant", ["triton_row", "triton_columns"])
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_ties_nan_inf_match_torch(name, variant, gen):
    x = torch.randint(0, 4, (6, 100), generator=gen).float()
    x[0, 20], x[0, 90], x[1, 5], x[2, 0] = float("nan"), float("nan"), float("inf"), float("-inf")
    x[3, :] = float("-inf")
    x[4, 70] = float("nan")
    dim = 1 if variant == "triton_row" else 0
    x = x if dim == 1 else x.t().contiguous()
    want = getattr(torch, name)(x, dim)
    with force_variant(name, variant):
        v, i = getattr(S, name)(x, dim)
    assert torch.equal(v.nan_to_num(-7.0), want.values.nan_to_num(-7.0))
    assert torch.equal(i, want.indices)


@pytest.mark.parametrize("dtype", [BF16, F16, torch.int32, torch.int64, torch.uint8], ids=str)
def test_cummax_dtypes(dtype, gen):
    x = (torch.randint(0, 50, (3, 70), generator=gen)).to(dtype)
    for name in ("cummax", "cummin"):
        v, i = getattr(S, name)(x, 1)
        want = getattr(torch, name)(x, 1)
        assert v.dtype == dtype and torch.equal(v, want.values) and torch.equal(i, want.indices)


def test_cummax_block_walk(gen):
    x = torch.randint(0, 30, (3, 100), generator=gen).float()
    y, i = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64)
    K.launch_row_scan(x, y, i, K.MAX, False, False, {"BLOCK_R": 2, "BLOCK_C": 32})
    want = torch.cummax(x, 1)
    assert torch.equal(y, want.values) and torch.equal(i, want.indices)


@pytest.mark.parametrize("variant", ["triton_row", "triton_columns", "triton_lookback"])
def test_nan_inf_propagate_like_torch(variant, gen, short_tiles):
    x = rand((8, 100), gen)
    x[1, 3], x[2, 4], x[3, 5], x[3, 7] = float("nan"), float("inf"), float("inf"), float("-inf")
    dim = 0 if variant == "triton_columns" else 1
    with force_variant("cumsum", variant):
        out = S.cumsum(x, dim)
    want = torch.cumsum(x.double(), dim).float()
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    assert torch.equal(torch.isinf(out), torch.isinf(want))


# ---------------------------------------------------------------------------
# Segmented scans
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("publish", [True, False], ids=["inclusive", "aggregates-only"])
def test_segmented_all_directions(publish, gen):
    x = rand((2, 160), gen)
    flags = torch.rand((2, 160), generator=gen) < 0.04
    flags[0, 40:100] = False  # a segment spanning several tiles
    for exclusive in (False, True):
        for reverse in (False, True):
            y = torch.empty_like(x)
            K.launch_lookback_scan(x, y, flags, K.SUM, exclusive, reverse, {"BLOCK": 16, "WINDOW": 2},
                                   publish_inclusive=publish)
            check(y, seg_oracle(x, flags, exclusive, reverse), F32)


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int32], ids=str)
def test_segmented_public_dtypes(dtype, gen):
    x = rand((300,), gen, dtype) if dtype.is_floating_point else torch.randint(-9, 9, (300,), generator=gen,
                                                                               dtype=dtype)
    flags = torch.rand(300, generator=gen) < 0.03
    out_dt = dtype if dtype.is_floating_point else torch.int64
    check(S.segmented_cumsum(x, flags=flags), seg_oracle(x, flags).to(out_dt), out_dt)


def test_segmented_offsets_with_empty_segments(gen):
    x = rand((100,), gen)
    offsets = torch.tensor([0, 0, 10, 10, 55, 100, 100], dtype=torch.int32)
    flags = torch.zeros(100, dtype=torch.bool)
    flags[[10, 55]] = True
    check(S.segmented_cumsum(x, offsets=offsets, exclusive=True), seg_oracle(x, flags, True), F32)


def test_segmented_inf_does_not_leak_across_segments(gen):
    x = rand((200,), gen)
    x[5] = float("inf")
    flags = torch.zeros(200, dtype=torch.bool)
    flags[100] = True
    out = S.segmented_cumsum(x, flags=flags)
    assert torch.isinf(out[5:100]).all() and torch.isfinite(out[100:]).all()


# ---------------------------------------------------------------------------
# Compaction and nonzero
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("publish", [True, False], ids=["inclusive", "aggregates-only"])
def test_compact_kernel_small_tiles(publish, gen):
    x = rand((400,), gen)
    mask = torch.rand(400, generator=gen) < 0.4
    out = torch.empty(int(mask.sum()))
    K.launch_compact(x, mask, out, False, {"BLOCK": 32, "WINDOW": 4}, publish_inclusive=publish)
    assert torch.equal(out, x[mask])
    idx = torch.empty(int(mask.sum()), dtype=torch.int64)
    K.launch_compact(None, mask, idx, True, {"BLOCK": 32, "WINDOW": 4}, publish_inclusive=publish)
    assert torch.equal(idx, torch.nonzero(mask).flatten())


@pytest.mark.parametrize("dtype", [F32, BF16, F64, torch.int32, torch.int64], ids=str)
def test_compact_elements_and_rows(dtype, gen):
    x = rand((30, 7), gen, dtype) if dtype.is_floating_point else torch.randint(-9, 9, (30, 7), generator=gen,
                                                                               dtype=dtype)
    m = torch.rand((30, 7), generator=gen) < 0.5
    rows = torch.rand(30, generator=gen) < 0.5
    assert torch.equal(C.compact(x, m), x[m])
    assert torch.equal(C.compact(x, rows), x[rows])
    assert torch.equal(C.compact(x.t(), m.t()), x.t()[m.t()])  # non-contiguous


def test_compact_and_nonzero_with_size(gen):
    x = rand((200,), gen)
    m = torch.rand(200, generator=gen) < 0.5
    k = int(m.sum())
    for size in (k + 5, k - 3):
        out = C.compact(x, m, size=size, fill_value=-1.0)
        want = torch.full((size,), -1.0)
        want[:min(k, size)] = x[m][:size]
        assert torch.equal(out, want)
    m2 = m.reshape(10, 20)
    for size in (k + 2, k - 4):
        assert torch.equal(C.nonzero(m2, size=size), torch.nonzero_static(m2, size=size, fill_value=-1))


def test_nonzero_shapes(gen):
    for shape in ((0,), (1,), (3, 4, 5), (7, 1, 9)):
        m = torch.rand(shape, generator=gen) < 0.3
        assert torch.equal(C.nonzero(m), torch.nonzero(m))
    assert torch.equal(C.nonzero(torch.tensor(True)), torch.nonzero(torch.tensor(True)))
    assert C.nonzero(torch.zeros(4, 4, dtype=torch.bool)).shape == (0, 2)
