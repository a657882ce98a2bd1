"""Perfect-hash (direct) join: over unique dense integer build keys, a direct-address table
``slot[key - min] = build row`` replaces the hash table and each probe reads one slot.

Eligible when the build side's single key column is a unique integer column whose value range is
at most ``DENSE_RANGE_PER_ROW`` times its rows (``base.py``; dense keys, e.g. TPC-H's surrogate
keys). The planner's estimate can be wrong: build keys that turn out not unique and dense at run
time make it a hash join (the note says so).
"""
from __future__ import annotations

import torch

from opforge.sql.physical.joins.base import (
    DENSE_RANGE_PER_ROW, KEY_BYTES, RANDOM_PROBE_BYTES, Hardware, JoinAlgorithm, JoinRun, JoinSizes, SideInfo,
    output_bytes,
)
from opforge.sql.physical.joins.hash import ALGORITHM as HASH

DIRECT_MIN_RANGE = 1024  # tiny builds may spread a little wider at run time
DIRECT_BYTES_PER_SLOT = 8  # a direct-address table: one row id per key value in [min, max]
FALLBACK_NOTE = "direct join: build keys not unique and dense at run time: hash join instead"


def direct_cost(s: JoinSizes, key_range: float, hw: Hardware) -> float:
    """The table is an array indexed by ``key - min``: ``key_range`` slots."""
    table = key_range * DIRECT_BYTES_PER_SLOT
    keys = (s.build_rows + s.probe_rows) * KEY_BYTES
    per_probe = KEY_BYTES if table <= hw.l2_bytes else RANDOM_PROBE_BYTES
    return keys + table + s.probe_rows * per_probe + output_bytes(s)


def direct_pairs(bkey, pkey, bvalid=None, pvalid=None, how="inner"):
    """Perfect hashing: a direct-address table ``slot[key - min] = build row`` over unique dense
    integer build keys; each probe reads one slot. -> (build_index, probe_index) as
    ``hashing.hash_join`` gives them (by probe row; -1 for an unmatched "left" probe row), or None
    when the build keys are not unique or too sparse (the caller hashes instead)."""
    dev = bkey.device
    rows = torch.arange(len(bkey), device=dev)
    kb = bkey.long()
    if bvalid is not None:
        rows, kb = rows[bvalid], kb[bvalid]
    pk = pkey.long()
    if kb.numel() == 0:
        lo, span = 0, 0
    else:
        lo, hi = (int(x) for x in torch.aminmax(kb))
        span = hi - lo + 1
        if span > max(DIRECT_MIN_RANGE, DENSE_RANGE_PER_ROW * kb.numel()):
            return None
    slot = torch.full((max(span, 1),), -1, dtype=torch.int64, device=dev)
    if span:
        if int(torch.bincount(kb - lo, minlength=span).max()) > 1:
            return None  # duplicate build keys: not a perfect hash
        slot[kb - lo] = rows
    inside = (pk >= lo) & (pk < lo + span)
    if pvalid is not None:
        inside &= pvalid
    b = torch.where(inside, slot[torch.where(inside, pk - lo, 0)], -1)
    hit = b >= 0
    if how == "left":
        return b, torch.arange(len(pk), device=dev)
    keep = torch.nonzero(hit if how in ("inner", "semi") else ~hit).squeeze(1)
    return b[keep], keep


class DirectJoin(JoinAlgorithm):
    name = "direct"
    rank = 2
    probes_outer = True

    def eligible(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> bool:
        return build.dense_range is not None and build.dense_range <= DENSE_RANGE_PER_ROW * max(1.0, build.rows)

    def cost(self, s: JoinSizes, build: SideInfo, probe: SideInfo, hw: Hardware) -> float:
        return direct_cost(s, build.dense_range, hw)

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        return f"unique dense int keys, range {build.dense_range:.0f}"

    def label(self, presorted: bool, bits: int | None) -> str:
        return "perfect-hash (direct) join"

    def pairs(self, lkey, rkey, lvalid, rvalid, run: JoinRun):
        right_builds = run.right_builds(len(lkey), len(rkey))
        got = direct_pairs(rkey, lkey, rvalid, lvalid) if right_builds else direct_pairs(lkey, rkey, lvalid, rvalid)
        if got is not None:
            return (got[1], got[0]) if right_builds else got
        if run.ctx is not None:
            run.ctx.note(FALLBACK_NOTE)
        return HASH.pairs(lkey, rkey, lvalid, rvalid, run)

    def probe(self, bkey, pkey, bvalid, pvalid, how: str, run: JoinRun):
        got = direct_pairs(bkey, pkey, bvalid, pvalid, how)
        if got is not None:
            return got
        run.ctx.note(FALLBACK_NOTE)
        return HASH.probe(bkey, pkey, bvalid, pvalid, how, run)


ALGORITHM = DirectJoin()
