"""Hash join: ``opforge.hash_join`` through dispatch (the Triton open-addressing table on CUDA, the
sort-based reference on the CPU). The general-purpose join: eligible for any equi-join whose table
fits the budget, the executor's rule for unplanned joins when nothing cheaper applies, and where
the other algorithms' run-time guards fall back to.

A table larger than the budget is radix-partitioned at run time (``hash_pairs``): both sides are
split on the key (``keys.partition_of``) into 2^p parts whose build sides fit, each part is joined
in turn (heavy-hitter probe keys apart, ``physical/skew.py``), and the pairs are put back in the
order the unpartitioned join gives (by probe row, then build row): the answer does not depend on p.
The planned partitioned variant is ``radix.py``.
"""
from __future__ import annotations

from opforge.sql.physical.joins.base import (
    HASH_BYTES_PER_ROW, KEY_BYTES, ROW_ID_BYTES, Hardware, JoinAlgorithm, JoinRun, JoinSizes, SideInfo,
    hash_table_bytes, mb, output_bytes, probe_bytes_per_row,
)


def hash_cost(s: JoinSizes, hw: Hardware, partitioned: bool) -> float:
    """Read both keys, build the table, probe it (from the L2 or HBM), write the output;
    ``partitioned``: scatter keys + row ids of both sides once (read + write) first, then every
    partition's table fits the L2."""
    table = hash_table_bytes(s.build_rows)
    keys = (s.build_rows + s.probe_rows) * KEY_BYTES
    if partitioned:
        scatter = 2 * (s.build_rows + s.probe_rows) * (KEY_BYTES + ROW_ID_BYTES)
        return keys + scatter + table + s.probe_rows * KEY_BYTES + output_bytes(s)
    return keys + table + s.probe_rows * probe_bytes_per_row(table, hw) + output_bytes(s)


def hash_pairs(bkey, pkey, bvalid=None, pvalid=None, how="inner", budget=None, ctx=None, bits=None,
               heavy=None):
    """``opforge.hash_join`` (build, probe) -> (build_index, probe_index), radix-partitioned when
    the build side's table exceeds ``budget`` bytes (or into ``2^bits`` parts when given). Order as
    the unpartitioned call: by probe row, then build row. ``heavy``: probe key values handled
    apart in the partitioned case (``physical/skew.py``)."""
    from opforge.ops import hashing
    from opforge.sql.physical.keys import partition_bits, partition_of
    from opforge.sql.physical.skew import partitioned_pairs

    if bits is None:
        bits = partition_bits(len(bkey) * HASH_BYTES_PER_ROW, budget)
        why = f"build {len(bkey) * HASH_BYTES_PER_ROW} B > budget {budget} B"
    else:
        why = f"build {len(bkey) * HASH_BYTES_PER_ROW} B, L2-sized parts"
    if bits == 0:
        return hashing.hash_join(bkey, pkey, how=how, build_valid=bvalid, probe_valid=pvalid)
    bi, pi, report = partitioned_pairs(bkey, pkey, bvalid, pvalid, partition_of(bkey, bits),
                                       partition_of(pkey, bits), 1 << bits, how, heavy)
    if ctx is not None:
        ctx.note(f"radix-partitioned into {1 << bits} parts ({why}): {report.describe()}")
        if report.heavy:
            ctx.count("heavy_keys", len(report.heavy))
        ctx.metrics["max_partition_rows"] = max(report.loads, default=0)
        ctx.metrics["max_partition_rows_plain"] = max(report.plain_loads, default=0)
    return bi, pi


class HashJoin(JoinAlgorithm):
    name = "hash"
    rank = 1
    unplanned_priority = 2
    probes_outer = True

    def eligible(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> bool:
        return hash_table_bytes(build.rows) <= hw.table_budget

    def cost(self, s: JoinSizes, build: SideInfo, probe: SideInfo, hw: Hardware) -> float:
        return hash_cost(s, hw, self.partitioned)

    def reason(self, build: SideInfo, probe: SideInfo, hw: Hardware) -> str:
        table = hash_table_bytes(build.rows)
        return f"table {mb(table)} {'fits the L2' if table <= hw.l2_bytes else 'in HBM'} ({mb(hw.l2_bytes)})"

    def unplanned(self, left_rows: int, right_rows: int, presorted: bool) -> bool:
        return True

    def label(self, presorted: bool, bits: int | None) -> str:
        return "hash join"

    def pairs(self, lkey, rkey, lvalid, rvalid, run: JoinRun):
        if run.right_builds(len(lkey), len(rkey)):  # heavy keys are the left (probe) side's
            ri, li = hash_pairs(rkey, lkey, rvalid, lvalid, "inner", run.budget, run.ctx, run.bits, run.heavy)
        else:
            li, ri = hash_pairs(lkey, rkey, lvalid, rvalid, "inner", run.budget, run.ctx, run.bits)
        return li, ri

    def probe(self, bkey, pkey, bvalid, pvalid, how: str, run: JoinRun):
        return hash_pairs(bkey, pkey, bvalid, pvalid, how, run.budget, run.ctx, run.bits, run.heavy)


ALGORITHM = HashJoin()
