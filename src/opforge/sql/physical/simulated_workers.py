"""Distributed joins over simulated workers (real ranks: ``dist_join.py``): ``connect(workers=N)``
runs every equi-join as if its inputs were spread over N workers (all on this one device), as
broadcast or partitioned, the method chosen by ``planner/distribution.py`` from the inputs' actual
bytes (``join_distribution`` = auto | broadcast | partitioned):

* placement: a table registered with ``partition_key=`` lives hash-partitioned on that column
  (every row on worker ``skew.hash_dest(key, N)``); any other input lives in N contiguous slices;
* broadcast: the build side is copied to every worker; each worker joins its own slice of the
  probe side against it (the probe rows do not move); output placed as the probe side;
* partitioned: both sides are shuffled by a hash of the key (the same ``hash_dest`` on both), each
  worker joins its partition; heavy-hitter probe keys are dealt round-robin and their build rows
  replicated (``physical/skew.py``); output hash-partitioned on the keys (unless skew handling
  moved rows off their key's worker). Inputs already hash-partitioned on the join keys
  (co-partitioned) skip the shuffle: nothing moves.

Each worker's join is ``opforge.hash_join``; the pairs are put back in the single-worker order (by
probe row, then build row), so results equal a ``workers=1`` run. EXPLAIN ANALYZE's notes give
the method, the reason, the bytes moved and each worker's load. A real multi-process run of the
same exchange over ``opforge.distributed.shuffle_by`` is tested in ``tests/sql/test_sql_dist_gloo.py``.
"""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql.expr import Batch, Ref
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.skew import hash_dest, heavy_keys, partitioned_pairs
from opforge.sql.plan import Join
from opforge.sql.planner.distribution import choose_distribution


def _bytes(batch: Batch) -> int:
    total = 0
    for c in batch.cols.values():
        total += c.values.numel() * c.values.element_size() + (0 if c.valid is None else c.valid.numel())
    return total


def copartitioned(node: Join, left: Batch, right: Batch) -> bool:
    """Both inputs hash-partitioned on this join's (single) key pair."""
    if len(node.left_keys) != 1:
        return False
    lk, rk = node.left_keys[0], node.right_keys[0]
    return isinstance(lk, Ref) and isinstance(rk, Ref) and lk.cid in left.hash_keys and rk.cid in right.hash_keys


def slices(n: int, workers: int) -> list[tuple[int, int]]:
    """The contiguous row range of each worker for an input spread evenly."""
    return [(n * w // workers, n * (w + 1) // workers) for w in range(workers)]


def distributed_pairs(node: Join, lk, rk, lvalid, rvalid, how: str, left: Batch, right: Batch,
                      ctx: ExecContext) -> tuple[torch.Tensor, torch.Tensor, frozenset]:
    """(build index, probe index, output hash keys) of ``node`` over ``ctx.workers`` workers, the
    left input probing (``how`` as ``hashing.hash_join``) and the right one building."""
    w = ctx.workers
    build_bytes, probe_bytes = _bytes(right), _bytes(left)
    co = copartitioned(node, left, right)
    choice = choose_distribution(build_bytes, probe_bytes, w, ctx.join_distribution, co)
    ctx.metrics["distribution"] = choice.method
    ctx.metrics["bytes_moved"] = int(choice.bytes_moved)
    dev = lk.device
    if choice.method == "broadcast":
        out_b, out_p, loads = [], [], []
        for a, b in slices(left.n, w):
            loads.append(b - a + right.n)
            if b == a:
                continue
            sb, sp = hashing.hash_join(rk, lk[a:b], how=how, build_valid=rvalid,
                                       probe_valid=None if lvalid is None else lvalid[a:b])
            out_b.append(sb)
            out_p.append(sp + a)
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        bi = torch.cat(out_b) if out_b else e
        pi = torch.cat(out_p) if out_p else e.clone()
        ctx.note(f"distributed over {w} workers: broadcast ({choice.reason}); moved {choice.bytes_moved:.0f} B; "
                 f"largest worker {max(loads)} rows; rule: planner/distribution.py")
        ctx.metrics["max_partition_rows"] = max(loads)
        return bi, pi, left.hash_keys
    heavy = heavy_keys(lk, lvalid, ctx.skew_threshold, node.heavy_keys)
    bi, pi, report = partitioned_pairs(rk, lk, rvalid, lvalid, hash_dest(rk, w), hash_dest(lk, w), w, how, heavy)
    shuffle = "co-partitioned: no shuffle" if co and choice.bytes_moved == 0 else "shuffled by key hash"
    ctx.note(f"distributed over {w} workers: partitioned, {shuffle} ({choice.reason}); moved "
             f"{choice.bytes_moved:.0f} B; {report.describe()}; rule: planner/distribution.py")
    ctx.metrics["max_partition_rows"] = max(report.loads, default=0)
    ctx.metrics["max_partition_rows_plain"] = max(report.plain_loads, default=0)
    if report.heavy:
        ctx.metrics["heavy_keys"] = len(report.heavy)
    keys = frozenset()
    if not report.heavy and len(node.left_keys) == 1 and how == "inner":
        keys = frozenset(e.cid for e in (node.left_keys[0], node.right_keys[0]) if isinstance(e, Ref))
    elif not report.heavy and len(node.left_keys) == 1 and isinstance(node.left_keys[0], Ref):
        keys = frozenset([node.left_keys[0].cid])
    return bi, pi, keys
