"""Broadcast vs partitioned joins: the method of lower estimated time on each side of the
threshold, the byte-count rule where the network is the bottleneck, co-partitioned inputs never
shuffled, a build side too big for one worker never broadcast, forced settings obeyed."""
import itertools

import pytest

from opforge.sql.planner.distribution import Interconnect, choose_distribution, network_bytes, worker_seconds

# a network-bound cluster: 1 GB/s links, work nearly free beside them
SLOW_NETWORK = Interconnect(link_bytes_per_s=1e9, build_s_per_byte=1e-15, shuffle_s_per_byte=1e-15,
                            probe_s_per_byte=1e-15)


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_network_bound_threshold_is_the_byte_count(workers):
    probe = 1e9
    threshold = probe / (workers - 1)  # broadcast while B (w - 1) < (B + P)(w - 1)/w
    assert choose_distribution(0.9 * threshold, probe, workers, link=SLOW_NETWORK).method == "broadcast"
    assert choose_distribution(1.1 * threshold, probe, workers, link=SLOW_NETWORK).method == "partitioned"


def test_two_h200s_broadcast_wherever_it_fits():
    # measured on 2 H200s: broadcast faster at every build size up to 2x the probe side
    for ratio in (0.001, 0.01, 0.1, 0.5, 1.0, 2.0):
        assert choose_distribution(ratio * 1.6e9, 1.6e9, 2).method == "broadcast"
    assert choose_distribution(3.2e9, 1.6e9, 2, worker_memory=1e9).method == "partitioned"


def test_many_workers_partition_large_build_sides():
    probe = 1.6e9
    assert choose_distribution(0.01 * probe, probe, 8).method == "broadcast"
    assert choose_distribution(probe, probe, 8).method == "partitioned"
    # the switch lies between: one crossing, broadcast below it
    picks = [choose_distribution(r * probe, probe, 8).method for r in (0.01, 0.05, 0.1, 0.2, 0.5, 1, 2)]
    assert picks == sorted(picks)  # "broadcast" < "partitioned": no flip back


def test_choice_is_the_faster_estimate_and_reports_its_bytes():
    for build, probe, workers in itertools.product([1e3, 1e6, 1e8, 1e10], [1e6, 1e9], [2, 3, 8]):
        c = choose_distribution(build, probe, workers)
        other = "partitioned" if c.method == "broadcast" else "broadcast"
        assert c.bytes_moved == network_bytes(c.method, build, probe, workers)
        assert worker_seconds(c.method, build, probe, workers) <= worker_seconds(other, build, probe, workers)
        assert "est." in c.reason


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
