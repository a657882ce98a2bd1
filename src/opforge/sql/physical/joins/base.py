"""What every physical join algorithm is, and the terms the planner prices it in.

A :class:`JoinAlgorithm` is one way to find the (left row, right row) pairs of an equi-join. The
planner (``planner/physical_choice.py``) asks each registered algorithm whether it is ``eligible``
for a join and what it would ``cost``, keeps the cheapest, and prints its ``reason``; the executor
(``physical/join.py``) runs the chosen (or forced) one through ``pairs`` / ``probe`` and names it in
EXPLAIN ANALYZE by its ``label``. The registry (``physical/joins/__init__.py``) holds one instance
per module of this package.

Costs are bytes of device memory traffic (the unit a bandwidth-bound GPU join pays in): a join
reads its key columns, builds a table over one side (the build side), probes it with the other, and
materializes its output (a gather of every carried column: read + write). What the GPU adds to the
textbook model is *where the table lives*: a table of at most ``Hardware.l2_bytes`` is probed from
the L2 (a probe costs its key's bytes); a larger one in HBM, where each probe moves whole DRAM
sectors (``RANDOM_PROBE_BYTES``) for a few useful bytes.

This module and the algorithm modules import no executor module at module level (the planner reads
them); what an algorithm needs to run (``opforge.ops.hashing``, ``physical/keys.py``,
``physical/skew.py``) it imports inside ``pairs`` / ``probe``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# ------------------------------------------------------------------------------------- constants
L2_BYTES = 50_000_000  # the H100/H200 L2: tables up to this are probed from it; radix parts fit it
TABLE_BUDGET_BYTES = 100e9  # HBM (141 GB on the H200) less room for inputs and outputs
KEY_BYTES = 8  # one int64 join key (keys are packed into one int64 per side)
ROW_ID_BYTES = 8  # one int64 row index (the join's output pairs, a partition's row list)
RANDOM_PROBE_BYTES = 64  # a probe past the L2: a 32-B DRAM sector for the slot, one for its row
HASH_BYTES_PER_ROW = 48  # a hash table's bytes per build row (slots at load factor 1/2: owner, key
#                          copy, count; plus the slot id and sort permutation per row)
DENSE_RANGE_PER_ROW = 2.0  # a unique int key is dense when its value range is at most this x its rows


@dataclass(frozen=True)
class Hardware:
    """What the cost model knows of the device: L2 size, and how large one table may grow before
    the join must be radix-partitioned."""

    l2_bytes: float = float(L2_BYTES)
    table_budget: float = TABLE_BUDGET_BYTES

    @staticmethod
    def with_budget(memory_budget: int | None) -> "Hardware":
        return Hardware() if memory_budget is None else Hardware(table_budget=float(memory_budget))


class SideInfo(NamedTuple):
    """One join input as the planner sees it: rows, bytes per row, and facts about its key (a
    tuple: the enumerator builds two per costed join)."""

    rows: float
    width: float
    sorted_key: bool = False  # the (single) key column is ascending without NULLs
    dense_range: float | None = None  # unique dense int key: its value range (max - min + 1)


class JoinSizes(NamedTuple):
    """One join's inputs and output: rows and bytes per row of the carried columns (a tuple: the
    enumerator builds two per costed join)."""

    build_rows: float
    build_width: float
    probe_rows: float
    probe_width: float
    out_rows: float
    out_width: float


def output_bytes(s: JoinSizes) -> float:
    """Materializing the output: the (left, right) row-id pairs, then each output column gathered
    (read at the pair's row, written in order)."""
    return s.out_rows * (2 * ROW_ID_BYTES + 2 * s.out_width)


def hash_table_bytes(build_rows: float) -> float:
    return build_rows * HASH_BYTES_PER_ROW


def probe_bytes_per_row(table_bytes: float, hw: Hardware) -> float:
    """A probe's traffic: its key when the table sits in the L2, else random DRAM sectors."""
    return KEY_BYTES if table_bytes <= hw.l2_bytes else RANDOM_PROBE_BYTES


def mb(b: float) -> str:
    """Bytes in EXPLAIN's words."""
    return f"{b / 1e6:.3g} MB"


@dataclass
class JoinRun:
    """How the executor runs one equi-join: ``build`` is the table's side ("left", "right" or
    "smaller"); ``presorted``: both key columns ascending without NULLs; ``budget``: the connection's
    memory budget in bytes; ``ctx``: the ``ExecContext`` that takes the notes; ``bits``: radix
    partitions (2^bits) when the algorithm partitions; ``heavy``: probe key values handled apart in
    partitioned joins (``physical/skew.py``)."""

    presorted: bool = False
    build: str = "smaller"
    budget: int | None = None
    ctx: object = None
    bits: int | None = None
    heavy: object = None

    def right_builds(self, left_rows: int, right_rows: int) -> bool:
        return self.build == "right" or (self.build == "smaller" and right_rows <= left_rows)


class JoinAlgorithm:
    """One physical equi-join algorithm. Class attributes say what it is; methods answer the
    planner (``eligible``, ``cost``, ``reason``) and the executor (``label``, ``pairs``, ``probe``).

    * ``name``: the registry key and the ``connect(join_algorithm=...)`` override name;
    * ``rank``: the order the planner tries algorithms in (on equal cost the lower rank wins);
    * ``plan_name`` / ``partitioned``: the planner's ``JoinChoice`` words (EXPLAIN prints
      ``<plan_name>[ partitioned] build=...``); by default ``name`` and False;
    * ``unplanned_priority``: joins the planner did not plan (outer, semi, anti) take the eligible
      (``unplanned``) algorithm of the least priority; None: never chosen there;
    * ``probes_outer``: ``probe`` answers left / semi / anti joins itself (the right input builds);
    * ``without_keys``: the algorithm of joins without equi keys (exactly one has it).
    """

    name: str = ""
    rank: int = 100
    plan_name: str | None = None
    partitioned: bool = False
    unplanned_priority: int | None = None
    probes_outer: bool = False
    without_keys: bool = False

    def __init__(self):
        if self.plan_name is None:
            self.plan_name = self.name

    # planner -----------------------------------------------------------------------------------
    def eligible(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> bool:
        """Whether it can run this join with ``build`` as the build side."""
        return True

    def cost(self, s: JoinSizes, build: SideInfo, probe: SideInfo, hw: Hardware) -> float:
        """Bytes of device memory traffic."""
        raise NotImplementedError

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        """Why it is eligible and cheapest, in EXPLAIN's words (built once per chosen join)."""
        raise NotImplementedError

    # executor ----------------------------------------------------------------------------------
    def unplanned(self, left_rows: int, right_rows: int, presorted: bool) -> bool:
        """The run-time rule for joins the planner did not plan (see ``unplanned_priority``)."""
        return False

    def planned_guard(self, left_rows: int, right_rows: int) -> str | None:
        """Why a planned join of these actual sizes must run as a hash join instead (None: it runs)."""
        return None

    def partitions(self, build_rows: int, ctx, forced: bool) -> int | None:
        """Radix bits for this run (None: the algorithm does not partition by itself)."""
        return None

    def label(self, presorted: bool, bits: int | None) -> str:
        """The operator's name in EXPLAIN ANALYZE's notes."""
        raise NotImplementedError

    def pairs(self, lkey, rkey, lvalid, rvalid, run: JoinRun):
        """All (left row, right row) with equal keys, NULL keys never matching: (li, ri), ordered
        as the unpartitioned hash join orders them for the build side ``run`` names."""
        raise NotImplementedError

    def probe(self, bkey, pkey, bvalid, pvalid, how: str, run: JoinRun):
        """``hashing.hash_join``'s answer for ``how`` ("inner", "left", "semi", "anti"):
        (build index, probe index). Only when ``probes_outer``."""
        raise NotImplementedError(f"{self.name} join has no {how} probe")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
