"""Integer sums never wrap (issue 25): a window sum outside int64 raises
``StreamOverflowError`` naming the operator, the aggregation and the key, on
the columnar paths (panes, per-window rows) and the record path alike; an
int a column cannot hold (2^70) is rejected at the source, naming the field."""

import pytest

from opforge.stream import (Aggregations, CountTrigger, EventTimeSessionWindows, GlobalWindows,
                            SlidingEventTimeWindows, StreamExecutionEnvironment, TumblingEventTimeWindows,
                            WatermarkStrategy)
from opforge.stream.errors import StreamOverflowError
from opforge.stream.reference import run_reference

BIG = 2**62


def _job(events, window, batch_size=8, trigger=None):
    env = StreamExecutionEnvironment(batch_size=batch_size)
    ws = env.from_collection(events, WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("f2")) \
        .key_by(0).window(window)
    if trigger is not None:
        ws = ws.trigger(trigger)
    sink = ws.aggregate(Aggregations(with_window=True, total=("sum", "f1"), n=("count",))).name("sums").collect()
    return env, sink


@pytest.mark.parametrize("window", [TumblingEventTimeWindows.of(100), SlidingEventTimeWindows.of(100, 50),
                                    SlidingEventTimeWindows.of(100, 30), EventTimeSessionWindows.with_gap(50)])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_window_sum_past_int64_raises_naming_operator_aggregation_and_key(window, batch_size):
    events = [(7, BIG, 1), (7, BIG, 2), (3, 1, 3)]
    env, _ = _job(events, window, batch_size)
    with pytest.raises(StreamOverflowError) as e:
        env.execute()
    msg = str(e.value)
    assert isinstance(e.value, OverflowError)
    assert "sums" in msg and "'total'" in msg and "sum" in msg and "key 7" in msg and "int64" in msg


def test_a_sum_whose_partials_overflow_but_the_total_fits_is_exact():
    events = [(1, BIG, 1), (1, BIG, 2), (1, -BIG, 3), (1, -BIG + 5, 4)]
    for window in (TumblingEventTimeWindows.of(100), SlidingEventTimeWindows.of(100, 50),
                   SlidingEventTimeWindows.of(100, 30)):
        env, sink = _job(events, window, batch_size=4)
        env.execute()
        assert {r["total"] for r in sink.records()} == {5}


def test_panes_that_fit_but_whose_window_does_not_raise():
    # each 50 ms pane holds 2^62 (fits); the 100 ms window holding both panes does not
    events = [(4, BIG, 10), (4, BIG, 60), (4, BIG - 1, 160)]
    env, _ = _job(events, SlidingEventTimeWindows.of(100, 50), batch_size=1)
    with pytest.raises(StreamOverflowError, match="key 4"):
        env.execute()


def test_the_record_path_and_the_reference_raise_too():
    events = [(2, BIG, 1), (2, BIG, 2)]
    env, _ = _job(events, GlobalWindows.create(), trigger=CountTrigger.of(2))
    with pytest.raises(StreamOverflowError, match="'total'.*key 2"):
        env.execute()
    env, _ = _job(events, TumblingEventTimeWindows.of(100))
    with pytest.raises(StreamOverflowError, match="'total'"):
        run_reference(env)


def test_an_int_no_column_can_hold_is_rejected_at_the_source_naming_the_field():
    env = StreamExecutionEnvironment(batch_size=4)
    env.from_collection([(1, 5, 1), (1, 2**70, 2)]).key_by(0).sum(1).collect()
    with pytest.raises(ValueError, match=r"field 'f1'.*2\*\*63|field 'f1'.*int64") as e:
        env.execute()
    assert "1180591620717411303424" in str(e.value)


def test_a_rolling_sum_past_int64_raises_naming_the_key():
    env = StreamExecutionEnvironment(batch_size=4)
    env.from_collection([("a", BIG), ("b", 1), ("a", BIG), ("b", 2)]).key_by(0).sum(1).name("running").collect()
    with pytest.raises(StreamOverflowError, match="running.*key 'a'.*int64"):
        env.execute()
    env = StreamExecutionEnvironment(batch_size=1)
    sink = env.from_collection([("a", BIG), ("a", -BIG), ("a", BIG), ("a", BIG - 1)]).key_by(0).sum(1).collect()
    env.execute()
    assert [r[1] for r in sink.records()] == [BIG, 0, BIG, 2 * BIG - 1]
