"""DISTINCT: one row per distinct combination of all columns (NULLs equal), first occurrence kept."""
from __future__ import annotations

import torch

from opforge.sql.expr import Batch
from opforge.sql.physical.keys import dense_ids


def run_distinct(batch: Batch) -> Batch:
    n, dev = batch.n, batch.device
    gid, groups = dense_ids(list(batch.cols.values()), n, dev)
    first = torch.full((groups,), n, dtype=torch.int64, device=dev)
    first = first.scatter_reduce(0, gid, torch.arange(n, device=dev), "amin", include_self=True)
    return batch.take(torch.sort(first).values)
