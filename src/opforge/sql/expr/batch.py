"""The batch that flows between physical operators: whole columns by column id."""
from __future__ import annotations

import torch

from opforge.sql.column import Column


class Batch:
    """Whole-column batch flowing between operators: cid -> Column, all of length n.
    ``hash_keys``: in the simulated multi-worker mode, the columns whose hash places every row on
    its worker (``physical/simulated_workers.py``); empty otherwise."""

    hash_keys: frozenset = frozenset()

    def __init__(self, cols: dict[int, Column], n: int, device):
        self.cols, self.n, self.device = cols, n, device

    def take(self, idx: torch.Tensor) -> "Batch":
        return Batch({k: c.take(idx) for k, c in self.cols.items()}, int(idx.shape[0]), self.device)
