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
  ``following`` rows after it around it, only the segment's own rows kept;
* RANGE frames with constant offsets (``RANGE BETWEEN 5 PRECEDING AND 2.5 FOLLOWING`` over the one
  numeric ORDER BY key): the same, the rows around the segment chosen by key instead of by count:
  before it those within the largest PRECEDING offset of its last key, after it those within the
  largest FOLLOWING offset of its last key; a segment ends only where the rows read so far reach
  past that key (NULL keys are one peer group: their frame is themselves).

Anything else (GROUPS frames with offsets, offsets read from the row, UNBOUNDED FOLLOWING, IGNORE
NULLS, an aggregate over the whole input) needs rows without a bound:
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
from opforge.sql.expr import Batch, Lit, cast_values, evaluate
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
    range_preceding: list = dataclasses.field(default_factory=list)  # RANGE offsets (constant Lits)
    range_following: list = dataclasses.field(default_factory=list)


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
        elif f is not None and f.unit == "range" and not call.ignore_nulls and call.func not in ("fill",) \
                and f.start.kind in BOUNDS and f.end.kind in BOUNDS \
                and all(b.kind == "current" or _constant_offset(b.offset) for b in (f.start, f.end)):
            s.framed.append((o, call))
            for b in (f.start, f.end):
                if b.kind != "current":
                    (s.range_preceding if b.kind == "preceding" else s.range_following).append(b.offset)
        else:
            frame = f" {f}" if f is not None else ""
            nulls = " IGNORE NULLS" if call.ignore_nulls else ""
            return f"{call.func}{nulls}{frame} reads rows without a bound"
    return s


def _constant_offset(e) -> bool:
    """A RANGE offset the same for every row (a number: its sign is checked where it is used)."""
    return isinstance(e, Lit) and e.value is not None and e.type.is_numeric and e.type.kind != "BOOL"


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
    by_key = _KeyReach(node, s) if s.range_preceding or s.range_following else None
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
        key = by_key.key(pending) if by_key is not None and pending.n else None
        if done:
            cut = pending.n
        else:
            # the segment ends where a peer group starts (the last group may go on) with at least
            # ``following`` rows after it (and the rows read reaching past its RANGE frames)
            can_end = starts[: max(0, pending.n - s.following + 1)].clone()
            if key is not None:
                can_end &= by_key.read_past(key, can_end.numel())
            groups = torch.nonzero(can_end).flatten()
            cut = int(groups[-1]) if len(groups) else 0
            if cut == 0:
                continue
        idx = torch.arange(pending.n, device=pending.device)
        seg = pending.take(idx[:cut])
        following = s.following if key is None else max(s.following, by_key.after(key, cut))
        after = pending.take(idx[cut:cut + following])
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
        if s.preceding or key is not None:
            seen = seg if before is None else concat([before, seg])
            keep = s.preceding if key is None else max(s.preceding, by_key.before(seen))
            before = seen.take(torch.arange(max(0, seen.n - keep), seen.n, device=seen.device))
        counts["segments"] = counts.get("segments", 0) + 1
        pending = pending.take(idx[cut:])
        if seg.n or counts["segments"] == 1:
            yield Batch(out, seg.n, seg.device)


class _KeyReach:
    """Which rows RANGE frames with offsets reach, by the one ORDER BY key: as ``window_functions``
    searches them, the key as float64, negated when DESC (so frames always look up the values),
    a frame's bounds the key minus the PRECEDING offset and plus the FOLLOWING one. The offsets are
    constants, read at the first batch; a negative one is refused when the frames are computed."""

    def __init__(self, node: P.WindowFunctions, s: Shape):
        self.expr, self.desc, self.nulls_first = node.order[0]
        self.offsets = (s.range_preceding, s.range_following)
        self.reach: tuple[float, float] | None = None  # the largest PRECEDING, FOLLOWING offsets

    def key(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's keys (ascending among the non-NULL ones) and which are not NULL."""
        col = evaluate(self.expr, b)
        w = cast_values(col, T.FLOAT64).double()
        if self.reach is None:
            self.reach = tuple(max([0.0] + [float(cast_values(evaluate(e, b), T.FLOAT64).double().reshape(-1)[0])
                                            for e in offs]) for offs in self.offsets)
        return (-w if self.desc else w), col.valid_mask()

    def read_past(self, key, n: int) -> torch.Tensor:
        """Per candidate end ``c`` < n: whether the rows read include every row the frames of rows
        before ``c`` reach: a row past the FOLLOWING bound of row c - 1, or NULL keys after the
        non-NULL ones (NULLS LAST: no key comes after them). Row c - 1 with a NULL key reaches its
        peers only."""
        w, valid = key
        ok = torch.zeros(n, dtype=torch.bool, device=w.device)
        if n <= 1:
            return ok
        keyed = torch.nonzero(valid).flatten()
        if not len(keyed) or (not self.nulls_first and not bool(valid[-1])):  # every key read
            ok[1:] = True
            return ok
        ok[1:] = ~valid[: n - 1] | (w[: n - 1] + self.reach[1] < w[int(keyed[-1])])
        return ok

    def after(self, key, cut: int) -> int:
        """How many rows from ``cut`` on the frames of the segment's rows reach."""
        w, valid = key
        if cut == 0 or not bool(valid[cut - 1]):
            return 0
        return int((valid[cut:] & (w[cut:] <= w[cut - 1] + self.reach[1])).sum())

    def before(self, seen: Batch) -> int:
        """How many of the last rows of ``seen`` the frames of later rows reach (their keys are at
        least its last one's)."""
        w, valid = self.key(seen)
        if not seen.n or not bool(valid[-1]):
            return 0
        return int((valid & (w >= w[-1] - self.reach[0])).sum())


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
