"""The join operator: equi-joins by the registered algorithms (``physical/joins``: hash, radix,
direct, merge, nested loop), residual predicates, outer padding with NULLs, semi / anti, and a
nested loop for joins without equi keys.

Keys. ``keys.join_keys`` turns the key columns of both sides into one int key per side (one column:
its values in the common type; several: packed dense ids, exact) plus validity (NULL never matches).

Who chooses the algorithm (``pick_algorithm``, named in EXPLAIN ANALYZE's notes as ``rule: ...``):
* ``connect(join_algorithm=...)`` other than "auto": the user's override, for every equi-join;
* a join the planner built (``Join.physical``, from ``planner/physical_choice.py``): its algorithm
  (``joins.for_choice``) with the right input as the build side. Run-time guards keep the answer
  right when the estimates were wrong: a planned algorithm whose ``planned_guard`` objects to the
  actual sizes (a nested loop over more than ``NESTED_LOOP_GUARD_PAIRS`` pairs) runs as a hash
  join, and a direct join whose build keys turn out not unique and dense hashes (the note says so);
* every other join (outer, semi, anti: the planner does not reorder them): the run-time rule
  ``joins.unplanned`` (nested loop for tiny inputs, merge when both keys are sorted, else hash),
  the smaller side building.

Algorithms that probe outer joins themselves (``probes_outer``: hash, radix, direct) answer left /
semi / anti joins without a residual with the preserved side probing (they come out of the kernel
directly as ``how="left" / "semi" / "anti"``), and right joins through the hash kernel.

Memory budget: a hash build side needs about ``HASH_BYTES_PER_ROW`` bytes per row; past the budget
the hash join radix-partitions (``joins/hash.py``), and partitioned joins split heavy-hitter probe
keys off (``physical/skew.py``). ``connect(workers=N)`` runs the equi-joins over simulated workers
(``physical/simulated_workers.py``).
"""
from __future__ import annotations

import torch

from opforge.sql.column import Column
from opforge.sql.expr import Batch, evaluate
from opforge.sql.physical import joins
from opforge.sql.physical.context import ExecContext
from opforge.sql.physical.joins.base import HASH_BYTES_PER_ROW, JoinRun
from opforge.sql.physical.joins.hash import hash_pairs
from opforge.sql.physical.joins.nested_loop import cross_pairs
from opforge.sql.physical.keys import join_keys, partition_bits
from opforge.sql.physical.skew import heavy_keys
from opforge.sql.plan import Join


def choose_algorithm(nl: int, nr: int, presorted: bool, forced: str = "auto") -> str:
    """The run-time rule for unplanned joins (``joins.unplanned``), unless ``forced``."""
    if forced != "auto":
        return forced
    return joins.unplanned(nl, nr, presorted).name


def join_pairs(lkey: torch.Tensor, rkey: torch.Tensor, lvalid=None, rvalid=None, *, algorithm="hash",
               presorted=False, budget=None, ctx=None, build="smaller", bits=None, heavy=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """All (left row, right row) with equal keys (inner pairs), NULL keys never matching, by the
    registered ``algorithm``. ``build``: the hash / direct table's side ("left", "right" or
    "smaller")."""
    run = JoinRun(presorted, build, budget, ctx, bits, heavy)
    return joins.get(algorithm).pairs(lkey, rkey, lvalid, rvalid, run)


def pick_algorithm(node: Join, nl: int, nr: int, presorted: bool, ctx: ExecContext) -> tuple[str, str, str]:
    """(algorithm name, build side, rule): the rules in the module docstring."""
    if ctx.join_algorithm != "auto":
        build = "right" if node.physical is not None else "smaller"
        return ctx.join_algorithm, build, f"join_algorithm={ctx.join_algorithm} (user override)"
    choice = node.physical
    if choice is not None and node.left_keys:
        algo = joins.for_choice(choice.algorithm, choice.partitioned)
        rule = f"planner (physical_choice): {choice.describe()}"
        why = algo.planned_guard(nl, nr)
        if why is not None:
            return "hash", "right", rule + f"; {why}: hash instead"
        return algo.name, "right", rule
    return choose_algorithm(nl, nr, presorted), "smaller", "executor rule (join not planned)"


def _pad(col: Column, idx: torch.Tensor, present: torch.Tensor) -> Column:
    """Gather with NULL where `present` is False (outer-join padding)."""
    safe = torch.where(present, idx, torch.zeros_like(idx))
    if len(col) == 0:
        vals = col.values.new_zeros((len(idx),) + tuple(col.values.shape[1:]))  # [n, 2]: 128-bit DECIMALs
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
            from opforge.sql.physical.simulated_workers import distributed_pairs

            how = kind if node.residual is None and kind != "inner" else "inner"
            bi, pi, hash_keys = distributed_pairs(node, lk, rk, lvalid, rvalid, how, left, right, ctx)
            if how != "inner":
                direct = pi, bi
            else:
                li, ri = pi, bi
        else:
            hash_keys = frozenset()
            name, build, rule = pick_algorithm(node, left.n, right.n, presorted, ctx)
            algo = joins.get(name)
            bits = algo.partitions(right.n if build != "left" else left.n, ctx, ctx.join_algorithm == name)
            side = {"right": ", build=right", "left": ", build=left"}.get(build, "")
            ctx.note(f"{algo.label(presorted, bits)}{side}: {left.n} x {right.n} rows; rule: {rule}")
            heavy = None  # heavy probe (left) keys, for the partitioned joins only
            partitioned = bits or partition_bits(right.n * HASH_BYTES_PER_ROW, ctx.memory_budget)
            if ctx.skew_threshold is not None and partitioned:
                heavy = heavy_keys(lk, lvalid, ctx.skew_threshold, node.heavy_keys)
            run = JoinRun(presorted, build, ctx.memory_budget, ctx, bits, heavy)
            if algo.probes_outer and node.residual is None and kind in ("left", "semi", "anti") \
                    and not (kind == "anti" and node.null_aware):
                ri, li = algo.probe(rk, lk, rvalid, lvalid, kind, run)
                direct = li, ri
            elif algo.probes_outer and node.residual is None and kind == "right":
                li, ri = hash_pairs(lk, rk, lvalid, rvalid, "left", ctx.memory_budget, ctx, bits)
                present = li >= 0
                cols = {k: _pad(c, li, present) for k, c in left.cols.items()}
                cols.update({k: c.take(ri) for k, c in right.cols.items()})
                return Batch(cols, len(ri), dev)
            else:
                li, ri = algo.pairs(lk, rk, lvalid, rvalid, run)
    else:
        hash_keys = frozenset()
        ctx.note(f"nested-loop join (no equi keys): {left.n} x {right.n} rows")
        li, ri = cross_pairs(left.n, right.n, dev)
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
