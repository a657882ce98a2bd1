"""Which physical join runs an inner equi-join, and which side builds: the cheapest eligible
algorithm under ``cost`` (both orientations tried), with the reason EXPLAIN prints.

Eligibility:
* nested loop: when ``left rows * right rows <= NESTED_LOOP_MAX_PAIRS`` (it materializes every
  pair), and always for a join without equi keys (then it is the only algorithm);
* direct (perfect hashing): the build side's single key column is a unique integer column whose
  value range is at most ``DIRECT_MAX_RANGE_PER_ROW`` times its rows (dense keys, e.g. TPC-H's
  surrogate keys): an array indexed by ``key - min`` replaces the hash table;
* sort-merge: any equi-join (the build side is sorted unless it is already in key order);
* hash: any equi-join, radix-partitioned when the table exceeds the budget (required) or when
  partitions that fit the L2 cost less than probing a table in HBM.

The join enumerator prices every join by its choice here, EXPLAIN prints the choice of each
planned join, and the executor runs it (``Join.physical``; ``sql/physical/join.py``: the
algorithm, with the right input as the build side; "hash" + partitioned is the radix-partitioned
hash join, "direct" the perfect-hash join), unless ``connect(join_algorithm=...)`` overrides it or
a run-time guard finds the estimate wrong (a nested loop over far more pairs than planned, build
keys of a direct join that are not unique and dense).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from opforge.sql.expr import Ref
from opforge.sql.physical.join import NESTED_LOOP_MAX_PAIRS
from opforge.sql.planner import cost as C

DIRECT_MAX_RANGE_PER_ROW = 2.0


class SideInfo(NamedTuple):
    """One join input as the choice sees it: rows, bytes per row, and facts about its key (a
    tuple: the enumerator builds two per costed join)."""

    rows: float
    width: float
    sorted_key: bool = False  # the (single) key column is ascending without NULLs
    dense_range: float | None = None  # unique dense int key: its value range (max - min + 1)


@dataclass(frozen=True)
class JoinChoice:
    algorithm: str  # hash | direct | merge | nested_loop
    build: str  # "left" or "right": the side the table (or sorted array) is built over
    partitioned: bool
    cost: float
    reason: str

    def describe(self) -> str:
        part = " partitioned" if self.partitioned else ""
        return f"{self.algorithm}{part} build={self.build}: {self.reason}"


def _mb(b: float) -> str:
    return f"{b / 1e6:.3g} MB"


def _merge_cost(s: C.JoinSizes, build: SideInfo, probe: SideInfo, hw: C.Hardware) -> float:
    base = C.merge_cost(s, build.sorted_key, probe.sorted_key)
    if build.sorted_key and probe.sorted_key:
        return base
    # unsorted probes binary-search the sorted build keys: log2(B) accesses each
    steps = max(1.0, math.log2(max(2.0, s.build_rows)))
    per = C.KEY_BYTES if s.build_rows * C.KEY_BYTES <= hw.l2_bytes else C.RANDOM_PROBE_BYTES
    return base + s.probe_rows * steps * per


def _reason(algorithm: str, partitioned: bool, b: SideInfo, p: SideInfo, hw: C.Hardware) -> str:
    """Why the winner is eligible and cheapest, in EXPLAIN's words (built once per chosen join)."""
    table = C.hash_table_bytes(b.rows)
    if algorithm == "hash" and table > hw.table_budget:
        return f"table {_mb(table)} > budget {_mb(hw.table_budget)}: radix partitions"
    if algorithm == "hash" and partitioned:
        return f"table {_mb(table)} > L2 ({_mb(hw.l2_bytes)}): L2-sized radix partitions cost less than HBM probes"
    if algorithm == "hash":
        return f"table {_mb(table)} {'fits the L2' if table <= hw.l2_bytes else 'in HBM'} ({_mb(hw.l2_bytes)})"
    if algorithm == "direct":
        return f"unique dense int keys, range {b.dense_range:.0f}"
    if algorithm == "merge":
        return "both inputs in key order" if b.sorted_key and p.sorted_key else \
            "build side in key order" if b.sorted_key else "sorts the build side"
    return f"{b.rows:.0f} x {p.rows:.0f} pairs <= {NESTED_LOOP_MAX_PAIRS}"


def choose(left: SideInfo, right: SideInfo, out_rows: float, has_keys: bool,
           hw: C.Hardware = C.Hardware()) -> JoinChoice:
    """The cheapest eligible (algorithm, build side, partitioned) for one join."""
    out_width = left.width + right.width
    if not has_keys:
        b, bname, p = (left, "left", right) if left.rows <= right.rows else (right, "right", left)
        s = C.JoinSizes(b.rows, b.width, p.rows, p.width, out_rows, out_width)
        return JoinChoice("nested_loop", bname, False, C.nested_loop_cost(s), "no equi keys: every pair is tested")
    tiny = left.rows * right.rows <= NESTED_LOOP_MAX_PAIRS
    best = None  # (cost, algorithm, build name, partitioned, build, probe)
    for bname, b, p in (("right", right, left), ("left", left, right)):
        s = C.JoinSizes(b.rows, b.width, p.rows, p.width, out_rows, out_width)
        table = C.hash_table_bytes(b.rows)
        options = [(C.hash_cost(s, hw, True), "hash", True)]
        if table <= hw.table_budget:
            options.append((C.hash_cost(s, hw, False), "hash", False))
        if b.dense_range is not None and b.dense_range <= DIRECT_MAX_RANGE_PER_ROW * max(1.0, b.rows):
            options.append((C.direct_cost(s, b.dense_range, hw), "direct", False))
        options.append((_merge_cost(s, b, p, hw), "merge", False))
        if tiny:
            options.append((C.nested_loop_cost(s), "nested_loop", False))
        for cost, algorithm, partitioned in options:
            if best is None or cost < best[0]:
                best = (cost, algorithm, bname, partitioned, b, p)
    cost, algorithm, bname, partitioned, b, p = best
    return JoinChoice(algorithm, bname, partitioned, cost, _reason(algorithm, partitioned, b, p, hw))


class PhysicalCost:
    """The enumerator's cost model: each join costs its cheapest physical algorithm."""

    name = "gpu"

    def __init__(self, hw: C.Hardware = C.Hardware()):
        self.hw = hw

    def join(self, left, right, out_rows: float, keys: list) -> tuple[float, JoinChoice]:
        lside, rside = side_info(left, keys, 0), side_info(right, keys, 1)
        choice = choose(lside, rside, out_rows, bool(keys), self.hw)
        return choice.cost, choice


class COut:
    """C_out: a join costs its output rows (Cluet & Moerkotte), whatever algorithm runs it."""

    name = "c_out"

    def join(self, left, right, out_rows: float, keys: list) -> tuple[float, None]:
        return C.c_out(out_rows), None


def side_info(plan, keys: list, side: int) -> SideInfo:
    """A ``join_tree.JoinPlan`` as one join input (``keys``: (left expr, right expr) equalities);
    key facts only for a key of one column."""
    key = keys[0][side] if len(keys) == 1 else None
    if not isinstance(key, Ref):
        return SideInfo(plan.rows, plan.width)
    return SideInfo(plan.rows, plan.width, key.cid in plan.sorted_cids, plan.dense_ranges.get(key.cid))
