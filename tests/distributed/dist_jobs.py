"""Jobs that every rank of a test group runs (see ``dist_ranks``), and the
inputs they make: each rank derives its data from its rank and a seed, so the
test process can build the same data and compute the single-process answer."""

from __future__ import annotations

import os
import time

import torch

import opforge.distributed as D

def on(t: torch.Tensor) -> torch.Tensor:
    """A tensor on the device the group's backend takes (the GPU under NCCL)."""
    return t.to(D.device())


DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bfloat16": torch.bfloat16}


def rows(rank: int, n: int, width: int = 3, dtype: str = "float32", seed: int = 0) -> torch.Tensor:
    """Integer-valued rows (exact in every float dtype), distinct per rank and seed."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + n)
    return torch.randint(-8, 9, (n, width), generator=g).to(DTYPES[dtype])


def labelled(rank: int, n: int) -> dict[str, torch.Tensor]:
    """A columnar batch whose rows say where they came from: source rank and row number."""
    idx = torch.arange(n, dtype=torch.int64)
    return {"src": torch.full((n,), rank, dtype=torch.int64), "row": idx,
            "value": torch.stack([idx.double() * 0.5, -idx.double()], 1).float(),
            "flag": idx % 2 == 0}


def operand(shape: tuple[int, ...], dtype: str, seed: int, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if integer:
        return torch.randint(-3, 4, shape, generator=g).to(DTYPES[dtype])
    return torch.randn(shape, generator=g, dtype=torch.float64).to(DTYPES[dtype])


# ---------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------
def rank_info():
    i = D.info()
    return i.rank, i.world_size, i.backend, str(i.device)


def broadcast(src: int, dtype: str):
    r = D.rank()
    t = rows(src, 5, 4, dtype) if r == src else torch.zeros(5, 4, dtype=DTYPES[dtype])
    return D.broadcast(on(t), src)


def all_gather(sizes: list[int], dtype: str, pass_sizes: bool):
    x = on(rows(D.rank(), sizes[D.rank()], 3, dtype))
    return D.all_gather(x, sizes=sizes if pass_sizes else None)


def all_gather_mismatch():
    dtype = "float64" if D.rank() == 1 else "float32"
    return D.all_gather(on(rows(D.rank(), 2, 3, dtype)))


def reduce_scatter(n: int, op: str, sizes: list[int] | None, dtype: str):
    return D.reduce_scatter(on(rows(D.rank(), n, 3, dtype)), op, sizes=sizes)


def shuffle(counts: list[list[int]]):
    """Rank r sends counts[r][d] labelled rows to rank d."""
    r = D.rank()
    batch = {k: on(v) for k, v in labelled(r, sum(counts[r])).items()}
    got, recv = D.shuffle_batch(batch, counts[r])
    return got, recv


def shuffle_round_trip(counts: list[list[int]], width: int):
    """Shuffle rows out and back again with the received counts: the original rows return."""
    r = D.rank()
    x = on(rows(r, sum(counts[r]), width, "float64"))
    there, recv = D.shuffle(x, torch.tensor(counts[r]))
    back, again = D.shuffle(there, recv)
    return x, back, again


def shuffle_by_hash(n: int):
    keys = on(torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(D.rank())))
    dest = D.hash_partition(keys, D.world_size())
    got, _ = D.shuffle_by({"key": keys, "double": keys * 2}, dest)
    return keys, got["key"], got["double"]


def shuffle_schema_mismatch():
    batch = {"a": on(torch.zeros(2))}
    if D.rank() == 0:
        batch["b"] = on(torch.zeros(2))
    return D.shuffle_batch(batch, [2] + [0] * (D.world_size() - 1))


def all_gather_matmul(m: int, k: int, n: int, dtype: str, chunks, integer: bool, middle: tuple = (),
                      graph: bool = False, transport: str = "auto"):
    x = on(operand((m,) + tuple(middle) + (k,), dtype, 100 + D.rank(), integer))
    w = on(operand((k, n), dtype, 7, integer))

    def call(a, **kw):
        return D.all_gather_matmul(a, w, chunks=chunks, transport=transport, **kw)

    over = call(x, graph=graph)
    if graph:  # a second call replays the captured graph with new inputs
        over = call(x * 0, graph=True).add_(call(x, graph=True))
    return over, call(x, overlap=False)


def matmul_reduce_scatter(m: int, kp: int, n: int, dtype: str, chunks, integer: bool, reduce_op: str = "sum",
                          graph: bool = False, transport: str = "auto"):
    x = on(operand((m, kp), dtype, 200 + D.rank(), integer))
    w = on(operand((kp, n), dtype, 300 + D.rank(), integer))

    def call(a, **kw):
        return D.matmul_reduce_scatter(a, w, reduce_op, chunks=chunks, transport=transport, **kw)

    over = call(x, graph=graph)
    if graph:
        over = call(x * 0, graph=True).add_(call(x, graph=True))
    return over, call(x, overlap=False)


def all_gather_matmul_uneven_shards():
    x = on(torch.zeros(2 + D.rank(), 4))
    return D.all_gather_matmul(x, on(torch.zeros(4, 3)))


def mesh_gather():
    """A (1, world) mesh: the 'tp' dim spans every rank, the 'dp' dim only this one."""
    m = D.mesh((1, D.world_size()), ("dp", "tp"))
    x = on(rows(D.rank(), 2, 2, "float32"))
    return D.all_gather(x, group=D.mesh_group(m, "tp")), D.all_gather(x, group=D.mesh_group(m, "dp"))


def die_during_shuffle(victim: int):
    """The victim rank exits; the others must get a CollectiveError, not hang."""
    if D.rank() == victim:
        os._exit(3)
    time.sleep(0.5)
    world = D.world_size()
    t0 = time.perf_counter()
    try:
        D.shuffle(on(torch.zeros(world, 2)), [1] * world)
    except D.CollectiveError as e:
        return "CollectiveError", str(e), time.perf_counter() - t0
    return "no error", "", time.perf_counter() - t0


def bench_quick():
    from opforge.distributed import bench

    return bench.run(quick=True, warmup=1, repeats=2, log=lambda *a: None)


def bad_arguments():
    """Each call's (exception type, message): raised on this rank before any collective."""
    x, w = on(torch.zeros(4, 3)), on(torch.zeros(3, 2))
    calls = {
        "ag_dtype": lambda: D.all_gather_matmul(x, w.double()),
        "ag_k": lambda: D.all_gather_matmul(x, on(torch.zeros(5, 2))),
        "ag_chunks": lambda: D.all_gather_matmul(x, w, chunks=0),
        "ag_variant": lambda: D.all_gather_matmul(x, w, matmul_variant="cublas"),
        "rs_w_dims": lambda: D.matmul_reduce_scatter(x, on(torch.zeros(3, 2, 1))),
        "rs_op": lambda: D.matmul_reduce_scatter(x, w, "max"),
        "bcast_src": lambda: D.broadcast(x, src=D.world_size()),
        "bcast_type": lambda: D.broadcast([1, 2]),
        "gather_0d": lambda: D.all_gather(on(torch.tensor(1.0))),
        "gather_sizes": lambda: D.all_gather(x, sizes=[4]),
        "shuffle_counts": lambda: D.shuffle(x, [1] * D.world_size()),
        "shuffle_float_counts": lambda: D.shuffle(x, torch.ones(D.world_size())),
        "shuffle_rows": lambda: D.shuffle_batch({"a": x, "b": on(torch.zeros(3))}, [4] + [0] * (D.world_size() - 1)),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = ("no error", "")
        except Exception as e:
            out[name] = (type(e).__name__, str(e))
    return out
