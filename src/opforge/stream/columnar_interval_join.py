"""The columnar interval join: Flink's ``IntervalJoinOperator`` on whole
micro-batches (``a.key_by(k).interval_join(b.key_by(k)).between(lo, hi)
.process(fn)`` with a ``@vectorized`` ``fn``).

**The vectorized process-join function.** ``fn(left, right)`` gets two
``Batch`` es of equal length: row ``i`` of each is one pair, each with its
own record's timestamp (``left.timestamps``, ``right.timestamps``). It
returns one output row per pair (a ``Batch``, a mapping of columns or one
tensor), or columns plus ``"__row__"`` (the pair each output row comes from)
for any number of outputs per pair, as a vectorized flat_map. An output's
time is its pair's: the later of the two timestamps. (Side outputs of the
pair function are a record-path feature.)

**State.** Each input's buffered rows, as columns sorted by (key, event
time, arrival). Per row, a ``death`` watermark: the record path registers a
timer at ``ts + max(bound, 0)`` (``upper`` on the left, ``-lower`` on the
right) that drops the row's timestamp bucket when the watermark reaches it;
a timer registered at the current watermark fires at the next advance, so a
row is gone once event time is at least ``max(ts + max(bound, 0),
watermark when it came + 1)``.

**One run of one input** (the engine feeds a two-input operator runs of one
input, records with the watermark each saw): record ``i`` with watermark
``w_i`` is late when ``ts_i < w_i`` (dropped or sent to its side output);
else it pairs with the other input's rows of its key with a time in
``[ts_i + lo, ts_i + hi]`` still alive at ``w_i`` (``searchsorted`` on (key,
time), ``repeat_interleave`` to make the pairs), then joins its own input's
buffer. The other input does not change within the run, save for rows dying,
hence the per-pair ``death > w_i`` test.

**Order.** The record form's: the arriving records in order, each with the
other input's timestamp buckets in the order they were made (a bucket is
made by the first row of its (key, time) and lives until all its rows die
together), rows of a bucket in arrival order. Flink promises only the first
(its buckets are a hash map); keeping both makes outputs comparable row
for row with the record form at every batch size.

**Both inputs at once.** With record-granularity watermarks the engine
holds a source poll's batches of both inputs and hands them over whole
(``process_merged``), with the order the record path meets their rows in:
each row pairs with the other input's rows that came before it (``seq``),
so a poll is one pass of tensor ops however finely the inputs interleave.

State is checkpointed through ``snapshot_state`` / ``restore_state`` (no
pickle) and rescaled by key groups (``rescale_state``). A state budget
(``env.set_state_budget``) is not applied here: the buffers hold only the
rows that the watermark still lets the other input match.
"""

from __future__ import annotations

import torch

from opforge.ops.hashing import expand_runs
from opforge.ops.scan import cummax
from opforge.stream.columnar_join import Rows, _TwoInputs
from opforge.stream.functions import as_callable, batch_result
from opforge.stream.operators import Operator
from opforge.stream.partitioning import key_group_targets
from opforge.stream.records import NO_TIMESTAMP, Batch

_INT62 = 2**62


def interval_pairs(fn, left: Batch, right: Batch, where: str) -> Batch:
    """The vectorized process-join function on aligned pair batches, as an
    output batch timed like the pairs (the later of the two timestamps)."""
    when = torch.maximum(left.timestamps, right.timestamps)
    like = Batch({}, when, None)
    res = fn(left, right)
    if isinstance(res, dict) and "__row__" in res:
        res = dict(res)
        rows = torch.as_tensor(res.pop("__row__"), dtype=torch.int64, device=when.device)
        res["__timestamp__"] = when.index_select(0, rows)
        return batch_result(res, like, where, same_length=False).with_keys(None)
    return batch_result(res, like, where, same_length=True).with_keys(None)


class Buffer:
    """One input's buffered rows sorted by (key, ts, seq), with each row's death watermark."""

    def __init__(self, rows: Rows, death: torch.Tensor):
        self.rows, self.death = rows, death

    def __len__(self) -> int:
        return len(self.rows)

    @staticmethod
    def empty(device) -> "Buffer":
        return Buffer(Rows.empty(device), torch.empty(0, dtype=torch.int64, device=device))

    def take(self, idx: torch.Tensor) -> "Buffer":
        return Buffer(self.rows.take(idx), self.death.index_select(0, idx))

    @staticmethod
    def sorted_of(rows: Rows, death: torch.Tensor) -> "Buffer":
        """Rows in any order, sorted by (key, ts, seq)."""
        order = torch.argsort(rows.seq)
        order = order.index_select(0, torch.argsort(rows.ts.index_select(0, order), stable=True))
        order = order.index_select(0, torch.argsort(rows.key.index_select(0, order), stable=True))
        return Buffer(rows.take(order), death.index_select(0, order))

    def added(self, rows: Rows, death: torch.Tensor) -> "Buffer":
        """With ``rows`` (later arrivals, in arrival order), sorted again: stable
        sorts keep (key, ts) ties in arrival order (one sort of packed (key,
        ts) codes when they fit an int64, else two)."""
        both = Rows.concat([self.rows, rows]) if len(self) else rows
        death = torch.cat([self.death, death]) if len(self) else death
        packing = _packing(both.key, both.ts)
        if packing is not None:
            kmin, _, tmin, span = packing
            order = torch.argsort((both.key - kmin) * span + (both.ts - tmin), stable=True)
        else:
            order = torch.argsort(both.ts, stable=True)
            order = order.index_select(0, torch.argsort(both.key.index_select(0, order), stable=True))
        return Buffer(both.take(order), death.index_select(0, order))

    def alive(self, watermark: int) -> "Buffer":
        if len(self) == 0:
            return self
        keep = torch.nonzero(self.death > watermark).flatten()
        return self if keep.shape[0] == len(self) else self.take(keep)

    def ranges(self, key: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        """Per probe: ``(start, count)`` of the rows with its key and ``lo <= ts <= hi``:
        ``searchsorted`` on (key, ts) packed into int64 codes (by key value, else
        by key rank, else a binary search on the pairs)."""
        bk, bt = self.rows.key, self.rows.ts
        packing = _packing(bk, bt)
        if packing is not None:
            kmin, kmax, tmin, span = packing
            near = key.clamp(kmin, kmax)
            return _packed_ranges((bk - kmin) * span + (bt - tmin), (near - kmin) * span, near == key,
                                  lo - tmin, hi - tmin, span)
        n = bk.shape[0]
        change = torch.ones(n, dtype=torch.bool, device=bk.device)
        change[1:] = bk[1:] != bk[:-1]
        rank = torch.cumsum(change, 0) - 1
        groups, tmin, tmax = torch.stack([rank[-1] + 1, bt.min(), bt.max()]).tolist()
        span = tmax - tmin + 1
        if groups * span + span >= _INT62:  # (key rank, ts) does not pack into one int64
            return _lex_ranges(bk, bt, key, lo, hi)
        uniq = bk[change]
        at = torch.searchsorted(uniq, key).clamp(max=groups - 1)
        return _packed_ranges(rank * span + (bt - tmin), at * span, uniq.index_select(0, at) == key,
                              lo - tmin, hi - tmin, span)


def _packing(key: torch.Tensor, ts: torch.Tensor):
    """``(kmin, kmax, tmin, span)`` when ``(key - kmin) * span + (ts - tmin)``
    fits an int64 (an order-preserving code of (key, ts)), else None. One host sync."""
    kmin, kmax, tmin, tmax = torch.stack([key.min(), key.max(), ts.min(), ts.max()]).tolist()
    span = tmax - tmin + 1
    return (kmin, kmax, tmin, span) if (kmax - kmin + 1) * span + span < _INT62 else None


def _packed_ranges(packed, base, found, lo, hi, span):
    """``Buffer.ranges`` on sorted codes ``packed``; per probe its key's code
    ``base`` (valid where ``found``) and its time range relative to the codes' origin."""
    start = torch.searchsorted(packed, base + lo.clamp(0, span), right=False)
    count = (torch.searchsorted(packed, base + hi.clamp(-1, span - 1), right=True) - start).clamp(min=0)
    return start, torch.where(found, count, torch.zeros_like(count))


def _lex_ranges(bk, bt, key, lo, hi):
    """``Buffer.ranges`` by a vectorized binary search on (key, ts) pairs (any value ranges)."""

    def bound(qt, right: bool):
        first = torch.zeros_like(key)
        size = torch.full_like(key, bk.shape[0])
        while True:  # lower / upper bound: the first row not before (key, qt)
            if not bool((size > 0).any()):
                return first
            half = size // 2
            mid = (first + half).clamp(max=bk.shape[0] - 1)
            mk, mt = bk.index_select(0, mid), bt.index_select(0, mid)
            before = (mk < key) | ((mk == key) & ((mt <= qt) if right else (mt < qt)))
            before &= size > 0
            first = torch.where(before, mid + 1, first)
            size = torch.where(before, size - half - 1, half)

    start = bound(lo, False)
    return start, (bound(hi, True) - start).clamp(min=0)


class IntervalJoinOperator(_TwoInputs):
    """``IntervalJoinFunction`` (bounds already inclusive) on whole batches."""

    record_watermarks = True

    def __init__(self, name, lower: int, upper: int, function, key_selector, late_tags=(None, None)):
        Operator.__init__(self, name)  # (not _TwoInputs': the function's method is process_element)
        self.function, self.key_selector, self.flat = function, key_selector, False
        self.fn = as_callable(function, "process_element", name)
        self.lower, self.upper, self.late_tags = lower, upper, late_tags

    def open(self):
        super().open()
        self.buffers = [Buffer.empty(self.device), Buffer.empty(self.device)]

    def _bounds(self, side: int) -> tuple[int, int, int]:
        """``(lo, hi, keep)``: the other input's time range around a row of
        ``side``, and how long past its time the row is kept."""
        if side == 0:
            return self.lower, self.upper, max(self.upper, 0)
        return -self.upper, -self.lower, max(-self.lower, 0)

    def process_input(self, batch, input_index):
        if len(batch) == 0:
            return
        rows = self._rows(batch, input_index)
        seen = batch.watermarks if batch.watermarks is not None else \
            torch.full((len(batch),), self.watermark, dtype=torch.int64, device=rows.ts.device)
        arrivals = [None, None]
        arrivals[input_index] = (rows, seen.clamp(min=self.watermark))
        self._arrive(arrivals)

    def process_merged(self, parts: list, order: torch.Tensor, watermarks: torch.Tensor) -> None:
        """Every batch held over a source poll at once (``executor._Runner.flush``),
        instead of its runs one input at a time: ``parts`` ``[(batch, input
        index)]``; ``order``: the rows of their concatenation in the order the
        record path meets them; ``watermarks``: the one each sees, in that order."""
        n = order.shape[0]
        at = torch.empty_like(order)
        at[order] = torch.arange(n, device=order.device)  # each concatenated row's place in the order
        seen = watermarks.index_select(0, at).clamp(min=self.watermark)
        by_side: list = [[], []]
        lo = 0
        for batch, side in parts:
            if self.schemas[side] is None:
                self.schemas[side] = batch.schema
            rows = Rows.of(batch, 0)
            rows.seq = at[lo:lo + len(batch)] + self.next_seq
            by_side[side].append((rows, seen[lo:lo + len(batch)]))
            lo += len(batch)
        self.next_seq += n
        arrivals = [None, None]
        for side, got in enumerate(by_side):
            if got:
                rows = Rows.concat([r for r, _ in got])
                w = torch.cat([w for _, w in got])
                by_seq = torch.argsort(rows.seq)
                arrivals[side] = (rows.take(by_seq), w.index_select(0, by_seq))
        self._arrive(arrivals)

    def _arrive(self, arrivals: list) -> None:
        """``arrivals[side]``: ``(rows, watermark each saw)`` in arrival order, or None.
        Late rows go; the others join their input's buffer and pair with the
        other input's rows that came before them and are alive when they come."""
        sides = [a for a in arrivals if a is not None]
        checks = torch.stack([torch.stack([(r.ts == NO_TIMESTAMP).sum(), (r.ts < w).sum(), w.max()])
                              for r, w in sides]).tolist()
        if any(c[0] for c in checks):
            raise ValueError(f"{self.name}: a record has no timestamp; joins run in event time (give the "
                             "sources a WatermarkStrategy with a timestamp assigner)")
        last_wm = max(c[2] for c in checks)
        late_of = iter(c[1] for c in checks)
        for side, got in enumerate(arrivals):
            if got is None:
                continue
            rows, seen = got
            if next(late_of):
                late = rows.ts < seen
                tag = self.late_tags[side]
                if tag is not None:
                    gone = rows.take(torch.nonzero(late).flatten())
                    self.out.emit_side(tag, gone.batch(gone.ts, self.schemas[side]))
                on_time = torch.nonzero(~late).flatten()
                rows, seen = rows.take(on_time), seen.index_select(0, on_time)
            arrivals[side] = (rows, seen) if len(rows) else None
        for side, got in enumerate(arrivals):
            if got is not None:
                rows, seen = got
                death = torch.maximum(rows.ts + self._bounds(side)[2], seen + 1)
                self.buffers[side] = self.buffers[side].added(rows, death)
        pairs = [self._probe(side, *got) for side, got in enumerate(arrivals) if got is not None]
        pairs = [p for p in pairs if p is not None]
        if pairs:
            self._emit(pairs)
        if last_wm > self.watermark:
            self._advance(last_wm)

    def _probe(self, side: int, rows: Rows, seen: torch.Tensor):
        """``(probe seq, left rows, right rows)`` of ``rows``' pairs, in the record path's order."""
        other = self.buffers[1 - side]
        if len(other) == 0:
            return None
        lo, hi, _ = self._bounds(side)
        start, count = other.ranges(rows.key, rows.ts + lo, rows.ts + hi)
        probe, pos = expand_runs(start, count)
        if probe.numel() == 0:
            return None
        # the other input's rows that came before and are alive when the probe comes
        ok = (other.death.index_select(0, pos) > seen.index_select(0, probe)) & \
            (other.rows.seq.index_select(0, pos) < rows.seq.index_select(0, probe))
        kept = torch.nonzero(ok).flatten()
        if kept.shape[0] != probe.shape[0]:
            probe, pos = probe.index_select(0, kept), pos.index_select(0, kept)
            if probe.numel() == 0:
                return None
        probe, pos = _bucket_order(probe, pos, other.rows)
        mine, theirs = rows.take(probe), other.rows.take(pos)
        return (mine.seq,) + ((mine, theirs) if side == 0 else (theirs, mine))

    def _emit(self, pairs: list) -> None:
        if len(pairs) == 1:
            _, left, right = pairs[0]
        else:  # both inputs probed: their pairs in the order of the probing records
            order = torch.argsort(torch.cat([p[0] for p in pairs]), stable=True)
            left = Rows.concat([p[1] for p in pairs]).take(order)
            right = Rows.concat([p[2] for p in pairs]).take(order)
        out = interval_pairs(self.fn, left.batch(left.ts, self.schemas[0]), right.batch(right.ts, self.schemas[1]),
                             self.name)
        if len(out):
            self.out.emit(out)

    def _advance(self, watermark: int) -> None:
        self.watermark = watermark
        self.buffers = [b.alive(watermark) for b in self.buffers]

    def on_watermark(self, watermark):
        if watermark > self.watermark:
            self._advance(watermark)
        self.out.emit_watermark(watermark)

    # -- checkpoints ------------------------------------------------------------------
    def snapshot_state(self) -> dict:
        return {**self._base_state(), "inputs": [{**b.rows.state(), "death": b.death} for b in self.buffers]}

    def restore_state(self, s: dict) -> None:
        self._restore_base(s)
        self.buffers = [Buffer(Rows.from_state(x, self.device), x["death"].to(self.device)) for x in s["inputs"]]

    @classmethod
    def rescale_state(cls, states: list[dict], parallelism: int) -> list[dict]:
        """Each input's rows dealt to the new subtasks by the key group of their
        key; a key's rows come from one old subtask, so their order holds."""
        schemas = [next((s["schemas"][i] for s in states if s["schemas"][i] is not None), None) for i in (0, 1)]
        base = {"schemas": schemas, "next_seq": max(s["next_seq"] for s in states)}
        parts = [{**base, "inputs": []} for _ in range(parallelism)]
        for side in (0, 1):
            olds = [s["inputs"][side] for s in states]
            full = [o for o in olds if o["ts"].numel()] or olds[:1]
            rows = Rows.concat([Rows.from_state(o, "cpu") for o in full])
            death = torch.cat([o["death"].cpu() for o in full])
            owner = key_group_targets(rows.key, parallelism)
            for i, part in enumerate(parts):
                idx = torch.nonzero(owner == i).flatten()
                buf = Buffer.sorted_of(rows.take(idx), death.index_select(0, idx))
                part["inputs"].append({**buf.rows.state(), "death": buf.death})
        return parts


def _bucket_order(probe: torch.Tensor, pos: torch.Tensor, other: Rows):
    """Pairs (probe-major, then the other input's (ts, seq)) reordered within a
    probe by the order their timestamp buckets were made: a bucket's first
    (alive) row's arrival. Nothing moves when buckets were made in time order."""
    ts, seq = other.ts.index_select(0, pos), other.seq.index_select(0, pos)
    n = probe.shape[0]
    new = torch.ones(n, dtype=torch.bool, device=probe.device)
    new[1:] = (probe[1:] != probe[:-1]) | (ts[1:] != ts[:-1])
    first = cummax(torch.where(new, torch.arange(n, device=probe.device), 0), 0)[0]
    made = seq.index_select(0, first)
    back = torch.zeros(n, dtype=torch.bool, device=probe.device)
    back[1:] = (probe[1:] == probe[:-1]) & (made[1:] < made[:-1])
    if not bool(back.any()):
        return probe, pos
    order = torch.argsort(made, stable=True)
    order = order.index_select(0, torch.argsort(probe.index_select(0, order), stable=True))
    return probe.index_select(0, order), pos.index_select(0, order)
