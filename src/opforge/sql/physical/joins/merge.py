"""Sort-merge join: sort the build side unless it is already in key order, then each probe key's
matches are the run ``[lo, hi)`` found by ``searchsorted`` in the sorted build keys.

When both sides' single key column is already sorted ascending without NULLs (a table loaded in
key order, e.g. TPC-H orders / lineitem on orderkey, kept through filters) there is no sort and no
table, and both sides are read in order: then it is also the executor's rule for unplanned joins
that are not tiny. The executor always sorts (and searches) the right input.
"""
from __future__ import annotations

import math

import torch

from opforge.sql.physical.joins.base import (
    KEY_BYTES, RANDOM_PROBE_BYTES, ROW_ID_BYTES, Hardware, JoinAlgorithm, JoinRun, JoinSizes, SideInfo, output_bytes,
)

SORT_PASSES = 4  # an LSD radix sort of int64 keys + row ids: ~4 read+write passes at 16 bits/pass


def merge_cost(s: JoinSizes, sorted_build: bool, sorted_probe: bool) -> float:
    """Sort the sides that are not already in key order, then merge (both read in order)."""
    sort = 0.0
    for rows, done in ((s.build_rows, sorted_build), (s.probe_rows, sorted_probe)):
        if not done:
            sort += SORT_PASSES * 2 * rows * (KEY_BYTES + ROW_ID_BYTES)
    return sort + (s.build_rows + s.probe_rows) * KEY_BYTES + output_bytes(s)


def merge_pairs(lkey, rkey, lvalid=None, rvalid=None, presorted=False):
    """Sort-merge: sort the right side (skipped when ``presorted``: both sides ascending), then each
    left key's matches are a ``searchsorted`` range. Pairs ordered by left row, then right row."""
    from opforge.ops import hashing

    dev = lkey.device
    lk, rk = lkey.long(), rkey.long()
    if presorted:
        order, sorted_r = None, rk
    else:
        rows = torch.arange(len(rk), device=dev)
        if rvalid is not None:
            rows = rows[rvalid]
        sorted_r, o = torch.sort(rk[rows], stable=True)
        order = rows[o]
    lo = torch.searchsorted(sorted_r, lk, side="left")
    counts = torch.searchsorted(sorted_r, lk, side="right") - lo
    if lvalid is not None:
        counts = torch.where(lvalid, counts, 0)
    li, pos = hashing.expand_runs(lo, counts)
    return li, (pos if order is None else order[pos])


class MergeJoin(JoinAlgorithm):
    name = "merge"
    rank = 3
    unplanned_priority = 1

    def cost(self, s: JoinSizes, build: SideInfo, probe: SideInfo, hw: Hardware) -> float:
        base = merge_cost(s, build.sorted_key, probe.sorted_key)
        if build.sorted_key and probe.sorted_key:
            return base
        # unsorted probes binary-search the sorted build keys: log2(B) accesses each
        steps = max(1.0, math.log2(max(2.0, s.build_rows)))
        per = KEY_BYTES if s.build_rows * KEY_BYTES <= hw.l2_bytes else RANDOM_PROBE_BYTES
        return base + s.probe_rows * steps * per

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        return "both inputs in key order" if build.sorted_key and probe.sorted_key else \
            "build side in key order" if build.sorted_key else "sorts the build side"

    def unplanned(self, left_rows: int, right_rows: int, presorted: bool) -> bool:
        return presorted

    def label(self, presorted: bool, bits: int | None) -> str:
        return "merge join (inputs already sorted)" if presorted else "sort-merge join (sorts the right side)"

    def pairs(self, lkey, rkey, lvalid, rvalid, run: JoinRun):
        return merge_pairs(lkey, rkey, lvalid, rvalid, run.presorted)


ALGORITHM = MergeJoin()
