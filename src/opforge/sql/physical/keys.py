"""Key encoding shared by aggregation, join and distinct: several key columns -> one dense int64 id.

This is the swap point for GPU hashing: `dense_ids` (group-by) and `join_pairs` in join.py use torch
sort/unique/searchsorted today; `opforge.ops.hashing` can replace them without touching the operators."""
from __future__ import annotations

import torch

from opforge.sql.column import Column


def key_tensor(col: Column) -> torch.Tensor:
    """An int64 tensor whose equality is SQL equality of the values (NULL slots zeroed)."""
    v = col.values
    if v.dtype.is_floating_point:
        v = v.double()
        v = torch.where(v == 0, torch.zeros_like(v), v)  # -0.0 == 0.0
        v = torch.where(torch.isnan(v), torch.full_like(v, float("nan")), v)
        v = v.view(torch.int64)
    else:
        v = v.long()
    if col.valid is not None:
        v = torch.where(col.valid, v, torch.zeros_like(v))
    return v


def dense_ids(cols: list[Column], n: int, device) -> tuple[torch.Tensor, int]:
    """Group id per row (0..groups-1) for the combination of key values; NULL is one value of its own.
    Groups are numbered in key order, so the result is deterministic."""
    if not cols:
        return torch.zeros(n, dtype=torch.int64, device=device), (1 if n else 0)
    ids = None
    count = 1
    for col in cols:
        parts = [key_tensor(col)]
        if col.valid is not None:
            parts.append((~col.valid).long())
        for p in parts:
            uniq, inv = torch.unique(p, return_inverse=True)
            ids = inv if ids is None else ids * len(uniq) + inv
            uniq2, ids = torch.unique(ids, return_inverse=True)
            count = len(uniq2)
    return ids, count


def joint_ids(left: list[Column], right: list[Column], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense ids over both sides' keys together, plus which rows have any NULL key (never match)."""
    from opforge.sql.expr import comparable

    nl = len(left[0]) if left else 0
    both = []
    for l, r in zip(left, right):
        lv, rv = comparable(l, r)
        lk = key_tensor(Column(lv, l.valid, l.type))
        rk = key_tensor(Column(rv, r.valid, r.type))
        both.append(Column(torch.cat([lk, rk]), None, l.type))
    ids, _ = dense_ids(both, nl + (len(right[0]) if right else 0), device)
    lnull = torch.zeros(nl, dtype=torch.bool, device=device)
    rnull = torch.zeros(len(right[0]) if right else 0, dtype=torch.bool, device=device)
    for l, r in zip(left, right):
        lnull |= l.null_mask()
        rnull |= r.null_mask()
    return ids[:nl], ids[nl:], lnull, rnull
