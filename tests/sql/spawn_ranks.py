"""Run a function as N spawned ranks of a Gloo group on this machine and collect what each puts
on its queue (the distributed join test and the dist_join bench test share it)."""
import socket

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, extra_args: tuple, world: int = 2, timeout: float = 60) -> list:
    """``target(rank, world, port, *extra_args, queue)`` in ``world`` processes; their queue items,
    sorted by the rank in each item's first field."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *extra_args, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return sorted([q.get(timeout=timeout) for _ in range(world)], key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
