"""UNION [ALL]: concatenation by position, strings re-coded to one dictionary, types widened."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column, unify_strings
from opforge.sql.expr import Batch, cast_values
from opforge.sql.physical.distinct import run_distinct
from opforge.sql.plan import Union


def run_union(node: Union, batches: list[Batch], child_cids: list[list[int]]) -> Batch:
    dev = batches[0].device if batches else None
    cols = {}
    for pos, out in enumerate(node.outputs):
        parts = [b.cols[cids[pos]] for b, cids in zip(batches, child_cids)]
        if out.type.kind in T.NESTED:  # a side of narrower LIST / STRUCT type widened first
            from opforge.sql.nested import cast_column
            parts = [cast_column(p, out.type) for p in parts]
        if T.is_coded(out.type):
            parts = unify_strings(parts)
            vals = torch.cat([p.values for p in parts])
        else:
            vals = torch.cat([cast_values(p, out.type) for p in parts])
        valid = None
        if any(p.valid is not None for p in parts):
            valid = torch.cat([p.valid_mask() for p in parts])
        cols[out.cid] = Column(vals, valid, out.type, parts[0].dictionary if T.is_coded(out.type) else None)
    out = Batch(cols, sum(b.n for b in batches), dev)
    return out if node.all else run_distinct(out)
