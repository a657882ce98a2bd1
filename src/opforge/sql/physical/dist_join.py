"""Distributed equi-joins over real ranks (``opforge.distributed``: NCCL on GPUs, Gloo on CPUs).

``simulated_workers.py`` simulates the planner's two methods on one device; these are the same
exchanges run as collectives, so the product, the Gloo test and ``benchmarks/dist_join.py``
measure one implementation. Every rank passes its resident rows (keys + global row ids) and gets
back the ``[n, 2]`` (probe row, build row) pairs it produced; the union over ranks is the
single-process join.

* :func:`broadcast_join` all-gathers the build side and probes local rows in place: it moves
  B (w - 1) bytes but every rank holds, and builds a table over, the whole build side.
* :func:`partitioned_join` shuffles both sides by key hash: (B + P)(w - 1)/w bytes, 1/w of the
  work each. A heavy key (:func:`sample_heavy_keys`) would land on one rank, so its probe rows
  are dealt round-robin by row id and its (few) build rows replicated to every rank.
"""
from __future__ import annotations

import torch

import opforge.distributed as D
from opforge.sql.physical.joins.hash import hash_pairs
from opforge.sql.physical.skew import SKEW_SAMPLE_ROWS, heavy_keys


def _row_bytes(keys: torch.Tensor, rows: torch.Tensor) -> int:
    return keys.element_size() + rows.element_size()


def sample_heavy_keys(pkey: torch.Tensor, threshold: float | None, *, stride: int | None = None,
                      group=None) -> torch.Tensor | None:
    """The probe keys above ``threshold`` of a strided sample of every rank's probe keys (the
    same tensor on every rank; None: no skew). Collective."""
    if threshold is None:
        return None
    world = D.world_size(group)
    if stride is None:
        stride = max(1, len(pkey) * world // SKEW_SAMPLE_ROWS)
    sample = D.all_gather(pkey[::stride].contiguous(), group=group)
    return heavy_keys(sample, None, threshold)


def broadcast_join(pkey: torch.Tensor, prow: torch.Tensor, bkey: torch.Tensor, brow: torch.Tensor, *,
                   group=None) -> tuple[torch.Tensor, dict]:
    """All-gather the build side, join this rank's probe rows against it where they are.
    -> (pairs ``[n, 2]`` int64: probe row id, build row id; stats). Collective."""
    world = D.world_size(group)
    built = D.all_gather(torch.stack([bkey.long(), brow.long()], 1), group=group)  # one collective
    bi, pi = hash_pairs(built[:, 0].contiguous(), pkey)
    pairs = torch.stack([prow[pi], built[bi, 1]], 1)
    n = len(bkey)
    return pairs, {"rows_received": built.shape[0] - n, "load": built.shape[0] + len(pkey),
                   "bytes_sent": n * (world - 1) * 16, "heavy_keys": 0}


def partitioned_join(pkey: torch.Tensor, prow: torch.Tensor, bkey: torch.Tensor, brow: torch.Tensor, *,
                     heavy: torch.Tensor | None = None, group=None) -> tuple[torch.Tensor, dict]:
    """Shuffle both sides by ``D.hash_partition`` of the key, join each rank's partition.
    ``heavy``: key values whose probe rows go round-robin (by row id) and whose build rows go to
    every rank. -> (pairs ``[n, 2]``: probe row id, build row id; stats). Collective."""
    world, me = D.world_size(group), D.rank(group)
    pdest = D.hash_partition(pkey, world)
    if heavy is not None and heavy.numel():
        heavy = heavy.to(pkey.device)
        hp = torch.isin(pkey, heavy)
        pdest = torch.where(hp, prow % world, pdest)
        hb = torch.isin(bkey, heavy)
        light = ~hb
        n_heavy = int(hb.sum())
        bk = torch.cat([bkey[light], bkey[hb].repeat(world)])
        br = torch.cat([brow[light], brow[hb].repeat(world)])
        bdest = torch.cat([D.hash_partition(bkey[light], world),
                           torch.arange(world, device=bkey.device).repeat_interleave(n_heavy)])
    else:
        bk, br, bdest = bkey, brow, D.hash_partition(bkey, world)
    got_p, recv_p = D.shuffle_by({"k": pkey, "row": prow}, pdest, group=group)
    got_b, recv_b = D.shuffle_by({"k": bk, "row": br}, bdest, group=group)
    bi, pi = hash_pairs(got_b["k"], got_p["k"])
    pairs = torch.stack([got_p["row"][pi], got_b["row"][bi]], 1)
    sent = ((pdest != me).sum() * _row_bytes(pkey, prow) + (bdest != me).sum() * _row_bytes(bk, br)).item()
    received = int(recv_p.sum() - recv_p[me] + recv_b.sum() - recv_b[me])
    return pairs, {"rows_received": received, "load": len(got_p["k"]) + len(got_b["k"]), "bytes_sent": int(sent),
                   "heavy_keys": 0 if heavy is None else int(heavy.numel())}
