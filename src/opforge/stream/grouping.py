"""Grouping (key, start) pairs on the device, the columnar window and join
operators' step: order-preserving int64 codes of pairs, grouping by one sort
or a direct-address table, finding pairs in a table (``searchsorted``), all
with host syncs counted (none per record or per pair)."""

from __future__ import annotations

import torch

from opforge.ops.hashing import direct_groups


def group_pairs(a: torch.Tensor, b: torch.Tensor):
    """``(unique_pairs [G, 2], inverse [N])`` of the pairs ``(a[i], b[i])``, in
    lexicographic order: two stable 1-D sorts and a scan (``torch.unique(dim=0)``
    does the same far slower)."""
    order = torch.argsort(b, stable=True)
    order = order[torch.argsort(a[order], stable=True)]
    sa, sb = a[order], b[order]
    new = torch.ones_like(sa, dtype=torch.bool)
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    group_sorted = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(group_sorted)
    inverse[order] = group_sorted
    return torch.stack([sa[new], sb[new]], 1), inverse


_CODE_LIMIT = 2**62


def pair_codes(a: torch.Tensor, b: torch.Tensor, bounds, b_step: int):
    """Order-preserving int64 codes of the pairs ``(a[i], b[i])``:
    ``(a - a_lo) * span + (b - b_lo) // b_step``, with ``bounds = (a_lo, a_hi,
    b_lo, b_hi)`` host ints covering the pairs and every ``b - b_lo`` a multiple
    of ``b_step`` (window starts: all equal to the offset modulo the slide).
    ``(None, 0)`` when the product of the ranges does not fit in 62 bits."""
    a_lo, a_hi, b_lo, b_hi = bounds
    span = (b_hi - b_lo) // b_step + 1
    if (a_hi - a_lo + 1) * span >= _CODE_LIMIT:
        return None, 0
    return (a - a_lo) * span + torch.div(b - b_lo, b_step, rounding_mode="floor"), span


def direct_range_ok(code_range: int, n: int) -> bool:
    """Whether codes in ``[0, code_range)`` of ``n`` rows group through a
    direct-address table (a pass over the range) rather than a sort: the
    range is at most twice the rows plus 64 Ki."""
    return code_range <= 2 * n + 65_536


def group_codes(codes: torch.Tensor, code_range: int | None = None):
    """``(unique_codes [G], inverse [N])`` of codes in ``[0, code_range)``.
    When the range is small next to the batch (at most twice the rows plus
    64 Ki) the groups come from a direct-address table, no sort: mark the
    codes present, a prefix sum ranks them; otherwise one stable sort and a
    scan. Either way the output size is the one host sync, and the result is
    the same (codes ascending)."""
    if code_range is not None and direct_range_ok(code_range, codes.shape[0]):
        return direct_groups(codes, code_range)
    order = torch.argsort(codes, stable=True)
    sc = codes[order]
    new = torch.ones_like(sc, dtype=torch.bool)
    new[1:] = sc[1:] != sc[:-1]
    group_sorted = torch.cumsum(new, 0) - 1
    inverse = torch.empty_like(group_sorted)
    inverse[order] = group_sorted
    return sc[new], inverse


def merge_bounds(a, b):
    """The union of two host bound tuples ``(a_lo, a_hi, b_lo, b_hi)`` (None: empty)."""
    if a is None:
        return b
    if b is None:
        return a
    return (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))


def find_pairs(tk: torch.Tensor, ts: torch.Tensor, qk: torch.Tensor, qs: torch.Tensor, step: int, bounds=None):
    """For each query pair ``(qk[i], qs[i])``: whether it is a pair of the table
    ``(tk, ts)`` (pairs distinct) and, if so, its row. By order-preserving codes,
    a sort of the table and ``searchsorted`` (``bounds``: host ints covering both,
    read from the tensors when None); by grouping the union when the codes do not fit."""
    T, dev = tk.shape[0], tk.device
    if T == 0 or qk.shape[0] == 0:
        return (torch.zeros(qk.shape[0], dtype=torch.bool, device=dev),
                torch.zeros(qk.shape[0], dtype=torch.int64, device=dev))
    if bounds is None:
        bounds = tuple(torch.stack([torch.minimum(tk.min(), qk.min()), torch.maximum(tk.max(), qk.max()),
                                    torch.minimum(ts.min(), qs.min()), torch.maximum(ts.max(), qs.max())]).tolist())
    codes_t, _ = pair_codes(tk, ts, bounds, step)
    if codes_t is not None:
        codes_q, _ = pair_codes(qk, qs, bounds, step)
        sorted_t, perm = torch.sort(codes_t)
        pos = torch.searchsorted(sorted_t, codes_q).clamp_(max=T - 1)
        return sorted_t[pos] == codes_q, perm[pos]
    uniq, inv = group_pairs(torch.cat([tk, qk]), torch.cat([ts, qs]))
    owner = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=dev)
    owner[inv[:T]] = torch.arange(T, dtype=torch.int64, device=dev)
    o = owner[inv[T:]]
    return o >= 0, o.clamp(min=0)


def nonzero_known(mask: torch.Tensor, count: int) -> torch.Tensor:
    """``torch.nonzero(mask).flatten()`` when ``count`` (the number of True
    entries) is already known on the host: no second device-to-host sync."""
    global _NONZERO_STATIC
    if _NONZERO_STATIC:
        try:
            return torch.nonzero_static(mask, size=count).flatten()
        except (AttributeError, NotImplementedError, RuntimeError):  # a torch or device without it
            _NONZERO_STATIC = False
    return torch.nonzero(mask).flatten()


_NONZERO_STATIC = hasattr(torch, "nonzero_static")
