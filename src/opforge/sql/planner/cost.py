"""Cost of one join, in bytes of device memory traffic (the unit a bandwidth-bound GPU join pays in).

A join reads its key columns, builds a table over one side (the build side), probes it with the
other, and materializes its output (a gather of every carried column: read + write). What the
GPU adds to the textbook model is *where the table lives*:

* a hash table of at most ``Hardware.l2_bytes`` (50 MB, the H100/H200 L2) is probed from the L2:
  a probe costs its key's bytes;
* a larger table is probed in HBM: each probe is random accesses that move whole DRAM sectors
  (``RANDOM_PROBE_BYTES``: the slot's and its row's) for a few useful bytes;
* a radix-partitioned join first scatters both sides' keys and row ids into partitions (two extra
  passes, read + write) so that every partition's table fits the L2 again; it is required when
  the table exceeds ``Hardware.table_budget`` (HBM, or the connection's ``memory_budget``).

The formulas below price each physical algorithm on the same scale; ``physical_choice`` picks the
cheapest eligible one, and the join enumerator sums them over a plan. ``c_out`` is the classic
alternative (sum of intermediate result sizes), used to compare join orders apart from the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from opforge.sql.physical.join import HASH_BYTES_PER_ROW

KEY_BYTES = 8  # one int64 join key (keys are packed into one int64 per side)
ROW_ID_BYTES = 8  # one int64 row index (the join's output pairs, a partition's row list)
RANDOM_PROBE_BYTES = 64  # a probe past the L2: a 32-B DRAM sector for the slot, one for its row
NESTED_LOOP_BYTES_PER_PAIR = 1.0  # one compare per (left, right) pair, from registers / L1
DIRECT_BYTES_PER_SLOT = 8  # a direct-address table: one row id per key value in [min, max]
SORT_PASSES = 4  # an LSD radix sort of int64 keys + row ids: ~4 read+write passes at 16 bits/pass


@dataclass(frozen=True)
class Hardware:
    """What the cost model knows of the device: L2 size, and how large one table may grow before
    the join must be radix-partitioned."""

    l2_bytes: float = 50e6
    table_budget: float = 100e9  # HBM (141 GB on the H200) less room for inputs and outputs

    @staticmethod
    def with_budget(memory_budget: int | None) -> "Hardware":
        return Hardware() if memory_budget is None else Hardware(table_budget=float(memory_budget))


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


def hash_cost(s: JoinSizes, hw: Hardware, partitioned: bool) -> float:
    table = hash_table_bytes(s.build_rows)
    keys = (s.build_rows + s.probe_rows) * KEY_BYTES
    if partitioned:  # scatter keys + row ids of both sides once (read + write), then L2-sized tables
        scatter = 2 * (s.build_rows + s.probe_rows) * (KEY_BYTES + ROW_ID_BYTES)
        return keys + scatter + table + s.probe_rows * KEY_BYTES + output_bytes(s)
    return keys + table + s.probe_rows * probe_bytes_per_row(table, hw) + output_bytes(s)


def direct_cost(s: JoinSizes, key_range: float, hw: Hardware) -> float:
    """Perfect hashing for dense integer keys: the table is an array indexed by ``key - min``."""
    table = key_range * DIRECT_BYTES_PER_SLOT
    keys = (s.build_rows + s.probe_rows) * KEY_BYTES
    per_probe = KEY_BYTES if table <= hw.l2_bytes else RANDOM_PROBE_BYTES
    return keys + table + s.probe_rows * per_probe + output_bytes(s)


def merge_cost(s: JoinSizes, sorted_build: bool, sorted_probe: bool) -> float:
    """Sort-merge: sort the sides that are not already in key order, then merge (binary search of
    each probe key in the sorted build keys, both read in order)."""
    sort = 0.0
    for rows, done in ((s.build_rows, sorted_build), (s.probe_rows, sorted_probe)):
        if not done:
            sort += SORT_PASSES * 2 * rows * (KEY_BYTES + ROW_ID_BYTES)
    return sort + (s.build_rows + s.probe_rows) * KEY_BYTES + output_bytes(s)


def nested_loop_cost(s: JoinSizes) -> float:
    return s.build_rows * s.probe_rows * NESTED_LOOP_BYTES_PER_PAIR + \
        (s.build_rows + s.probe_rows) * KEY_BYTES + output_bytes(s)


def c_out(out_rows: float) -> float:
    """C_out's term for one join: its output size."""
    return out_rows
