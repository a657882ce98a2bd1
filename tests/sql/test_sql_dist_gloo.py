"""A real 2-process distributed join over ``opforge.distributed`` (Gloo on CPUs): partitioned (hash
shuffle, heavy Zipf keys dealt round-robin with their build rows replicated) and broadcast give
exactly the single-process join's pairs; no rank holds the heavy key's rows alone."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

import dist_join_job
from spawn_ranks import run_ranks
from opforge.ops import hashing

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no Gloo")


def _pairs(t):
    return sorted(map(tuple, torch.as_tensor(t).tolist()))


def test_two_gloo_ranks_join_like_one_process():
    world = 2
    results = run_ranks(dist_join_job.run, (), world=world, timeout=60)
    for r in results:
        assert not isinstance(r[1], str), r[2]
    fk, dk = dist_join_job.tables()
    bi, pi = hashing.hash_join(dk, fk)
    want = _pairs(torch.stack([pi, bi], 1))
    assert _pairs(np.concatenate([r[1] for r in results])) == want  # partitioned + skew handling
    assert _pairs(np.concatenate([r[2] for r in results])) == want  # broadcast
    heavy = results[0][3]
    assert heavy.tolist()[:2] == [0, 1] and (heavy == results[1][3]).all()
    loads = [r[4] for r in results]
    assert max(loads) <= 1.2 * (len(fk) + len(dk)) / world  # the heavy keys are spread
