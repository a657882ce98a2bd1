"""Process-group setup and failures: a missing rank, a rank that dies, a bad launch."""

import time

import pytest
import torch
import torch.distributed

import opforge.distributed as D
from dist_ranks import BACKEND, free_port, launch


@pytest.mark.skipif(BACKEND != "gloo", reason="NCCL's watchdog aborts the process group instead of raising")
def test_a_rank_that_dies_fails_the_others_with_a_clear_error():
    got = launch(3, "die_during_shuffle", 1, timeout_s=10.0)
    assert 1 not in got  # the victim never answered
    for r in (0, 2):
        status, (kind, msg, seconds), _ = got[r]
        assert status == "ok" and kind == "CollectiveError", got[r]
        assert "opforge.distributed.shuffle_batch" in msg and f"rank {r}" in msg and "3 ranks" in msg
        assert seconds < 15


def test_a_rank_that_never_starts_fails_init_within_the_timeout(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    t0 = time.perf_counter()
    with pytest.raises(D.SetupError, match="rank 0 of 2 could not form the group within 2 s"):
        D.init("gloo", timeout=2)
    assert time.perf_counter() - t0 < 10
    assert not torch.distributed.is_initialized()


def test_init_outside_torchrun_names_the_missing_variables(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(D.SetupError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set; launch with `torchrun"):
        D.init()


def test_init_rejects_bad_arguments(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(D.SetupError, match="expected 0 <= RANK < WORLD_SIZE"):
        D.init()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="backend must be one of"):
        D.init("mpi")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        D.init("gloo", timeout=0)
    if not torch.cuda.is_available():
        with pytest.raises(D.SetupError, match="backend 'nccl' needs CUDA GPUs"):
            D.init("nccl")


def test_calls_before_init_say_so():
    with pytest.raises(D.SetupError, match=r"opforge.distributed.all_gather: no process group; call opforge.distributed.init\(\)"):
        D.all_gather(torch.zeros(2))
