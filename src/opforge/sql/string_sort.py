"""The sorted distinct words of a string column and each row's rank among them, by a radix sort of
the UTF-8 bytes with torch on the column's device.

Why: a column of mostly distinct strings (TPC-H's comments) cannot use Parquet's dictionary pages
(the writer falls back to plain pages), and Arrow's way to the sorted dictionary the engine keeps
(hash ``dictionary_encode``, ``unify_dictionaries``, a comparison ``sort_indices`` over strings) runs
on one host thread: seconds for 1.5 M comments, most of q13's first run. Here the bytes go to the
device once and a least-significant-digit radix sort orders the rows: one stable ``torch.sort`` per
7-byte slice of the strings (zero-padded; a 7-byte big-endian slice fits a non-negative int64) and
one for the length, the least significant key (a prefix sorts first). UTF-8 byte order is
code-point order, the order of Python ``str``. Equal neighbours in sorted order share a rank.
"""
from __future__ import annotations

import numpy as np
import torch

SLICE = 7  # bytes per sort key: a non-negative int64


def _slice_key(data: torch.Tensor, start: torch.Tensor, length: torch.Tensor, k: int) -> torch.Tensor:
    """Bytes ``[SLICE*k, SLICE*k + SLICE)`` of each string (zero past its end), big-endian in an int64."""
    key = torch.zeros(start.shape[0], dtype=torch.int64, device=start.device)
    for j in range(SLICE):
        at = SLICE * k + j
        inside = length > at
        byte = data[torch.where(inside, start + at, 0)].to(torch.int64)
        key = key * 256 + torch.where(inside, byte, 0)
    return key


def sorted_ranks(offsets: torch.Tensor, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``n`` strings (row ``i``'s UTF-8 bytes: ``data[offsets[i]:offsets[i + 1]]``; int64
    offsets, uint8 data, one device): each row's rank among the distinct strings in sorted order
    (int32) and, per rank, the row of one string of that rank (int64)."""
    n = offsets.shape[0] - 1
    device = offsets.device
    if n <= 0:
        return torch.zeros(0, dtype=torch.int32, device=device), torch.zeros(0, dtype=torch.int64, device=device)
    if data.numel() == 0:  # every string is empty: gathers need one byte to point at
        data = torch.zeros(1, dtype=torch.uint8, device=device)
    start, length = offsets[:-1], offsets[1:] - offsets[:-1]
    order = torch.sort(length, stable=True).indices
    slices = -(-int(length.max()) // SLICE)
    for k in reversed(range(slices)):
        key = _slice_key(data, start[order], length[order], k)
        order = order[torch.sort(key, stable=True).indices]
    s, ln = start[order], length[order]
    new = torch.ones(n, dtype=torch.bool, device=device)  # differs from its predecessor in sorted order
    new[1:] = ln[1:] != ln[:-1]
    for k in range(slices):
        key = _slice_key(data, s, ln, k)
        new[1:] |= key[1:] != key[:-1]
    ranks = torch.empty(n, dtype=torch.int32, device=device)
    ranks[order] = (torch.cumsum(new, 0) - 1).to(torch.int32)
    return ranks, order[new]


GATHER_BYTES = 1 << 24  # bytes gathered at a time: each batch makes a few int64 tensors of this length (256 MiB)
GATHER_WORK_BYTES = 24 * GATHER_BYTES  # device bytes a batch's temporaries take (three int64 per byte)


def gathered_words(offsets: torch.Tensor, data: torch.Tensor, rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The strings of ``rows`` (as ``sorted_ranks`` takes them: int64 offsets, uint8 data, one
    device), gathered on that device and brought to the host as Arrow's string layout: int64
    offsets from 0 (one more than ``rows``) and the bytes. Why: the sorted distinct words of a
    column of millions of comments are rows scattered over a gigabyte; a host gather of them
    misses the cache at every word, the device's takes milliseconds. Each word's bytes are a run
    of consecutive source positions, so the source of every output byte is a cumulative sum of
    ones with a jump where a word starts."""
    k = rows.shape[0]
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    ends = torch.zeros(k + 1, dtype=torch.int64, device=offsets.device)
    torch.cumsum(lengths, 0, out=ends[1:])
    host_ends = ends.cpu().numpy()
    total = int(host_ends[-1])
    out = np.empty(total, dtype=np.uint8)
    cuts = np.searchsorted(host_ends, np.arange(GATHER_BYTES, total, GATHER_BYTES, dtype=np.int64))
    bounds = np.unique(np.concatenate([[0], cuts, [k]]))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        b0, b1 = int(host_ends[lo]), int(host_ends[hi])
        if b1 == b0:
            continue
        length = lengths[lo:hi]
        some = length > 0
        s, ln, at = starts[lo:hi][some], length[some], ends[lo:hi][some] - b0
        jump = s.clone()
        jump[1:] -= s[:-1] + ln[:-1] - 1  # from the last byte of the word before
        jump[0] += 1
        step = torch.ones(b1 - b0, dtype=torch.int64, device=offsets.device)
        step[at] = jump
        out[b0:b1] = data[torch.cumsum(step, 0) - 1].cpu().numpy()
    return host_ends, out
