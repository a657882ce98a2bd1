"""Broadcast vs partitioned joins: chosen on the right side of the size threshold, co-partitioned
inputs never shuffled, a build side too big for one worker never broadcast, forced settings obeyed."""
import itertools

import pytest

from opforge.sql.planner.distribution import choose_distribution, network_bytes


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_both_sides_of_the_threshold(workers):
    probe = 1e9
    threshold = probe / (workers - 1)
    assert choose_distribution(0.9 * threshold, probe, workers).method == "broadcast"
    assert choose_distribution(1.1 * threshold, probe, workers).method == "partitioned"


def test_choice_is_the_method_that_moves_fewer_bytes():
    for build, probe, workers in itertools.product([1e3, 1e6, 1e8, 1e10], [1e6, 1e9], [2, 3, 8]):
        c = choose_distribution(build, probe, workers)
        other = "partitioned" if c.method == "broadcast" else "broadcast"
        assert c.bytes_moved == network_bytes(c.method, build, probe, workers)
        assert c.bytes_moved <= network_bytes(other, build, probe, workers)


def test_copartitioned_memory_limit_forced_and_local():
    assert choose_distribution(1e9, 1e9, 4, copartitioned=True).bytes_moved == 0
    small_build = choose_distribution(1e3, 1e9, 4, worker_memory=1e2)
    assert small_build.method == "partitioned" and "exceeds" in small_build.reason
    assert choose_distribution(1e9, 1e3, 4, setting="broadcast").method == "broadcast"
    assert choose_distribution(1e3, 1e9, 4, setting="partitioned").method == "partitioned"
    assert choose_distribution(1e3, 1e9, 1).method == "local"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="setting must be one of"):
        choose_distribution(1, 1, 2, setting="shuffle")
    with pytest.raises(ValueError, match="workers must be an int"):
        choose_distribution(1, 1, 0)
    with pytest.raises(ValueError, match="method must be"):
        network_bytes("replicate", 1, 1, 2)
