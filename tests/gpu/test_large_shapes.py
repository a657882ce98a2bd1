"""Shapes the interpreter cannot reach: rows split across cooperating programs,
and tensors past 2**31 elements (64-bit offsets). Skipped without CUDA; run on
the lent H200 with ``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu``."""

import os

import pytest
import torch

import opforge
from opforge.ops.softmax import REFERENCE
from opforge.runtime import dispatch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)

BIG = 2**31 + 4099  # past the int32 offset range, not a multiple of any block


def _close(out, want, tol):
    err = (out.double() - want.double()).norm() / want.double().norm()
    assert float(err) <= tol, float(err)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(64, 262144), (300, 70001), (3, 1048576)])
def test_split_softmax_matches_torch(name, shape):
    x = torch.randn(shape, device="cuda") * 4
    x[1, 5] = float("nan")
    d = dispatch.explain(name, x, -1)
    assert d.variant.name == "triton_split", d.rejected
    fn, ref = getattr(opforge, name), getattr(torch, name)
    out, want = fn(x, -1), ref(x.double(), -1)
    assert torch.isnan(out[1]).all()
    keep = torch.ones(shape[0], dtype=torch.bool, device="cuda")
    keep[1] = False
    _close(out[keep], want[keep], 1e-5)
    g = torch.randn_like(x)
    back = getattr(torch.ops.opforge, f"{name}_backward")
    oracle = REFERENCE[f"{name}_backward"]
    y = ref(x[keep], -1)
    assert dispatch.explain(f"{name}_backward", g[keep], y, -1).variant.name == "triton_split"
    _close(back(g[keep], y, -1), oracle(g[keep].double(), y.double(), -1), 1e-5)


def test_split_softmax_is_the_same_across_runs():
    x = torch.randn(128, 200000, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(opforge.softmax(x), opforge.softmax(x))


def test_elementwise_past_int32_offsets():
    x = torch.full((BIG,), 0.5, device="cuda", dtype=torch.bfloat16)
    x[-1] = 2.0
    y = opforge.mul(x, 3.0)
    assert float(y[-1]) == 6.0 and float(y[0]) == 1.5 and float(y[2**31 + 7]) == 1.5


def test_softmax_and_norm_past_int32_offsets():
    rows, cols = BIG // 8192 + 1, 8192
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    tail = slice(rows - 3, rows)
    _close(opforge.softmax(x)[tail], torch.softmax(x[tail].float(), -1), 1e-2)
    _close(opforge.rms_norm(x, (cols,), eps=1e-6)[tail],
           torch.nn.functional.rms_norm(x[tail].float(), (cols,), eps=1e-6), 1e-2)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4096, 4096), 0), ((8, 20000, 96), 1), ((3000, 7), 0)])
def test_column_split_softmax_matches_torch(name, shape, dim):
    x = torch.randn(shape, device="cuda") * 4
    d = dispatch.explain(name, x, dim)
    assert d.variant.name == "triton_col_split", d.rejected
    fn, ref = getattr(opforge, name), getattr(torch, name)
    out = fn(x, dim)
    assert out.is_contiguous()
    _close(out, ref(x.double(), dim), 1e-5)
    g = torch.randn_like(x)
    y = ref(x, dim)
    back = getattr(torch.ops.opforge, f"{name}_backward")
    _close(back(g, y, dim), REFERENCE[f"{name}_backward"](g.double(), y.double(), dim), 1e-5)


def test_norms_past_int32_offsets_on_every_row_kernel():
    import torch.nn.functional as F

    for cols, variant in ((8192, "triton_row"), (65536, "triton_split")):
        rows = 2**31 // cols + 2
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        tail = slice(rows - 4, rows)
        with dispatch.force_variant("rms_norm", variant), dispatch.force_variant("layer_norm", variant):
            _close(opforge.rms_norm(x, (cols,), eps=1e-6)[tail], F.rms_norm(x[tail].float(), (cols,), eps=1e-6), 1e-2)
            _close(opforge.layer_norm(x, (cols,))[tail], F.layer_norm(x[tail].float(), (cols,)), 1e-2)
        del x
    rows = 2**31 // 8192 + 2
    x = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    out, new_res = opforge.add_rms_norm(x, r, (8192,), eps=1e-6)
    tail = slice(rows - 4, rows)
    assert torch.equal(new_res[tail], x[tail] + r[tail])
    _close(out[tail], F.rms_norm((x[tail] + r[tail]).float(), (8192,), eps=1e-6), 1e-2)


def test_add_rms_norm_is_exact_on_the_residual_and_replays_in_a_graph():
    x = torch.randn(256, 65536, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(65536, device="cuda", dtype=torch.bfloat16) + 0.5
    out, new_res = opforge.add_rms_norm(x, r, (65536,), w, eps=1e-6)
    assert torch.equal(new_res, x + r)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_res = opforge.add_rms_norm(x, r, (65536,), w, eps=1e-6)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_res, x + r)
    _close(g_out, torch.nn.functional.rms_norm((x + r).float(), (65536,), w.float(), eps=1e-6), 1e-2)


def test_transpose_past_int32_offsets():
    x = torch.arange(BIG, device="cuda", dtype=torch.int32)[: (BIG // 4096) * 4096].view(-1, 4096)
    out = opforge.transpose(x, 0, 1)
    assert out.shape == (4096, x.shape[0]) and out.is_contiguous()
    assert torch.equal(out[:, -3:], x[-3:].t()) and torch.equal(out[-2:, :5], x[:5, -2:].t())


def test_reductions_and_cross_entropy_past_int32_offsets():
    x = torch.ones(BIG, device="cuda", dtype=torch.int8)
    x[-1] = 5
    assert int(opforge.sum(x)) == BIG + 4  # int8 sums in int64: exact
    assert int(opforge.argmax(x)) == BIG - 1
    f = x.to(torch.bfloat16)
    assert int(opforge.argmax(f)) == BIG - 1 and float(opforge.amax(f)) == 5.0
    rows, cols = 2**31 // 32000 + 2, 32000
    logits = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, cols, (rows,), device="cuda")
    loss = opforge.cross_entropy(logits, target, reduction="none")
    tail = slice(rows - 4, rows)
    _close(loss[tail], torch.nn.functional.cross_entropy(logits[tail].float(), target[tail], reduction="none"), 1e-2)


def test_cumsum_past_int32_offsets():
    x = torch.ones(BIG, device="cuda", dtype=torch.int8)
    out = opforge.cumsum(x, 0)
    assert out.dtype == torch.int64
    assert int(out[-1]) == BIG and int(out[2**31]) == 2**31 + 1 and int(out[0]) == 1


@pytest.mark.parametrize("variant", ["triton_lookback", "triton_reduce_scan"])
def test_tile_scans_match_torch_on_long_rows(variant):
    x = torch.randn(3, 5_000_003, device="cuda")
    with dispatch.force_variant("cumsum", variant):
        out = opforge.cumsum(x, -1)
    _close(out, torch.cumsum(x.double(), -1), 1e-4)  # fp32 running sums over 5M terms
    flags = torch.rand(5_000_003, device="cuda") < 0.001
    flags[0] = True
    seg = opforge.segmented_cumsum(x[0], flags=flags)
    starts = torch.cumsum(flags.long(), 0) - 1
    full = torch.cumsum(x[0].double(), 0)
    base = (full - x[0].double())[flags][starts]
    _close(seg, full - base, 1e-5)
    mask = x[1] > 0
    assert torch.equal(opforge.compact(x[1], mask), x[1][mask])
