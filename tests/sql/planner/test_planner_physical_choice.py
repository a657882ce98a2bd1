"""The physical join choice: each algorithm where its rule says, the build side that the cost
model says, and costs that grow with the traffic the GPU pays for."""
import pytest

from opforge.sql.physical.joins.nested_loop import NESTED_LOOP_MAX_PAIRS
from opforge.sql.planner import cost as C
from opforge.sql.planner.physical_choice import SideInfo, choose

HW = C.Hardware()


def test_tiny_inputs_take_the_nested_loop():
    c = choose(SideInfo(10, 8), SideInfo(20, 8), 20, True)
    assert c.algorithm == "nested_loop" and 10 * 20 <= NESTED_LOOP_MAX_PAIRS


def test_no_equi_keys_means_nested_loop_over_the_smaller_build():
    c = choose(SideInfo(1e5, 8), SideInfo(50, 8), 100, False)
    assert c.algorithm == "nested_loop" and c.build == "right" and "no equi keys" in c.reason


def test_hash_builds_on_the_smaller_side():
    big, small = SideInfo(1e6, 16), SideInfo(1e4, 16)
    assert choose(big, small, 1e6, True).build == "right"
    assert choose(small, big, 1e6, True).build == "left"
    c = choose(big, small, 1e6, True)
    assert c.algorithm == "hash" and not c.partitioned and "fits the L2" in c.reason


def test_dense_unique_keys_take_the_direct_join():
    dim = SideInfo(1e4, 16, dense_range=1e4)
    c = choose(SideInfo(1e7, 16), dim, 1e7, True)
    assert c.algorithm == "direct" and c.build == "right" and "dense" in c.reason
    sparse = SideInfo(1e4, 16, dense_range=1e7)  # range 1000x the rows: not dense
    assert choose(SideInfo(1e7, 16), sparse, 1e7, True).algorithm == "hash"


def test_sorted_inputs_merge():
    c = choose(SideInfo(1e6, 16, sorted_key=True), SideInfo(1e6, 16, sorted_key=True), 1e6, True)
    assert c.algorithm == "merge" and "both inputs in key order" in c.reason


def test_table_past_the_budget_is_partitioned():
    hw = C.Hardware(table_budget=1e6)
    c = choose(SideInfo(1e7, 16), SideInfo(1e6, 16), 1e7, True, hw)
    assert c.algorithm == "hash" and c.partitioned and "budget" in c.reason


def test_partitioning_pays_off_only_past_the_l2():
    l2_rows = HW.l2_bytes / C.HASH_BYTES_PER_ROW
    inside = choose(SideInfo(1e8, 16), SideInfo(0.5 * l2_rows, 16), 1e8, True)
    outside = choose(SideInfo(1e9, 16), SideInfo(20 * l2_rows, 16), 1e9, True)
    assert inside.algorithm == "hash" and not inside.partitioned
    assert outside.algorithm == "hash" and outside.partitioned and "L2" in outside.reason


def test_costs_grow_with_traffic():
    s = C.JoinSizes(1e5, 16, 1e6, 16, 1e6, 32)
    assert C.hash_cost(s, HW, False) < C.hash_cost(C.JoinSizes(1e5, 16, 2e6, 16, 2e6, 32), HW, False)
    # the same join with its table past the L2 costs more per probe
    small_l2 = C.Hardware(l2_bytes=1e3)
    assert C.hash_cost(s, small_l2, False) - C.hash_cost(s, HW, False) == pytest.approx(
        s.probe_rows * (C.RANDOM_PROBE_BYTES - C.KEY_BYTES))
    assert C.output_bytes(s) == 1e6 * (2 * C.ROW_ID_BYTES + 2 * 32)
    assert C.merge_cost(s, True, True) < C.merge_cost(s, False, True) < C.merge_cost(s, False, False)
    assert C.c_out(123.0) == 123.0
