"""The Nexmark event generator under the Triton interpreter: ``triton_fused`` equals the plain-torch
reference bit for bit for every kind, over index ranges straddling the 50-event period, shuffled
indices with event numbers past 2^32, no skew and a skew of 1 ms, one auction in flight, all or no
bids hot, seeds 0 and 2^32 - 1 and an empty batch. Both are checked against the documented
semantics computed with Python ints (an oracle that is not opforge), and the public function's
argument checks are exercised."""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge.ops import nexmark as N

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning")]

CONFIGS = {"small_blocks": {"BLOCK": 128, "num_warps": 2}, "large_blocks": {"BLOCK": 1024, "num_warps": 4}}
# (seed, events_per_second, skew, auctions_in_flight, hot_per_mille)
PARAMS = [(0, 10_000, 500, 100, 500), (3, 1000, 0, 1, 1000), (N.MAX_SEED, 7, 1, 7, 0)]


def run_triton(cfg, j, kind, *params):
    return N.EVENTS.variant("triton_fused").run(cfg, j, kind, *params)


def run_reference(j, kind, *params):
    return N.EVENTS.reference(j, kind, *params)


# ---------------------------------------------------------------------------
# An oracle in Python ints, from the module's documented semantics
# ---------------------------------------------------------------------------
def hash31(x: int) -> int:
    h = (x ^ (x >> 32)) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return (h ^ (h >> 16)) & 0x7FFFFFFF


def oracle_event(j: int, kind: str, seed: int, eps: int, skew: int, in_flight: int, hot: int) -> list[int]:
    lo, hi = {"person": (0, 1), "auction": (1, 4), "bid": (4, 50)}[kind]
    epoch, rest = divmod(j, hi - lo)
    n = epoch * 50 + lo + rest

    def u(salt):
        return hash31(n * 8 + seed * 1_000_003 + salt)

    ts = n * 1000 // eps + skew - u(0) % (skew + 1)
    newest_person = 1000 + epoch
    if kind == "person":
        cols = [1000 + epoch, u(1) % 50, u(2) % 1000, ts]
    elif kind == "auction":
        initial = 100 + u(3) % 10_000
        cols = [1000 + epoch * 3 + rest, 1000 + u(4) % (newest_person - 999), 10 + u(5) % 5, initial,
                initial + u(6) % 1000, ts, ts + 10_000 + u(7) % 20_000]
    else:
        newest_auction = 1000 + epoch * 3 + 2
        auction = newest_auction if u(8) % 1000 < hot else max(newest_auction - u(9) % in_flight, 1000)
        cols = [auction, 1000 + u(10) % (newest_person - 999), 100 + u(11) % 10_000, ts]
    return cols + [ts]


def indices(gen) -> list[torch.Tensor]:
    return [torch.arange(0, 700, dtype=torch.int64), torch.arange(45, 58, dtype=torch.int64),
            torch.randint(0, 1 << 40, (300,), generator=gen, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)]


# ---------------------------------------------------------------------------
# Triton vs reference vs oracle
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("kind", N.KINDS)
def test_triton_matches_reference(kind, cfg):
    gen = torch.Generator().manual_seed(1)
    for j in indices(gen):
        for params in PARAMS:
            out = run_triton(CONFIGS[cfg], j, kind, *params)
            ref = run_reference(j, kind, *params)
            assert out.dtype == torch.int64 and out.shape == (len(N.FIELDS[kind]) + 1, j.numel())
            assert torch.equal(out, ref), (kind, params, j[:3].tolist())


@pytest.mark.parametrize("kind", N.KINDS)
def test_reference_and_triton_match_python_oracle(kind):
    gen = torch.Generator().manual_seed(2)
    j = torch.cat([torch.arange(0, 60), torch.randint(0, 1 << 40, (40,), generator=gen)])
    for params in PARAMS:
        want = [oracle_event(int(i), kind, *params) for i in j]
        assert run_reference(j, kind, *params).T.tolist() == want
        assert run_triton(CONFIGS["small_blocks"], j, kind, *params).T.tolist() == want


def test_public_function_dispatches_and_checks_its_arguments():
    j = torch.arange(100, dtype=torch.int64)
    got = opforge.nexmark_events(j, "bid", seed=3, events_per_second=1000, skew=20)
    assert torch.equal(got, run_reference(j, "bid", 3, 1000, 20, 100, 500))
    torch.testing.assert_close(torch.ops.opforge.nexmark_events(j, "person", 0, 10, 0, 1, 0),
                               run_reference(j, "person", 0, 10, 0, 1, 0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        opforge.nexmark_events(j, "seller")
    with pytest.raises(TypeError, match="j must be int64"):
        opforge.nexmark_events(j.int(), "bid")
    with pytest.raises(ValueError, match="j must be 1-D"):
        opforge.nexmark_events(j.view(10, 10), "bid")
    with pytest.raises(ValueError, match="events_per_second must be in"):
        opforge.nexmark_events(j, "bid", events_per_second=0)
    with pytest.raises(ValueError, match="hot_per_mille must be in"):
        opforge.nexmark_events(j, "bid", hot_per_mille=1001)
    with pytest.raises(ValueError, match="seed must be in"):
        opforge.nexmark_events(j, "bid", seed=-1)
    with pytest.raises(TypeError, match="skew must be an int"):
        opforge.nexmark_events(j, "bid", skew=1.5)
