"""Event time: watermark formulas, per-subtask watermarks combined by min,
idleness, monotonous timestamps."""

import pytest

from opforge.stream import (KeyedProcessFunction, MAX_WATERMARK, ProcessFunction, SimulatedClock, SplitSource,
                            StreamExecutionEnvironment, TimestampAssigner, WatermarkStrategy)


class SeeWatermark(ProcessFunction):
    """Outputs (record, watermark when it arrived)."""

    def process_element(self, value, ctx):
        yield (value, ctx.timer_service().current_watermark())


class KeyedSee(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield (value, ctx.timer_service().current_watermark())


def _seen_watermarks(granularity, batch_size=2):
    env = StreamExecutionEnvironment(batch_size=batch_size, watermark_granularity=granularity)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(10).with_timestamp_assigner(lambda r, _: r)
    sink = env.from_collection([100, 90, 130, 120, 125], strategy).key_by(lambda r: 0).process(KeyedSee()).collect()
    env.execute()
    return sink.records()


def test_bounded_out_of_orderness_watermark_follows_each_batch():
    # the first batch sees no watermark; then max_ts - 10 - 1 after each batch of 2
    assert _seen_watermarks("batch") == [(100, -(2**63)), (90, -(2**63)), (130, 89), (120, 89), (125, 119)]


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_bounded_out_of_orderness_watermark_follows_each_record(batch_size):
    # the first record sees no watermark; then max_ts - 10 - 1 of the records before it, in any batching
    assert _seen_watermarks("record", batch_size) == [(100, -(2**63)), (90, 89), (130, 89), (120, 119),
                                                      (125, 119)]


def test_monotonous_rejects_time_going_back():
    env = StreamExecutionEnvironment(batch_size=3)
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda r, _: r)
    env.from_collection([1, 2, 5, 4], strategy).map(lambda x: x).collect()
    with pytest.raises(ValueError, match="for_monotonous_timestamps got timestamp 4 after 5"):
        env.execute()


class Ts(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[1]


def two_split_job(splits, idleness=None):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(Ts())
    if idleness is not None:
        strategy = strategy.with_idleness(idleness)
    env = StreamExecutionEnvironment(parallelism=2, clock=SimulatedClock(step_ms=100))
    ds = env.from_source(SplitSource(splits), strategy)
    sink = ds.key_by(lambda r: 0).process(KeyedSee()).set_parallelism(1).collect()
    env.execute()
    return sink.records()


def test_watermark_is_the_min_over_parallel_sources():
    fast = [[("a", 100)], [("a", 200)], [("a", 300)], [("a", 400)]]
    slow = [[("b", 10)], [("b", 20)], [("b", 30)], [("b", 40)]]
    got = two_split_job([fast, slow])
    # records after the first round see min(fast, slow) - 1 = the slow split's time
    wms = {r: wm for r, wm in got}
    assert wms[("a", 200)] == 9 and wms[("a", 300)] == 19 and wms[("a", 400)] == 29
    assert max(wm for _, wm in got) < 40


def test_an_idle_split_does_not_hold_back_the_watermark():
    busy = [[("a", t)] for t in range(100, 1100, 100)]
    quiet = [[("b", 5)]] + [[] for _ in range(9)] + [[("b", 2000)]]
    held = dict(two_split_job([busy, quiet]))
    freed = dict(two_split_job([busy, quiet], idleness=300))
    assert held[("a", 1000)] == 4  # the quiet split pins event time at 5 - 1
    assert freed[("a", 1000)] == 899  # idle after 300 ms: only the busy split counts
    # back from idleness, the split counts again and event time never goes back
    assert freed[("b", 2000)] >= 899


def test_end_of_input_sends_the_max_watermark():
    class Last(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service().register_event_time_timer(10**12)
            return ()

        def on_timer(self, ts, ctx):
            yield ("fired", ts, ctx.timer_service().current_watermark())

    env = StreamExecutionEnvironment()
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner(lambda r, _: r)
    sink = env.from_collection([1], strategy).key_by(lambda r: 0).process(Last()).collect()
    env.execute()
    assert sink.records() == [("fired", 10**12, MAX_WATERMARK)]


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="for_bounded_out_of_orderness"):
        WatermarkStrategy.for_bounded_out_of_orderness(-1)
    with pytest.raises(TypeError, match="with_timestamp_assigner"):
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(3)


def test_timestamp_column_fast_path_matches_assigner():
    recs = [{"id": i, "ts": 50 - i * 3} for i in range(10)]
    out = []
    for assigner in ("ts", lambda r, _: r["ts"]):
        env = StreamExecutionEnvironment(batch_size=3)
        s = WatermarkStrategy.for_bounded_out_of_orderness(5).with_timestamp_assigner(assigner)
        sink = env.from_collection(recs, s).process(SeeWatermark()).collect()
        env.execute()
        out.append((sink.records(), sink.timestamps()))
    assert out[0] == out[1] and out[0][1] == [r["ts"] for r in recs]
