"""Window joins, co-groups and interval joins: against brute-force pairs over
the same records, against the record-at-a-time reference executor (late data
included), and their state cleanup."""

import pytest
import torch

from opforge.stream import (CoGroupFunction, EventTimeSessionWindows, FlatJoinFunction, JoinFunction, OutputTag,
                            ProcessJoinFunction, SimulatedClock, SlidingEventTimeWindows, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, TumblingProcessingTimeWindows, WatermarkStrategy)
from opforge.stream.keys import KeySelector
from opforge.stream.operators import CoProcessOperator
from opforge.stream.records import Batch
from stream_helpers import multiset, out_of_order_events, reference_outputs, run_with_failures

BOUND = 15


def two_sides(env, events, bound=BOUND):
    """One source (the reference models one), split into two inputs: even
    values left, odd values right; filters next to the source keep order."""
    s = WatermarkStrategy.for_bounded_out_of_orderness(bound).with_timestamp_assigner("f2")
    src = env.from_collection(events, s)
    left = src.filter(lambda r: r[1] % 2 == 0).set_parallelism(1)
    right = src.filter(lambda r: r[1] % 2 != 0).set_parallelism(1)
    return left, right


def engine(job, events, parallelism, batch_size):
    # record granularity (the default): the join meets both inputs' records in the source's order
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sink = job(env, events)
    env.execute()
    return multiset(zip(sink.records(), sink.timestamps()))


class Pair(JoinFunction):
    def join(self, first, second):
        return (first[0], first[1], second[1])


def window_pairs(events, size, slide):
    out = []
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]
    for a in left:
        for b in right:
            if a[0] != b[0]:
                continue
            start = a[2] - a[2] % slide
            while start > a[2] - size:
                if start <= b[2] < start + size:
                    out.append(((a[0], a[1], b[1]), start + size - 1))
                start -= slide
    return multiset(out)


@pytest.mark.parametrize("size,slide", [(40, 40), (60, 20)])
@pytest.mark.parametrize("parallelism,batch_size", [(1, 7), (3, 32)])
def test_window_join_is_every_pair_of_a_key_and_window(size, slide, parallelism, batch_size):
    events = out_of_order_events(300, keys=5, bound=BOUND, seed=size + slide)
    assigner = SlidingEventTimeWindows.of(size, slide) if size != slide else TumblingEventTimeWindows.of(size)

    def job(env, events):
        left, right = two_sides(env, events)
        return left.join(right).where(0).equal_to(lambda r: r[0]).window(assigner).apply(Pair()).collect()

    want = window_pairs(events, size, slide)
    assert len(want) > 100
    assert engine(job, events, parallelism, batch_size) == want
    assert reference_outputs(job, events, batch_size) == want


def test_window_join_drops_late_records_like_the_reference():
    events = out_of_order_events(400, keys=4, bound=BOUND, seed=4, late=0.08)

    def job(env, events):
        left, right = two_sides(env, events)
        return left.join(right).where(0).equal_to(0).window(TumblingEventTimeWindows.of(30)).apply(Pair()).collect()

    got = engine(job, events, 2, 9)
    assert got == reference_outputs(job, events, 9)
    everything = window_pairs(events, 30, 30)
    assert len(got) < len(everything) and all(g in everything for g in got)


def test_window_join_with_late_data_does_not_depend_on_the_batch_size():
    """Record granularity: a join's two inputs, split from one source batch, meet in
    the order of the watermarks they saw, so late records are the same at every batch size."""
    events = out_of_order_events(300, keys=3, bound=BOUND, seed=31, late=0.1)

    def job(env, events):
        left, right = two_sides(env, events)
        return left.join(right).where(0).equal_to(0).window(TumblingEventTimeWindows.of(30)).apply(Pair()).collect()

    want = reference_outputs(job, events, 1)
    assert 0 < len(want) < len(window_pairs(events, 30, 30))  # late records were dropped
    for parallelism, batch_size in ((1, 1), (1, 13), (2, 300)):
        assert engine(job, events, parallelism, batch_size) == want


class Flat(FlatJoinFunction):
    def join(self, first, second):
        if first[1] > second[1]:
            yield (first[0], first[1] - second[1])


class Group(CoGroupFunction):
    def co_group(self, first, second):
        yield (len(first), len(second), sum(r[1] for r in first) - sum(r[1] for r in second))


def test_flat_join_and_co_group():
    events = out_of_order_events(200, keys=3, bound=BOUND, seed=8)
    w = TumblingEventTimeWindows.of(25)

    def flat(env, events):
        left, right = two_sides(env, events)
        return left.join(right).where(0).equal_to(0).window(w).apply(Flat()).collect()

    def co_group(env, events):
        left, right = two_sides(env, events)
        return left.co_group(right).where(0).equal_to(0).window(w).apply(Group()).collect()

    want = multiset([((k, a - b), t) for (k, a, b), t in window_pairs(events, 25, 25) if a > b])
    assert engine(flat, events, 2, 11) == want
    groups = {}
    for k, v, ts in events:
        g = groups.setdefault((k, ts - ts % 25), [0, 0, 0])
        g[v % 2] += 1
        g[2] += v if v % 2 == 0 else -v
    want = multiset([((n0, n1, d), start + 24) for (k, start), (n0, n1, d) in groups.items()])
    assert engine(co_group, events, 3, 11) == want  # one-sided groups too: an outer co-group
    assert reference_outputs(co_group, events, 11) == want


class Interval(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        assert ctx.get_timestamp() == max(ctx.get_left_timestamp(), ctx.get_right_timestamp())
        yield (left[0], left[1], right[1], ctx.get_left_timestamp(), ctx.get_right_timestamp())


def interval_pairs(events, lo, hi):
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]
    return multiset([((a[0], a[1], b[1], a[2], b[2]), max(a[2], b[2]))
                     for a in left for b in right if a[0] == b[0] and lo <= b[2] - a[2] <= hi])


@pytest.mark.parametrize("lo,hi,exclusive", [(-10, 20, ""), (-10, 20, "both"), (5, 30, "lower"),
                                             (-25, -3, "upper"), (0, 0, "")])
@pytest.mark.parametrize("parallelism,batch_size", [(1, 5), (3, 64)])
def test_interval_join_pairs_and_times(lo, hi, exclusive, parallelism, batch_size):
    events = out_of_order_events(300, keys=4, bound=BOUND, seed=abs(lo * hi) + 1)

    def job(env, events):
        left, right = two_sides(env, events)
        joined = left.key_by(0).interval_join(right.key_by(0)).between(lo, hi)
        if exclusive in ("lower", "both"):
            joined = joined.lower_bound_exclusive()
        if exclusive in ("upper", "both"):
            joined = joined.upper_bound_exclusive()
        return joined.process(Interval()).collect()

    want = interval_pairs(events, lo + (exclusive in ("lower", "both")), hi - (exclusive in ("upper", "both")))
    assert len(want) >= (3 if lo == hi else 50)
    assert engine(job, events, parallelism, batch_size) == want
    assert reference_outputs(job, events, batch_size) == want


def test_interval_join_late_records_go_to_side_outputs_like_the_reference():
    events = out_of_order_events(400, keys=3, bound=BOUND, seed=21, late=0.1)
    late_left, late_right = OutputTag("late-left"), OutputTag("late-right")

    def job(env, events):
        left, right = two_sides(env, events)
        joined = left.key_by(0).interval_join(right.key_by(0)).between(-20, 20) \
            .side_output_left_late_data(late_left).side_output_right_late_data(late_right).process(Interval())
        out = joined.collect()
        joined.get_side_output(late_left).map(lambda r: ("L",) + r).sink_to(out)
        joined.get_side_output(late_right).map(lambda r: ("R",) + r).sink_to(out)
        return out

    got = engine(job, events, 1, 8)
    assert got == reference_outputs(job, events, 8)
    late = [r for r, _ in got if r[0] in ("L", "R")]
    assert late and all((r[0] == "L") == (r[2] % 2 == 0) for r in late)
    pairs = [g for g in got if g[0][0] not in ("L", "R")]
    assert len(pairs) < len(interval_pairs(events, -20, 20))


class _Out:
    def __init__(self):
        self.batches, self.wms = [], []

    def emit(self, batch, tag=None):
        self.batches.append(batch)

    def emit_side(self, tag, batch):
        self.batches.append(batch)

    def emit_watermark(self, wm):
        self.wms.append(wm)


def _operator(fn):
    op = CoProcessOperator("IntervalJoin", fn, KeySelector(0))
    op.setup(_Out(), 0, 1, SimulatedClock(), torch.device("cpu"))
    op.open()
    return op


def _batch(op, rows):
    b = Batch.from_records(rows, "cpu", timestamps=[r[2] for r in rows])
    return b.with_keys(op.key_selector.key_ids(b))


def _buffered(op, side):
    cells = op.state.cells[f"interval-join-{side}"].values
    return sorted(ts for m, _ in cells.values() for ts in m)


def test_interval_join_state_is_cleaned_when_the_watermark_passes():
    env = StreamExecutionEnvironment()
    left, right = (env.from_collection([(0, 0, 0)]).key_by(0) for _ in range(2))
    fn = left.interval_join(right).between(-5, 10).process(Interval()).transformation.params["fn"]
    op = _operator(fn)
    op.process_input(_batch(op, [(1, 0, 100), (1, 2, 120)]), 0)
    op.process_input(_batch(op, [(1, 1, 104)]), 1)
    assert _buffered(op, "left") == [100, 120] and _buffered(op, "right") == [104]
    op.on_watermark(108)
    assert _buffered(op, "left") == [100, 120] and _buffered(op, "right") == [104]
    op.on_watermark(109)  # right@104 met left records up to 109; left@100 meets rights up to 110
    assert _buffered(op, "left") == [100, 120] and _buffered(op, "right") == []
    op.on_watermark(110)
    assert _buffered(op, "left") == [120]
    op.on_watermark(130)  # left@120 meets right records up to 130
    assert _buffered(op, "left") == [] and not op.event_timers
    op.process_input(_batch(op, [(1, 3, 125)]), 1)  # late: behind the watermark
    assert _buffered(op, "right") == []
    recs = [r for b in op.out.batches for r in b.records()]
    assert recs == [(1, 0, 1, 100, 104)]
    assert op.out.batches[0].timestamps.tolist() == [104]


def test_window_join_state_is_cleared_when_its_window_fires():
    env = StreamExecutionEnvironment()
    a, b = env.from_collection([(0, 0, 0)]), env.from_collection([(0, 0, 0)])
    fn = a.join(b).where(0).equal_to(0).window(TumblingEventTimeWindows.of(10)).apply(Pair()) \
        .transformation.params["fn"]
    op = _operator(fn)
    op.process_input(_batch(op, [(1, 0, 3), (1, 2, 15)]), 0)
    op.process_input(_batch(op, [(1, 1, 7)]), 1)
    assert len(op.state.cells["window-join-panes"].values[(1, None)][0]) == 2
    op.on_watermark(9)
    assert list(op.state.cells["window-join-panes"].values[(1, None)][0]) == [(10, 20)]
    op.on_watermark(19)
    assert not op.state.cells["window-join-panes"].values.get((1, None), ({},))[0]
    # [10, 20) fired at watermark 19: records for it are late now, dropped
    op.process_input(_batch(op, [(1, 4, 19)]), 0)
    op.process_input(_batch(op, [(1, 5, 12), (1, 7, 20)]), 1)
    assert list(op.state.cells["window-join-panes"].values[(1, None)][0]) == [(20, 30)]
    op.on_watermark(40)
    assert [r for batch in op.out.batches for r in batch.records()] == [(1, 0, 1)]


def test_join_errors_name_the_operator():
    env = StreamExecutionEnvironment()
    a = env.from_collection([(1, 2)])
    b = env.from_collection([(1, 3)])
    with pytest.raises(ValueError, match="where"):
        a.join(b).equal_to(0)
    with pytest.raises(ValueError, match="event-time tumbling or sliding"):
        a.join(b).where(0).equal_to(0).window(EventTimeSessionWindows.with_gap(5))
    with pytest.raises(ValueError, match="event-time tumbling or sliding"):
        a.join(b).where(0).equal_to(0).window(TumblingProcessingTimeWindows.of(5))
    with pytest.raises(TypeError, match="KeyedStream"):
        a.key_by(0).interval_join(b)
    with pytest.raises(ValueError, match="lower bound 5 must not exceed"):
        a.key_by(0).interval_join(b.key_by(0)).between(5, -5)
    from datetime import timedelta

    bounded = a.key_by(0).interval_join(b.key_by(0)).between(timedelta(seconds=-1), timedelta(milliseconds=2500))
    assert (bounded.lower, bounded.upper) == (-1000, 2500)
    with pytest.raises(ValueError, match="empty"):
        a.key_by(0).interval_join(b.key_by(0)).between(3, 3).lower_bound_exclusive().process(Interval())
    a.join(b).where(0).equal_to(0).window(TumblingEventTimeWindows.of(10)).apply(Pair()).collect()
    with pytest.raises(ValueError, match="WindowJoin: a record has no timestamp"):
        env.execute()


class _Boom(RuntimeError):
    pass


class _FailAt:
    def __init__(self, at):
        self.at = at

    def map(self, value):
        if value["seq"] == self.at:
            raise _Boom(f"injected failure at record {self.at}")
        return value


class _IntervalRow(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        yield {"key": left["key"], "a": left["value"], "b": right["value"], "t": ctx.get_timestamp()}


def test_join_state_survives_a_failure_and_restore(tmp_path):
    from checkpoint_job import per_subtask_rows
    from opforge.stream import CollectionSource, FileSink

    evs = [{"key": k, "value": v, "ts": t, "seq": i}
           for i, (k, v, t) in enumerate(out_of_order_events(300, keys=4, bound=20, seed=12, late=0.05))]

    def build(env, out, fail_at):
        s = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
        src = env.from_source(CollectionSource(evs), s, "events").map(_FailAt(fail_at))
        left = src.filter(lambda r: r["value"] % 2 == 0)
        right = src.filter(lambda r: r["value"] % 2 != 0)
        left.join(right).where("key").equal_to("key").window(TumblingEventTimeWindows.of(30)) \
            .apply(lambda a, b: {"key": a["key"], "a": a["value"], "b": b["value"]}) \
            .sink_to(FileSink(out / "window", "json"))
        left.key_by("key").interval_join(right.key_by("key")).between(-15, 10).process(_IntervalRow()) \
            .sink_to(FileSink(out / "interval", "json"))

    def env_():
        return StreamExecutionEnvironment(parallelism=2, batch_size=6, clock=SimulatedClock(step_ms=100))

    def rows(path):
        return multiset([r for part in per_subtask_rows(path).values() for r in part])

    ref, out = run_with_failures(env_, build, tmp_path, (80, 190), _Boom)
    for sink in ("window", "interval"):
        want = rows(ref / sink)
        assert want and rows(out / sink) == want
