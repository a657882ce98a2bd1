"""Equi-joins by hash, sort-merge or nested loop; residual predicates, outer padding with NULLs,
semi/anti, and a nested-loop path for joins without equi keys.

Keys. ``keys.join_keys`` turns the key columns of both sides into one int key per side (one column:
its values in the common type; several: packed dense ids, exact) plus validity (NULL never matches).

Algorithm rule (``choose_algorithm``; ``connect(join_algorithm=...)`` forces one):
* nested loop when ``left rows * right rows <= NESTED_LOOP_MAX_PAIRS``: one broadcast compare, no
  table, no sort: the cheapest for tiny inputs (and the only way for joins without equi keys);
* sort-merge when both sides' single key column is already sorted ascending without NULLs (a
  table loaded in key order, e.g. TPC-H orders / lineitem on orderkey, kept through filters):
  the matches of each left key are the run ``[lo, hi)`` found by ``searchsorted`` in the right
  side, with no sort and no table, and both sides are read in order;
* hash otherwise: ``opforge.hash_join`` through dispatch (the Triton open-addressing table on
  CUDA, the sort-based reference on the CPU), the smaller side as the build side for inner joins,
  the preserved side as the probe side for left / right / semi / anti joins without a residual
  (they then come out of the kernel directly as ``how="left" / "semi" / "anti"``).

Memory budget: a hash build side needs about ``HASH_BYTES_PER_ROW`` bytes per row (slots at load
factor 1/2: owner, key copy, count; plus the slot id and sort permutation per row). When that
exceeds the budget, both sides are radix-partitioned on the key (``keys.partition_of``) into 2^p
parts whose build sides fit, each part is joined in turn, and the pairs are put back in the order
the unpartitioned join gives (by probe row, then build row): the answer does not depend on p.
"""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql.column import Column
from opforge.sql.expr import Batch, evaluate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.keys import join_keys, partition_bits, partition_of, partitions
from opforge.sql.plan import Join

NESTED_LOOP_MAX_PAIRS = 4096
HASH_BYTES_PER_ROW = 48


# ------------------------------------------------------------------------------------- algorithms
def _counts_to_pairs(lo: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand per-left-row runs ``[lo, lo + count)`` of right positions into (left, position) pairs."""
    dev = lo.device
    total = int(counts.sum()) if counts.numel() else 0  # the output size: one host sync
    li = torch.repeat_interleave(torch.arange(len(lo), device=dev), counts, output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, device=dev) - starts[li]
    return li, lo[li] + within


def merge_pairs(lkey, rkey, lvalid=None, rvalid=None, presorted=False):
    """Sort-merge: sort the right side (skipped when ``presorted``: both sides ascending), then each
    left key's matches are a ``searchsorted`` range. Pairs ordered by left row, then right row."""
    dev = lkey.device
    lk, rk = lkey.long(), rkey.long()
    if presorted:
        order, sorted_r = None, rk
    else:
        rows = torch.arange(len(rk), device=dev)
        if rvalid is not None:
            rows = rows[rvalid]
        sorted_r, o = torch.sort(rk[rows], stable=True)
        order = rows[o]
    lo = torch.searchsorted(sorted_r, lk, side="left")
    counts = torch.searchsorted(sorted_r, lk, side="right") - lo
    if lvalid is not None:
        counts = torch.where(lvalid, counts, 0)
    li, pos = _counts_to_pairs(lo, counts)
    return li, (pos if order is None else order[pos])


def nested_loop_pairs(lkey, rkey, lvalid=None, rvalid=None):
    """Every (left, right) compared at once: for tiny inputs. Pairs ordered by left, then right."""
    eq = lkey.long()[:, None] == rkey.long()[None, :]
    if lvalid is not None:
        eq &= lvalid[:, None]
    if rvalid is not None:
        eq &= rvalid[None, :]
    li, ri = torch.nonzero(eq, as_tuple=True)
    return li, ri


def hash_pairs(bkey, pkey, bvalid=None, pvalid=None, how="inner", budget=None, ctx=None):
    """``opforge.hash_join`` (build, probe) -> (build_index, probe_index), radix-partitioned when
    the build side's table exceeds ``budget`` bytes. Order as the unpartitioned call: by probe
    row, then build row."""
    bits = partition_bits(len(bkey) * HASH_BYTES_PER_ROW, budget)
    if bits == 0:
        return hashing.hash_join(bkey, pkey, how=how, build_valid=bvalid, probe_valid=pvalid)
    if ctx is not None:
        ctx.note(f"radix-partitioned into {1 << bits} parts (build {len(bkey) * HASH_BYTES_PER_ROW} B "
                 f"> budget {budget} B)")
    bparts = partitions(partition_of(bkey, bits), bits)
    pparts = partitions(partition_of(pkey, bits), bits)
    out_b, out_p = [], []
    for bidx, pidx in zip(bparts, pparts):
        if len(pidx) == 0:
            continue
        sb, sp = hashing.hash_join(bkey[bidx], pkey[pidx], how=how,
                                   build_valid=None if bvalid is None else bvalid[bidx],
                                   probe_valid=None if pvalid is None else pvalid[pidx])
        out_b.append(torch.where(sb >= 0, bidx[sb.clamp(min=0)], -1) if len(bidx) else torch.full_like(sb, -1))
        out_p.append(pidx[sp])
    if not out_b:
        e = torch.zeros(0, dtype=torch.int64, device=bkey.device)
        return e, e.clone()
    bi, pi = torch.cat(out_b), torch.cat(out_p)
    order = torch.argsort(pi * (len(bkey) + 1) + (bi + 1))
    return bi[order], pi[order]


def choose_algorithm(nl: int, nr: int, presorted: bool, forced: str = "auto") -> str:
    """The rule in the module docstring."""
    if forced != "auto":
        return forced
    if nl * nr <= NESTED_LOOP_MAX_PAIRS:
        return "nested_loop"
    if presorted:
        return "merge"
    return "hash"


def join_pairs(lkey: torch.Tensor, rkey: torch.Tensor, lvalid=None, rvalid=None, *, algorithm="hash",
               presorted=False, budget=None, ctx=None) -> tuple[torch.Tensor, torch.Tensor]:
    """All (left row, right row) with equal keys (inner pairs), NULL keys never matching."""
    if algorithm == "nested_loop":
        return nested_loop_pairs(lkey, rkey, lvalid, rvalid)
    if algorithm == "merge":
        return merge_pairs(lkey, rkey, lvalid, rvalid, presorted)
    if len(rkey) <= len(lkey):  # the smaller side builds the table
        ri, li = hash_pairs(rkey, lkey, rvalid, lvalid, "inner", budget, ctx)
    else:
        li, ri = hash_pairs(lkey, rkey, lvalid, rvalid, "inner", budget, ctx)
    return li, ri


def _cross_pairs(nl: int, nr: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    li = torch.arange(nl, device=dev).repeat_interleave(nr)
    ri = torch.arange(nr, device=dev).repeat(nl)
    return li, ri


def _pad(col: Column, idx: torch.Tensor, present: torch.Tensor) -> Column:
    """Gather with NULL where `present` is False (outer-join padding)."""
    safe = torch.where(present, idx, torch.zeros_like(idx))
    if len(col) == 0:
        vals = torch.zeros(len(idx), dtype=col.values.dtype, device=idx.device)
        return Column(vals, torch.zeros(len(idx), dtype=torch.bool, device=idx.device), col.type, col.dictionary)
    out = col.take(safe)
    return Column(out.values, out.valid_mask() & present, col.type, col.dictionary)


def _is_sorted(cols: list[Column]) -> bool:
    return len(cols) == 1 and cols[0].sorted


# ------------------------------------------------------------------------------------- operator
def run_join(node: Join, left: Batch, right: Batch, ctx: ExecContext | None = None) -> Batch:
    ctx = ctx or ExecContext()
    dev = left.device
    kind = node.kind
    direct = None  # (li, ri) with ri = -1 for an unmatched left row, straight from the hash kernel
    if node.left_keys:
        lcols = [evaluate(e, left) for e in node.left_keys]
        rcols = [evaluate(e, right) for e in node.right_keys]
        lk, rk, lvalid, rvalid = join_keys(lcols, rcols, dev)
        presorted = _is_sorted(lcols) and _is_sorted(rcols)
        algo = choose_algorithm(left.n, right.n, presorted, ctx.join_algorithm)
        if algo == "merge" and not presorted:
            algo_name = "sort-merge join (sorts the right side)"
        else:
            algo_name = {"hash": "hash join", "merge": "merge join (inputs already sorted)",
                         "nested_loop": "nested-loop join"}[algo]
        ctx.note(f"{algo_name}: {left.n} x {right.n} rows")
        if algo == "hash" and node.residual is None and kind in ("left", "semi", "anti") \
                and not (kind == "anti" and node.null_aware):
            ri, li = hash_pairs(rk, lk, rvalid, lvalid, kind, ctx.memory_budget, ctx)
            direct = li, ri
        elif algo == "hash" and node.residual is None and kind == "right":
            li, ri = hash_pairs(lk, rk, lvalid, rvalid, "left", ctx.memory_budget, ctx)
            present = li >= 0
            cols = {k: _pad(c, li, present) for k, c in left.cols.items()}
            cols.update({k: c.take(ri) for k, c in right.cols.items()})
            return Batch(cols, len(ri), dev)
        else:
            li, ri = join_pairs(lk, rk, lvalid, rvalid, algorithm=algo, presorted=presorted,
                                budget=ctx.memory_budget, ctx=ctx)
    else:
        ctx.note(f"nested-loop join (no equi keys): {left.n} x {right.n} rows")
        li, ri = _cross_pairs(left.n, right.n, dev)
    if direct is not None:
        li, ri = direct
        if kind in ("semi", "anti"):
            return left.take(li)
        present = ri >= 0
        cols = {k: c.take(li) for k, c in left.cols.items()}
        cols.update({k: _pad(c, ri, present) for k, c in right.cols.items()})
        return Batch(cols, len(li), dev)
    if node.residual is not None and len(li):
        need = node.residual.cids()  # gather only the columns the residual reads
        cols = {k: c.take(li) for k, c in left.cols.items() if k in need}
        cols.update({k: c.take(ri) for k, c in right.cols.items() if k in need})
        pair = Batch(cols, len(li), dev)
        r = evaluate(node.residual, pair)
        keep = torch.nonzero(r.values & r.valid_mask()).squeeze(1)
        li, ri = li[keep], ri[keep]
    if kind in ("semi", "anti"):
        matched = torch.zeros(left.n, dtype=torch.bool, device=dev)
        matched[li] = True
        if kind == "anti" and node.null_aware:
            rk = [evaluate(e, right) for e in node.right_keys]
            if right.n and any(bool(c.null_mask().any()) for c in rk):
                matched[:] = True  # x NOT IN (... NULL ...) is never true
            elif right.n:
                lk = [evaluate(e, left) for e in node.left_keys]
                for c in lk:
                    matched |= c.null_mask()
        keep = matched if kind == "semi" else ~matched
        return left.take(torch.nonzero(keep).squeeze(1))
    if kind in ("inner", "cross"):
        return Batch({**left.take(li).cols, **right.take(ri).cols}, len(li), dev)
    lpresent = torch.ones(len(li), dtype=torch.bool, device=dev)
    rpresent = torch.ones(len(li), dtype=torch.bool, device=dev)
    if kind in ("left", "full"):
        seen = torch.zeros(left.n, dtype=torch.bool, device=dev)
        seen[li] = True
        extra = torch.nonzero(~seen).squeeze(1)
        li = torch.cat([li, extra])
        ri = torch.cat([ri, torch.zeros_like(extra)])
        lpresent = torch.cat([lpresent, torch.ones_like(extra, dtype=torch.bool)])
        rpresent = torch.cat([rpresent, torch.zeros_like(extra, dtype=torch.bool)])
    if kind in ("right", "full"):
        seen = torch.zeros(right.n, dtype=torch.bool, device=dev)
        seen[ri[rpresent]] = True
        extra = torch.nonzero(~seen).squeeze(1)
        ri = torch.cat([ri, extra])
        li = torch.cat([li, torch.zeros_like(extra)])
        rpresent = torch.cat([rpresent, torch.ones_like(extra, dtype=torch.bool)])
        lpresent = torch.cat([lpresent, torch.zeros_like(extra, dtype=torch.bool)])
    cols = {k: _pad(c, li, lpresent) for k, c in left.cols.items()}
    cols.update({k: _pad(c, ri, rpresent) for k, c in right.cols.items()})
    return Batch(cols, len(li), dev)
