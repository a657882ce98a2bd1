"""Skew across workers: the heavy keys of a partitioned join's probe side, found over the group,
handled apart when both sides are shuffled.

A shuffle by key sends every row of one key to one worker; a key holding a large share of the
rows of one side (a heavy hitter) makes that worker's part of the join the whole query's time (and
its memory). So before the shuffle every worker counts the keys of both sides and sends its
``TOP`` most frequent (key, count) pairs of each; a key is heavy on a side when its count summed
over the workers is above ``threshold`` of that side's rows (the same set on every worker: it is
computed from the same gathered numbers). An inner join is symmetric, so the skewed side may be
either (the left one when both are). Then, as ``physical/skew.py`` does between partitions on one
device:

* the skewed side's rows with a heavy key are dealt round-robin over the workers (no worker gets
  more than its share of them), the others go to the worker of their key's hash;
* the other side's rows with a heavy key are sent to every worker (they are few in a
  key-foreign-key join), the others to the worker of their key's hash.

Each dealt row lands on one worker and meets there every other-side row of its key, so the pairs
are those of the plain partitioned join. Keys are compared by ``exchange.key_bits`` (equal
for equal SQL values on both sides; two values sharing bits are both handled apart: still exact).
"""
from __future__ import annotations

import torch

import opforge.distributed as D

TOP = 8  # candidate keys per worker


def heavy_keys(sides: list[torch.Tensor], threshold: float, group=None) -> list[torch.Tensor]:
    """For each side's key bits: the keys above ``threshold`` of that side's rows on all workers.
    One collective for all sides."""
    dev = D.device(group)
    mine = torch.zeros((len(sides), TOP + 1, 2), dtype=torch.int64)
    for i, bits in enumerate(sides):
        uniq, counts = torch.unique(bits, return_counts=True)
        top = torch.topk(counts, min(TOP, counts.numel()))
        mine[i, 0, 0] = bits.numel()
        mine[i, 1: top.values.numel() + 1, 0] = uniq[top.indices].cpu()
        mine[i, 1: top.values.numel() + 1, 1] = top.values.cpu()
    each = len(sides) * (TOP + 1)  # the same on every worker: no size exchange
    table = D.all_gather(mine.reshape(-1, 2).to(dev), group=group, sizes=[each] * D.world_size(group)).cpu()
    table = table.reshape(-1, len(sides), TOP + 1, 2)
    out = []
    for i, bits in enumerate(sides):
        rows = int(table[:, i, 0, 0].sum())
        cand = table[:, i, 1:].reshape(-1, 2)
        cand = cand[cand[:, 1] > 0]
        if rows == 0 or cand.numel() == 0:
            out.append(torch.zeros(0, dtype=torch.int64, device=bits.device))
            continue
        keys, inv = torch.unique(cand[:, 0], return_inverse=True)
        total = torch.zeros(keys.numel(), dtype=torch.int64).index_add_(0, inv, cand[:, 1])
        out.append(keys[total > threshold * rows].to(bits.device))
    return out


def dealt_dest(bits: torch.Tensor, heavy: torch.Tensor, world: int, rank: int) -> tuple[torch.Tensor, int]:
    """Worker of each row of the skewed side: its key's hash, or round-robin for a heavy key (from
    this worker's rank on, so the workers' heavy rows spread evenly). Also the number of heavy rows."""
    dest = D.hash_partition([bits], world)
    hp = torch.isin(bits, heavy)
    dealt = (torch.cumsum(hp.long(), 0) - 1 + rank) % world
    return torch.where(hp, dealt, dest), int(hp.sum())
