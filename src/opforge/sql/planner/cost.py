"""Cost of one join, in bytes of device memory traffic (the unit a bandwidth-bound GPU join pays in).

The model lives with the algorithms it prices (``sql/physical/joins``): the device and the shared
terms in ``joins/base.py`` (``Hardware``: the L2 a table is probed from when it fits, HBM
otherwise, and the budget past which a table must be radix-partitioned; ``JoinSizes``; the output
a join materializes), each algorithm's formula in its own module (``hash_cost`` in ``joins/hash.py``
prices both the plain and the radix-partitioned hash join, ``direct_cost``, ``merge_cost``,
``nested_loop_cost``). They are named here for the planner's readers; ``physical_choice`` picks
the cheapest eligible algorithm through the registry, and the join enumerator sums them over a
plan. ``c_out`` is the classic alternative (sum of intermediate result sizes), used to compare
join orders apart from the GPU.
"""
from __future__ import annotations

from opforge.sql.physical.joins.base import (
    HASH_BYTES_PER_ROW, KEY_BYTES, RANDOM_PROBE_BYTES, ROW_ID_BYTES, Hardware, JoinSizes, hash_table_bytes,
    output_bytes, probe_bytes_per_row,
)
from opforge.sql.physical.joins.direct import direct_cost
from opforge.sql.physical.joins.hash import hash_cost
from opforge.sql.physical.joins.merge import merge_cost
from opforge.sql.physical.joins.nested_loop import nested_loop_cost

__all__ = ["HASH_BYTES_PER_ROW", "KEY_BYTES", "RANDOM_PROBE_BYTES", "ROW_ID_BYTES", "Hardware", "JoinSizes",
           "c_out", "direct_cost", "hash_cost", "hash_table_bytes", "merge_cost", "nested_loop_cost",
           "output_bytes", "probe_bytes_per_row"]


def c_out(out_rows: float) -> float:
    """C_out's term for one join: its output size."""
    return out_rows
