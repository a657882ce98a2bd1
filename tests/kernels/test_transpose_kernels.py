"""Transpose/permute kernels under the Triton interpreter: each variant forced
(or run directly with small tiles, so a few dozen rows take several tiles and
ragged edges), every element size, layouts that reach every plan shape. The
oracle is torch's own ``permute(...).contiguous()``; a data move must be
bit-exact, so results are compared bitwise (NaN payloads, -0.0 included).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from opforge.kernels import transpose as K
from opforge.ops import transpose as T
from opforge.ops.transpose import OPS, permute, transpose
from opforge.runtime import dispatch
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
DTYPES = (F32, BF16, F16, F64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)
VARIANTS = ("triton_tiled", "triton_gather")

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),  # interpreter
]


def rand(shape, gen, dtype=F32):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=F64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -10**6), min(info.max, 10**6), shape, generator=gen,
                         dtype=torch.int64).to(dtype)


def bits(t):
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(out, want):
    """Same shape, dtype, contiguous, bit for bit."""
    assert out.shape == want.shape and out.dtype == want.dtype
    assert out.is_contiguous()
    assert torch.equal(bits(out), bits(want.contiguous())), "values differ"


def run(variant, cfg, x, d0, d1):
    return OPS["transpose"].variant(variant).run(cfg, x, d0, d1)


# ---------------------------------------------------------------------------
# Every dtype through both kernels
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_matrix_every_dtype(variant, dtype, gen):
    x = rand((37, 70), gen, dtype)
    with force_variant("transpose", variant):
        same(transpose(x, 0, 1), x.t())
        same(transpose(x, -1, -2), x.t())


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int8, F64], ids=str)
def test_tiled_many_small_tiles_and_ragged_edges(dtype, gen):
    x = rand((45, 70), gen, dtype)       # 3 x 5 tiles of 16x16, both edges ragged
    same(run("triton_tiled", {"TILE_R": 16, "TILE_C": 16, "num_warps": 1}, x, 0, 1), x.t())
    b = rand((2, 40, 2, 33), gen, dtype)  # batch dims ride along (B, R, M, C) -> (B, C, M, R)
    same(run("triton_tiled", {"TILE_R": 8, "TILE_C": 16, "num_warps": 1}, b, 1, 3), b.transpose(1, 3))


@pytest.mark.parametrize("dtype", [F32, BF16, torch.int8], ids=str)
def test_gather_many_small_blocks(dtype, gen):
    x = rand((9, 5, 70), gen, dtype)      # strided copy: rows of 70, 2 column blocks each
    same(run("triton_gather", {"BLOCK_R": 4, "BLOCK_C": 64, "num_warps": 1}, x, 0, 1), x.transpose(0, 1))
    y = rand((11, 3, 7), gen, dtype)      # tiny planes: inner dim read at stride 7
    same(run("triton_gather", {"BLOCK_R": 8, "BLOCK_C": 2, "num_warps": 1}, y, 1, 2), y.transpose(1, 2))


# ---------------------------------------------------------------------------
# Layouts: every pair of dims, non-contiguous inputs, permutations
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pair_of_dims_4d(variant, gen):
    x = rand((3, 4, 33, 34), gen, F32)
    with force_variant("transpose", variant):
        for d0, d1 in list(itertools.combinations(range(4), 2)) + [(-1, 0), (-2, -1), (3, -1)]:
            if dispatch.reject_reason(OPS["transpose"], OPS["transpose"].variant(variant), (x, d0, d1)):
                assert variant == "triton_tiled"   # a strided copy: the gather kernel's
                continue
            same(transpose(x, d0, d1), x.transpose(d0, d1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_noncontiguous_inputs_read_in_place(variant, gen):
    base = rand((40, 90), gen, F32)
    inputs = [
        base.t(),                                   # a transposed input: back to a plain copy
        base[3:, 5:80],                             # storage offset, row stride 90
        rand((5, 40, 66), gen, F32)[:, :, 1:65],    # batched, ragged rows
        rand((33, 1), gen, F32).expand(33, 40),     # stride 0
        rand((6, 8, 40), gen, F32).permute(2, 0, 1),  # a permuted input
    ]
    for x in inputs:
        d = dispatch.explain("transpose", x, 0, 1)
        if variant in d.rejected:
            continue
        with force_variant("transpose", variant):
            same(transpose(x, 0, 1), x.transpose(0, 1))
            same(transpose(x, -1, 0), x.transpose(-1, 0))


def test_input_without_unit_stride_goes_to_gather(gen):
    x = rand((40, 90), gen, F32)[:, ::3]
    d = dispatch.explain("transpose", x, 0, 1)
    assert d.variant.name == "triton_gather"
    assert "unit stride" in d.rejected["triton_tiled"]
    same(transpose(x, 0, 1), x.t())


@pytest.mark.parametrize("variant", VARIANTS)
def test_permutations(variant, gen):
    # tiled: the planes must reach 1024 elements; gather: all 24 on a small tensor.
    x = rand((2, 3, 40, 33), gen, BF16) if variant == "triton_tiled" else rand((2, 3, 4, 5), gen, BF16)
    seen = 0
    with force_variant("permute", variant):
        for perm in itertools.permutations(range(4)):
            if dispatch.reject_reason(OPS["permute"], OPS["permute"].variant(variant), (x, perm)):
                continue
            same(permute(x, perm), x.permute(perm))
            seen += 1
    # tiled: of the 18 that move the innermost dim, those with a big enough plane
    assert 6 <= seen < 18 if variant == "triton_tiled" else seen == 24
    if variant == "triton_gather":
        y = rand((2, 3, 2, 3, 2, 5), gen, F32)          # six dims, nothing merges
        same(permute(y, (5, 3, 1, 0, 2, 4)), y.permute(5, 3, 1, 0, 2, 4))


def test_tall_skinny_and_short_wide(gen):
    for shape in ((1500, 3), (3, 1500), (2000, 1), (7, 200)):
        x = rand(shape, gen, F32)
        for v in VARIANTS:
            if shape == (2000, 1) and v == "triton_tiled":
                continue   # a size-1 dim: a plain copy
            with force_variant("transpose", v):
                same(transpose(x, 0, 1), x.t())


# ---------------------------------------------------------------------------
# Values: NaN payloads, infinities, signed zeros
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_special_values_bit_exact(variant, dtype, gen):
    x = rand((33, 40), gen, dtype)
    x[0, 1], x[2, 3], x[4, 5], x[6, 7] = float("nan"), float("inf"), float("-inf"), -0.0
    payload = bits(x)
    payload[8, 9] = payload[0, 1] | 1    # a NaN with another payload bit set
    payload[10, 11] = payload[0, 1] | 3
    with force_variant("transpose", variant):
        out = transpose(x, 0, 1)
    same(out, x.t())
    assert torch.signbit(out[7, 6]) and out[7, 6] == 0
    assert int(bits(out)[9, 8]) == int(payload[8, 9])


# ---------------------------------------------------------------------------
# Empty, size-1, 0-dim
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_empty_and_size_one(variant, gen):
    with force_variant("transpose", variant):
        for shape, d0, d1 in (((0, 5), 0, 1), ((5, 0), 0, 1), ((2, 0, 3), 0, 2), ((1, 40), 0, 1),
                              ((40, 1), 0, 1), ((1, 1), 0, 1), ((3, 1, 50), 1, 2), ((), 0, 0), ((), -1, 0),
                              ((4, 5), 1, 1)):
            x = rand(shape, gen, F32)
            if dispatch.reject_reason(OPS["transpose"], OPS["transpose"].variant(variant), (x, d0, d1)):
                assert variant == "triton_tiled"
                continue
            out = transpose(x, d0, d1)
            same(out, x.transpose(d0, d1))
            if x.numel():
                assert out.data_ptr() != x.data_ptr()   # always a new tensor


# ---------------------------------------------------------------------------
# Plans, geometry, configs, 64-bit offsets
# ---------------------------------------------------------------------------
def test_plan_merges_dims():
    assert K.plan((4, 5, 6), (30, 6, 1), (0, 1, 2)).dims == ((120, 1),)                  # a flat copy
    assert K.plan((4, 5), (5, 1), (1, 0)).dims == ((5, 1), (4, 5))
    assert K.plan((2, 3, 4, 5), (60, 20, 5, 1), (0, 3, 2, 1)).dims == ((2, 60), (5, 1), (4, 5), (3, 20))
    assert K.plan((8, 6, 10), (60, 10, 1), (1, 0, 2)).dims == ((6, 10), (8, 60), (10, 1))  # strided copy
    assert K.plan((3, 1, 4), (4, 4, 1), (2, 1, 0)).dims == ((4, 1), (3, 4))                # size 1 dropped
    assert K.plan((), (), ()).dims == ((1, 1),)
    assert K.plan((5, 7), (0, 1), (1, 0)).dims == ((7, 1), (5, 0))                         # broadcast input


def test_tiled_geometry_and_reasons():
    g = K.tiled_geometry(K.plan((2, 8, 4, 256), (8192, 1024, 256, 1), (0, 3, 2, 1)))
    assert (g.R, g.C, g.in_sr, g.out_sc) == (8, 256, 1024, 32)
    assert g.batch == ((2, 8192, 8192), (4, 256, 8)) and g.planes == 8
    assert "strided copy" in K.tiled_geometry(K.plan((8, 6, 10), (60, 10, 1), (1, 0, 2)))
    assert "unit stride" in K.tiled_geometry(K.plan((40, 30), (90, 3), (1, 0)))
    assert "under" in K.tiled_geometry(K.plan((50, 3, 7), (21, 7, 1), (0, 2, 1)))
    six = K.plan((2, 3, 2, 3, 64, 64), (73728, 24576, 12288, 4096, 64, 1), (0, 2, 1, 3, 5, 4))
    assert len(six.dims) == 6 and "batch dims" in K.tiled_geometry(six)
    assert K.gather_check(six) is None
    assert "exceed" in K.gather_check(K.plan((2,) * 8, tuple(2 ** i for i in range(8)), tuple(range(8))))


def test_default_configs_fill_the_gpu_and_stay_small():
    for es, shape in ((4, (16384, 16384)), (2, (32768, 8192)), (1, (4096, 4096)), (8, (4096, 4096)),
                      (4, (1 << 26, 3)), (4, (3, 1 << 26)), (2, (256, 256))):
        p = K.plan(shape, (shape[1], 1), (1, 0))
        g = K.tiled_geometry(p)
        cfg = K.tiled_default_config(g, es)
        elems = cfg["TILE_R"] * cfg["TILE_C"]
        assert elems * es <= 32768 and elems <= 16384
        programs = g.planes * -(-g.R // cfg["TILE_R"]) * -(-g.C // cfg["TILE_C"])
        assert programs >= K.TARGET_PROGRAMS or elems <= 1024
        assert all(c["TILE_R"] * c["TILE_C"] * es <= 32768 for c in K.tiled_configs(g, es))
    p = K.plan((8192, 64, 1024), (65536, 1024, 1), (1, 0, 2))
    cfg = K.gather_default_config(p, 2)
    assert cfg["BLOCK_C"] == 1024 and cfg["BLOCK_R"] * cfg["BLOCK_C"] * 2 <= 32768


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_autotune_config_is_correct(variant, gen):
    x = rand((40, 67), gen, BF16)
    v = OPS["transpose"].variant(variant)
    cfgs = v.configs(x, 0, 1)
    assert len(cfgs) >= 2
    for cfg in cfgs:
        same(v.run(cfg, x, 0, 1), x.t())


def test_int64_offsets(gen, monkeypatch):
    big = K.Plan(((1 << 16, 1), (1 << 16, 1 << 16)), 1 << 32, 1 << 32)
    assert K.needs_int64(big, 4096)
    assert not K.needs_int64(K.plan((64, 64), (64, 1), (1, 0)), 4096)
    # The INT64 code path itself, on small tensors: lower the threshold.
    monkeypatch.setattr(K, "_INT32_MAX", 16)
    x = rand((3, 29, 37), gen, F32)
    cfg = {"TILE_R": 16, "TILE_C": 16, "BLOCK_R": 4, "BLOCK_C": 16, "num_warps": 1}
    for v in VARIANTS:
        same(run(v, cfg, x, 1, 2), x.transpose(1, 2))
    same(run("triton_gather", cfg, x, 0, 1), x.transpose(0, 1))


# ---------------------------------------------------------------------------
# Dispatch decisions and the bench module
# ---------------------------------------------------------------------------
def test_dispatch_decisions(gen):
    cases = [
        ((rand((64, 96), gen), 0, 1), "triton_tiled"),
        ((rand((4, 32, 48), gen, BF16), 1, 2), "triton_tiled"),
        ((rand((512, 3), gen), 0, 1), "triton_tiled"),            # tall-skinny: one tile side padded
        ((rand((16, 4, 64), gen), 0, 1), "triton_gather"),        # strided copy
        ((rand((50, 3, 7), gen), 1, 2), "triton_gather"),         # tiny planes
        ((rand((5, 6), gen), 0, 1), "triton_gather"),
    ]
    for args, want in cases:
        d = dispatch.explain("transpose", *args)
        assert d.variant.name == want, (args[0].shape, str(d))
        assert "torch_eager" in d.rejected   # CUDA only
    d = dispatch.explain("permute", rand((4, 8, 64), gen), (2, 0, 1))
    assert d.variant.name == "triton_tiled"


def test_bench_quick_cases_are_correct():
    from opforge.bench import transpose as B
    from opforge.bench.case import rel_err

    dev = torch.device("cpu")
    for case in B.cases(dev, quick=True):
        args = case.make_args(dev)
        out = case.run(*args)
        assert rel_err(out, case.reference(*args)) == 0.0
        assert case.nbytes == 2 * args[0].numel() * args[0].element_size() and case.flops == 0
    for case in B.crossover_cases(dev, quick=True):
        args = case.make_args(dev)
        assert dispatch.reject_reason(OPS["transpose"], OPS["transpose"].variant(case.variant), args) is None
