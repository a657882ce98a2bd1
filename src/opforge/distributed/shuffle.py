"""All-to-all shuffle of variable-size partitions: the exchange behind a
distributed hash join, a group-by on keys spread over ranks, or Flink's keyBy.

Each rank holds rows grouped by destination (``counts[d]`` rows for rank d,
in rank order). A shuffle runs in two steps:

1. **counts exchange** — one all-gather of every rank's ``counts`` (plus a
   fingerprint of column names, dtypes and trailing shapes, so ranks that
   disagree fail together with a ``ValueError`` instead of hanging). Each rank
   now knows how many rows it receives from each peer and sizes its output;
   this is the one host sync of a shuffle.
2. **payload** — one ``all_to_all_single`` per column with those split sizes,
   all in flight at once.

Received rows come grouped by source rank, in each source's order. Columnar
batches (``dict`` of tensors sharing dim 0) move together under one counts
exchange. :func:`hash_partition` and :func:`shuffle_by` build the counts from
keys or destinations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from opforge.distributed import group as G
from opforge.distributed.collectives import check_sizes, check_tensor, exchange, guard, signature

INT_KEYS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
FLOAT_KEYS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
              torch.float64: torch.int64}
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64 (Fibonacci hashing)
_MIX = -4658895280553007687  # 0xBF58476D1CE4E5B9 (splitmix64's multiplier)


def _counts_list(where: str, counts, world: int, rows: int) -> list[int]:
    if isinstance(counts, torch.Tensor):
        if counts.dtype.is_floating_point or counts.dtype == torch.bool or counts.dim() != 1:
            raise TypeError(f"{where}: counts must be a 1-D integer tensor or a list of ints, got "
                            f"{counts.dtype} of shape {tuple(counts.shape)}")
        counts = counts.tolist()
    out = check_sizes(where, "counts", counts, world)
    if sum(out) != rows:
        raise ValueError(f"{where}: counts sum to {sum(out)} but the partitions hold {rows} rows")
    return out


def _check_batch(where: str, batch, group) -> int:
    if not isinstance(batch, Mapping) or not batch:
        raise TypeError(f"{where}: batch must be a non-empty dict of column name -> tensor, got "
                        f"{type(batch).__name__}")
    rows = None
    for name, col in batch.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}: column names must be strings, got {name!r}")
        check_tensor(where, f"column {name!r}", col, group, min_dim=1)
        if rows is None:
            rows = col.shape[0]
        elif col.shape[0] != rows:
            raise ValueError(f"{where}: column {name!r} has {col.shape[0]} rows but the others have {rows}")
    return rows


def shuffle_batch(batch: Mapping[str, torch.Tensor], counts, *, group=None
                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Send ``counts[d]`` rows of every column to rank d; returns the received
    batch (rows grouped by source rank) and the rows received from each rank
    (an int64 tensor of length world, on the batch's device)."""
    where = "opforge.distributed.shuffle_batch"
    world, me = G.world_size(group, where=where), G.rank(group, where=where)
    rows = _check_batch(where, batch, group)
    send = _counts_list(where, counts, world, rows)
    names = sorted(batch)  # one collective order on every rank, whatever the dict order
    cols = {n: batch[n].contiguous() for n in names}
    sig = ",".join(f"{n}:{signature(cols[n])}" for n in names)
    table = exchange(where, "column names, dtypes and trailing shapes", send, sig, group)  # [src, dst]
    recv = table[:, me].tolist()
    dev = next(iter(cols.values())).device
    out = {n: torch.empty((sum(recv),) + tuple(c.shape[1:]), dtype=c.dtype, device=c.device) for n, c in cols.items()}
    if int(table.sum()) > 0:
        with guard(where, "the payload all-to-all", group):
            works = [dist.all_to_all_single(out[n], cols[n], recv, send, group=group, async_op=True) for n in names]
            for w in works:
                w.wait()
    return {n: out[n] for n in batch}, torch.tensor(recv, dtype=torch.int64, device=dev)


def shuffle(tensor: torch.Tensor, counts, *, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`shuffle_batch` for one tensor (rows on dim 0)."""
    where = "opforge.distributed.shuffle"
    check_tensor(where, "tensor", tensor, group, min_dim=1)
    out, recv = shuffle_batch({"tensor": tensor}, counts, group=group)
    return out["tensor"], recv


def partition(dest: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Order rows by destination: ``(order, counts)`` with ``order`` a stable
    permutation grouping rows by ``dest`` and ``counts[d]`` the rows bound for d."""
    where = "opforge.distributed.partition"
    if not isinstance(dest, torch.Tensor) or dest.dim() != 1 or dest.dtype.is_floating_point \
            or dest.dtype == torch.bool:
        raise TypeError(f"{where}: dest must be a 1-D integer tensor of destination ranks")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"{where}: world must be a positive int, got {world!r}")
    d = dest.to(torch.int64)
    if d.numel() and bool(((d < 0) | (d >= world)).any()):
        raise ValueError(f"{where}: dest holds ranks outside 0..{world - 1}")
    order = torch.sort(d, stable=True).indices
    return order, torch.bincount(d, minlength=world)


def _key_bits(where: str, k: torch.Tensor) -> torch.Tensor:
    if k.dtype in FLOAT_KEYS:
        k = (k + 0).masked_fill(k == 0, 0)  # -0.0 and 0.0 are one key
        return k.view(FLOAT_KEYS[k.dtype]).to(torch.int64)
    if k.dtype in INT_KEYS:
        return k.to(torch.int64)
    raise TypeError(f"{where}: keys must be integer, bool or float tensors, got {k.dtype}")


def hash_partition(keys: torch.Tensor | Sequence[torch.Tensor], world: int) -> torch.Tensor:
    """Destination rank of each row by a hash of its key columns (equal keys, one rank)."""
    where = "opforge.distributed.hash_partition"
    cols = [keys] if isinstance(keys, torch.Tensor) else list(keys)
    if not cols or not all(isinstance(c, torch.Tensor) and c.dim() == 1 for c in cols):
        raise TypeError(f"{where}: keys must be a 1-D tensor or a non-empty list of 1-D tensors")
    if len({c.shape[0] for c in cols}) != 1:
        raise ValueError(f"{where}: key columns differ in length: {[c.shape[0] for c in cols]}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"{where}: world must be a positive int, got {world!r}")
    h = torch.zeros(cols[0].shape[0], dtype=torch.int64, device=cols[0].device)
    for c in cols:
        h = (h ^ _key_bits(where, c)) * _GOLDEN  # int64 products wrap, as the hash wants
        h = (h ^ (h >> 31)) * _MIX
    return ((h >> 33) & 0x7FFFFFFF) % world


def shuffle_by(batch: Mapping[str, torch.Tensor], dest: torch.Tensor, *, group=None
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Send row i of every column to rank ``dest[i]`` (rows in any order);
    :func:`shuffle_batch`'s result."""
    where = "opforge.distributed.shuffle_by"
    world = G.world_size(group, where=where)
    rows = _check_batch(where, batch, group)
    if not isinstance(dest, torch.Tensor) or dest.shape != (rows,):
        raise ValueError(f"{where}: dest must be a tensor of shape ({rows},) (one rank per row)")
    order, counts = partition(dest.to(next(iter(batch.values())).device), world)
    return shuffle_batch({n: c.index_select(0, order) for n, c in batch.items()}, counts, group=group)
