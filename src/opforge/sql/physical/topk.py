"""Top-k: ORDER BY ... LIMIT k [OFFSET o] without sorting every row.

With m = o + k, the first m rows of the stable multi-key sort all hold a first-key value at least
as good as the m-th best first-key value t (NULLs placed per NULLS FIRST/LAST). So: find t with
``torch.topk`` over the first key (one pass, no full sort), keep the candidates whose first key is
at least as good as t (ties with t included: every row that could be among the first m), sort only
the candidates with all keys by the same stable sort as ORDER BY (they keep their input order, so
ties break exactly as in the full sort), and slice ``[o, o + k)``. The answer is identical to
Sort followed by Limit, ties included, and deterministic.

Falls back to the full sort when m covers the input, or when the first key is a float holding NaN
(NaN compares false, so the threshold test would not select it).
"""
from __future__ import annotations

import torch

from opforge.sql import decimal128
from opforge.sql.expr import Batch, evaluate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.sort import sort_permutation
from opforge.sql.plan import TopK


def _kth_best(v: torch.Tensor, m: int, desc: bool) -> torch.Tensor:
    """The m-th best value (1-based) of v in the order ASC (desc False) or DESC, as a 0-dim tensor."""
    best = torch.topk(v, m, largest=desc, sorted=False).values
    return best.min() if desc else best.max()


def candidates(values: torch.Tensor, valid: torch.Tensor | None, desc: bool, nulls_first: bool, m: int
               ) -> torch.Tensor | None:
    """Rows (in input order) that may be among the first m of the sort on this key, or None when
    every row may be (the caller sorts them all)."""
    n = values.shape[0]
    if m >= n:
        return None
    v = values
    if v.dim() == 2:  # 128-bit DECIMAL rows: an int64 key of the same order
        v = decimal128.order_key(v)
    if v.dtype == torch.bool or v.dtype in (torch.int8, torch.int16, torch.uint8):
        v = v.to(torch.int32)
    if v.dtype.is_floating_point and bool(torch.isnan(v if valid is None else v[valid]).any()):
        return None
    if valid is None:
        thr = _kth_best(v, m, desc)
        keep = v >= thr if desc else v <= thr
        return torch.nonzero(keep).squeeze(1)
    nvalid = int(valid.sum())
    nnull = n - nvalid
    if nulls_first:
        if m <= nnull:
            return torch.nonzero(~valid).squeeze(1)
        thr = _kth_best(v[valid], m - nnull, desc)
    else:
        if m > nvalid:
            return None
        thr = _kth_best(v[valid], m, desc)
    better = (v >= thr if desc else v <= thr) & valid
    keep = better | ~valid if nulls_first else better
    return torch.nonzero(keep).squeeze(1)


def run_topk(node: TopK, batch: Batch, ctx: ExecContext | None = None) -> Batch:
    dev = batch.device
    m = node.offset + node.limit
    if m == 0 or batch.n == 0:
        return batch.take(torch.zeros(0, dtype=torch.int64, device=dev))
    e0, desc0, nf0 = node.keys[0]
    first = evaluate(e0, batch)
    cand = candidates(first.values, first.valid, desc0, nf0, m)
    if cand is not None:
        batch = batch.take(cand)
    if ctx is not None:
        ctx.note(f"top-{m}: sorted {batch.n} candidate rows" + ("" if cand is not None else " (all rows)"))
    keys = []
    for e, desc, nulls_first in node.keys:
        c = evaluate(e, batch)
        keys.append((c.values, c.valid, desc, nulls_first))
    perm = sort_permutation(keys, batch.n, dev)
    return batch.take(perm[node.offset:m])
