"""One rank of the 2-process Gloo test of ``cluster/exchange.py`` (``test_exchange.py``): each rank
holds its own batch (its own string and LIST dictionaries, NULLs on one rank only, a 2-wide decimal
column, bools), gathers it and shuffles it by a destination per row, and puts the rows it got (as
Python values), the dictionaries it ended with and the collectives each exchange took on the queue."""
import os

import pyarrow as pa
import torch


def rows(rank: int) -> dict:
    """The rank's rows, column name -> Python values (rank 1 holds NULLs, rank 0 none)."""
    if rank == 0:
        return {"i": [1, 2, 3, 4], "f": [0.5, 1.5, 2.5, 3.5], "b": [True, False, True, True],
                "d": [10, -20, 30, 2 ** 70], "s": ["pear", "apple", "fig", "apple"],
                "l": [[1, 2], [3], [1, 2], []], "same": ["x", "y", "x", "x"]}
    return {"i": [5, 6, 7], "f": [None, 6.5, None], "b": [False, False, True],
            "d": [None, 5, -(2 ** 66)], "s": ["kiwi", None, "apple"], "l": [[0], None, [3]],
            "same": ["y", "x", "y"]}


def dests(rank: int) -> list[int]:
    return [1, 0, 1, 1] if rank == 0 else [0, 0, 1]


ARROW_TYPES = {"i": pa.int64(), "f": pa.float64(), "b": pa.bool_(), "d": pa.decimal128(38, 0), "s": pa.string(),
               "l": pa.list_(pa.int64()), "same": pa.string()}


def _batch(data: dict):
    from opforge.sql.column import Column
    from opforge.sql.expr import Batch

    cols = {cid: Column.from_arrow(pa.array(data[name], ARROW_TYPES[name]), "cpu", name)
            for cid, name in enumerate(ARROW_TYPES)}
    return Batch(cols, len(data["i"]), torch.device("cpu"))


def _values(batch) -> dict:
    return {name: batch.cols[cid].to_arrow().to_pylist() for cid, name in enumerate(ARROW_TYPES)}


def count_collectives(calls: list) -> None:
    """Count the collectives ``exchange.py`` can reach (opforge.distributed's and torch's)."""
    import torch.distributed as dist

    from opforge.distributed import collectives

    def wrap(owner, name):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        setattr(owner, name, counted)

    wrap(collectives, "all_gather_single")
    for name in ("all_to_all_single", "all_gather_object", "all_gather", "broadcast", "all_reduce"):
        wrap(dist, name)


def in_gloo_group(rank, world, port, out_q, body, **env) -> None:
    """A spawned rank's frame (this file's and ``one_worker_rank.py``'s): the process group's
    environment (plus ``env``) before anything imports opforge, one thread, a Gloo group; puts
    ``(rank, *body())`` on the queue, or ``(rank, "error", traceback)``; leaves the group."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env)
    torch.set_num_threads(1)
    import opforge.distributed as D

    try:
        D.init("gloo", timeout=60)
        out_q.put((rank, *body()))
    except Exception:  # noqa: BLE001 - the test reports it
        import traceback

        out_q.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            D.destroy()
        except Exception:  # noqa: BLE001
            pass


def run(rank, world, port, out_q):
    in_gloo_group(rank, world, port, out_q, lambda: _exchanges(rank))


def _exchanges(rank: int) -> tuple[dict, dict]:
    from opforge.cluster import exchange as X
    from opforge.sql.expr import Batch

    calls: list = []
    count_collectives(calls)
    batch = _batch(rows(rank))
    out, counts = {}, {}
    for name, move in (("gather", lambda: X.gather_rows(batch)),
                       ("shuffle", lambda: X.shuffle_rows(batch, torch.tensor(dests(rank))))):
        calls.clear()
        got = move()
        counts[name] = len(calls)
        out[name] = (_values(got), {n: got.cols[c].dictionary for c, n in enumerate(ARROW_TYPES)})
    empty = batch.take(torch.zeros(0, dtype=torch.int64)) if rank == 1 else batch  # one rank with no rows
    out["gather_one_empty"] = _values(X.gather_rows(empty))
    out["shuffle_one_empty"] = _values(X.shuffle_rows(empty, torch.zeros(empty.n, dtype=torch.int64)))
    ints = Batch({0: empty.cols[0]}, empty.n, empty.device)  # rank 0 sends only to itself, rank 1 nothing
    out["shuffle_to_itself"] = X.shuffle_rows(ints, torch.zeros(ints.n, dtype=torch.int64)).cols[0].values.tolist()
    nothing = Batch({}, batch.n, batch.device)  # COUNT(*) over a projection of nothing
    out["no_columns"] = (X.gather_rows(nothing).n, X.shuffle_rows(nothing, torch.tensor(dests(rank))).n)
    return out, counts
