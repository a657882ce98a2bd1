"""Filter: evaluate the predicate to a mask (NULL counts as false), then gather the kept rows.
Kept rows stay in order, so a column's ``sorted`` flag survives the filter."""
from __future__ import annotations

import torch

from opforge.sql.expr import Batch, Expr, evaluate


def keep_rows(predicate: Expr, batch: Batch) -> Batch:
    m = evaluate(predicate, batch)
    mask = m.values & m.valid_mask() if m.valid is not None else m.values
    idx = torch.nonzero(mask).squeeze(1)  # stream compaction: one size sync
    out = batch.take(idx)
    for k, c in batch.cols.items():
        if c.sorted:
            out.cols[k].sorted = True
    return out
