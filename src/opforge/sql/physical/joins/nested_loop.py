"""Nested-loop join: every (left, right) pair compared at once (one broadcast compare, no table, no
sort): the cheapest for tiny inputs, and the only way for joins without equi keys.

Eligible when ``left rows * right rows <= NESTED_LOOP_MAX_PAIRS`` (it materializes every pair);
that is also the executor's first rule for unplanned joins. A planned nested loop whose actual
inputs make more than ``NESTED_LOOP_GUARD_PAIRS`` pairs (the estimate was wrong) runs as a hash
join instead.
"""
from __future__ import annotations

import torch

from opforge.sql.physical.joins.base import (
    KEY_BYTES, Hardware, JoinAlgorithm, JoinRun, JoinSizes, SideInfo, output_bytes,
)

NESTED_LOOP_MAX_PAIRS = 4096
NESTED_LOOP_GUARD_PAIRS = 1 << 22  # a planned nested loop above this many actual pairs hashes instead
NESTED_LOOP_BYTES_PER_PAIR = 1.0  # one compare per (left, right) pair, from registers / L1


def nested_loop_cost(s: JoinSizes) -> float:
    return s.build_rows * s.probe_rows * NESTED_LOOP_BYTES_PER_PAIR + \
        (s.build_rows + s.probe_rows) * KEY_BYTES + output_bytes(s)


def nested_loop_pairs(lkey, rkey, lvalid=None, rvalid=None):
    """Every (left, right) compared at once: for tiny inputs. Pairs ordered by left, then right."""
    eq = lkey.long()[:, None] == rkey.long()[None, :]
    if lvalid is not None:
        eq &= lvalid[:, None]
    if rvalid is not None:
        eq &= rvalid[None, :]
    li, ri = torch.nonzero(eq, as_tuple=True)
    return li, ri


def cross_pairs(nl: int, nr: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (left, right) pair: a join without equi keys (its residual filters them after)."""
    li = torch.arange(nl, device=dev).repeat_interleave(nr)
    ri = torch.arange(nr, device=dev).repeat(nl)
    return li, ri


class NestedLoopJoin(JoinAlgorithm):
    name = "nested_loop"
    rank = 4
    unplanned_priority = 0
    without_keys = True

    def eligible(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> bool:
        return build.rows * probe.rows <= NESTED_LOOP_MAX_PAIRS

    def cost(self, s: JoinSizes, build: SideInfo, probe: SideInfo, hw: Hardware) -> float:
        return nested_loop_cost(s)

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        return f"{build.rows:.0f} x {probe.rows:.0f} pairs <= {NESTED_LOOP_MAX_PAIRS}"

    def unplanned(self, left_rows: int, right_rows: int, presorted: bool) -> bool:
        return left_rows * right_rows <= NESTED_LOOP_MAX_PAIRS

    def planned_guard(self, left_rows: int, right_rows: int) -> str | None:
        if left_rows * right_rows > NESTED_LOOP_GUARD_PAIRS:
            return f"actual {left_rows} x {right_rows} pairs > {NESTED_LOOP_GUARD_PAIRS}"
        return None

    def label(self, presorted: bool, bits: int | None) -> str:
        return "nested-loop join"

    def pairs(self, lkey, rkey, lvalid, rvalid, run: JoinRun):
        return nested_loop_pairs(lkey, rkey, lvalid, rvalid)


ALGORITHM = NestedLoopJoin()
