"""Moving SQL batches between workers over the cluster's process group (``opforge.distributed``).

A batch is a dict of ``Column``s (values, validity, string dictionary). On the wire every column is
two tensors, its values and its validity (bool as uint8: Gloo's all-to-all takes no bools). String
columns are dictionary codes whose dictionary is each worker's own (built from the rows it holds),
so before codes move every worker's dictionary of that column is compared by fingerprint and, when
they differ, merged into one sorted dictionary and the codes recoded (the engine's string order is
code order, so the merged dictionary must be the same on every worker).

* :func:`shuffle_rows`: row i to worker ``dest[i]`` (a partitioned join, a group-by on keys);
* :func:`gather_rows`: every worker gets every row (a broadcast build side, a final sort);
* :func:`key_dest`: the destination of each row from a hash of key columns that is the same for
  equal values whatever their storage (string codes, int widths, NULLs).
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

import opforge.distributed as D
from opforge.sql.column import Column, merge_dictionaries, recode
from opforge.sql.expr import Batch

_NULL_KEY = -0x5EED  # the hash input of a NULL key: every NULL lands on one worker


def _word_hashes(words: tuple[str, ...]) -> torch.Tensor:
    return torch.tensor([zlib.crc32(w.encode()) for w in words] or [0], dtype=torch.int64)


def key_bits(col: Column) -> torch.Tensor:
    """An int64 per row, equal for equal SQL values (strings by content, integral floats as ints)."""
    v = col.values
    if col.type.kind == "STRING":
        bits = _word_hashes(col.dictionary or ()).to(v.device)[v.long()] if len(v) else v.long()
    elif v.dtype.is_floating_point:
        x = v.double()
        integral = x == torch.round(x)
        bits = torch.where(integral, x.clamp(-2.0 ** 62, 2.0 ** 62).long(), (x + 0.0).view(torch.int64))
    else:
        bits = v.long()
    if col.valid is not None:
        bits = torch.where(col.valid, bits, torch.full_like(bits, _NULL_KEY))
    return bits


def key_dest(cols: list[Column], world: int) -> torch.Tensor:
    """The worker of each row: a hash of its key columns (``opforge.distributed.hash_partition``)."""
    return D.hash_partition([key_bits(c) for c in cols], world)


def _unify_dictionaries(batch: Batch, group) -> dict[int, Column]:
    """The batch's columns, string ones recoded against a dictionary shared by every worker."""
    cols = dict(batch.cols)
    strings = sorted(cid for cid, c in cols.items() if c.type.kind == "STRING")
    if not strings:
        return cols
    prints = [zlib.crc32("\x1f".join(cols[c].dictionary or ()).encode()) for c in strings]
    table = D.all_gather(torch.tensor([prints], dtype=torch.int64, device=D.device(group)), group=group).cpu()
    differ = [c for i, c in enumerate(strings) if bool((table[:, i] != table[0, i]).any())]
    if not differ:
        return cols
    mine = [list(cols[c].dictionary or ()) for c in differ]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    for i, cid in enumerate(differ):
        merged, maps = merge_dictionaries(*(tuple(d[i]) for d in everyone))
        me = dist.get_rank(group)
        cols[cid] = recode(cols[cid], merged, maps[me])
    return cols


def _wire(cols: dict[int, Column]) -> dict[str, torch.Tensor]:
    out = {}
    for cid, c in cols.items():
        out[f"v{cid}"] = c.values.to(torch.uint8) if c.values.dtype == torch.bool else c.values
        out[f"m{cid}"] = c.valid_mask().to(torch.uint8)
    return out


def _unwire(got: dict[str, torch.Tensor], like: dict[int, Column], n: int, device) -> Batch:
    cols = {}
    for cid, c in like.items():
        v = got[f"v{cid}"]
        if c.values.dtype == torch.bool:
            v = v.bool()
        m = got[f"m{cid}"].bool()
        valid = None if bool(m.all()) else m
        cols[cid] = Column(v, valid, c.type, c.dictionary)
    return Batch(cols, n, device)


def shuffle_rows(batch: Batch, dest: torch.Tensor, group=None) -> Batch:
    """Row i of ``batch`` to worker ``dest[i]``; the rows this worker receives. Collective."""
    cols = _unify_dictionaries(batch, group)
    if not cols:  # no columns (COUNT(*) over a projection of nothing): move row counts only
        order, counts = D.partition(dest, dist.get_world_size(group))
        got, _ = D.shuffle_batch({"_": torch.zeros(batch.n, dtype=torch.uint8, device=D.device(group))}, counts,
                                 group=group)
        return Batch({}, int(got["_"].shape[0]), batch.device)
    got, recv = D.shuffle_by(_wire(cols), dest, group=group)
    return _unwire(got, cols, int(recv.sum()), batch.device)


def gather_rows(batch: Batch, group=None) -> Batch:
    """Every worker's rows, in worker order, on every worker. Collective."""
    cols = _unify_dictionaries(batch, group)
    if not cols:
        sizes = D.all_gather(torch.tensor([batch.n], dtype=torch.int64, device=D.device(group)), group=group)
        return Batch({}, int(sizes.sum()), batch.device)
    wire = _wire(cols)
    got = {name: D.all_gather(t, group=group) for name, t in sorted(wire.items())}
    n = int(next(iter(got.values())).shape[0])
    return _unwire(got, cols, n, batch.device)


def slice_rows(batch: Batch, group=None) -> Batch:
    """This worker's share (row i where i % world == rank) of a batch every worker holds whole."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    idx = torch.arange(me, batch.n, world, device=batch.device)
    return batch.take(idx)


def batch_bytes(batch: Batch) -> int:
    return sum(c.values.numel() * c.values.element_size() + len(c) for c in batch.cols.values())


__all__ = ["key_bits", "key_dest", "shuffle_rows", "gather_rows", "slice_rows", "batch_bytes"]
