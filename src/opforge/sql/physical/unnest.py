"""UNNEST of LIST columns (``plan.Unnest``): rows repeated per element. The distinct lists of a
column (its dictionary, ``sql/nested.py``) are flattened once into one child column with offsets;
the output rows and each element's position are index arithmetic on the device."""
from __future__ import annotations

import torch

from opforge.sql import nested
from opforge.sql.column import Column
from opforge.sql.expr import Batch, evaluate
from opforge.sql.plan import Unnest


def _flat(col: Column, element) -> tuple[Column, torch.Tensor, torch.Tensor]:
    """The elements of the column's distinct lists one after another, each list's first offset and length."""
    lists = [w.value for w in col.dictionary] or [[]]
    lens = [len(v) for v in lists]
    starts, at = [], 0
    for n in lens:
        starts.append(at)
        at += n
    flat = nested.from_python([x for v in lists for x in v] or [None], element, col.device)
    dev = col.device
    return flat, torch.tensor(starts, dtype=torch.int64, device=dev), torch.tensor(lens, dtype=torch.int64, device=dev)


def run_unnest(node: Unnest, batch: Batch) -> Batch:
    dev = batch.device
    parts = []
    for out, e in node.lists:
        col = evaluate(e, batch)
        flat, starts, lens = _flat(col, out.type)
        codes = col.values.long() if col.dictionary else torch.zeros(batch.n, dtype=torch.int64, device=dev)
        row_len = torch.where(col.valid_mask(), lens[codes], 0)
        parts.append((out, flat, starts[codes], row_len))
    per_row = torch.stack([p[3] for p in parts]).amax(0) if parts else torch.zeros(batch.n, dtype=torch.int64, device=dev)
    rows = torch.repeat_interleave(torch.arange(batch.n, device=dev), per_row)
    first = torch.cumsum(per_row, 0) - per_row
    pos = torch.arange(len(rows), device=dev) - first[rows]
    out_batch = batch.take(rows)
    for out, flat, start, row_len in parts:
        inside = pos < row_len[rows]
        idx = torch.where(inside, start[rows] + pos, 0)
        elem = flat.take(idx)
        valid = inside if elem.valid is None else inside & elem.valid
        out_batch.cols[out.cid] = Column(elem.values, None if bool(valid.all()) else valid, out.type, elem.dictionary)
    return out_batch
