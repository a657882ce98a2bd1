"""Windows: assigners, the columnar and record paths, lateness, late side
outputs, sessions, count and processing-time windows."""

import pytest
import torch

from opforge.stream import (Aggregations, CountTrigger, EventTimeSessionWindows, EventTimeTrigger, GlobalWindows, OutputTag,
                            ProcessWindowFunction, SimulatedClock, SlidingEventTimeWindows, SplitSource,
                            StreamExecutionEnvironment, TimeWindow, TumblingEventTimeWindows,
                            TumblingProcessingTimeWindows, WatermarkStrategy)
from opforge.stream.columnar_window_operator import ColumnarWindowOperator
from opforge.stream.paned_window_operator import PanedWindowOperator
from opforge.stream.window_operator import WindowOperator
from stream_helpers import multiset, out_of_order_events

AGG = dict(n=("count",), total=("sum", "f1"), low=("min", "f1"), high=("max", "f1"), avg=("mean", "f1"))


def strategy(bound):
    return WatermarkStrategy.for_bounded_out_of_orderness(bound).with_timestamp_assigner("f2")


def brute_force(events, size, slide):
    """Every (key, window) with its records, by definition."""
    out = {}
    for k, v, ts in events:
        start = ts - ts % slide
        while start > ts - size:
            out.setdefault((k, start), []).append(v)
            start -= slide
    return [{"key": k, "window_start": s, "window_end": s + size, "n": len(vs), "total": sum(vs),
             "low": min(vs), "high": max(vs), "avg": sum(vs) / len(vs)} for (k, s), vs in out.items()]


@pytest.mark.parametrize("size,slide", [(50, 50), (60, 20), (50, 20)])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_columnar_window_aggregate_matches_definition(size, slide, parallelism):
    events = out_of_order_events(400, keys=6, bound=30, seed=size + slide, late=0.0)
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=32)
    assigner = SlidingEventTimeWindows.of(size, slide)
    sink = env.from_collection(events, strategy(30)).key_by(0).window(assigner) \
        .aggregate(Aggregations(with_window=True, **AGG)).collect()
    env.execute()
    got = sink.records()
    assert multiset(got) == multiset(brute_force(events, size, slide))
    assert sink.timestamps() == [r["window_end"] - 1 for r in got]


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows.of(20), SlidingEventTimeWindows.of(20, 15)])
def test_the_fast_path_is_taken_and_agrees_with_the_record_path(assigner, monkeypatch):
    import opforge.stream.executor as executor

    events = out_of_order_events(300, keys=4, bound=10, seed=7, late=0.3)
    results = []
    for record_path in (False, True):
        if record_path:  # the generic operator in place of the columnar one
            monkeypatch.setattr(executor, "columnar_window_operator",
                                lambda name, a, fn, key, lateness, tag: WindowOperator(
                                    name, a, EventTimeTrigger(), ("aggregate", fn), key, lateness, tag))
        env = StreamExecutionEnvironment(parallelism=2, batch_size=3)
        late = OutputTag("late")
        out = env.from_collection(events, strategy(10)).key_by(0).window(assigner) \
            .allowed_lateness(5).side_output_late_data(late).aggregate(Aggregations(with_window=True, **AGG))
        t = env.transformations[-1]
        op = executor.build_operator(t, t.inputs[0].key)
        columnar = PanedWindowOperator if assigner.size % assigner.slide == 0 else ColumnarWindowOperator
        assert isinstance(op, WindowOperator if record_path else columnar)
        main, side = out.collect(), out.get_side_output(late).collect()
        env.execute()
        results.append((multiset(zip(main.records(), main.timestamps())), multiset(side.records())))
    assert results[0] == results[1]
    assert results[0][1], "the stream should have records past the lateness"
    fired = [r for r, _ in results[0][0]]
    assert len(fired) > len({(r["key"], r["window_start"]) for r in fired}), "and late firings"


def test_allowed_lateness_fires_again_with_updated_results():
    # tumbling 10 ms; bound 0: watermark = max_ts - 1 after each one-record batch
    events = [("k", 1, 1), ("k", 2, 5), ("k", 4, 12), ("k", 8, 7), ("k", 16, 25), ("k", 32, 3)]
    env = StreamExecutionEnvironment(batch_size=1)
    late = OutputTag("late")
    out = env.from_collection(events, strategy(0)).key_by(0).window(TumblingEventTimeWindows.of(10)) \
        .allowed_lateness(10).side_output_late_data(late).aggregate(Aggregations(total=("sum", "f1")))
    main, side = out.collect(), out.get_side_output(late).collect()
    env.execute()
    # [0,10) fires at wm 11 with 3, again with 11 when ts 7 arrives (wm 11 < 9 + 10);
    # ts 3 arrives at wm 24 >= 9 + 10: too late, to the side output
    assert main.records() == [{"total": 3}, {"total": 11}, {"total": 4}, {"total": 16}]
    assert side.records() == [("k", 32, 3)]


def test_late_records_are_dropped_and_counted_without_a_tag():
    events = [(0, 1, 100), (0, 1, 10)]
    env = StreamExecutionEnvironment(batch_size=1)
    env.from_collection(events, strategy(0)).key_by(0).window(TumblingEventTimeWindows.of(10)) \
        .aggregate(Aggregations(n=("count",))).collect()
    res = env.execute()
    assert res.metrics["WindowAggregate"].late_records_dropped == 1


class Collect(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, sorted(e[1] for e in elements))


def test_session_windows_merge():
    events = [(0, 1, 0), (0, 2, 5), (1, 3, 7), (0, 4, 30), (0, 5, 14), (1, 6, 40)]
    env = StreamExecutionEnvironment(batch_size=10)
    sink = env.from_collection(events, strategy(100)).key_by(0) \
        .window(EventTimeSessionWindows.with_gap(10)).process(Collect()).collect()
    env.execute()
    # key 0: 0, 5, 14 chain ([0,24)); 30 is its own session; key 1: 7 and 40 apart
    assert multiset(sink.records()) == multiset([(0, 0, 24, [1, 2, 5]), (0, 30, 40, [4]),
                                                 (1, 7, 17, [3]), (1, 40, 50, [6])])


def test_window_reduce():
    events = [(i % 2, i, i * 10) for i in range(10)]
    env = StreamExecutionEnvironment(batch_size=3)
    sink = env.from_collection(events, strategy(0)).key_by(0).window(TumblingEventTimeWindows.of(50)) \
        .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2]))).collect()
    env.execute()
    assert multiset(sink.records()) == multiset([(0, 6, 40), (1, 4, 30), (0, 14, 80), (1, 21, 90)])


def test_count_windows():
    events = [(i % 2, i, 0) for i in range(9)]
    env = StreamExecutionEnvironment(batch_size=4)
    ks = env.from_collection(events).key_by(0)
    purged = ks.count_window(2).reduce(lambda a, b: (a[0], a[1] + b[1], 0)).collect()
    rolling = ks.window(GlobalWindows.create()).trigger(CountTrigger.of(2)) \
        .aggregate(Aggregations(n=("count",), total=("sum", "f1"))).collect()
    env.execute()
    assert multiset(purged.records()) == multiset([(0, 2, 0), (0, 10, 0), (1, 4, 0), (1, 12, 0)])
    assert multiset(rolling.records()) == multiset([{"n": 2, "total": 2}, {"n": 4, "total": 12},
                                                    {"n": 2, "total": 4}, {"n": 4, "total": 16}])


def test_global_windows_need_a_trigger():
    env = StreamExecutionEnvironment()
    with pytest.raises(ValueError, match="never fire"):
        env.from_collection([(1, 1)]).key_by(0).window(GlobalWindows.create()).reduce(lambda a, b: a)


def test_processing_time_tumbling_windows():
    # rounds tick 100 ms: records polled at 100, 200 | 300, 400 | 500 fall in 200 ms windows
    splits = [[[("a", 1)], [("a", 2)], [("a", 3)], [("a", 4)], [("a", 5)], [], [], []]]
    env = StreamExecutionEnvironment(clock=SimulatedClock(step_ms=100))
    sink = env.from_source(SplitSource(splits)).key_by(0).window(TumblingProcessingTimeWindows.of(200)) \
        .reduce(lambda a, b: (a[0], a[1] + b[1])).collect()
    env.execute()
    assert sink.records() == [("a", 1), ("a", 5), ("a", 9)]


def test_records_without_timestamps_are_an_error():
    env = StreamExecutionEnvironment()
    env.from_collection([(1, 2, 3)]).key_by(0).window(TumblingEventTimeWindows.of(5)) \
        .aggregate(Aggregations(n=("count",))).collect()
    with pytest.raises(ValueError, match="no timestamp"):
        env.execute()


def test_assigners_tensor_and_scalar_forms_agree():
    ts = torch.tensor([0, 7, 19, 20, 21, 99, 1234])
    for a in (TumblingEventTimeWindows.of(10), SlidingEventTimeWindows.of(30, 10),
              SlidingEventTimeWindows.of(25, 10, 3)):
        rows, starts, ends = a.assign(ts)
        got = sorted(zip(rows.tolist(), starts.tolist(), ends.tolist()))
        want = sorted((i, w.start, w.end) for i, t in enumerate(ts.tolist()) for w in a.assign_one(t))
        assert got == want
        assert all(s <= ts[r] < e for r, s, e in got)
    assert TimeWindow(0, 10).intersects(TimeWindow(10, 20))


def test_aggregations_arguments_are_checked():
    with pytest.raises(ValueError, match="Aggregations"):
        Aggregations(x=("median", "f1"))
    with pytest.raises(ValueError, match="needs a column"):
        Aggregations(x=("sum",))


@pytest.mark.triton_kernels
def test_window_fold_through_the_triton_segment_reduce():
    events = [(i % 3, i, i) for i in range(60)]
    env = StreamExecutionEnvironment(batch_size=30)
    sink = env.from_collection(events, strategy(0)).key_by(0).window(TumblingEventTimeWindows.of(20)) \
        .aggregate(Aggregations(with_window=True, **AGG)).collect()
    env.execute()
    assert multiset(sink.records()) == multiset(brute_force(events, 20, 20))


def test_group_pairs_matches_torch_unique():
    from opforge.stream.grouping import group_pairs

    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(-3, 4, (500,), generator=g), torch.randint(0, 5, (500,), generator=g) * 10
    uniq, inv = group_pairs(a, b)
    want_u, want_inv = torch.unique(torch.stack([a, b], 1), dim=0, return_inverse=True)
    assert torch.equal(uniq, want_u) and torch.equal(inv, want_inv)
    empty = group_pairs(a[:0], b[:0])
    assert empty[0].shape == (0, 2) and empty[1].numel() == 0
