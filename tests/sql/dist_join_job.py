"""One rank of the 2-process Gloo join test (``test_sql_dist_gloo.py``): each rank holds half of
a fact and a dimension table, and joins them over ``opforge.dist`` (real all-to-all shuffles and
all-gathers) the way ``sql/physical/distributed.py`` simulates it: partitioned with heavy-key
handling (heavy probe rows dealt round-robin, their build rows replicated), and broadcast."""
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
    import opforge.dist as D
    from opforge.sql.physical.join import hash_pairs
    from opforge.sql.physical.skew import heavy_keys

    try:
        D.init("gloo", timeout=60)
        fk, dk = tables()
        # this rank's resident rows: a contiguous half of each table (global row ids kept)
        def mine(t):
            a, b = len(t) * rank // world, len(t) * (rank + 1) // world
            return t[a:b], torch.arange(a, b)
        pk, prow = mine(fk)
        bk, brow = mine(dk)
        # --- partitioned, with skew handling: heavy keys from a sample of every rank's probe keys
        sample = D.all_gather(pk[::4].contiguous())
        heavy = heavy_keys(sample, None, 0.05)
        pdest = D.hash_partition(pk, world)
        hp = torch.isin(pk, heavy)
        pdest = torch.where(hp, (prow % world), pdest)  # heavy probe rows: round-robin
        got_p, _ = D.shuffle_by({"k": pk, "row": prow}, pdest)
        hb = torch.isin(bk, heavy)
        light = ~hb
        bdest = D.hash_partition(bk[light], world)
        rep_k = bk[hb].repeat(world)  # heavy build rows: one copy for every rank
        rep_row = brow[hb].repeat(world)
        rep_dest = torch.arange(world).repeat_interleave(int(hb.sum()))
        got_b, _ = D.shuffle_by({"k": torch.cat([bk[light], rep_k]), "row": torch.cat([brow[light], rep_row])},
                                torch.cat([bdest, rep_dest]))
        bi, pi = hash_pairs(got_b["k"], got_p["k"])
        part_pairs = torch.stack([got_p["row"][pi], got_b["row"][bi]], 1)
        load = len(got_p["k"]) + len(got_b["k"])
        # --- broadcast: every rank gathers the whole build side, probes its own rows in place
        all_bk, all_brow = D.all_gather(bk), D.all_gather(brow)
        bi, pi = hash_pairs(all_bk, pk)
        bcast_pairs = torch.stack([prow[pi], all_brow[bi]], 1)
        # numpy, not tensors: torch's queue would pass shared memory that dies with this process
        out_q.put((rank, part_pairs.numpy(), bcast_pairs.numpy(), heavy.numpy(), load))
    except Exception as e:  # noqa: BLE001 - the test reports it
        import traceback

        out_q.put((rank, "error", traceback.format_exc(), None, None))
    finally:
        try:
            D.destroy()
        except Exception:  # noqa: BLE001
            pass
