"""Wave kernels (``kernels.waves``) under the interpreter, against float64 torch.

Small shapes reaching every path: several pieces a row with a ragged last
piece, several waves with a partial last one, a row of -inf (NaN as in
torch), and the device gate (dispatch takes the variants only with
``OPFORGE_ROWS=1``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from opforge.bench.case import rel_err
from opforge.kernels import norm as NK
from opforge.kernels import softmax as SK
from opforge.kernels import waves
from opforge.ops import device_gate
from opforge.runtime import dispatch

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# 3 rows of 300 columns in pieces of 128 (3 a row, the last ragged) and waves
# of 2 rows: 2 waves, the last one half empty.
ROWS, COLS, CFG = 3, 300, {"CHUNK": 128, "WAVE_ROWS": 2, "num_warps": 4}


@triton.jit
def _roles_kernel(out_ptr, n, W):
    is_stats, wave, idx = waves.wave_role(tl.program_id(0), n, W)
    pid = tl.program_id(0)
    tl.store(out_ptr + 3 * pid, is_stats.to(tl.int32))
    tl.store(out_ptr + 3 * pid + 1, wave)
    tl.store(out_ptr + 3 * pid + 2, idx)


def test_wave_roles_cover_every_piece_once_with_applies_after_their_stats():
    n, W = 2, 3
    out = torch.empty(2 * W * n, 3, dtype=torch.int32)
    _roles_kernel[(2 * W * n,)](out, n, W)
    roles = [tuple(r) for r in out.tolist()]  # in launch order
    assert sorted(roles) == sorted((s, w, i) for s in (0, 1) for w in range(W) for i in range(n))
    for k, (stats, wave, _) in enumerate(roles):
        if not stats:
            assert all(roles.index((1, wave, i)) < k for i in range(n))
    assert waves.wave_plan(5, 3, 2) == (2, 3, 36)


@triton.jit
def _pairs_kernel(lo_ptr, hi_ptr, word_ptr, out_ptr, N: tl.constexpr):
    i = tl.program_id(0)
    waves.wave_publish_pair(word_ptr + i, tl.load(lo_ptr + i), tl.load(hi_ptr + i))
    if i == tl.num_programs(0) - 1:
        k = tl.arange(0, N)
        lo, hi = waves.wave_gather_pairs(word_ptr + k, k < tl.num_programs(0))
        tl.store(out_ptr + k, lo)
        tl.store(out_ptr + N + k, hi)


def test_packed_pairs_round_trip_every_float_and_start_pending():
    lo = torch.tensor([1.5, float("-inf"), float("nan"), -0.0, 3.4e38, -2.0])
    hi = torch.tensor([0.0, 7.25, float("nan"), float("inf"), 1e-40, 5.0])
    assert bool((waves.pending_words(3, "cpu") >> 32).to(torch.int32).view(torch.float32).eq(-1.0).all())
    words = waves.pending_words(8, "cpu")
    out = torch.full((16,), 9.0)
    _pairs_kernel[(6,)](lo, hi, words, out, N=8)
    assert torch.equal(out[:6].view(torch.int32), lo.view(torch.int32))
    assert torch.equal(out[8:14].view(torch.int32), hi.view(torch.int32))
    assert torch.equal(out[6:8], torch.zeros(2)) and torch.equal(out[14:], torch.zeros(2))  # masked lanes


@pytest.mark.parametrize("dtype,log,packed", [(torch.float32, False, 1), (torch.bfloat16, True, 0)])
def test_softmax_wave_matches_torch(dtype, log, packed, gen):
    x = (torch.randn((ROWS, COLS), generator=gen, dtype=torch.float64) * 4).to(dtype)
    x[1] = float("-inf")
    y = torch.empty_like(x)
    SK.launch_wave_forward(x, y, log, dict(CFG, PACKED=packed))
    ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    assert torch.isnan(y[1]).all()
    assert rel_err(y[[0, 2]], ref[[0, 2]]) <= (1e-2 if dtype == torch.bfloat16 else 1e-6)


@pytest.mark.parametrize("is_rms,packed", [(False, 1), (True, 1), (False, 0)])
def test_norm_wave_matches_torch(is_rms, packed, gen):
    x = torch.randn((ROWS, COLS), generator=gen, dtype=torch.float64).float() * 3 + 5
    w = torch.rand(COLS, generator=gen) + 0.5
    b = None if is_rms else torch.randn(COLS, generator=gen)
    y, rstd = torch.empty_like(x), torch.empty(ROWS)
    mean = None if is_rms else torch.empty(ROWS)
    NK.launch_fwd_wave(x, y, w, b, mean, rstd, 1e-5, is_rms, dict(CFG, PACKED=packed))
    x64 = x.double()
    ref = F.rms_norm(x64, (COLS,), w.double(), 1e-5) if is_rms else F.layer_norm(x64, (COLS,), w.double(),
                                                                                 b.double(), 1e-5)
    assert rel_err(y, ref) <= 1e-5
    var = (x64 * x64).mean(-1) if is_rms else x64.var(-1, unbiased=False)
    assert rel_err(rstd, torch.rsqrt(var + 1e-5)) <= 1e-5
    if not is_rms:
        assert rel_err(mean, x64.mean(-1)) <= 1e-6


def test_wave_variants_are_gated_until_measured(monkeypatch):
    long = torch.empty((2, SK.ROW_LIMIT + 1))
    monkeypatch.setitem(device_gate.MEASURED, "triton_wave", False)
    monkeypatch.delenv("OPFORGE_ROWS", raising=False)
    assert "OPFORGE_ROWS" in dispatch.explain("softmax", long, -1).rejected["triton_wave"]
    assert "OPFORGE_ROWS" in dispatch.explain("rms_norm", long, (SK.ROW_LIMIT + 1,), 1e-5).rejected["triton_wave"]
    monkeypatch.setenv("OPFORGE_ROWS", "1")
    dispatch.reset()
    assert dispatch.explain("softmax", long, -1).variant.name == "triton_wave"
    assert dispatch.explain("rms_norm", long, (SK.ROW_LIMIT + 1,), 1e-5).variant.name == "triton_wave"

