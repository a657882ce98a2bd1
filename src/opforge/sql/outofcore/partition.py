"""Hash partitions of rows by key *values*, the same for every chunk and for both sides of a join.

Why not ``keys.join_keys`` / dictionary codes: those are only comparable inside one batch pair (a
string's code depends on its chunk's dictionary, a decimal's storage on its scale, packed keys on
the batch's bounds). Here each key is first brought to a canonical int64 per value: strings by a
hash of the word (one per dictionary entry, cached by dictionary; LIST / STRUCT values alike),
decimals / timestamps rescaled
to the scale both sides share, numbers cast to the pair's common type. ``seed`` changes the hash
so that a partition split again spreads its rows over new partitions."""
from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np
import torch

from opforge.sql import nested
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.expr import Batch, cast_values, evaluate
from opforge.sql.physical.keys import key_tensor, partitions

_MIX = 0x9E3779B97F4A7C15 - (1 << 64)
_SEEDS = [0x2545F4914F6CDD1D, 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x27BB2EE687B0B0FD,
          0x61C8864680B583EB, 0x165667B19E3779F9]
_WORD_HASHES: OrderedDict[int, tuple[tuple, torch.Tensor]] = OrderedDict()


def key_types(left_types: list[T.SqlType], right_types: list[T.SqlType] | None = None) -> list[T.SqlType] | None:
    """The type each key is canonicalized to (a join: the pair's common type); None when a pair
    has no common type this module can hash (the operator then stays in memory)."""
    out = []
    for i, a in enumerate(left_types):
        b = a if right_types is None else right_types[i]
        if a.kind == "STRING" or b.kind == "STRING":
            if a.kind != b.kind:
                return None
            out.append(T.STRING)
        elif a.kind in T.NESTED or b.kind in T.NESTED:
            if a != b:
                return None
            out.append(a)
        elif a.kind in ("DATE", "TIMESTAMP") or b.kind in ("DATE", "TIMESTAMP"):
            if a.kind != b.kind:
                return None
            out.append(a if a.scale >= b.scale else b)
        else:
            try:
                t = T.common_numeric(a, b)
            except Exception:  # noqa: BLE001 - no common type: not partitionable here
                return None
            out.append(T.decimal(18, t.scale) if t.kind == "DECIMAL" else t)
    return out


def dictionary_hashes(words: tuple) -> torch.Tensor:
    """An int64 per entry of a coded column's dictionary (strings, or LIST / STRUCT values), equal
    for equal values whatever dictionary holds them: codes are not (each chunk, each worker codes
    its own values). Cached by dictionary."""
    key = id(words)
    hit = _WORD_HASHES.get(key)
    if hit is not None and hit[0] is words:
        return hit[1]
    # crc32 under two seeds: deterministic across processes (str's hash is salted per process)
    data = (w.encode() if isinstance(w, str) else nested.stable_bytes(w.value) for w in words)
    h = torch.from_numpy(np.fromiter((_word_hash(b) for b in data), dtype=np.uint64,
                                     count=len(words)).view(np.int64))
    _WORD_HASHES[key] = (words, h)
    while len(_WORD_HASHES) > 32:
        _WORD_HASHES.popitem(last=False)
    return h


def _word_hash(b: bytes) -> int:
    return zlib.crc32(b) | (zlib.crc32(b, 0x9747B28C) << 32)


def canonical(col: Column, typ: T.SqlType) -> torch.Tensor:
    """int64 per row, equal exactly when the SQL values are equal (NULL slots arbitrary)."""
    if T.is_coded(typ):
        h = dictionary_hashes(col.dictionary or ()).to(col.device)
        return h[col.values.long()] if len(h) else torch.zeros(len(col), dtype=torch.int64, device=col.device)
    if typ.kind in ("DATE", "TIMESTAMP"):
        return col.values.long() * 10 ** (typ.scale - col.type.scale) if typ.kind == "TIMESTAMP" else col.values.long()
    return key_tensor(Column(cast_values(col, typ), None, typ))


def row_hash(batch: Batch, exprs, types: list[T.SqlType], seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(hash, valid): one int64 per row from its keys; valid False where a key is NULL."""
    h, valid = None, None
    for e, t in zip(exprs, types):
        col = evaluate(e, batch)
        k = canonical(col, t)
        if col.valid is not None:
            k = torch.where(col.valid, k, torch.zeros_like(k))
            valid = col.valid if valid is None else valid & col.valid
        h = k if h is None else (h * _MIX) ^ k
    h = (h ^ _SEEDS[seed % len(_SEEDS)]) * _MIX
    return h ^ (h >> 29), valid


def split(batch: Batch, exprs, types, bits: int, seed: int, nulls_equal: bool = False) -> list[Batch]:
    """``batch`` cut into 2^bits partitions by the hash of its keys; rows with a NULL key go to
    partition 0 (they match nothing, but outer joins keep them), or, ``nulls_equal`` (GROUP BY,
    DISTINCT, PARTITION BY: NULLs are one value), are hashed with the NULL as a value, so that a
    re-split spreads them too."""
    h, valid = row_hash(batch, exprs, types, seed)
    part = (h >> 3) & ((1 << bits) - 1)
    if valid is not None and not nulls_equal:
        part = torch.where(valid, part, torch.zeros_like(part))
    return [batch.take(idx) for idx in partitions(part, bits)]


def distinct_keys(batch: Batch, exprs, types, nulls_equal: bool = False) -> int:
    """How many distinct key tuples (non-NULL ones unless ``nulls_equal``) ``batch`` holds, capped
    at 2 (1: it cannot be split)."""
    h, valid = row_hash(batch, exprs, types, 0)
    if valid is not None and not nulls_equal:
        h = h[valid]
    if h.numel() == 0:
        return 0
    return 1 if bool((h == h[0]).all()) else 2
