"""Groups of 2 and 3 ranks on localhost, started once per test session: Gloo on
CPUs; NCCL with ``OPFORGE_DIST_TEST_BACKEND=nccl`` (groups larger than the
GPU count are skipped there)."""

import pytest
import torch

from dist_ranks import BACKEND, Ranks


def _pool(world):
    if BACKEND == "nccl" and torch.cuda.device_count() < world:
        pytest.skip(f"NCCL group of {world} ranks needs {world} GPUs; {torch.cuda.device_count()} visible")
    return Ranks(world)


@pytest.fixture(scope="session")
def ranks2():
    pool = _pool(2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def ranks3():
    pool = _pool(3)
    yield pool
    pool.close()


@pytest.fixture(params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request):
    """The 2-rank and the 3-rank group in turn."""
    return request.getfixturevalue(f"ranks{request.param}")
