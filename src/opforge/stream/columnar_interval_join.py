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

State is checkpointed through ``snapshot_state`` / ``restore_state`` (no
pickle) and rescaled by key groups (``rescale_state``).
"""

from __future__ import annotations

import torch

from opforge.ops.hashing import expand_runs
from opforge.stream.checkpoint import schema_from_state, schema_state
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

    def merged(self, new: "Buffer") -> "Buffer":
        """``new`` (later arrivals) merged in: buffer rows first on equal (key, ts)."""
        if len(self) == 0:
            return new
        if len(new) == 0:
            return self
        rows = Rows.concat([self.rows, new.rows])
        order = torch.argsort(rows.ts, stable=True)
        order = order.index_select(0, torch.argsort(rows.key.index_select(0, order), stable=True))
        return Buffer(rows.take(order), torch.cat([self.death, new.death]).index_select(0, order))

    def alive(self, watermark: int) -> "Buffer":
        if len(self) == 0:
            return self
        keep = torch.nonzero(self.death > watermark).flatten()
        return self if keep.shape[0] == len(self) else self.take(keep)

    def ranges(self, key: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        """Per probe: ``(start, count)`` of the rows with its key and ``lo <= ts <= hi``."""
        bk, bt = self.rows.key, self.rows.ts
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
        found = uniq.index_select(0, at) == key
        base = at * span
        packed = rank * span + (bt - tmin)
        a = base + (lo - tmin).clamp(0, span)
        b = base + (hi - tmin).clamp(-1, span - 1)
        start = torch.searchsorted(packed, a, right=False)
        count = (torch.searchsorted(packed, b, right=True) - start).clamp(min=0)
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
        dev = rows.ts.device
        seen = batch.watermarks if batch.watermarks is not None else \
            torch.full((len(batch),), self.watermark, dtype=torch.int64, device=dev)
        seen = seen.clamp(min=self.watermark)
        missing, late_n, last_wm = torch.stack([(rows.ts == NO_TIMESTAMP).sum(), (rows.ts < seen).sum(),
                                                seen[-1]]).tolist()
        if missing:
            raise ValueError(f"{self.name}: a record has no timestamp; joins run in event time (give the "
                             "sources a WatermarkStrategy with a timestamp assigner)")
        if late_n:
            late = rows.ts < seen
            tag = self.late_tags[input_index]
            if tag is not None:
                self.out.emit_side(tag, batch.select(late).with_keys(None).with_watermarks(None))
            on_time = torch.nonzero(~late).flatten()
            rows, seen = rows.take(on_time), seen.index_select(0, on_time)
        if len(rows):
            lo, hi, keep = self._bounds(input_index)
            other = self.buffers[1 - input_index]
            if len(other):
                self._probe(rows, seen, other, lo, hi, input_index)
            death = torch.maximum(rows.ts + keep, seen + 1)
            self.buffers[input_index] = self.buffers[input_index].merged(Buffer.sorted_of(rows, death))
        if last_wm > self.watermark:
            self._advance(last_wm)

    def _probe(self, rows: Rows, seen: torch.Tensor, other: Buffer, lo: int, hi: int, side: int) -> None:
        start, count = other.ranges(rows.key, rows.ts + lo, rows.ts + hi)
        probe, pos = expand_runs(start, count)
        if probe.numel() == 0:
            return
        alive = torch.nonzero(other.death.index_select(0, pos) > seen.index_select(0, probe)).flatten()
        if alive.shape[0] != probe.shape[0]:
            probe, pos = probe.index_select(0, alive), pos.index_select(0, alive)
            if probe.numel() == 0:
                return
        probe, pos = _bucket_order(probe, pos, other.rows)
        mine, theirs = rows.take(probe), other.rows.take(pos)
        left, right = (mine, theirs) if side == 0 else (theirs, mine)
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
    first = torch.cummax(torch.where(new, torch.arange(n, device=probe.device), 0), 0).values
    made = seq.index_select(0, first)
    back = torch.zeros(n, dtype=torch.bool, device=probe.device)
    back[1:] = (probe[1:] == probe[:-1]) & (made[1:] < made[:-1])
    if not bool(back.any()):
        return probe, pos
    order = torch.argsort(made, stable=True)
    order = order.index_select(0, torch.argsort(probe.index_select(0, order), stable=True))
    return probe.index_select(0, order), pos.index_select(0, order)
