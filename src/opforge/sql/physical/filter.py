"""Filter: evaluate the predicate to a mask (NULL counts as false), then gather the kept rows."""
from __future__ import annotations

import torch

from opforge.sql.expr import Batch, Expr, evaluate


def keep_rows(predicate: Expr, batch: Batch) -> Batch:
    m = evaluate(predicate, batch)
    mask = m.values & m.valid_mask() if m.valid is not None else m.values
    idx = torch.nonzero(mask).squeeze(1)  # stream compaction: one size sync
    return batch.take(idx)
