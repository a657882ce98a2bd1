"""broadcast, all_gather, reduce_scatter on 2 and 3 Gloo ranks against the single-process answer."""

import pytest
import torch

from dist_jobs import rows
from dist_ranks import BACKEND


def test_group_from_torchrun_environment(ranks2):
    device = ["cpu", "cpu"] if BACKEND == "gloo" else ["cuda:0", "cuda:1"]
    assert ranks2.run("rank_info") == [(r, 2, BACKEND, device[r]) for r in range(2)]


@pytest.mark.parametrize("src", [0, 2])
def test_broadcast_copies_the_source_rank(ranks3, src):
    for got in ranks3.run("broadcast", src, "float64"):
        assert torch.equal(got, rows(src, 5, 4, "float64"))


@pytest.mark.parametrize("sizes", [[4, 4, 4], [3, 0, 5], [0, 0, 2], [0, 0, 0]])
@pytest.mark.parametrize("pass_sizes", [False, True])
def test_all_gather_concatenates_uneven_and_empty_partitions(ranks3, sizes, pass_sizes):
    expected = torch.cat([rows(r, sizes[r], 3, "int64") for r in range(3)])
    for got in ranks3.run("all_gather", sizes, "int64", pass_sizes):
        assert torch.equal(got, expected)


def test_all_gather_of_different_dtypes_fails_on_every_rank(ranks2):
    for kind, msg in ranks2.errors("all_gather_mismatch"):
        assert kind == "ValueError" and "ranks disagree on dtype and trailing shape" in msg


@pytest.mark.parametrize("op,reduce", [("sum", lambda t: t.sum(0)), ("max", lambda t: t.amax(0)),
                                       ("min", lambda t: t.amin(0)), ("product", lambda t: t.prod(0))])
def test_reduce_scatter_even(ranks3, op, reduce):
    full = reduce(torch.stack([rows(r, 6, 3, "float64") for r in range(3)]))
    for r, got in enumerate(ranks3.run("reduce_scatter", 6, op, None, "float64")):
        assert torch.equal(got, full[2 * r: 2 * r + 2])


@pytest.mark.parametrize("sizes", [[1, 4, 2], [0, 3, 0], [0, 0, 0]])
def test_reduce_scatter_uneven_sizes(ranks3, sizes):
    n = sum(sizes)
    full = torch.stack([rows(r, n, 3, "float32") for r in range(3)]).sum(0)
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    for r, got in enumerate(ranks3.run("reduce_scatter", n, "sum", sizes, "float32")):
        assert torch.equal(got, full[starts[r]: starts[r] + sizes[r]])


def test_reduce_scatter_rejects_rows_not_divisible(ranks2):
    for kind, msg in ranks2.errors("reduce_scatter", 3, "sum", None, "float32"):
        assert kind == "ValueError" and "3 rows, not divisible by the group size 2" in msg


def test_reduce_scatter_rejects_unknown_op(ranks2):
    for kind, msg in ranks2.errors("reduce_scatter", 2, "mean", None, "float32"):
        assert kind == "ValueError" and "op must be one of" in msg


def test_mesh_groups_gather_over_their_dim(ranks2):
    for r, (tp, dp) in enumerate(ranks2.run("mesh_gather")):
        assert torch.equal(tp, torch.cat([rows(0, 2, 2), rows(1, 2, 2)]))
        assert torch.equal(dp, rows(r, 2, 2))
