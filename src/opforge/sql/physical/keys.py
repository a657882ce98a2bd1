"""Key encoding shared by aggregation, join and distinct: several key columns -> one dense int64 id.

Every grouping goes through the registry op ``opforge.group_by`` (dispatch picks the Triton
open-addressing table on CUDA, the sort-based reference on the CPU), so the SQL operators never
hash on their own. A multi-column key is reduced exactly, never by a lossy hash of the tuple: each
column is grouped on its own, the ids are packed (``ids * G_next + g_next``, below 2^62 since both
factors are at most the row count), and the packed id is grouped again to keep it dense.
Group ids are numbered by first occurrence (``group_by``'s rule), so results are deterministic.

``partition_of`` spreads keys over 2^p radix partitions for operators that exceed the memory
budget. It mixes with a different multiplier than the hash kernels' Fibonacci hashing, whose
table slots are the *top* bits of ``key * 2^64/phi``: partitioning on those same bits would put all
keys of one partition into 1/2^p of the table's home slots.
"""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql.column import Column

# xxHash64's PRIME64_2, as a signed int64: independent of the kernels' 2^64/phi multiplier.
_PART_MUL = 0xC2B2AE3D27D4EB4F - (1 << 64)


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


def hash_key(col: Column) -> torch.Tensor:
    """``key_tensor`` narrowed to int32 when the values are int32-or-narrower integers: the hash
    table reads half the bytes. Equality is unchanged (NULL slots zeroed)."""
    v = col.values
    if v.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        v = v.to(torch.int32)
        if col.valid is not None:
            v = torch.where(col.valid, v, torch.zeros_like(v))
        return v
    return key_tensor(col)


def group_ids(keys: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Dense ids (first occurrence) of one int key tensor through ``opforge.group_by``; NULL rows
    (valid False) form one group of their own."""
    out = hashing.group_by(keys, valid)
    return out[0], int(out[1].shape[0])


def dense_ids(cols: list[Column], n: int, device) -> tuple[torch.Tensor, int]:
    """Group id per row (0..groups-1) for the combination of key values; NULL is one value of its own.
    Groups are numbered by first occurrence, so the result is deterministic."""
    if not cols:
        return torch.zeros(n, dtype=torch.int64, device=device), (1 if n else 0)
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=device), 0
    ids, count = None, 1
    for col in cols:
        g, gc = group_ids(hash_key(col), col.valid)
        if ids is None:
            ids, count = g, gc
        else:
            ids, count = group_ids(ids * gc + g)
    return ids, count


def join_keys(left: list[Column], right: list[Column], device
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One int key per side whose equality is equality of all key columns, and each side's validity
    (False where any key is NULL: such rows never match), or None when a side has no NULL keys.

    One column: its values in the pair's common type (``comparable``), int32 kept as int32.
    Several: each column is grouped over both sides together (``dense_ids`` on the concatenation)
    and the ids are packed and regrouped, so the pair of keys is dense int64."""
    from opforge.sql.expr import comparable

    nl = len(left[0])
    lvalid = rvalid = None
    for l, r in zip(left, right):
        if l.valid is not None:
            lvalid = l.valid if lvalid is None else lvalid & l.valid
        if r.valid is not None:
            rvalid = r.valid if rvalid is None else rvalid & r.valid
    pairs = []
    for l, r in zip(left, right):
        lv, rv = comparable(l, r)
        pairs.append((Column(lv, l.valid, l.type), Column(rv, r.valid, r.type)))
    if len(pairs) == 1:
        lk, rk = hash_key(pairs[0][0]), hash_key(pairs[0][1])
        if lk.dtype != rk.dtype:
            lk, rk = lk.long(), rk.long()
        return lk, rk, lvalid, rvalid
    both = [Column(torch.cat([hash_key(l).long(), hash_key(r).long()]), None, l.type) for l, r in pairs]
    ids, _ = dense_ids(both, nl + len(right[0]), device)
    return ids[:nl], ids[nl:], lvalid, rvalid


def joint_ids(left: list[Column], right: list[Column], device
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense int64 ids over both sides' keys together, plus which rows have any NULL key (never match)."""
    lk, rk, lvalid, rvalid = join_keys(left, right, device)
    if len(left) == 1:
        ids, _ = dense_ids([Column(torch.cat([lk.long(), rk.long()]), None, left[0].type)],
                           len(lk) + len(rk), device)
        lk, rk = ids[:len(lk)], ids[len(lk):]
    lnull = torch.zeros(len(lk), dtype=torch.bool, device=device) if lvalid is None else ~lvalid
    rnull = torch.zeros(len(rk), dtype=torch.bool, device=device) if rvalid is None else ~rvalid
    return lk, rk, lnull, rnull


def partition_of(keys: torch.Tensor, bits: int) -> torch.Tensor:
    """Radix partition (0..2^bits-1) of each int key: the top bits of a multiplicative hash."""
    h = keys.long() * _PART_MUL  # wraps modulo 2^64
    return (h >> (64 - bits)) & ((1 << bits) - 1)


def partitions(part: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Row indices of each partition, in row order (one stable sort, one host sync for the sizes)."""
    order = torch.sort(part, stable=True).indices
    sizes = torch.bincount(part, minlength=1 << bits).tolist()
    return list(torch.split(order, sizes))


def partition_bits(need_bytes: int, budget: int | None, max_bits: int = 12) -> int:
    """Least p such that each of 2^p partitions fits ``budget`` (0: no partitioning needed)."""
    if budget is None or need_bytes <= budget:
        return 0
    bits = 0
    while (need_bytes >> bits) > budget and bits < max_bits:
        bits += 1
    return bits
