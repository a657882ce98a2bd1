"""LIKE over a string dictionary held on the device: Arrow's layout (one byte buffer, word offsets)
as tensors, matched by whole-buffer tensor passes instead of a loop over words.

Why: a column's dictionary can hold millions of distinct words (TPC-H's o_comment: 15M at SF 10),
and a host loop over them, even Arrow's, takes seconds where the rest of the query takes
milliseconds. Every word is matched at once here: for each literal segment of the pattern (the
pieces between ``%``), one pass marks every byte position where the segment starts (``_`` matches
any byte), then the first usable mark of each word is found by a scatter-min over the marks, left
to right through the segments (greedy leftmost matching is exact for LIKE, whose segments have fixed
lengths). Anchored ends (a pattern not starting or ending with ``%``) compare the word's first or
last bytes directly.

Bytes, not characters: a literal segment matches a UTF-8 string exactly where its bytes do (UTF-8
is self-synchronizing), but ``_`` is one character, so patterns with ``_`` take this path only on
ASCII dictionaries (:func:`supports`); the caller falls back to Arrow otherwise.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from opforge.runtime.host_staging import to_device

_CACHE: OrderedDict[tuple[int, str], tuple[tuple, "DeviceWords"]] = OrderedDict()
_CACHE_SIZE = 16
# Device bytes the cache may hold, beyond its newest entry: kept dictionaries outlive their query and
# count against the next one's memory limit (TPC-H SF100's part and customer names: ~1 GB)
_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class DeviceWords:
    data: torch.Tensor  # uint8, every word's bytes back to back
    offsets: torch.Tensor  # int64, n + 1: word i is data[offsets[i]:offsets[i + 1]]
    ascii: bool

    @property
    def count(self) -> int:
        return self.offsets.numel() - 1


def from_arrow(words: pa.Array, device) -> DeviceWords:
    """An Arrow string array (no NULLs) as device tensors."""
    words = words.cast(pa.large_string())  # 64-bit offsets: a dictionary may pass 2 GiB of bytes
    _, off_buf, data_buf = words.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[words.offset:words.offset + len(words) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0]:offsets[-1]] if data_buf is not None and len(words) \
        else np.zeros(0, dtype=np.uint8)
    offsets = offsets - offsets[0] if len(offsets) else np.zeros(1, dtype=np.int64)
    # through the pinned staging, straight out of Arrow's buffer: o_comment's slices at SF100 are
    # 7 GB a query, and a pageable copy (after a host copy of the bytes) ran at a fraction of the link
    data_t = to_device([data], len(data), torch.uint8, device)
    ascii_only = bool((data_t < 128).all()) if data_t.numel() else True
    return DeviceWords(data_t, to_device([offsets], len(offsets), torch.int64, device), ascii_only)


def device_words(words: tuple[str, ...], arrow: pa.Array, device) -> DeviceWords:
    """The dictionary ``words`` (its Arrow copy ``arrow``) on ``device``, cached by identity."""
    key = (id(words), str(device))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is words:
        _CACHE.move_to_end(key)
        return hit[1]
    dw = from_arrow(arrow, device)
    _CACHE[key] = (words, dw)
    while len(_CACHE) > 1 and (len(_CACHE) > _CACHE_SIZE or _cached_bytes() > _CACHE_BYTES):
        _CACHE.popitem(last=False)
    return dw


PIECE_BYTES = 1 << 30  # past this many bytes a dictionary is matched a slice of words at a time


def like_words(words: tuple[str, ...], arrow: pa.Array, pattern: str, device) -> torch.Tensor | None:
    """``word LIKE pattern`` for every word of the dictionary ``words`` (its Arrow copy ``arrow``) on
    ``device``; None when the pattern needs the host path. A dictionary of up to ``PIECE_BYTES``
    stays on the device (``device_words``); a larger one is matched slice by slice and not kept:
    matching takes a few times its bytes, and TPC-H's o_comment at SF100 holds 7 GB of words."""
    wide = pa.types.is_large_string(arrow.type)
    offsets = np.frombuffer(arrow.buffers()[1], dtype=np.int64 if wide else np.int32)[
        arrow.offset:arrow.offset + len(arrow) + 1] if len(arrow) else np.zeros(1, dtype=np.int64)
    if int(offsets[-1]) - int(offsets[0]) <= PIECE_BYTES:
        dw = device_words(words, arrow, device)
        return like(dw, pattern) if supports(dw, pattern) else None
    offsets = offsets.astype(np.int64)
    cuts = np.searchsorted(offsets, np.arange(offsets[0] + PIECE_BYTES, offsets[-1], PIECE_BYTES), side="right") - 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(arrow)]]))
    out = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        dw = from_arrow(arrow.slice(lo, hi - lo), device)
        if not supports(dw, pattern):
            return None
        out.append(like(dw, pattern))
    return torch.cat(out)


def _cached_bytes() -> int:
    return sum(dw.data.numel() + dw.offsets.numel() * 8 for _, dw in _CACHE.values())


def supports(dw: DeviceWords, pattern: str) -> bool:
    """Whether :func:`like` matches ``pattern`` exactly on ``dw`` (no escapes; ``_`` needs ASCII)."""
    return "\\" not in pattern and (dw.ascii or "_" not in pattern)


def _segment_bytes(segment: str) -> tuple[list[int], list[bool]]:
    raw = segment.encode("utf-8")
    return list(raw), [b == ord("_") for b in raw]


def _match_at(data: torch.Tensor, starts: torch.Tensor, seg: list[int], wild: list[bool]) -> torch.Tensor:
    """Whether the segment's bytes are at each start position (starts + len within data)."""
    ok = torch.ones(starts.shape, dtype=torch.bool, device=data.device)
    for j, (b, w) in enumerate(zip(seg, wild)):
        if not w:
            ok &= data[starts + j] == b
    return ok


def _marks(data: torch.Tensor, seg: list[int], wild: list[bool]) -> torch.Tensor:
    """Every byte position where the segment starts (ascending)."""
    span = data.numel() - len(seg) + 1
    if span <= 0:
        return torch.zeros(0, dtype=torch.int64, device=data.device)
    hit = torch.ones(span, dtype=torch.bool, device=data.device)
    for j, (b, w) in enumerate(zip(seg, wild)):
        if not w:
            hit &= data[j:j + span] == b
    return torch.nonzero(hit).flatten()


def like(dw: DeviceWords, pattern: str) -> torch.Tensor:
    """``word LIKE pattern`` for every word of ``dw`` (bool, on its device)."""
    if not supports(dw, pattern):
        raise ValueError(f"strings.like: pattern {pattern!r} needs the host path (escape, or '_' on non-ASCII)")
    data, offsets = dw.data, dw.offsets
    start, end = offsets[:-1], offsets[1:]
    parts = pattern.split("%")
    anchored_start, anchored_end = len(parts) == 1 or parts[0] != "", len(parts) == 1 or parts[-1] != ""
    segments = [_segment_bytes(p) for p in parts if p]
    ok = torch.ones(dw.count, dtype=torch.bool, device=data.device)
    cur = start.clone()  # the first byte each word's next segment may start at
    if len(parts) == 1:  # no '%': the whole word, byte for byte
        seg, wild = segments[0] if segments else ([], [])
        ok &= (end - start) == len(seg)
        idx = torch.nonzero(ok).flatten()
        ok[idx] = _match_at(data, start[idx], seg, wild)
        return ok
    first, last = 0, len(segments)
    if anchored_start and segments:
        seg, wild = segments[0]
        ok &= (end - start) >= len(seg)
        idx = torch.nonzero(ok).flatten()
        ok[idx] = _match_at(data, start[idx], seg, wild)
        cur = start + len(seg)
        first = 1
    tail = None
    if anchored_end and len(segments) > first:
        tail = segments[-1]
        last -= 1
    for seg, wild in segments[first:last]:
        marks = _marks(data, seg, wild)
        word = torch.searchsorted(offsets, marks, right=True) - 1
        usable = (marks >= cur[word]) & (marks + len(seg) <= end[word])
        marks, word = marks[usable], word[usable]
        big = torch.iinfo(torch.int64).max
        found = torch.full((dw.count,), big, dtype=torch.int64, device=data.device)
        found.scatter_reduce_(0, word, marks, "amin")
        ok &= found != big
        cur = torch.where(found != big, found + len(seg), cur)
    if tail is not None:
        seg, wild = tail
        at = end - len(seg)
        ok &= at >= cur
        idx = torch.nonzero(ok).flatten()
        ok[idx] = _match_at(data, at[idx], seg, wild)
    return ok


SHORT_MAX = 7  # bytes of a slice packed into one int64 key (the top byte stays clear: keys stay positive)
SHORT_MAX_WORDS = 1 << 16  # distinct slices decoded back into host strings


def short_substring(dw: DeviceWords, begin: int, length: int) -> tuple[torch.Tensor, tuple[str, ...]] | None:
    """SUBSTRING(word, begin + 1, length) of every word, as (int32 code of each word's slice in the
    new dictionary, the new sorted dictionary), or None where this path is not exact or not cheap:
    non-ASCII words (slices count characters), a NUL byte, ``length`` past :data:`SHORT_MAX`, or
    more than :data:`SHORT_MAX_WORDS` distinct slices.

    Why: a per-word host pass over a dictionary of millions of words (TPC-H q22's phone prefixes:
    1.5M words at SF 10) costs tens of milliseconds each time. Here each word's slice is read from
    the device bytes and packed big-endian into an int64 (zero padding sorts a prefix first, as
    strings sort); one ``torch.unique`` gives the sorted new dictionary and every word's code."""
    if not dw.ascii or begin < 0 or not 0 <= length <= SHORT_MAX:
        return None
    data, offsets = dw.data, dw.offsets
    dev = data.device
    if data.numel() and bool((data == 0).any()):
        return None
    lo = offsets[:-1] + begin
    n = (torch.minimum(lo + length, offsets[1:]) - lo).clamp(min=0)
    key = torch.zeros(dw.count, dtype=torch.int64, device=dev)
    last = max(data.numel() - 1, 0)
    for j in range(length):
        byte = data[(lo + j).clamp(max=last)].long() if data.numel() else torch.zeros_like(key)
        key = key * 256 + torch.where(j < n, byte, torch.zeros_like(byte))
    uniq, inv = torch.unique(key, return_inverse=True)
    if uniq.numel() > SHORT_MAX_WORDS:
        return None
    packed = uniq.cpu().numpy().astype(">i8").view(np.uint8).reshape(-1, 8)[:, 8 - length:] if length else \
        np.zeros((uniq.numel(), 0), dtype=np.uint8)
    words = tuple(bytes(row).rstrip(b"\0").decode("ascii") for row in packed)
    return inv.to(torch.int32), words
