"""Multi-key sort by successive stable sorts, least significant key first.
Defaults as DuckDB: ASC NULLS LAST, DESC NULLS LAST... (callers pass the resolved nulls_first)."""
from __future__ import annotations

import torch

from opforge.sql import decimal128
from opforge.sql.expr import Batch, evaluate
from opforge.sql.plan import Sort


def sort_permutation(keys: list[tuple[torch.Tensor, torch.Tensor | None, bool, bool]], n: int, dev) -> torch.Tensor:
    """keys: (values, valid-or-None, descending, nulls_first). Returns the row order."""
    perm = torch.arange(n, device=dev)
    for values, valid, desc, nulls_first in reversed(keys):
        if values.dim() == 2:  # 128-bit DECIMAL rows: an int64 key of the same order
            values = decimal128.order_key(values)
        v = values[perm]
        if v.dtype == torch.bool:
            v = v.to(torch.int8)
        if valid is not None:  # NULL slots hold arbitrary values: make them tie so earlier keys' order holds
            v = torch.where(valid[perm], v, torch.zeros_like(v))
        o = torch.sort(v, descending=desc, stable=True).indices
        perm = perm[o]
        if valid is not None:
            isnull = (~valid[perm]).to(torch.int8)
            o = torch.sort(isnull, descending=nulls_first, stable=True).indices
            perm = perm[o]
    return perm


def run_sort(node: Sort, batch: Batch) -> Batch:
    keys = []
    for e, desc, nulls_first in node.keys:
        c = evaluate(e, batch)
        keys.append((c.values, c.valid, desc, nulls_first))
    return batch.take(sort_permutation(keys, batch.n, batch.device))
