"""A cluster of one worker (one GPU: the TPC-H device run's) holds every row: the distributed
executor answers as the single-process engine does, with no collective at all (issue #29: on one
H200 every exchange was a fixed cost for nothing)."""
import importlib.util
from pathlib import Path

import pytest
import torch.distributed as dist

import one_worker_rank as job

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no Gloo")

_SPEC = importlib.util.spec_from_file_location("spawn_ranks",
                                               Path(__file__).resolve().parents[1] / "sql" / "spawn_ranks.py")
spawn_ranks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(spawn_ranks)


def test_one_worker_answers_like_one_process_without_collectives():
    (rank, *result), = spawn_ranks.run_ranks(job.run, (), world=1, timeout=90)
    assert result[0] != "error", result[1]
    assert len(result[0]) == len(job.QUERIES)
    for text, want, got, spread, collectives in result[0]:
        assert got == want, text
        assert spread == "replicated" and collectives == 0, (text, spread, collectives)


def test_workers_compute_on_a_gpu_they_see_whatever_the_group(monkeypatch):
    """NCCL: the worker's own GPU; Gloo with GPUs visible (more workers than GPUs): the GPUs in turn;
    no GPU: the CPU."""
    import torch

    from opforge.cluster.worker import compute_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compute_device("gloo", 3) == torch.device("cpu")
    assert compute_device("nccl", 3) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [compute_device("gloo", i) for i in range(3)] == [torch.device("cuda", i) for i in (0, 1, 0)]
