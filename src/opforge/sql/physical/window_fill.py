"""``fill(x [ORDER BY k]) OVER (...)``: each NULL ``x`` replaced by a linear interpolation between
the nearest rows of its partition, by the key ``k`` (default: the window's ORDER BY), that have
both a value and a key; beyond the first / last such row it extrapolates the line through the two
nearest, and with one such row it copies its value (a row whose key is NaN or infinite is no such
row: its line would be NaN). A row whose key is NULL stays NULL; the frame
is not used. As DuckDB: an integer or DECIMAL result is truncated toward zero between two rows and
rounded beyond them. All index arithmetic on the device: one sort by (partition, key), running
max / min of the known positions give each row its neighbours."""
from __future__ import annotations

import torch

from opforge.ops.scan import cummax, cummin
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.physical.sort import sort_permutation


def _prev_known(known: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The last known position at or before each position (-1: none)."""
    return cummax(torch.where(known, pos, -1), 0)[0]


def _next_known(known: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
    """The first known position at or after each position (n: none)."""
    return torch.flip(cummin(torch.flip(torch.where(known, pos, n), [0]), 0)[0], [0])


def fill(x: Column, k: Column, part_id: torch.Tensor, typ: T.SqlType) -> Column:
    n, dev = len(x), x.device
    if n == 0:
        return x
    kvalid = k.valid_mask()
    key = torch.where(kvalid, k.values.double(), 0.0)
    perm = sort_permutation([(part_id, None, False, False), (key, kvalid, False, False)], n, dev)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=dev)
    pid, kk, ok = part_id[perm], key[perm] / 2, kvalid[perm]  # halved: differences of huge keys stay finite
    xv = x.values[perm].double()  # integers and DECIMALs in their storage units
    known = x.valid_mask()[perm] & ok & torch.isfinite(kk)  # DuckDB: a NaN / infinite key is no neighbour
    pos = torch.arange(n, device=dev)
    prev, nxt = _prev_known(known, pos), _next_known(known, pos, n)
    prev2 = torch.where(prev >= 1, prev[(prev - 1).clamp(min=0)], -1)
    nxt2 = torch.where(nxt <= n - 2, nxt[(nxt + 1).clamp(max=n - 1)], n)

    def same(j):  # j is a real position in this row's partition
        inside = (j >= 0) & (j < n)
        return inside & (pid[j.clamp(0, n - 1)] == pid)

    def at(t, j):
        return t[j.clamp(0, n - 1)]

    has_p, has_n, has_p2, has_n2 = same(prev), same(nxt), same(prev2), same(nxt2)

    def line(k1, x1, k0, x0):  # through (k0, x0) and (k1, x1), at this row's key; flat when k0 == k1
        span = k1 - k0
        ratio = torch.where(span != 0, (kk - k1) / torch.where(span != 0, span, 1.0), 0.0)
        return x1 + (x1 - x0) * ratio

    between = line(at(kk, nxt), at(xv, nxt), at(kk, prev), at(xv, prev))
    right = torch.where(has_p2, line(at(kk, prev), at(xv, prev), at(kk, prev2), at(xv, prev2)), at(xv, prev))
    left = torch.where(has_n2, line(at(kk, nxt), at(xv, nxt), at(kk, nxt2), at(xv, nxt2)), at(xv, nxt))
    inner = has_p & has_n
    guess = torch.where(inner, between, torch.where(has_p, right, left))
    if not typ.is_float:  # DuckDB: truncated between two rows, rounded (half away from zero) beyond
        rounded = torch.sign(guess) * torch.floor(guess.abs() + 0.5)
        guess = torch.where(inner, torch.trunc(guess), rounded)
    usable = ok & (has_p | has_n)
    filled = ~x.valid_mask()[perm] & usable
    values = torch.where(filled, guess.to(x.values.dtype), x.values[perm])
    valid = x.valid_mask()[perm] | filled
    return Column(values[inverse], None if bool(valid.all()) else valid[inverse], typ)
