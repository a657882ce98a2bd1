"""LIMIT / OFFSET: a slice of the rows."""
from __future__ import annotations

import torch

from opforge.sql.expr import Batch
from opforge.sql.plan import Limit


def run_limit(node: Limit, batch: Batch) -> Batch:
    start = min(node.offset, batch.n)
    stop = batch.n if node.limit is None else min(batch.n, start + node.limit)
    return batch.take(torch.arange(start, stop, device=batch.device))
