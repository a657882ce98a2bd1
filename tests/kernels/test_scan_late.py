"""The LATE look-back (loads issued at the program's own index before the
tile counter confirms it, the tile's total published first, its own scan
after the look-back) under the interpreter: the cumsum and the compaction
against torch, with carries across many tiles, both publication paths
(inclusive prefixes, and aggregates only: the walk a GPU takes when
predecessors still run), SKEW=1 (every guessed tile wrong: the reload), and
status packed with the value in one word (PACK, the default) or not."""

from __future__ import annotations

import pytest
import torch

from opforge.kernels import scan as K

LATE = {"BLOCK": 16, "WINDOW": 4, "LATE": 1}


@pytest.mark.parametrize("publish,exclusive,reverse,skew,pack",
                         [(True, False, False, 0, 1), (False, True, True, 1, 1), (False, False, False, 0, 0)],
                         ids=["inclusive-ordered", "aggregates-only-exclusive-reverse-reload", "flags-and-values"])
def test_late_lookback_cumsum_carries_across_tiles(publish, exclusive, reverse, skew, pack, gen):
    x = torch.randn((2, 100), generator=gen)  # 7 tiles a row, a ragged last one
    y = torch.empty_like(x)
    cfg = dict(LATE, SKEW=skew, PACK=pack, ORDERED=int(publish))  # ORDERED: the program id is the tile
    K.launch_lookback_scan(x, y, None, K.SUM, exclusive, reverse, cfg, publish_inclusive=publish)
    x64 = x.double().flip(1) if reverse else x.double()
    ref = x64.cumsum(1) - (x64 if exclusive else 0)
    ref = ref.flip(1) if reverse else ref
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_late_compact_matches_masked_select(gen):
    x = torch.randn(120, generator=gen)  # 8 tiles
    mask = torch.rand(120, generator=gen) < 0.4
    out = torch.empty(int(mask.sum()))
    K.launch_compact(x, mask, out, False, dict(LATE, SKEW=1), publish_inclusive=False)
    assert torch.equal(out, x[mask])
    idx = torch.empty(int(mask.sum()), dtype=torch.int64)
    K.launch_compact(None, mask, idx, True, dict(LATE, PACK=0, ORDERED=1), publish_inclusive=True)
    assert torch.equal(idx, torch.nonzero(mask).flatten())
