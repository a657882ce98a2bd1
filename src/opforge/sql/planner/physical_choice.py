"""Which physical join runs an inner equi-join, and which side builds: the cheapest eligible
algorithm of the registry (``sql/physical/joins``: each algorithm's ``eligible`` and ``cost``), both
orientations tried, with the reason EXPLAIN prints (the winner's ``reason``).

Candidates are tried build = right first, then build = left, and within one orientation in the
registry's order (``rank``: radix-partitioned hash, hash, direct, merge, nested loop); a later
candidate wins only when strictly cheaper. A join without equi keys is a nested loop over the
smaller side.

The join enumerator prices every join by its choice here, EXPLAIN prints the choice of each
planned join, and the executor runs it (``Join.physical``; ``sql/physical/join.py``: the
algorithm, with the right input as the build side; "hash" + partitioned is the radix-partitioned
hash join, "direct" the perfect-hash join), unless ``connect(join_algorithm=...)`` overrides it or
a run-time guard finds the estimate wrong (a nested loop over far more pairs than planned, build
keys of a direct join that are not unique and dense).
"""
from __future__ import annotations

from dataclasses import dataclass

from opforge.sql.expr import Ref
from opforge.sql.physical import joins
from opforge.sql.physical.joins.base import Hardware, JoinSizes, SideInfo
from opforge.sql.planner import cost as C


@dataclass(frozen=True)
class JoinChoice:
    algorithm: str  # the algorithm's plan_name: hash | direct | merge | nested_loop
    build: str  # "left" or "right": the side the table (or sorted array) is built over
    partitioned: bool
    cost: float
    reason: str

    def describe(self) -> str:
        part = " partitioned" if self.partitioned else ""
        return f"{self.algorithm}{part} build={self.build}: {self.reason}"


def choose(left: SideInfo, right: SideInfo, out_rows: float, has_keys: bool,
           hw: Hardware = Hardware()) -> JoinChoice:
    """The cheapest eligible (algorithm, build side) for one join."""
    out_width = left.width + right.width
    if not has_keys:
        algo = joins.without_keys()
        b, bname, p = (left, "left", right) if left.rows <= right.rows else (right, "right", left)
        s = JoinSizes(b.rows, b.width, p.rows, p.width, out_rows, out_width)
        return JoinChoice(algo.plan_name, bname, algo.partitioned, algo.cost(s, b, p, hw),
                          "no equi keys: every pair is tested")
    best = None  # (cost, algorithm, build name, build, probe)
    for bname, b, p in (("right", right, left), ("left", left, right)):
        s = JoinSizes(b.rows, b.width, p.rows, p.width, out_rows, out_width)
        for algo in joins.ALGORITHMS:
            if not algo.eligible(b, p, hw):
                continue
            cost = algo.cost(s, b, p, hw)
            if best is None or cost < best[0]:
                best = (cost, algo, bname, b, p)
    cost, algo, bname, b, p = best
    return JoinChoice(algo.plan_name, bname, algo.partitioned, cost, algo.reason(b, p, hw))


class PhysicalCost:
    """The enumerator's cost model: each join costs its cheapest physical algorithm."""

    name = "gpu"

    def __init__(self, hw: Hardware = Hardware()):
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
