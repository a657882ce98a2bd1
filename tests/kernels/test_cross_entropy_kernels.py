"""Cross-entropy kernels under the Triton interpreter: each variant forced (or run
directly with small column blocks and chunks, so a few hundred classes take
several blocks and several split programs); the oracle is torch's
``F.cross_entropy`` in float64, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.bench.case import rel_err
from opforge.ops import cross_entropy as CE
from opforge.ops.cross_entropy import BACKWARD_OP, FORWARD_OP, FUSED_OP, cross_entropy
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
FWD = "cross_entropy_forward"
BWD = "cross_entropy_backward"
FUSED = "cross_entropy_fused"
# Small blocks so that a row of ~100 classes spans several blocks / chunks.
SMALL = {
    "triton_online": {"BLOCK_R": 1, "BLOCK_C": 16, "num_warps": 1},
    "triton_split": {"CHUNK": 32, "BLOCK_C": 16, "num_warps": 1},
}
OPTIONS = {
    "plain": {},
    "smooth": {"label_smoothing": 0.1},
    "weight": {"weight": True},
    "weight+smooth": {"weight": True, "label_smoothing": 0.25},
}

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked lanes: -inf - -inf
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),  # interpreter loop bounds
]


def rand(shape, gen, dtype=F32, scale=3.0):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale).to(dtype)


def targets(shape, cols, gen, ignore=-100, frac=0.2):
    t = torch.randint(0, cols, shape, generator=gen)
    t[torch.rand(shape, generator=gen) < frac] = ignore
    return t


def kwargs_for(opt, cols, gen, dtype):
    kw = dict(OPTIONS[opt])
    if kw.get("weight"):
        kw["weight"] = (torch.rand(cols, generator=gen, dtype=F64) + 0.5).to(dtype)
    return kw


def oracle(x, t, reduction="none", **kw):
    if kw.get("weight") is not None:
        kw = {**kw, "weight": kw["weight"].double()}
    return F.cross_entropy(x.double(), t, reduction=reduction, **kw)


def oracle_grad(x, t, g=None, reduction="none", **kw):
    xr = x.double().requires_grad_()
    out = oracle(xr, t, reduction, **kw)
    (d,) = torch.autograd.grad(out, xr, g.double() if g is not None else None)
    return d


def check(out, want, dtype):
    assert out.dtype == dtype and out.shape == want.shape
    err = rel_err(out, want)
    assert err <= BOUND[dtype], err


def run_forward(variant, x, t, ignore_index=-100, eps=0.0, weight=None, config=None):
    v = FORWARD_OP.variant(variant)
    cfg = config if config is not None else v.default_config(x, t, ignore_index, eps, weight)
    return v.run(cfg, x, t, ignore_index, eps, weight)


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------
FORWARD_GRID = ([("triton_online", F32, opt) for opt in OPTIONS]
                + [(v, dt, opt) for v in ("triton_online", "triton_split") for dt in (BF16, F16, F64)
                   for opt in ("plain", "weight+smooth")]
                + [("triton_split", F32, opt) for opt in ("plain", "weight+smooth")])


@pytest.mark.parametrize("variant,dtype,opt", FORWARD_GRID, ids=lambda p: str(p).replace("torch.", ""))
def test_forward_rows_match_float64(variant, dtype, opt, gen):
    x = rand((7, 97), gen, dtype)
    t = targets((7,), 97, gen)
    kw = kwargs_for(opt, 97, gen, dtype)
    stats = run_forward(variant, x, t, -100, kw.get("label_smoothing", 0.0), kw.get("weight"), SMALL[variant])
    assert stats.shape == (3, 7) and stats.dtype == CE.stats_dtype(dtype)
    check(stats[0].to(dtype), oracle(x, t, **kw), dtype)
    # The statistics: lse = m + log-sum on active rows, zeros on ignored ones.
    active = t != -100
    lse = torch.logsumexp(x.double(), 1)
    got = stats[1].double() + stats[2].double()
    assert rel_err(got[active], lse[active]) <= 1e-6
    assert (stats[:, ~active] == 0).all()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("variant", ["triton_online", "triton_split"])
def test_public_reductions_through_forced_variants(variant, reduction, gen):
    x = rand((6, 50), gen)
    t = targets((6,), 50, gen)
    w = torch.rand(50, generator=gen) + 0.5
    with force_variant(FWD, variant):
        for kw in ({}, {"weight": w, "label_smoothing": 0.1}):
            check(cross_entropy(x, t, reduction=reduction, **kw), oracle(x, t, reduction, **kw), F32)


def test_short_rows_several_per_program(gen):
    x = rand((37, 5), gen)
    t = targets((37,), 5, gen)
    cfg = FORWARD_OP.variant("triton_online").default_config(x, t, -100, 0.0)
    assert cfg["BLOCK_R"] > 1
    with force_variant(FWD, "triton_online"):
        check(cross_entropy(x, t, reduction="none", label_smoothing=0.3),
              oracle(x, t, label_smoothing=0.3), F32)


def test_split_combine_with_many_parts(gen):
    """300 classes in chunks of 16: 19 parts, padded to 32 split programs per row."""
    x = rand((3, 300), gen)
    t = torch.tensor([5, -100, 299])
    w = torch.rand(300, generator=gen) + 0.5
    cfg = {"CHUNK": 16, "BLOCK_C": 16, "num_warps": 1}
    assert FORWARD_OP.variant("triton_split").default_config(x, t, -100, 0.2, w)["CHUNK"] < 300
    stats = run_forward("triton_split", x, t, -100, 0.2, w, cfg)
    check(stats[0], oracle(x, t, weight=w, label_smoothing=0.2), F32)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------
CHUNKS = {"BLOCK_R": 1, "BLOCK_C": 16, "CHUNK": 32, "num_warps": 1}      # row cut into 4 chunks
ROW_TILES = {"BLOCK_R": 4, "BLOCK_C": 128, "CHUNK": 128, "num_warps": 2}  # several rows per tile
BACKWARD_GRID = ([(F32, opt, cfg) for opt in OPTIONS for cfg in (CHUNKS, ROW_TILES)]
                 + [(dt, "weight+smooth", cfg) for dt, cfg in ((BF16, CHUNKS), (F16, ROW_TILES), (F64, CHUNKS))])


@pytest.mark.parametrize("dtype,opt,config", BACKWARD_GRID,
                         ids=lambda p: ("chunks" if p is CHUNKS else "row-tiles") if isinstance(p, dict)
                         else str(p).replace("torch.", ""))
def test_backward_kernel_matches_torch_grad(dtype, opt, config, gen):
    x = rand((9, 100), gen, dtype)
    t = targets((9,), 100, gen)
    kw = kwargs_for(opt, 100, gen, dtype)
    eps, w = kw.get("label_smoothing", 0.0), kw.get("weight")
    g = rand((9,), gen, CE.stats_dtype(dtype), 1.0)
    stats = CE.cross_entropy_forward_reference(x.double(), t, -100, eps, None if w is None else w.double())
    stats = stats.to(CE.stats_dtype(dtype))
    dx = BACKWARD_OP.variant("triton_tiled").run(config, g, x, t, stats, -100, eps, w)
    check(dx, oracle_grad(x, t, g, **kw), dtype)
    assert (dx[t == -100] == 0).all()


@pytest.mark.parametrize("fused", ["triton_fused", "triton_two_pass"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_autograd_through_the_kernels(reduction, fused, gen):
    x = rand((2, 3, 5, 4), gen)  # [N, C, d1, d2]: classes on dim 1
    t = targets((2, 5, 4), 3, gen)
    w = torch.rand(3, generator=gen) + 0.5
    g = rand((2, 5, 4), gen, F32, 1.0) if reduction == "none" else None
    xo = x.clone().requires_grad_()
    # none: forward op + backward kernel; mean / sum: the fused op (one kernel, or two).
    with force_variant(FWD, "triton_online"), force_variant(BWD, "triton_tiled"), force_variant(FUSED, fused):
        out = cross_entropy(xo, t, weight=w, reduction=reduction, label_smoothing=0.15)
        (dx,) = torch.autograd.grad(out, xo, g)
    check(out, oracle(x, t, reduction, weight=w, label_smoothing=0.15), F32)
    check(dx, oracle_grad(x, t, g, reduction, weight=w, label_smoothing=0.15), F32)


@pytest.mark.parametrize("variant", ["triton_fused", "triton_two_pass"])
@pytest.mark.parametrize("opt", ["plain", "weight+smooth"])
@pytest.mark.parametrize("dtype", [F32, BF16, F64], ids=str)
def test_fused_kernel_writes_stats_and_gradient(dtype, opt, variant, gen):
    """The same statistics as the forward kernel, and the gradient of the reduced
    loss (row scale 1 / 7 here) swept over several blocks: in one pass, or in the
    forward then the backward kernel."""
    x = rand((5, 70), gen, dtype)
    t = targets((5,), 70, gen)
    kw = kwargs_for(opt, 70, gen, dtype)
    eps, w = kw.get("label_smoothing", 0.0), kw.get("weight")
    stats = torch.full((3, 5), float("nan"), dtype=CE.stats_dtype(dtype))
    scale = torch.full((1,), 1 / 7, dtype=CE.stats_dtype(dtype))
    config = {"BLOCK_R": 1, "BLOCK_C": 16, "num_warps": 1} | ({"CHUNK": 32} if variant == "triton_two_pass" else {})
    dx = FUSED_OP.variant(variant).run(config, x, t, stats, scale, -100, eps, w)
    check(stats[0].to(dtype), oracle(x, t, **kw), dtype)
    check(dx, oracle_grad(x, t, reduction="sum", **kw) / 7, dtype)
    assert (dx[t == -100] == 0).all()


# ---------------------------------------------------------------------------
# Numerics and special values
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_online", "triton_split"])
def test_logits_near_1e4_do_not_overflow(variant, gen):
    x = rand((4, 64), gen, F32, 1.0) + 1e4
    x[1] = rand((64,), gen, F32, 1e4)
    t = targets((4,), 64, gen, frac=0.0)
    for eps in (0.0, 0.1):
        stats = run_forward(variant, x, t, -100, eps, None, SMALL[variant])
        assert torch.isfinite(stats).all()
        check(stats[0], oracle(x, t, label_smoothing=eps), F32)
        g = torch.ones(4)
        dx = BACKWARD_OP.variant("triton_tiled").run(
            {"BLOCK_R": 1, "BLOCK_C": 32, "CHUNK": 64, "num_warps": 1}, g, x, t, stats, -100, eps)
        check(dx, oracle_grad(x, t, g, label_smoothing=eps), F32)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("variant", ["triton_online", "triton_split"])
def test_nan_and_inf_behave_as_torch(variant, eps, gen):
    inf, nan = float("inf"), float("nan")
    x = rand((8, 40), gen)
    t = torch.tensor([1, 2, 3, 4, 5, 6, 7, -100])
    x[0, 3] = nan              # NaN elsewhere in the row: NaN loss
    x[1, 7] = inf              # +inf: NaN loss
    x[2, :] = -inf             # all -inf: NaN loss
    x[3, :20] = -inf           # -inf before finite values (not the target)
    x[4, 5] = -inf             # -inf target logit: +inf loss
    x[5, 0] = -inf             # one -inf non-target: finite without smoothing, +inf with
    x[7, :] = nan              # ignored row of NaN: 0
    want = oracle(x, t, label_smoothing=eps)
    stats = run_forward(variant, x, t, -100, eps, None, SMALL[variant])
    torch.testing.assert_close(stats[0].double(), want, equal_nan=True)
    if variant == "triton_split":
        return  # the gradient is the backward kernel's, checked below with the online forward
    # Gradients: rows with -inf logits match torch's; NaN / +inf rows are NaN.
    xr = x.clone().requires_grad_()
    with force_variant(FWD, variant), force_variant(BWD, "triton_tiled"):
        cross_entropy(xr, t, reduction="sum", label_smoothing=eps).backward()
    want_g = oracle_grad(x, t, reduction="sum", label_smoothing=eps)
    torch.testing.assert_close(xr.grad[[3, 4, 5, 6]].double(), want_g[[3, 4, 5, 6]], equal_nan=True)
    assert torch.isnan(xr.grad[:3]).any(dim=1).all()
    # By design the ignored row's gradient is exactly 0: its logits are never
    # read (torch's is NaN there, from log_softmax's backward of NaN logits).
    assert (xr.grad[7] == 0).all()


def test_fp16_extremes_round_once(gen):
    x = rand((5, 64), gen, F16, 4.0)
    t = targets((5,), 64, gen, frac=0.0)
    with force_variant(FWD, "triton_online"):
        check(cross_entropy(x, t, reduction="none"), oracle(x, t), F16)


# ---------------------------------------------------------------------------
# Layouts, empty and size-1
# ---------------------------------------------------------------------------
def test_layouts_and_noncontiguous(gen):
    """The layout is the ops layer's (shared by the forward variants): one variant suffices."""
    variant = "triton_online"
    cases = []
    x = rand((40, 9), gen).t()                                   # class stride 9: copied
    cases.append((x, targets((9,), 40, gen)))
    s = rand((7, 60), gen)[:, ::2]                               # class stride 2: copied
    cases.append((s, targets((7,), 30, gen)))
    r = rand((10, 64), gen)[::2, 3:50]                           # row stride 128, unit class stride: a view
    cases.append((r, targets((5,), 47, gen)))
    n = rand((2, 11, 2, 2), gen)                                 # [N, C, d1, d2]
    cases.append((n, targets((2, 2, 2), 11, gen)))
    cl = rand((2, 2, 2, 11), gen).permute(0, 3, 1, 2)            # channels-last: classes innermost, a view
    cases.append((cl, targets((2, 2, 2), 11, gen)))
    v = rand((17,), gen)                                         # [C] with a 0-dim target
    cases.append((v, torch.tensor(6)))
    tnc = targets((14,), 12, gen)[::2]                           # non-contiguous target
    cases.append((rand((7, 12), gen), tnc))
    with force_variant(FWD, variant), force_variant(BWD, "triton_tiled"):
        for x, t in cases:
            check(cross_entropy(x, t, reduction="none", label_smoothing=0.1),
                  oracle(x, t, "none", label_smoothing=0.1), F32)
            xr = x.detach().clone().requires_grad_()
            cross_entropy(xr, t, label_smoothing=0.1).backward()
            check(xr.grad, oracle_grad(x, t, reduction="mean", label_smoothing=0.1), F32)


@pytest.mark.parametrize("variant", ["triton_online", "triton_split"])
def test_empty_size_one_and_all_ignored(variant):
    with force_variant(FWD, variant), force_variant(BWD, "triton_tiled"):
        x0, t0 = torch.empty(0, 5), torch.empty(0, dtype=torch.long)
        assert cross_entropy(x0, t0, reduction="none").shape == (0,)
        assert float(cross_entropy(x0, t0, reduction="sum")) == 0.0
        assert torch.isnan(cross_entropy(x0, t0))
        no_rows = cross_entropy(torch.empty(2, 5, 0), torch.empty(2, 0, dtype=torch.long), reduction="none")
        assert no_rows.shape == (2, 0)
        x1 = torch.tensor([[0.5]], requires_grad=True)         # one class: loss 0, grad 0
        out = cross_entropy(x1, torch.tensor([0]))
        out.backward()
        assert float(out.detach()) == 0.0 and float(x1.grad) == 0.0
        xs = torch.linspace(-1, 1, 8).reshape(1, 8)
        check(cross_entropy(xs, torch.tensor([3])), oracle(xs, torch.tensor([3]), "mean"), F32)
        xa = torch.randn(4, 6, requires_grad=True)
        ta = torch.full((4,), -100)
        assert torch.isnan(cross_entropy(xa, ta))               # 0 / 0, as torch
        assert float(cross_entropy(xa, ta, reduction="sum").detach()) == 0.0
        cross_entropy(xa, ta, reduction="sum").backward()
        assert (xa.grad == 0).all()


def test_custom_ignore_index_inside_the_class_range(gen):
    x = rand((12, 6), gen)
    t = torch.randint(0, 6, (12,), generator=gen)
    with force_variant(FWD, "triton_online"):
        for red in ("none", "mean"):
            check(cross_entropy(x, t, ignore_index=2, reduction=red, label_smoothing=0.2),
                  oracle(x, t, red, ignore_index=2, label_smoothing=0.2), F32)


# ---------------------------------------------------------------------------
# Launch geometry
# ---------------------------------------------------------------------------
def test_int64_offsets_flag():
    from opforge.kernels.cross_entropy import needs_int64

    small, big = torch.empty(4, 8), torch.empty_strided((2, 8), (2**31, 1), device="meta")
    assert not needs_int64(4, 8, (small,), 32)
    assert needs_int64(2, 8, (big,), 32)
    # 32768 x 128256 logits: 4.2 G elements.
    huge = torch.empty_strided((32768, 128256), (128256, 1), device="meta")
    assert needs_int64(32768, 128256, (huge,), 4096)


def test_default_configs_fill_the_gpu_and_cap_the_tile():
    from opforge.kernels import cross_entropy as K

    for rows, cols in ((8192, 32000), (16384, 128256), (4096, 128256), (64, 1000), (100000, 7)):
        for cfg in (K.online_default_config(rows, cols), K.fused_default_config(rows, cols)):
            assert cfg["BLOCK_R"] * cfg["BLOCK_C"] <= K.MAX_TILE
        b = K.backward_default_config(rows, cols)
        assert b["BLOCK_R"] * b["BLOCK_C"] <= K.MAX_TILE and b["CHUNK"] >= b["BLOCK_C"]
        for c in K.online_configs(rows, cols) + K.backward_configs(rows, cols):
            assert c["BLOCK_R"] * c["BLOCK_C"] <= K.MAX_TILE
    # A few long rows: the split covers the row in enough programs, the backward chunks it.
    s = K.split_default_config(8, 128256)
    assert 8 * K.split_parts(128256, s["CHUNK"]) >= 132 and K.split_parts(128256, s["CHUNK"]) <= K.MAX_SPLITS
    b = K.backward_default_config(8, 128256)
    assert 8 * K.split_parts(128256, b["CHUNK"]) >= 132
