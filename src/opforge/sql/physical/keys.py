"""Key encoding shared by aggregation, join and distinct: several key columns -> one int64 key.

Every grouping goes through the registry op ``opforge.group_by`` (dispatch picks the Triton
open-addressing table on CUDA, the sort-based reference on the CPU), so the SQL operators never
hash on their own. A multi-column key is reduced exactly, never by a lossy hash of the tuple:

* integer keys whose ranges multiply to less than 2^62 (dictionary codes, dates, TPC-H's dense
  ids) are *packed*: ``sum((k_i - min_i) * stride_i)``, one min / max pass per column and one host
  sync for all of them. A join then probes one int64 key per side; a grouping groups it once.
* otherwise each column is grouped on its own, the ids are packed (``ids * G_next + g_next``,
  below 2^62 since both factors are at most the row count), and the packed id is grouped again.

A key whose range is small next to the row count (at most ``2 n + 64 Ki``) needs no hash table:
its groups come from a direct-address table (mark the codes present, a prefix sum ranks them), so
a few hot groups (TPC-H q1's four) cost no atomic contention. Groups are then numbered in key
order; the hash table numbers them by first occurrence. Either way the numbering is deterministic.

``partition_of`` spreads keys over 2^p radix partitions for operators that exceed the memory
budget. It mixes with a different multiplier than the hash kernels' Fibonacci hashing, whose
table slots are the *top* bits of ``key * 2^64/phi``: partitioning on those same bits would put all
keys of one partition into 1/2^p of the table's home slots.
"""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql import decimal128
from opforge.sql.column import Column

# xxHash64's PRIME64_2, as a signed int64: independent of the kernels' 2^64/phi multiplier.
_PART_MUL = 0xC2B2AE3D27D4EB4F - (1 << 64)


def key_tensor(col: Column) -> torch.Tensor:
    """An int64 tensor whose equality is SQL equality of the values (NULL slots zeroed). A 128-bit
    DECIMAL gives ``decimal128.order_key``: its values when they fit int64, else its dense ranks,
    equal within this column only (``join_keys`` keys both sides together)."""
    v = col.values
    if v.dim() == 2:
        v = decimal128.order_key(v)
    elif v.dtype.is_floating_point:
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


# Largest product of key ranges that packs into one int64 key (leaves headroom for the NULL slot).
PACK_LIMIT = 1 << 62


def _direct_limit(n: int) -> int:
    """Largest code range grouped by a direct-address table: its two arrays stay near the input's size."""
    return 2 * n + 65_536


def _is_int(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and t.dtype != torch.bool


def _bounds(keys: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(min, max) of each non-empty int tensor, with one host sync for all of them."""
    stats = torch.stack([v for k in keys for v in torch.aminmax(k)]).tolist()
    return [(stats[2 * i], stats[2 * i + 1]) for i in range(len(keys))]


def pack(keys: list[torch.Tensor], bounds: list[tuple[int, int]], valids=None) -> tuple[torch.Tensor, int] | None:
    """``(codes, code_range)``: one int64 per row, equal exactly when all keys are, in ``[0,
    code_range)`` and ordered as the key tuples; ``valids[i]`` (or None) makes NULL one more value
    of column i. None when the ranges multiply past ``PACK_LIMIT``."""
    valids = valids or [None] * len(keys)
    radix = [hi - lo + 1 + (v is not None) for (lo, hi), v in zip(bounds, valids)]
    total = 1
    for r in radix:
        total *= r
    if total >= PACK_LIMIT:
        return None
    codes = None
    for k, (lo, hi), v, r in zip(keys, bounds, valids, radix):
        c = k.long() - lo
        if v is not None:
            c = torch.where(v, c, hi - lo + 1)
        codes = c if codes is None else codes * r + c
    return codes, total


def direct_ids(codes: torch.Tensor, code_range: int) -> tuple[torch.Tensor, int]:
    """Dense ids of int codes in ``[0, code_range)``, numbered in code order, without hashing
    (``hashing.direct_groups``; one host sync: the group count)."""
    present, ids = hashing.direct_groups(codes, code_range)
    return ids, int(present.shape[0])


def group_ids(keys: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Dense ids (first occurrence) of one int key tensor through ``opforge.group_by``; NULL rows
    (valid False) form one group of their own."""
    out = hashing.group_by(keys, valid)
    return out[0], int(out[1].shape[0])


def _note(ctx, text: str) -> None:
    if ctx is not None:
        ctx.note(text)


def dense_ids(cols: list[Column], n: int, device, ctx=None) -> tuple[torch.Tensor, int]:
    """Group id per row (0..groups-1) for the combination of key values; NULL is one value of its own.
    The numbering is deterministic: key order (direct-address path) or first occurrence (hash table).
    ``ctx`` (an ``ExecContext``) is told which way the groups were found, for EXPLAIN ANALYZE."""
    if not cols:
        return torch.zeros(n, dtype=torch.int64, device=device), (1 if n else 0)
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=device), 0
    keys = [hash_key(c) for c in cols]
    if all(_is_int(k) for k in keys):
        packed = pack(keys, _bounds(keys), [c.valid for c in cols])
        if packed is not None:
            codes, code_range = packed
            if code_range <= _direct_limit(n):
                _note(ctx, f"groups by direct-address table over a key range of {code_range}")
                return direct_ids(codes, code_range)
            if len(cols) > 1:
                _note(ctx, f"groups by hash table of {len(cols)} packed keys (range {code_range})")
                return group_ids(codes)
    _note(ctx, "groups by hash table" + (" per key column, regrouped" if len(cols) > 1 else ""))
    ids, count = None, 1
    for col, k in zip(cols, keys):
        g, gc = group_ids(k, col.valid)
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
    Several: packed over both sides' common bounds (``pack``) when the ranges allow; otherwise each
    column is grouped over both sides together (``dense_ids`` on the concatenation) and the ids are
    packed and regrouped, so the pair of keys is dense int64."""
    from opforge.sql.expr import comparable

    nl, nr = len(left[0]), len(right[0])
    lvalid = rvalid = None
    for l, r in zip(left, right):
        if l.valid is not None:
            lvalid = l.valid if lvalid is None else lvalid & l.valid
        if r.valid is not None:
            rvalid = r.valid if rvalid is None else rvalid & r.valid
    pairs = []
    for l, r in zip(left, right):
        lv, rv = comparable(l, r)
        if lv.dim() == 2:  # 128-bit DECIMALs: keyed over both sides together, so equal values share a key
            keys = decimal128.order_key(torch.cat([lv, rv]))
            lv, rv = keys[:nl], keys[nl:]
        pairs.append((hash_key(Column(lv, l.valid, l.type)), hash_key(Column(rv, r.valid, r.type))))
    if len(pairs) == 1:
        lk, rk = pairs[0]
        if lk.dtype != rk.dtype:
            lk, rk = lk.long(), rk.long()
        return lk, rk, lvalid, rvalid
    if nl and nr and all(_is_int(a) and _is_int(b) for a, b in pairs):
        lb, rb = _bounds([a for a, _ in pairs]), _bounds([b for _, b in pairs])
        bounds = [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(lb, rb)]
        packed_l, packed_r = pack([a for a, _ in pairs], bounds), pack([b for _, b in pairs], bounds)
        if packed_l is not None:
            return packed_l[0], packed_r[0], lvalid, rvalid
    both = [Column(torch.cat([a.long(), b.long()]), None, l.type) for (a, b), l in zip(pairs, left)]
    ids, _ = dense_ids(both, nl + nr, device)
    return ids[:nl], ids[nl:], lvalid, rvalid


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
