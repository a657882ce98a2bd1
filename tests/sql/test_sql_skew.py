"""Skew handling on Zipf(1.2) join keys: the skew-aware partitioned join (heavy probe keys dealt
round-robin, their build rows replicated) gives the same answer as the plain one and as pandas,
EXPLAIN ANALYZE names the heavy keys, and no partition dominates any more."""
import numpy as np
import pyarrow as pa
import pytest
import torch

import opforge.sql as sql
from opforge.sql.physical.skew import hash_dest, heavy_keys, partitioned_pairs
from opforge.ops import hashing

N, KEYS = 60_000, 5000


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(12)
    keys = (rng.zipf(1.2, N) - 1) % KEYS  # key 0 holds ~18% of the rows, key 1 ~8%
    fact = pa.table({"fk": pa.array(keys, pa.int64()), "fv": pa.array(rng.integers(0, 100, N), pa.int64())})
    dk = np.concatenate([np.arange(KEYS), [0, 0, 1]])  # heavy keys have several build rows
    dim = pa.table({"dk": pa.array(dk, pa.int64()), "dg": pa.array(rng.integers(0, 9, len(dk)), pa.int32())})
    return fact, dim


Q = "SELECT dg, count(*) AS n, sum(fv) AS s FROM fact JOIN dim ON fk = dk GROUP BY dg ORDER BY dg"


def _con(fact, dim, **kw):
    con = sql.connect("cpu", **kw)
    return con.register("fact", fact).register("dim", dim)


def _reference(fact, dim):
    m = fact.to_pandas().merge(dim.to_pandas(), left_on="fk", right_on="dk")
    g = m.groupby("dg").agg(n=("fv", "size"), s=("fv", "sum")).reset_index()
    return [tuple(int(x) for x in r) for r in g.itertuples(index=False)]


def _join(con):
    [s] = [s for s in con.sql(Q).analyze().stats if s.describe.startswith("Join")]
    return s


@pytest.mark.parametrize("mode", [dict(workers=4, join_distribution="partitioned"), dict(join_algorithm="radix")])
def test_skew_aware_join_equals_plain_join_and_spreads_heavy_keys(data, mode):
    fact, dim = data
    aware = _con(fact, dim, skew_threshold=0.05, **mode)
    plain = _con(fact, dim, skew_threshold=None, **mode)
    want = _reference(fact, dim)
    assert aware.sql(Q).fetchall() == plain.sql(Q).fetchall() == want
    a, p = _join(aware), _join(plain)
    notes = " ".join(a.notes)
    assert "skew: heavy keys [0, 1" in notes and "build rows replicated to every partition" in notes
    assert "skew" not in " ".join(p.notes)
    assert a.metrics["heavy_keys"] >= 2
    # without skew handling one partition holds the heavy keys; with it, none dominates
    assert a.metrics["max_partition_rows_plain"] == p.metrics["max_partition_rows"]
    even = (N + dim.num_rows) / 4  # 4 workers / 4 radix parts
    assert a.metrics["max_partition_rows"] <= 1.15 * even  # keys below the threshold still vary
    assert p.metrics["max_partition_rows"] >= 1.25 * a.metrics["max_partition_rows"]


def test_heavy_keys_come_from_statistics_and_sampling(data):
    fact, dim = data
    con = _con(fact, dim, workers=4, join_distribution="partitioned")
    assert "skewed keys (> 10% of rows): fk#" in con.sql(Q).explain()  # the planner's MCVs
    k = torch.tensor(fact["fk"].to_numpy().copy())
    assert heavy_keys(k, None, 0.05).tolist()[:2] == [0, 1]
    assert heavy_keys(k, None, None) is None
    assert heavy_keys(torch.arange(1000), None, 0.05) is None  # uniform: nothing heavy


def test_partitioned_pairs_with_heavy_keys_equal_hash_join_for_every_how():
    g = torch.Generator().manual_seed(2)
    probe = torch.cat([torch.zeros(3000, dtype=torch.long), torch.randint(0, 300, (2000,), generator=g)])
    probe = probe[torch.randperm(len(probe), generator=g)]
    build = torch.cat([torch.arange(0, 300, 2), torch.tensor([0, 0, 4])])
    pvalid = torch.rand(len(probe), generator=g) > 0.05
    for how in ("inner", "left", "semi", "anti"):
        want = hashing.hash_join(build, probe, how=how, probe_valid=pvalid)
        bi, pi, rep = partitioned_pairs(build, probe, None, pvalid, hash_dest(build, 5), hash_dest(probe, 5), 5,
                                        how, torch.tensor([0]))
        assert torch.equal(pi, want[1]), how
        if how in ("inner", "left"):
            assert torch.equal(bi, want[0]), how
        assert rep.heavy == [0] and rep.replicated_build_rows == 3
        assert max(rep.loads) < max(rep.plain_loads)
