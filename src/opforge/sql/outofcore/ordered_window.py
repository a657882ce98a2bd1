"""Window functions without PARTITION BY over more rows than the device limit.

The whole input is one partition, so it cannot be split by hash (``grace``); instead it is
externally sorted by the window's ORDER BY (``external_sort.sorted_chunks``) and computed segment
by segment in that order. Segments end at a peer-group boundary (a change of the ORDER BY key),
so ties never straddle two segments. What a segment needs from outside itself is carried:

* row_number / rank / dense_rank: computed on the segment, plus the rows (peer groups) before it;
  percent_rank, cume_dist and ntile from those and the total rows (known once the input is sorted);
* running aggregates (count, sum, min, max from UNBOUNDED PRECEDING to CURRENT ROW, ROWS or
  RANGE): computed on the segment, then combined with the previous segments' total;
* lag / lead with a constant offset and ROWS frames with constant bounds (any function of the
  frame): computed on the segment with the last ``preceding`` rows before it and the next
  ``following`` rows after it around it, only the segment's own rows kept.

Anything else (RANGE / GROUPS frames with offsets, UNBOUNDED FOLLOWING, IGNORE NULLS, an aggregate over the whole input) needs rows without a bound:
``unstreamable`` names why, and the executor then takes the input whole (EXPLAIN ANALYZE says so)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch

from opforge.sql import plan as P
from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import SqlError
from opforge.sql.expr import Batch, Lit, evaluate
from opforge.sql.outofcore.grace import concat
from opforge.sql.profile import batch_bytes
from opforge.sql.physical.window_functions import _narrowed, _starts, ntile, run_window_functions

RANKS = ("row_number", "rank", "dense_rank")
# relative ranks: computed from a rank of the segment (the call it stands for) and the total rows
RELATIVE = {"percent_rank": "rank", "cume_dist": "count_star", "ntile": "row_number"}
_PEERS = P.Frame("range", P.FrameBound("unbounded_preceding"), P.FrameBound("current"))
RUNNING = ("count", "count_star", "sum", "min", "max")
BOUNDS = ("preceding", "current", "following")


@dataclasses.dataclass
class Shape:
    """How each call of a window streams: ``carried`` (ranks, running aggregates) are computed on a
    segment alone; ``framed`` (lag / lead, bounded ROWS frames) with ``preceding`` rows before and
    ``following`` rows after it."""
    carried: list
    framed: list
    relative: list = dataclasses.field(default_factory=list)  # (output, call) of RELATIVE functions
    preceding: int = 0
    following: int = 0


def _constant(e) -> int | None:
    if isinstance(e, Lit) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


def _non_negative(e) -> bool:
    v = _constant(e)
    return v is not None and v >= 0


def shape(node) -> Shape | str:
    """The window's Shape, or why it cannot stream."""
    if not isinstance(node, P.WindowFunctions):
        return "an aggregate over the whole input (OVER () without ORDER BY)"
    if node.partition or not node.order:
        return "no ORDER BY" if not node.order else "PARTITION BY"
    s = Shape([], [])
    for o, call in node.calls:
        f = call.frame
        if call.func in RANKS:
            s.carried.append((o, call))
        elif call.func in RELATIVE:  # the segment's rank, row number or end of the peer group
            stand_in = P.WindowCall(RELATIVE[call.func], [], T.INT64, _PEERS)
            s.carried.append((dataclasses.replace(o, type=T.INT64), stand_in))
            s.relative.append((o, call))
        elif call.func in ("lag", "lead") and not call.ignore_nulls and _constant(call.args[1]) is not None:
            off = abs(_constant(call.args[1]))
            s.framed.append((o, call))
            s.preceding, s.following = max(s.preceding, off), max(s.following, off)
        elif call.func in RUNNING and f is not None and f.start.kind == "unbounded_preceding" \
                and f.end.kind == "current" and (call.func == "sum" or not o.type.wide) \
                and (call.func in ("count", "count_star") or o.type.is_numeric):
            s.carried.append((o, call))
        elif f is not None and f.unit == "rows" and not call.ignore_nulls and call.func not in ("fill",) \
                and f.start.kind in BOUNDS and f.end.kind in BOUNDS \
                and all(b.kind == "current" or _non_negative(b.offset) for b in (f.start, f.end)):
            s.framed.append((o, call))
            for b in (f.start, f.end):
                if b.kind == "preceding":
                    s.preceding = max(s.preceding, _constant(b.offset))
                elif b.kind == "following":
                    s.following = max(s.following, _constant(b.offset))
        else:
            frame = f" {f}" if f is not None else ""
            nulls = " IGNORE NULLS" if call.ignore_nulls else ""
            return f"{call.func}{nulls}{frame} reads rows without a bound"
    return s


def unstreamable(node) -> str | None:
    s = shape(node)
    return s if isinstance(s, str) else None


def stream(node: P.WindowFunctions, ordered: Iterable[Batch], segment_bytes: int, counts: dict) -> Iterator[Batch]:
    """The window's output over ``ordered`` (its input in ORDER BY order), segment by segment
    (at least one batch), a segment of about ``segment_bytes`` (a sort's blocks are small, and each
    segment costs kernel launches); ``counts`` gets segments."""
    s = shape(node)
    carried = dataclasses.replace(node, calls=s.carried)
    framed = dataclasses.replace(node, calls=s.framed)
    carry = _Carry()
    before: Batch | None = None  # the last ``preceding`` rows before the pending ones
    pending: Batch | None = None
    it = iter(ordered)
    done = False
    while not done:
        b = next(it, None)
        if b is None:
            done = True
        elif b.n == 0:
            pending = b if pending is None else pending
            continue
        else:
            pending = b if pending is None or pending.n == 0 else concat([pending, b])
        if pending is None or (not done and batch_bytes(pending) < segment_bytes):
            continue
        starts = _starts([_narrowed(evaluate(e, pending)) for e, _, _ in node.order], pending.n, pending.device)
        if done:
            cut = pending.n
        else:
            # the segment ends where a peer group starts (the last group may go on) with at least
            # ``following`` rows after it
            groups = torch.nonzero(starts[: max(0, pending.n - s.following + 1)]).flatten()
            cut = int(groups[-1]) if len(groups) else 0
            if cut == 0:
                continue
        idx = torch.arange(pending.n, device=pending.device)
        seg = pending.take(idx[:cut])
        after = pending.take(idx[cut:cut + s.following])
        out = dict(seg.cols)
        if s.carried:
            got = run_window_functions(carried, seg)
            for o, call in s.carried:
                out[o.cid] = carry.apply(o, call, got.cols[o.cid])
            for o, call in s.relative:  # its stand-in's column (same cid) -> the function's
                out[o.cid] = _relative(call, out[o.cid].values, counts.get("rows", 0), seg)
        if s.framed:
            around = [x for x in (before, seg, after) if x is not None and x.n]
            got = run_window_functions(framed, concat(around) if around else seg)
            lo = before.n if before is not None else 0
            keep = torch.arange(lo, lo + seg.n, device=seg.device)
            for o, _ in s.framed:
                out[o.cid] = got.cols[o.cid].take(keep)
        carry.rows += seg.n
        carry.groups += int(starts[:cut].sum())
        if s.preceding:
            seen = seg if before is None else concat([before, seg])
            before = seen.take(torch.arange(max(0, seen.n - s.preceding), seen.n, device=seen.device))
        counts["segments"] = counts.get("segments", 0) + 1
        pending = pending.take(idx[cut:])
        if seg.n or counts["segments"] == 1:
            yield Batch(out, seg.n, seg.device)


def _relative(call: P.WindowCall, at: torch.Tensor, total: int, seg: Batch) -> Column:
    """percent_rank from the rank, cume_dist from the end of the peer group, ntile from the row
    number, each over all rows (``total``), as ``window_functions._ranking`` computes them."""
    if call.func == "percent_rank":
        return Column((at - 1).double() / max(total - 1, 1), None, T.FLOAT64)
    if call.func == "cume_dist":
        return Column(at.double() / max(total, 1), None, T.FLOAT64)
    return ntile(at - 1, torch.full_like(at, total), evaluate(call.args[0], seg))


@dataclasses.dataclass
class _Carry:
    """What the segments before the current one leave to it: rows, peer groups and each running
    aggregate's total (None: NULL, no value yet)."""
    rows: int = 0
    groups: int = 0
    totals: dict = dataclasses.field(default_factory=dict)

    def apply(self, o, call, col: Column) -> Column:
        """``col`` (computed on the segment alone) as over all rows so far."""
        if call.func in ("row_number", "rank") or (call.func == "count_star" and call.frame is _PEERS):
            return Column(col.values + self.rows, col.valid, col.type)
        if call.func == "dense_rank":
            return Column(col.values + self.groups, col.valid, col.type)
        total = self.totals.get(o.cid)
        if total is not None and col.values.numel():
            v, valid = col.values, col.valid_mask()
            t = torch.as_tensor(total, dtype=v.dtype, device=v.device)
            if o.type.wide:  # 128-bit sums: [n, 2] words (``decimal128``)
                t = t.expand_as(v)
                joined, overflow = decimal128.add(v, t)
                if bool((overflow & valid).any()):
                    raise SqlError(f"{call}: the running sum overflows {o.type}")
                valid = valid[:, None]
            elif call.func in ("count", "count_star", "sum"):
                joined = v + t
            else:
                joined = torch.minimum(v, t) if call.func == "min" else torch.maximum(v, t)
            col = Column(torch.where(valid, joined, t), None, col.type)
        if col.values.numel():
            last = col.values[-1]
            self.totals[o.cid] = last.clone() if bool(col.valid_mask()[-1]) else total
        return col
