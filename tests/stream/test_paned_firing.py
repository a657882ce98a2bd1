"""How ``PanedWindowOperator`` fires and folds: a firing window is a run of
its key's pane rows (in (key, pane) order) reduced by prefix sums and sparse
tables (``range_sums``, ``range_extremes``), and a batch of dense keys whose
panes spread widely is grouped by each key's own pane range
(``_group_within_keys``). Checked against a record-at-a-time model of the
per-window semantics (rows, values, order, late firings, side output) with
the operator driven batch by batch, against the reference executor, across
batch sizes, and on the Nexmark q5 shape."""

import random

import pytest
import torch

import opforge.stream.executor as executor
import opforge.stream.grouping as wo
from opforge.stream import (Aggregations, OutputTag, SlidingEventTimeWindows, SplitSource,
                            StreamExecutionEnvironment, WatermarkStrategy)
from opforge.stream.keys import KeySelector
from opforge.stream.records import Batch, RecordSchema
from opforge.stream.reference import run_reference
from opforge.stream.columnar_window_operator import ColumnarWindowOperator
from opforge.stream.paned_window_operator import PanedWindowOperator
from opforge.stream.range_reductions import range_extremes, range_sums
from stream_helpers import multiset

LATE = OutputTag("late")
FIELDS = ("key", "v", "x", "ts")
# count, integer sum and mean (prefix sums), float sum (added per span), min / max (sparse tables)
AGG = dict(n=("count",), total=("sum", "v"), ftotal=("sum", "x"), low=("min", "x"), high=("max", "v"),
           avg=("mean", "v"))
# (size, slide, offset): 5 panes a window, 1 (tumbling), 3 off a zero grid, 8 (three sparse-table levels)
SHAPES = [(100, 20, 0), (40, 40, 0), (90, 30, 7), (80, 10, 0)]
BOUND = 25


def events(n, keys, seed, late=0.1):
    """``(key, v, x, ts)``: timestamps rising by 0..12 ms, shuffled within
    ``BOUND``; a ``late`` share pushed back by up to 10 x ``BOUND``; keys drawn
    from a window of ``keys`` ids that drifts, so a key's panes have gaps and
    ends; ``x`` is a multiple of 1/4, so that float sums are exact in any
    order."""
    rng = random.Random(seed)
    t, out = 0, []
    for _ in range(n):
        t += rng.randint(0, 12)
        back = rng.randint(0, BOUND) if rng.random() >= late else rng.randint(BOUND + 1, 10 * BOUND)
        key = t // 40 + rng.randrange(keys)
        out.append((key, rng.randint(-50, 100), rng.randint(-400, 400) / 4, max(0, t - back)))
    return out


def batches_of(evs, seed, sizes=(0, 1, 2, 7, 30, 120)):
    """The events cut into batches of random sizes, empty ones included."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(evs):
        k = rng.choice(sizes)
        out.append(evs[i:i + k])
        i += k
    return out


def watermarks(batches, seed):
    """After each batch: the bounded-out-of-orderness watermark (``max ts -
    BOUND - 1``), or None (skipped, so later watermarks fire many windows
    at once); a final one fires everything."""
    rng = random.Random(seed)
    top, out = None, []
    for b in batches:
        if b:
            top = max([e[3] for e in b] + ([] if top is None else [top]))
        out.append(None if top is None or rng.random() < 0.3 else top - BOUND - 1)
    return out + [10**9]


def model(batches, wms, shape, lateness):
    """The per-window table's semantics, record at a time: ``(fired
    (record, timestamp) in order, side output)``. A record none of whose
    windows is within the lateness goes to the side output; one with a
    fired window within the lateness is late: after the batch's other
    records it joins its windows and its fired ones fire again, latest start
    first. A watermark fires the windows ending up to it, by start, then by
    the batch that made the window, then by key."""
    size, slide, offset = shape
    vals, made, fired, side = {}, {}, [], []
    wm = -(2**63)

    def result(key, s):
        rows = vals[(key, s)]
        v, x = [r[1] for r in rows], [r[2] for r in rows]
        return ({"key": key, "window_start": s, "window_end": s + size, "n": len(rows), "total": sum(v),
                 "ftotal": sum(x), "low": min(x), "high": max(v), "avg": sum(v) / len(v)}, s + size - 1)

    for b, (batch, new_wm) in enumerate(zip(batches + [[]], wms)):
        late = []
        for e in batch:
            last = e[3] - (e[3] - offset) % slide
            live = [s for s in range(last, last - size, -slide) if s + size - 1 + lateness > wm]
            if not live:
                side.append(dict(zip(FIELDS, e)))
                continue
            for s in live:
                made.setdefault((e[0], s), b)
            if any(s + size - 1 <= wm for s in live):
                late.append((e, live))
            else:
                for s in live:
                    vals.setdefault((e[0], s), []).append(e)
        for e, live in late:
            for s in live:
                vals.setdefault((e[0], s), []).append(e)
            fired += [result(e[0], s) for s in live if s + size - 1 <= wm]  # live is latest start first
        if new_wm is not None and new_wm > wm:
            due = sorted((s, made[(k, s)], k) for k, s in vals if wm < s + size - 1 <= new_wm)
            fired += [result(k, s) for s, _, k in due]
            wm = new_wm
    return fired, side


class Collect:
    def __init__(self):
        self.main, self.side = [], []

    def emit(self, batch):
        self.main += list(zip(batch.records(), batch.timestamps.tolist()))

    def emit_side(self, tag, batch):
        self.side += batch.records()

    def emit_watermark(self, wm):
        pass


def as_batch(records) -> Batch:
    """``(key, v, x, ts)`` records as a keyed batch, as the window operator gets them."""
    cols = {f: torch.tensor(c) for f, c in zip(FIELDS, zip(*records))}
    return Batch(cols, cols["ts"], RecordSchema("dict", FIELDS), cols["key"])


def drive(batches, wms, shape, lateness):
    """The paned operator fed ``batches`` directly, each followed by its watermark."""
    selector = KeySelector("key")
    selector.space.identity = True
    op = PanedWindowOperator("w", SlidingEventTimeWindows.of(*shape), Aggregations(with_window=True, **AGG),
                             selector, lateness, LATE)
    out = Collect()
    op.setup(out, 0, 1, None, torch.device("cpu"))
    op.open()
    for batch, wm in zip(batches + [[]], wms):
        if batch:
            op.process_batch(as_batch(batch))
        if wm is not None and wm > op.watermark:
            op.on_watermark(wm)
    return out.main, out.side


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "/".join(map(str, s)))
@pytest.mark.parametrize("lateness", [0, 60])
@pytest.mark.parametrize("seed", range(3))
def test_firing_matches_the_record_at_a_time_model(shape, lateness, seed):
    evs = events(1500, keys=6, seed=seed)
    batches = batches_of(evs, seed)
    wms = watermarks(batches, seed)
    got, got_side = drive(batches, wms, shape, lateness)
    want, want_side = model(batches, wms, shape, lateness)
    assert got == want  # rows, values, timestamps, order
    assert got_side == want_side
    # the streams exercise what they should: windows of several panes, late firings, side output
    assert max(r["n"] for r, _ in got) > 3
    if lateness:
        assert len({(r["key"], r["window_start"]) for r, _ in got}) < len(got), "no late firing"
    assert got_side, "no record past the lateness"


def test_a_window_with_a_gap_between_its_panes_and_one_with_a_single_pane():
    """Key 1 has panes 0 and 60: windows starting -80..-40 hold only pane 0,
    -20 and 0 both (with a gap of two panes between them), 20..60 only pane
    60; key 2 only pane 20. One watermark fires them all, by start, then by
    first row (key 1's rows come first in the batch)."""
    batches = [[(2, 5, 1.0, 25), (1, 1, 0.5, 3), (1, 2, 0.25, 61), (1, 4, 1.5, 70)]]
    got, _ = drive(batches, [None, 10**9], (100, 20, 0), 0)
    want, _ = model(batches, [None, 10**9], (100, 20, 0), 0)
    assert got == want
    assert [(r["window_start"], r["key"], r["n"], r["total"], r["low"]) for r, _ in got] == [
        (-80, 1, 1, 1, 0.5), (-60, 1, 1, 1, 0.5), (-60, 2, 1, 5, 1.0), (-40, 1, 1, 1, 0.5), (-40, 2, 1, 5, 1.0),
        (-20, 1, 3, 7, 0.25), (-20, 2, 1, 5, 1.0), (0, 1, 3, 7, 0.25), (0, 2, 1, 5, 1.0), (20, 1, 2, 6, 0.25),
        (20, 2, 1, 5, 1.0), (40, 1, 2, 6, 0.25), (60, 1, 2, 6, 0.25)]


def build(env, evs, shape, lateness):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f3")
    out = env.from_collection(evs, strategy).key_by(0).window(SlidingEventTimeWindows.of(*shape)) \
        .allowed_lateness(lateness).side_output_late_data(LATE) \
        .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "f1"), ftotal=("sum", "f2"),
                                low=("min", "f2"), high=("max", "f1"), avg=("mean", "f1")))
    return out.collect(), out.get_side_output(LATE).collect()


@pytest.mark.parametrize("shape", [(100, 20, 0), (40, 40, 0)], ids=lambda s: "/".join(map(str, s)))
def test_every_batch_size_gives_the_reference_executors_results(shape):
    """On time only (``late=0``), every batch size gives the same multiset,
    that of the record-at-a-time reference executor; with late records the
    multiset depends on when watermarks come, so each batch size is checked
    against the reference at that batch size."""
    for late in (0.0, 0.15):
        evs = events(1200, keys=5, seed=11, late=late)
        results = []
        for batch_size in (1, 13, 100, 5000):
            env = StreamExecutionEnvironment(batch_size=batch_size)
            main, side = build(env, evs, shape, 60)
            ref = run_reference(env)
            want, want_side = multiset(ref[main]), multiset(r for r, _ in ref.get(side, []))
            env = StreamExecutionEnvironment(batch_size=batch_size)
            main, side = build(env, evs, shape, 60)
            env.execute()
            got = multiset(zip(main.records(), main.timestamps()))
            assert got == want and multiset(side.records()) == want_side, (late, batch_size)
            results.append(got)
        if late == 0:
            assert all(r == results[0] for r in results)


def test_empty_batches_between_firings():
    """Empty batches between the others change nothing: the same windows as one batch of everything."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner("f3")
    evs = events(300, keys=3, seed=5, late=0)
    evs.sort(key=lambda e: e[3])
    split = []
    for i in range(0, len(evs), 17):
        split += [evs[i:i + 17], []]
    outs = []
    for batches in (split, [evs]):
        env = StreamExecutionEnvironment()
        sink = env.from_source(SplitSource([batches]), strategy).key_by(0) \
            .window(SlidingEventTimeWindows.of(100, 20)) \
            .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "f1"))).collect()
        env.execute()
        outs.append(multiset(sink.records()))
    assert outs[0] == outs[1] and len(outs[0]) > 50


# -- the range reductions ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("max_width", [1, 2, 5, 8, 13])
def test_range_reductions_match_slices(dtype, max_width):
    g = torch.Generator().manual_seed(max_width)
    rows = 200
    vals = (torch.randn(rows, generator=g) * 1e4).to(dtype)
    if not dtype.is_floating_point:
        vals[::7] = torch.iinfo(dtype).max  # sums wrap as the accumulators do
    lo = torch.randint(0, rows, (500,), generator=g)
    width = torch.minimum(torch.randint(1, max_width + 1, (500,), generator=g), rows - lo)
    sums, low, high = (range_sums(vals, lo, width, max_width), range_extremes(vals, lo, width, max_width, "min"),
                       range_extremes(vals, lo, width, max_width, "max"))
    assert sums.dtype == low.dtype == high.dtype == dtype
    for i in range(500):
        part = vals[lo[i]:lo[i] + width[i]]
        assert low[i] == part.min() and high[i] == part.max()
        if dtype.is_floating_point:
            want = torch.tensor(0.0, dtype=torch.float64)
            for p in part.tolist():
                want = want + p
            assert sums[i] == want.to(dtype)
        else:
            assert sums[i] == part.to(torch.int64).sum().to(dtype)


# -- grouping within each key's panes ---------------------------------------------
def make_op(shape=(100, 20, 0), cls=PanedWindowOperator):
    op = cls("w", SlidingEventTimeWindows.of(*shape), Aggregations(n=("count",)), None)
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.open()
    return op


@pytest.mark.parametrize("spread", [1, 3, 40])
def test_grouping_within_keys_matches_torch_unique(spread, monkeypatch):
    """Dense keys, starts spread over 400 panes but at most ``spread`` per
    key: grouped within keys (no sort) while the keys' pane ranges make a
    small enough range, else by the sort; the same groups either way."""
    g = torch.Generator().manual_seed(spread)
    n, slide = 3000, 20
    keys = torch.randint(0, 2000, (n,), generator=g)
    starts = (keys // 5 + torch.randint(0, spread, (n,), generator=g)) * slide + 1000
    calls = []
    within = PanedWindowOperator._group_within_keys
    monkeypatch.setattr(PanedWindowOperator, "_group_within_keys",
                        lambda self, *a: calls.append(within(self, *a)) or calls[-1])
    op = make_op()
    bounds = (int(keys.min()), int(keys.max()), int(starts.min()), int(starts.max()))
    uk, us, inv = op._group(keys, starts, bounds)
    want_u, want_inv = torch.unique(torch.stack([keys, starts], 1), dim=0, return_inverse=True)
    assert torch.equal(torch.stack([uk, us], 1), want_u) and torch.equal(inv, want_inv)
    assert len(calls) == 1 and (calls[0] is None) == (spread == 40)


def test_q5_shape_grouped_within_keys_fires_like_the_per_window_table(monkeypatch):
    """Nexmark q5's counts with panes narrow next to a batch (hundreds of
    panes a batch, each auction's bids in a few): the within-keys grouping
    runs, and the counts come out as the one-row-per-window table gives
    them, row for row, and as plain Python counts them."""
    from opforge.stream.nexmark import NexmarkConfig, bids, generate

    config = NexmarkConfig(events=24_000, events_per_second=100, max_out_of_orderness_ms=300, seed=2)
    taken = []
    within = PanedWindowOperator._group_within_keys
    monkeypatch.setattr(PanedWindowOperator, "_group_within_keys",
                        lambda self, *a: taken.append(within(self, *a) is not None) or within(self, *a))

    def counts(per_window):
        with pytest.MonkeyPatch.context() as mp:
            if per_window:
                mp.setattr(executor, "columnar_window_operator", ColumnarWindowOperator)
            # whole batches of 8,192 reach the grouping (record watermarks would cut them at every slide)
            env = StreamExecutionEnvironment(batch_size=8192, watermark_granularity="batch")
            sink = bids(env, config).key_by("auction").window(SlidingEventTimeWindows.of(1000, 200)) \
                .aggregate(Aggregations(with_window=True, num=("count",))).collect()
            env.execute()
        return list(zip(sink.records(), sink.timestamps()))

    got = counts(False)
    assert any(taken)
    assert got == counts(True)
    want = {}
    for r in generate(config, "bid", 0, config.events, "cpu").records():
        t = r["date_time"]
        for s in range(t - t % 200, t - 1000, -200):
            want[(r["auction"], s)] = want.get((r["auction"], s), 0) + 1
    assert {(r["key"], r["window_start"]): r["num"] for r, _ in got} == want
    assert len(got) == len(want)


def test_the_firing_sorts_without_codes(monkeypatch):
    """Keys or times too wide for order-preserving codes: the pane runs, the
    firing order and the fold come from stable sorts, with the same output."""
    evs = events(600, keys=4, seed=9)
    batches = batches_of(evs, 9)
    wms = watermarks(batches, 9)
    want = drive(batches, wms, (100, 20, 0), 60)
    monkeypatch.setattr(wo, "pair_codes", lambda *a: (None, 0))
    assert drive(batches, wms, (100, 20, 0), 60) == want


def test_a_restored_table_fires_before_its_first_batch():
    """Restored from a checkpoint, the table's bounds are unknown until a
    batch reads them; a watermark first fires the same windows."""
    evs = events(400, keys=4, seed=4, late=0)
    selector = KeySelector("key")
    selector.space.identity = True
    ops, outs = [], []
    for _ in range(2):
        op = PanedWindowOperator("w", SlidingEventTimeWindows.of(100, 20), Aggregations(with_window=True, **AGG),
                                 selector)
        outs.append(Collect())
        op.setup(outs[-1], 0, 1, None, torch.device("cpu"))
        op.open()
        ops.append(op)
    ops[0].process_batch(as_batch(evs))
    ops[1].restore_table(ops[0].full_table())
    assert ops[1]._bounds is None
    for op in ops:
        op.on_watermark(max(e[3] for e in evs) // 2)
    assert outs[0].main == outs[1].main and len(outs[0].main) > 20
