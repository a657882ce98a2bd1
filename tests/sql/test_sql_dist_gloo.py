"""A real 2-process distributed join over ``opforge.dist`` (Gloo on CPUs): partitioned (hash
shuffle, heavy Zipf keys dealt round-robin with their build rows replicated) and broadcast give
exactly the single-process join's pairs; no rank holds the heavy key's rows alone."""
import socket

import numpy as np

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dist_join_job
from opforge.ops import hashing

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no Gloo")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pairs(t):
    return sorted(map(tuple, torch.as_tensor(t).tolist()))


def test_two_gloo_ranks_join_like_one_process():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    world, port = 2, _port()
    procs = [ctx.Process(target=dist_join_job.run, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted([q.get(timeout=60) for _ in range(world)], key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
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
