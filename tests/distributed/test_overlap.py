"""all_gather_matmul and matmul_reduce_scatter on 2 and 3 Gloo ranks: equal to the
single-process product (exactly, with integer-valued operands), and overlapped equal
to the same chunks run one after the other."""

import pytest
import torch

from dist_jobs import operand
from dist_ranks import BACKEND


def gathered_product(world, m, k, n, dtype, integer, middle=()):
    x = torch.cat([operand((m,) + middle + (k,), dtype, 100 + r, integer) for r in range(world)])
    return x.double() @ operand((k, n), dtype, 7, integer).double()


@pytest.mark.parametrize("chunks", [None, 1, 2, 3, 7])
def test_all_gather_matmul_exact(ranks, chunks):
    p = ranks.world
    expected = gathered_product(p, 5, 8, 6, "float32", True)
    for over, seq in ranks.run("all_gather_matmul", 5, 8, 6, "float32", chunks, True):
        assert over.shape == (5 * p, 6)
        assert torch.equal(over.double(), expected)
        assert torch.equal(over, seq)


def test_all_gather_matmul_middle_dims_and_random_floats(ranks2):
    expected = gathered_product(2, 3, 16, 5, "float64", False, (4,))
    for over, seq in ranks2.run("all_gather_matmul", 3, 16, 5, "float64", 2, False, (4,)):
        assert over.shape == (6, 4, 5)
        torch.testing.assert_close(over, expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(over, seq)


def test_empty_shards_and_empty_inner_dim(ranks2):
    for over, seq in ranks2.run("all_gather_matmul", 0, 4, 3, "float32", None, True):
        assert over.shape == (0, 3) and seq.shape == (0, 3)
    for over, _ in ranks2.run("all_gather_matmul", 2, 0, 3, "float32", None, True):
        assert torch.equal(over, torch.zeros(4, 3))
    for over, _ in ranks2.run("matmul_reduce_scatter", 0, 4, 3, "float32", None, True):
        assert over.shape == (0, 3)
    for over, _ in ranks2.run("matmul_reduce_scatter", 4, 0, 3, "float32", None, True):
        assert torch.equal(over, torch.zeros(2, 3))


def test_all_gather_matmul_rejects_uneven_shards(ranks2):
    for kind, msg in ranks2.errors("all_gather_matmul_uneven_shards"):
        assert kind == "ValueError" and "ranks disagree on x_shard's shape" in msg


def partial_sum(world, m, kp, n, dtype, integer):
    return sum(operand((m, kp), dtype, 200 + r, integer).double() @ operand((kp, n), dtype, 300 + r, integer).double()
               for r in range(world))


@pytest.mark.parametrize("chunks", [None, 1, 2, 4])
def test_matmul_reduce_scatter_exact(ranks, chunks):
    p = ranks.world
    m = 12 // p
    expected = partial_sum(p, 12, 5, 7, "float32", True)
    for r, (over, seq) in enumerate(ranks.run("matmul_reduce_scatter", 12, 5, 7, "float32", chunks, True)):
        assert over.shape == (m, 7)
        assert torch.equal(over.double(), expected[m * r: m * r + m])
        assert torch.equal(over, seq)


def test_matmul_reduce_scatter_avg_random_floats(ranks2):
    expected = partial_sum(2, 6, 9, 4, "float64", False) / 2
    for r, (over, seq) in enumerate(ranks2.run("matmul_reduce_scatter", 6, 9, 4, "float64", 3, False, "avg")):
        torch.testing.assert_close(over, expected[3 * r: 3 * r + 3], rtol=1e-12, atol=1e-12)
        assert torch.equal(over, seq)


def test_matmul_reduce_scatter_rows_must_divide(ranks2):
    for kind, msg in ranks2.errors("matmul_reduce_scatter", 3, 4, 2, "float32", None, True):
        assert kind == "ValueError" and "not divisible by the group size 2" in msg


@pytest.mark.parametrize("graph", [False, True])
def test_copy_engine_transport_exact(ranks2, graph):
    """``transport="copy_engine"`` (peer copies through symmetric memory, NCCL groups on one host)
    gives the exact products, overlapped or not, replayed or not; Gloo groups refuse it clearly."""
    ag = ("all_gather_matmul", 5, 8, 6, "float32", 2, True, (), graph, "copy_engine")
    rs = ("matmul_reduce_scatter", 12, 5, 7, "float32", 3, True, "sum", graph, "copy_engine")
    if BACKEND == "gloo":
        for job in (ag, rs):
            for kind, msg in ranks2.errors(*job):
                assert kind == "ValueError" and "transport='copy_engine' cannot run" in msg and "gloo" in msg
        return
    expected = gathered_product(2, 5, 8, 6, "float32", True)
    for over, seq in ranks2.run(*ag):
        assert torch.equal(over.double(), expected) and torch.equal(over, seq)
    expected = partial_sum(2, 12, 5, 7, "float32", True)
    for r, (over, seq) in enumerate(ranks2.run(*rs)):
        assert torch.equal(over.double(), expected[6 * r: 6 * r + 6]) and torch.equal(over, seq)


def test_chunking_helpers():
    from opforge.distributed.overlap import chunk_bounds, default_chunks

    assert chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert chunk_bounds(2, 2) == [(0, 1), (1, 2)]
    assert default_chunks(1, 8, 1 << 20) == 1  # never more chunks than rows
    assert default_chunks(8192, 2, 8192) == 8 and default_chunks(64, 2, 64) == 1


def test_graph_replays_equal_the_plain_pipeline(ranks2):
    """``graph=True``: captured once, replayed with new inputs (zeros, then the operands), equal to the
    non-overlapped chunks; on Gloo (CPU tensors) the flag is ignored and the pipeline runs as usual."""
    expected = gathered_product(2, 5, 8, 6, "float32", True)
    for over, seq in ranks2.run("all_gather_matmul", 5, 8, 6, "float32", 2, True, (), True):
        assert torch.equal(over.double(), expected) and torch.equal(over, seq)
    for over, seq in ranks2.run("matmul_reduce_scatter", 12, 5, 7, "float32", 3, True, "sum", True):
        assert torch.equal(over, seq)

