"""Spawn a group of ranks on localhost (Gloo; NCCL with ``OPFORGE_DIST_TEST_BACKEND=nccl``
on a host with a GPU per rank) and run jobs (functions of
``dist_jobs``) on all of them at once.

A :class:`Ranks` pool keeps its processes (and their process group) between
jobs, so a test file pays the start-up (torch import, rendezvous) once.
:func:`launch` runs one job in a fresh group, for tests that kill a rank.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback

import torch.multiprocessing as mp

_CTX = mp.get_context("spawn")
BACKEND = os.environ.get("OPFORGE_DIST_TEST_BACKEND", "gloo")


def _to_host(value):
    """Results travel back to the test process as CPU tensors."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank, world, port, timeout_s, inbox, outbox):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", OPFORGE_DIST_CHECK="1")
    import torch

    torch.set_num_threads(1)
    import dist_jobs
    import opforge.distributed as D

    try:
        D.init(BACKEND, timeout=timeout_s)
    except Exception as e:  # reported like a job's error
        outbox.put((rank, "error", type(e).__name__, str(e)))
        return
    while True:
        job = inbox.get()
        if job is None:
            break
        name, args = job
        try:
            outbox.put((rank, "ok", _to_host(getattr(dist_jobs, name)(*args)), None))
        except Exception as e:
            outbox.put((rank, "error", type(e).__name__, f"{e}\n{traceback.format_exc()}"))
    outbox.close()
    outbox.join_thread()
    os._exit(0)  # skip tearing down the group: the peers are leaving too


class RankError(AssertionError):
    pass


class Ranks:
    """``world`` ranks in one group; :meth:`run` a job on all of them."""

    def __init__(self, world: int, timeout_s: float = 30.0):
        self.world = world
        port = free_port()
        self.outbox = _CTX.Queue()
        self.ranks = list(range(world))
        self.inboxes = {r: _CTX.Queue() for r in self.ranks}
        self.procs = [_CTX.Process(target=_serve, args=(r, world, port, timeout_s, self.inboxes[r], self.outbox),
                                   daemon=True) for r in self.ranks]
        for p in self.procs:
            p.start()

    def submit(self, name: str, *args) -> None:
        for r in self.ranks:
            self.inboxes[r].put((name, args))

    def collect(self, timeout: float = 60.0) -> dict[int, tuple]:
        """rank -> (status, value, error message); ranks that exited or never
        answered within ``timeout`` are missing."""
        out = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(self.ranks) and time.monotonic() < deadline:
            try:
                rank, status, value, msg = self.outbox.get(timeout=0.2)
                out[rank] = (status, value, msg)
            except queue.Empty:
                alive = [r for r, p in zip(self.ranks, self.procs) if p.is_alive() and r not in out]
                if not alive and self.outbox.empty():
                    break
        return out

    def results(self, name: str, *args, timeout: float = 60.0) -> dict[int, tuple]:
        self.submit(name, *args)
        return self.collect(timeout)

    def run(self, name: str, *args, timeout: float = 60.0) -> list:
        """Each rank's return value, in rank order; any rank's error fails the test."""
        got = self.results(name, *args, timeout=timeout)
        bad = {r: got.get(r, ("missing", None, "no answer")) for r in self.ranks
               if got.get(r, ("missing",))[0] != "ok"}
        if bad:
            raise RankError(f"job {name} failed: " + "; ".join(f"rank {r}: {v[1]} {v[2]}" for r, v in bad.items()))
        return [got[r][1] for r in self.ranks]

    def errors(self, name: str, *args, timeout: float = 60.0) -> list[tuple[str, str]]:
        """Each rank's (exception type, message); fails if a rank succeeded."""
        got = self.results(name, *args, timeout=timeout)
        out = []
        for r in self.ranks:
            status, value, msg = got.get(r, ("missing", None, "no answer"))
            if status != "error":
                raise RankError(f"job {name}: rank {r} did not raise ({status})")
            out.append((value, msg))
        return out

    def close(self) -> None:
        for r in self.ranks:
            self.inboxes[r].put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


def launch(world: int, name: str, *args, timeout_s: float = 5.0, wait: float = 30.0) -> dict[int, tuple]:
    """Run one job in a fresh group of ``world`` ranks; rank -> result (a rank that died is missing)."""
    pool = Ranks(world, timeout_s)
    try:
        return pool.results(name, *args, timeout=wait)
    finally:
        pool.close()
