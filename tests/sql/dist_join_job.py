"""One rank of the 2-process Gloo join test (``test_sql_dist_gloo.py``): each rank holds half of
a fact and a dimension table, and joins them with ``sql/physical/dist_join.py`` (real all-to-all
shuffles and all-gathers over ``opforge.distributed``): partitioned with heavy-key handling (heavy probe
rows dealt round-robin, their build rows replicated), and broadcast."""
import os

import numpy as np
import torch


def tables(n=20_000, keys=2000, seed=4):
    rng = np.random.default_rng(seed)
    fk = (rng.zipf(1.2, n) - 1) % keys
    dk = np.concatenate([np.arange(0, keys, 2), [0, 0, 1]])  # key 0 and 1 have several build rows
    return torch.tensor(fk, dtype=torch.int64), torch.tensor(dk, dtype=torch.int64)


def run(rank, world, port, out_q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import opforge.distributed as D
    from opforge.sql.physical.dist_join import broadcast_join, partitioned_join, sample_heavy_keys

    try:
        D.init("gloo", timeout=60)
        fk, dk = tables()
        # this rank's resident rows: a contiguous half of each table (global row ids kept)
        def mine(t):
            a, b = len(t) * rank // world, len(t) * (rank + 1) // world
            return t[a:b], torch.arange(a, b)
        pk, prow = mine(fk)
        bk, brow = mine(dk)
        # heavy keys from a sample of every rank's probe keys, then partitioned with skew handling
        heavy = sample_heavy_keys(pk, 0.05, stride=4)
        part_pairs, stats = partitioned_join(pk, prow, bk, brow, heavy=heavy)
        # broadcast: every rank gathers the whole build side, probes its own rows in place
        bcast_pairs, _ = broadcast_join(pk, prow, bk, brow)
        # numpy, not tensors: torch's queue would pass shared memory that dies with this process
        out_q.put((rank, part_pairs.numpy(), bcast_pairs.numpy(), heavy.numpy(), stats["load"]))
    except Exception:  # noqa: BLE001 - the test reports it
        import traceback

        out_q.put((rank, "error", traceback.format_exc(), None, None))
    finally:
        try:
            D.destroy()
        except Exception:  # noqa: BLE001
            pass
