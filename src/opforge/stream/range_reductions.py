"""Reductions over ranges of rows (a sliding window's run of pane rows):
sums by prefix differences, min / max by a sparse table."""

from __future__ import annotations

import torch


def range_sums(vals: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, max_width: int) -> torch.Tensor:
    """``vals[lo[i] : lo[i] + width[i]].sum()`` per range (``1 <= width <=
    max_width``), in ``vals``' dtype. Integers: a difference of prefix sums,
    exact (wrapping as a direct sum would); floats: each range's values
    added in order in float64 and rounded once (as ``segment_reduce``'s
    deterministic sums), a prefix difference would not be exact."""
    if not vals.dtype.is_floating_point:
        sums = torch.zeros(vals.shape[0] + 1, dtype=torch.int64, device=vals.device)
        torch.cumsum(vals, 0, dtype=torch.int64, out=sums[1:])
        return (sums.index_select(0, lo + width) - sums.index_select(0, lo)).to(vals.dtype)
    wide = vals.to(torch.float64)
    out = wide.index_select(0, lo)
    for j in range(1, max_width):
        nxt = wide.index_select(0, (lo + j).clamp_(max=vals.shape[0] - 1))
        out = torch.where(width > j, out + nxt, out)
    return out.to(vals.dtype)


def range_extremes(vals: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, max_width: int,
                   op: str) -> torch.Tensor:
    """``op`` (``"min"`` / ``"max"``) of ``vals[lo[i] : lo[i] + width[i]]``
    per range (``1 <= width <= max_width``): a sparse table (level ``j``
    folds ``2**j`` rows from each row) and, per range, the fold of the two
    level-``floor(log2 width)`` blocks at its two ends, which overlap (the
    ops are idempotent) — ``log2(max_width)`` passes over ``vals``, two
    gathers per range, instead of ``max_width``."""
    fold = torch.minimum if op == "min" else torch.maximum
    levels = [vals]
    while 2 ** len(levels) <= max_width:
        prev, half = levels[-1], 2 ** (len(levels) - 1)
        level = prev.clone()  # the last rows fold fewer: no range reads them at this level
        level[:-half] = fold(prev[:-half], prev[half:])
        levels.append(level)
    table, rows = torch.cat(levels), vals.shape[0]
    j = torch.frexp(width.to(torch.float64))[1].to(torch.int64) - 1  # floor(log2 width), exactly
    base = j * rows + lo
    return fold(table.index_select(0, base), table.index_select(0, base + width - torch.pow(2, j)))
