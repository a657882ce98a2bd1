"""All-to-all shuffles of variable-size partitions on 2 and 3 Gloo ranks."""

import pytest
import torch

from dist_jobs import labelled, rows

COUNTS2 = {
    "uneven": [[3, 1], [0, 2]],
    "empty rank": [[0, 0], [2, 3]],
}
COUNTS3 = {
    "uneven": [[2, 0, 3], [1, 1, 1], [0, 4, 0]],
    "empty rank": [[0, 0, 0], [2, 0, 1], [1, 3, 0]],
    "all empty": [[0, 0, 0]] * 3,
    "only self": [[2, 0, 0], [0, 3, 0], [0, 0, 1]],
}


@pytest.mark.parametrize("world,case", [(3, c) for c in COUNTS3] + [(2, c) for c in COUNTS2])
def test_shuffle_batch_delivers_each_partition_to_its_rank(request, world, case):
    counts = (COUNTS3 if world == 3 else COUNTS2)[case]
    pool = request.getfixturevalue(f"ranks{world}")
    for dst, (got, recv) in enumerate(pool.run("shuffle", counts)):
        assert recv.tolist() == [counts[src][dst] for src in range(world)]
        expected = {k: [] for k in labelled(0, 0)}
        for src in range(world):  # source src's rows for dst: the slice after its rows for lower ranks
            start = sum(counts[src][:dst])
            for k, col in labelled(src, sum(counts[src])).items():
                expected[k].append(col[start: start + counts[src][dst]])
        for k, parts in expected.items():
            assert got[k].dtype == parts[0].dtype
            assert torch.equal(got[k], torch.cat(parts)), k


@pytest.mark.parametrize("case", ["uneven", "empty rank"])
def test_shuffle_there_and_back_returns_the_rows(ranks3, case):
    counts = COUNTS3[case]
    for r, (sent, back, again) in enumerate(ranks3.run("shuffle_round_trip", counts, 4)):
        assert torch.equal(back, sent)
        assert again.tolist() == counts[r]
        assert torch.equal(sent, rows(r, sum(counts[r]), 4, "float64"))


def test_shuffle_by_hash_puts_equal_keys_on_one_rank(ranks3):
    out = ranks3.run("shuffle_by_hash", 40)
    sent = torch.cat([k for k, _, _ in out])
    received = torch.cat([g for _, g, _ in out])
    assert torch.equal(torch.sort(sent).values, torch.sort(received).values)
    owners = [set(g.tolist()) for _, g, _ in out]
    assert all(not (owners[a] & owners[b]) for a in range(3) for b in range(a + 1, 3))
    for _, g, d in out:
        assert torch.equal(d, g * 2)  # columns travel together


def test_shuffle_batch_with_different_columns_fails_on_every_rank(ranks2):
    for kind, msg in ranks2.errors("shuffle_schema_mismatch"):
        assert kind == "ValueError" and "ranks disagree on column names" in msg


def test_partition_and_hash_partition_locally():
    from opforge.distributed import hash_partition, partition

    dest = torch.tensor([2, 0, 2, 1, 0])
    order, counts = partition(dest, 3)
    assert order.tolist() == [1, 4, 3, 0, 2] and counts.tolist() == [2, 1, 2]
    keys = torch.tensor([5, 7, 5, -1, 7])
    d = hash_partition(keys, 4)
    assert d[0] == d[2] and d[1] == d[4] and bool(((d >= 0) & (d < 4)).all())
    assert torch.equal(hash_partition(torch.tensor([0.0, -0.0]), 8)[0], hash_partition(torch.tensor([0.0]), 8)[0])
    assert hash_partition(torch.tensor([-0.0]), 8) == hash_partition(torch.tensor([0.0]), 8)
    with pytest.raises(ValueError, match="outside 0..2"):
        partition(torch.tensor([3]), 3)
    with pytest.raises(TypeError, match="integer, bool or float"):
        hash_partition(torch.tensor([1 + 1j]), 2)
