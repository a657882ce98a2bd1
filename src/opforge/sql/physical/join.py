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

Who chooses (``pick_algorithm``, named in EXPLAIN ANALYZE's notes as ``rule: ...``):
* ``connect(join_algorithm=...)`` other than "auto": the user's override, for every equi-join;
* a join the planner built (``Join.physical``, from ``planner/physical_choice.py``): its algorithm
  with the right input as the build side; "direct" is a perfect-hash join (a direct-address
  table over ``[min, max]`` of unique dense integer keys) and "hash" + partitioned the radix-
  partitioned hash join with L2-sized partitions. Run-time guards keep the answer right when the
  estimates were wrong: a planned nested loop over more than ``NESTED_LOOP_GUARD_PAIRS`` actual
  pairs, or a direct join whose build keys turn out not unique and dense, runs as a hash join
  (the note says so);
* every other join (outer, semi, anti: the planner does not reorder them): the run-time rule.

Partitioned joins split heavy-hitter probe keys off (``physical/skew.py``).
"""
from __future__ import annotations

import torch

from opforge.ops import hashing
from opforge.sql.column import Column
from opforge.sql.expr import Batch, evaluate
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.keys import join_keys, partition_bits, partition_of
from opforge.sql.physical.skew import heavy_keys, partitioned_pairs
from opforge.sql.plan import Join

NESTED_LOOP_MAX_PAIRS = 4096
NESTED_LOOP_GUARD_PAIRS = 1 << 22  # a planned nested loop above this many actual pairs hashes instead
HASH_BYTES_PER_ROW = 48
L2_BYTES = 50_000_000  # radix partitions of a planned partitioned hash join fit this (planner/cost.py)
DIRECT_MAX_RANGE_PER_ROW = 2.0  # as planner/physical_choice.py
DIRECT_MIN_RANGE = 1024  # tiny builds may spread a little wider
RADIX_MIN_BITS = 2  # join_algorithm="radix" uses at least 4 partitions


# ------------------------------------------------------------------------------------- algorithms
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
    li, pos = hashing.expand_runs(lo, counts)
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


def hash_pairs(bkey, pkey, bvalid=None, pvalid=None, how="inner", budget=None, ctx=None, bits=None,
               heavy=None):
    """``opforge.hash_join`` (build, probe) -> (build_index, probe_index), radix-partitioned when
    the build side's table exceeds ``budget`` bytes (or into ``2^bits`` parts when given). Order as
    the unpartitioned call: by probe row, then build row. ``heavy``: probe key values handled
    apart in the partitioned case (``physical/skew.py``)."""
    if bits is None:
        bits = partition_bits(len(bkey) * HASH_BYTES_PER_ROW, budget)
        why = f"build {len(bkey) * HASH_BYTES_PER_ROW} B > budget {budget} B"
    else:
        why = f"build {len(bkey) * HASH_BYTES_PER_ROW} B, L2-sized parts"
    if bits == 0:
        return hashing.hash_join(bkey, pkey, how=how, build_valid=bvalid, probe_valid=pvalid)
    bi, pi, report = partitioned_pairs(bkey, pkey, bvalid, pvalid, partition_of(bkey, bits),
                                       partition_of(pkey, bits), 1 << bits, how, heavy)
    if ctx is not None:
        ctx.note(f"radix-partitioned into {1 << bits} parts ({why}): {report.describe()}")
        if report.heavy:
            ctx.count("heavy_keys", len(report.heavy))
        ctx.metrics["max_partition_rows"] = max(report.loads, default=0)
        ctx.metrics["max_partition_rows_plain"] = max(report.plain_loads, default=0)
    return bi, pi


def direct_pairs(bkey, pkey, bvalid=None, pvalid=None, how="inner"):
    """Perfect hashing: a direct-address table ``slot[key - min] = build row`` over unique dense
    integer build keys; each probe reads one slot. -> (build_index, probe_index) as
    ``hashing.hash_join`` gives them (by probe row; -1 for an unmatched "left" probe row), or None
    when the build keys are not unique or too sparse (the caller hashes instead)."""
    dev = bkey.device
    rows = torch.arange(len(bkey), device=dev)
    kb = bkey.long()
    if bvalid is not None:
        rows, kb = rows[bvalid], kb[bvalid]
    pk = pkey.long()
    if kb.numel() == 0:
        lo, span = 0, 0
    else:
        lo, hi = (int(x) for x in torch.aminmax(kb))
        span = hi - lo + 1
        if span > max(DIRECT_MIN_RANGE, DIRECT_MAX_RANGE_PER_ROW * kb.numel()):
            return None
    slot = torch.full((max(span, 1),), -1, dtype=torch.int64, device=dev)
    if span:
        if int(torch.bincount(kb - lo, minlength=span).max()) > 1:
            return None  # duplicate build keys: not a perfect hash
        slot[kb - lo] = rows
    inside = (pk >= lo) & (pk < lo + span)
    if pvalid is not None:
        inside &= pvalid
    b = torch.where(inside, slot[torch.where(inside, pk - lo, 0)], -1)
    hit = b >= 0
    if how == "left":
        return b, torch.arange(len(pk), device=dev)
    keep = torch.nonzero(hit if how in ("inner", "semi") else ~hit).squeeze(1)
    return b[keep], keep


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
               presorted=False, budget=None, ctx=None, build="smaller", bits=None, heavy=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """All (left row, right row) with equal keys (inner pairs), NULL keys never matching.
    ``build``: the hash / direct table's side ("left", "right" or "smaller")."""
    if algorithm == "nested_loop":
        return nested_loop_pairs(lkey, rkey, lvalid, rvalid)
    if algorithm == "merge":
        return merge_pairs(lkey, rkey, lvalid, rvalid, presorted)
    right_builds = build == "right" or (build == "smaller" and len(rkey) <= len(lkey))
    if algorithm == "direct":
        got = direct_pairs(rkey, lkey, rvalid, lvalid) if right_builds else direct_pairs(lkey, rkey, lvalid, rvalid)
        if got is not None:
            return (got[1], got[0]) if right_builds else got
        if ctx is not None:
            ctx.note("direct join: build keys not unique and dense at run time: hash join instead")
    if right_builds:  # heavy keys are the left (probe) side's
        ri, li = hash_pairs(rkey, lkey, rvalid, lvalid, "inner", budget, ctx, bits, heavy)
    else:
        li, ri = hash_pairs(lkey, rkey, lvalid, rvalid, "inner", budget, ctx, bits)
    return li, ri


def pick_algorithm(node: Join, nl: int, nr: int, presorted: bool, ctx: ExecContext) -> tuple[str, str, str]:
    """(algorithm, build side, rule): the rules in the module docstring."""
    if ctx.join_algorithm != "auto":
        build = "right" if node.physical is not None else "smaller"
        return ctx.join_algorithm, build, f"join_algorithm={ctx.join_algorithm} (user override)"
    choice = node.physical
    if choice is not None and node.left_keys:
        algo = choice.algorithm
        rule = f"planner (physical_choice): {choice.describe()}"
        if algo == "nested_loop" and nl * nr > NESTED_LOOP_GUARD_PAIRS:
            return "hash", "right", rule + f"; actual {nl} x {nr} pairs > {NESTED_LOOP_GUARD_PAIRS}: hash instead"
        if algo == "hash" and choice.partitioned:
            algo = "radix"
        return algo, "right", rule
    return choose_algorithm(nl, nr, presorted), "smaller", "executor rule (join not planned)"


def _radix_bits(nb: int, ctx: ExecContext, forced: bool) -> int:
    """Partitions of a radix hash join: L2-sized (or budget-sized) tables; at least 4 when forced."""
    need = nb * HASH_BYTES_PER_ROW
    cap = L2_BYTES if ctx.memory_budget is None else min(L2_BYTES, ctx.memory_budget)
    bits = partition_bits(need, cap)
    return max(bits, RADIX_MIN_BITS) if forced else bits


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
    li = ri = None
    if node.left_keys:
        lcols = [evaluate(e, left) for e in node.left_keys]
        rcols = [evaluate(e, right) for e in node.right_keys]
        lk, rk, lvalid, rvalid = join_keys(lcols, rcols, dev)
        presorted = _is_sorted(lcols) and _is_sorted(rcols)
        if ctx.workers > 1 and kind in ("inner", "left", "semi", "anti") and not (kind == "anti" and node.null_aware):
            from opforge.sql.physical.distributed import distributed_pairs

            how = kind if node.residual is None and kind != "inner" else "inner"
            bi, pi, hash_keys = distributed_pairs(node, lk, rk, lvalid, rvalid, how, left, right, ctx)
            if how != "inner":
                direct = pi, bi
            else:
                li, ri = pi, bi
        else:
            hash_keys = frozenset()
            algo, build, rule = pick_algorithm(node, left.n, right.n, presorted, ctx)
            bits = _radix_bits(right.n if build != "left" else left.n, ctx, ctx.join_algorithm == "radix") \
                if algo == "radix" else None
            if algo == "merge" and not presorted:
                algo_name = "sort-merge join (sorts the right side)"
            else:
                algo_name = {"hash": "hash join", "merge": "merge join (inputs already sorted)",
                             "nested_loop": "nested-loop join", "direct": "perfect-hash (direct) join",
                             "radix": f"radix-partitioned hash join ({1 << (bits or 0)} parts)"}[algo]
            side = {"right": ", build=right", "left": ", build=left"}.get(build, "")
            ctx.note(f"{algo_name}{side}: {left.n} x {right.n} rows; rule: {rule}")
            heavy = None  # heavy probe (left) keys, for the partitioned joins only
            partitioned = bits or partition_bits(right.n * HASH_BYTES_PER_ROW, ctx.memory_budget)
            if ctx.skew_threshold is not None and partitioned:
                heavy = heavy_keys(lk, lvalid, ctx.skew_threshold, node.heavy_keys)
            hashed = algo in ("hash", "radix", "direct")
            if hashed and node.residual is None and kind in ("left", "semi", "anti") \
                    and not (kind == "anti" and node.null_aware):
                got = direct_pairs(rk, lk, rvalid, lvalid, kind) if algo == "direct" else None
                if algo == "direct" and got is None:
                    ctx.note("direct join: build keys not unique and dense at run time: hash join instead")
                ri, li = got if got is not None else \
                    hash_pairs(rk, lk, rvalid, lvalid, kind, ctx.memory_budget, ctx, bits, heavy)
                direct = li, ri
            elif hashed and node.residual is None and kind == "right":
                li, ri = hash_pairs(lk, rk, lvalid, rvalid, "left", ctx.memory_budget, ctx, bits)
                present = li >= 0
                cols = {k: _pad(c, li, present) for k, c in left.cols.items()}
                cols.update({k: c.take(ri) for k, c in right.cols.items()})
                return Batch(cols, len(ri), dev)
            else:
                li, ri = join_pairs(lk, rk, lvalid, rvalid, algorithm="hash" if algo == "radix" else algo,
                                    presorted=presorted, budget=ctx.memory_budget, ctx=ctx, build=build,
                                    bits=bits, heavy=heavy)
    else:
        hash_keys = frozenset()
        ctx.note(f"nested-loop join (no equi keys): {left.n} x {right.n} rows")
        li, ri = _cross_pairs(left.n, right.n, dev)
    out = _finish(node, left, right, li, ri, direct, ctx)
    out.hash_keys = hash_keys
    return out


def _finish(node: Join, left: Batch, right: Batch, li, ri, direct, ctx) -> Batch:
    """The output batch from the pairs (residual, semi / anti, outer padding)."""
    dev = left.device
    kind = node.kind
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
