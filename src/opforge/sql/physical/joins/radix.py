"""Radix-partitioned hash join: both sides scattered on the key into partitions whose tables fit
the L2 (two extra passes over keys + row ids), then a hash join per partition (``hash.hash_pairs``
with the bits given). The planner calls it "hash partitioned": required when the table exceeds the
budget (``Hardware.table_budget``), chosen when L2-sized partitions cost less than probing a table
in HBM. ``connect(join_algorithm="radix")`` forces it with at least ``RADIX_MIN_BITS`` bits.
"""
from __future__ import annotations

from opforge.sql.physical.joins.base import HASH_BYTES_PER_ROW, L2_BYTES, Hardware, SideInfo, hash_table_bytes, mb
from opforge.sql.physical.joins.hash import HashJoin

RADIX_MIN_BITS = 2  # join_algorithm="radix" uses at least 4 partitions


class RadixJoin(HashJoin):
    name = "radix"
    rank = 0
    plan_name = "hash"
    partitioned = True
    unplanned_priority = None

    def eligible(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> bool:
        return True

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        table = hash_table_bytes(build.rows)
        if table > hw.table_budget:
            return f"table {mb(table)} > budget {mb(hw.table_budget)}: radix partitions"
        return f"table {mb(table)} > L2 ({mb(hw.l2_bytes)}): L2-sized radix partitions cost less than HBM probes"

    def unplanned(self, left_rows: int, right_rows: int, presorted: bool) -> bool:
        return False

    def partitions(self, build_rows: int, ctx, forced: bool) -> int:
        """L2-sized (or budget-sized) tables; at least 2^``RADIX_MIN_BITS`` parts when forced."""
        from opforge.sql.physical.keys import partition_bits

        need = build_rows * HASH_BYTES_PER_ROW
        cap = L2_BYTES if ctx.memory_budget is None else min(L2_BYTES, ctx.memory_budget)
        bits = partition_bits(need, cap)
        return max(bits, RADIX_MIN_BITS) if forced else bits

    def label(self, presorted: bool, bits: int | None) -> str:
        return f"radix-partitioned hash join ({1 << (bits or 0)} parts)"


ALGORITHM = RadixJoin()
