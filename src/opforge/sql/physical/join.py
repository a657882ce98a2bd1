"""Equi-join by sort + searchsorted (all matching pairs, duplicates on both sides), residual predicates,
outer padding with NULLs, semi/anti, and a nested-loop path for joins without equi keys."""
from __future__ import annotations

import torch

from opforge.sql.column import Column
from opforge.sql.expr import Batch, evaluate
from opforge.sql.physical.keys import joint_ids
from opforge.sql.plan import Join


def join_pairs(lkey: torch.Tensor, rkey: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All (left row, right row) with equal keys. Swap point for opforge.ops.hashing's hash join."""
    dev = lkey.device
    order = torch.argsort(rkey, stable=True)
    sorted_r = rkey[order]
    lo = torch.searchsorted(sorted_r, lkey, side="left")
    hi = torch.searchsorted(sorted_r, lkey, side="right")
    counts = hi - lo
    total = int(counts.sum())  # the output size must be known: one host sync
    li = torch.repeat_interleave(torch.arange(len(lkey), device=dev), counts, output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, device=dev) - starts[li]
    ri = order[lo[li] + within]
    return li, ri


def _cross_pairs(nl: int, nr: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    li = torch.arange(nl, device=dev).repeat_interleave(nr)
    ri = torch.arange(nr, device=dev).repeat(nl)
    return li, ri


def _pad(col: Column, idx: torch.Tensor, present: torch.Tensor) -> Column:
    """Gather with NULL where `present` is False (outer-join padding)."""
    safe = torch.where(present, idx, torch.zeros_like(idx))
    if len(col) == 0:
        vals = torch.zeros(len(idx), dtype=col.values.dtype, device=idx.device)
        return Column(vals, torch.zeros(len(idx), dtype=torch.bool, device=idx.device), col.type, col.dictionary)
    out = col.take(safe)
    return Column(out.values, out.valid_mask() & present, col.type, col.dictionary)


def run_join(node: Join, left: Batch, right: Batch) -> Batch:
    dev = left.device
    if node.left_keys:
        lcols = [evaluate(e, left) for e in node.left_keys]
        rcols = [evaluate(e, right) for e in node.right_keys]
        lid, rid, lnull, rnull = joint_ids(lcols, rcols, dev)
        lid = torch.where(lnull, torch.full_like(lid, -1), lid)
        rid = torch.where(rnull, torch.full_like(rid, -2), rid)
        li, ri = join_pairs(lid, rid)
    else:
        li, ri = _cross_pairs(left.n, right.n, dev)
    if node.residual is not None and len(li):
        need = node.residual.cids()  # gather only the columns the residual reads
        cols = {k: c.take(li) for k, c in left.cols.items() if k in need}
        cols.update({k: c.take(ri) for k, c in right.cols.items() if k in need})
        pair = Batch(cols, len(li), dev)
        r = evaluate(node.residual, pair)
        keep = torch.nonzero(r.values & r.valid_mask()).squeeze(1)
        li, ri = li[keep], ri[keep]
    kind = node.kind
    if kind in ("semi", "anti"):
        matched = torch.zeros(left.n, dtype=torch.bool, device=dev)
        matched[li] = True
        if kind == "anti" and node.null_aware:
            rk = [evaluate(e, right) for e in node.right_keys]
            if right.n and any(bool(c.null_mask().any()) for c in rk):
                matched[:] = True  # x NOT IN (... NULL ...) is never true
            elif right.n:
                lk = [evaluate(e, left) for e in node.left_keys]
                for c in lk:
                    matched |= c.null_mask()
        keep = matched if kind == "semi" else ~matched
        return left.take(torch.nonzero(keep).squeeze(1))
    if kind in ("inner", "cross"):
        return Batch({**left.take(li).cols, **right.take(ri).cols}, len(li), dev)
    lpresent = torch.ones(len(li), dtype=torch.bool, device=dev)
    rpresent = torch.ones(len(li), dtype=torch.bool, device=dev)
    if kind in ("left", "full"):
        seen = torch.zeros(left.n, dtype=torch.bool, device=dev)
        seen[li] = True
        extra = torch.nonzero(~seen).squeeze(1)
        li = torch.cat([li, extra])
        ri = torch.cat([ri, torch.zeros_like(extra)])
        lpresent = torch.cat([lpresent, torch.ones_like(extra, dtype=torch.bool)])
        rpresent = torch.cat([rpresent, torch.zeros_like(extra, dtype=torch.bool)])
    if kind in ("right", "full"):
        seen = torch.zeros(right.n, dtype=torch.bool, device=dev)
        seen[ri[rpresent]] = True
        extra = torch.nonzero(~seen).squeeze(1)
        ri = torch.cat([ri, extra])
        li = torch.cat([li, torch.zeros_like(extra)])
        rpresent = torch.cat([rpresent, torch.ones_like(extra, dtype=torch.bool)])
        lpresent = torch.cat([lpresent, torch.zeros_like(extra, dtype=torch.bool)])
    cols = {k: _pad(c, li, lpresent) for k, c in left.cols.items()}
    cols.update({k: _pad(c, ri, rpresent) for k, c in right.cols.items()})
    return Batch(cols, len(li), dev)
