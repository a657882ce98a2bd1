"""PyFlink DataStream API parity (issue 26): the calls a PyFlink job makes
run here unchanged, and give what the record-at-a-time reference gives."""

import pytest

from opforge.stream import (Aggregations, Evictor, FileSink, KeyedBroadcastProcessFunction, MapStateDescriptor,
                            OutputTag, RestartStrategies, Row, SimulatedClock, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, Types, ValueStateDescriptor, WatermarkStrategy,
                            read_committed)
from opforge.stream.reference import run_reference
from stream_helpers import multiset, out_of_order_events

EVENTS = out_of_order_events(160, keys=4, bound=15, seed=7, late=0.08)
LATE = OutputTag("late")


def engine_and_reference(job, parallelism, batch_size):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sinks = job(env)
    env.execute()
    ref_env = StreamExecutionEnvironment(batch_size=batch_size)
    ref_sinks = job(ref_env)
    out = run_reference(ref_env)
    return ([multiset(zip(s.records(), s.timestamps())) for s in sinks],
            [multiset(out.get(s, [])) for s in ref_sinks])


def stamped_windows(env):
    """Timestamps and watermarks assigned after a map, not at the source (one
    subtask: parallel assigners would each make watermarks of their share)."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(15).with_timestamp_assigner(lambda r, _: r[2])
    w = env.from_collection(EVENTS).map(lambda r: (r[0], r[1] * 2, r[2])).set_parallelism(1) \
        .assign_timestamps_and_watermarks(strategy) \
        .key_by(0).window(TumblingEventTimeWindows.of(40)).side_output_late_data(LATE) \
        .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
    return [w.collect(), w.get_side_output(LATE).collect()]


def test_assign_timestamps_and_watermarks_matches_the_reference_at_any_batch_size():
    results = set()
    for parallelism, batch_size in ((1, 1), (1, 9), (2, 100)):
        got, want = engine_and_reference(stamped_windows, parallelism, batch_size)
        assert got == want and all(want)  # windows and late records
        results.add(repr(got))
    assert len(results) == 1
    with pytest.raises(TypeError, match="WatermarkStrategy"):
        StreamExecutionEnvironment().from_collection([1]).assign_timestamps_and_watermarks(15)


RULES = MapStateDescriptor("thresholds", Types.INT(), Types.INT())


class Alert(KeyedBroadcastProcessFunction):
    """Broadcast rules set a threshold per key; a record above it alerts and
    sets a timer that reports the key's record count (keyed state)."""

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n"))

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        return ()

    def process_element(self, value, ctx):
        self.n.update((self.n.value() or 0) + 1)
        rules = ctx.get_broadcast_state(RULES)
        with pytest.raises(TypeError, match="only read"):
            rules.put(value[0], 0)
        limit = rules.get(value[0])
        if limit is not None and value[1] > limit:
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10)
            yield ("alert", value[0], value[1], limit)

    def on_timer(self, ts, ctx):
        yield ("timer", ctx.get_current_key(), ts, self.n.value())


def broadcast_job(env):
    src = env.from_collection(EVENTS, WatermarkStrategy.for_bounded_out_of_orderness(15)
                              .with_timestamp_assigner("f2"))
    rules = src.filter(lambda r: r[1] % 7 == 0).set_parallelism(1) \
        .map(lambda r: (r[0], r[1] // 2, r[2])).set_parallelism(1).broadcast(RULES)
    events = src.filter(lambda r: r[1] % 7 != 0).set_parallelism(1)
    return [events.key_by(0).connect(rules).process(Alert()).collect()]


@pytest.mark.parametrize("parallelism,batch_size", [(1, 1), (3, 16)])
def test_keyed_broadcast_state_matches_the_reference(parallelism, batch_size):
    got, want = engine_and_reference(broadcast_job, parallelism, batch_size)
    assert got == want
    kinds = {r[0][0] for r in want[0]}
    assert kinds == {"alert", "timer"}


def test_rows_lists_and_pyflink_keyword_arguments():
    env = StreamExecutionEnvironment(batch_size=2)
    row = Types.ROW_NAMED(["name", "v"], [Types.STRING(), Types.DOUBLE()])
    typed = env.from_collection([("a", 1), ("b", 2), ("a", 4)], type_info=row)
    doubled = typed.map(lambda r: Row(name=r.name, v=r["v"] * 2), output_type=row)
    sums = doubled.key_by(lambda r: r.name, key_type=Types.STRING()).reduce(lambda a, b: Row(name=a.name, v=a.v + b.v))
    with sums.execute_and_collect() as it:
        got = list(it)
    assert got == [Row(name="a", v=2.0), Row(name="b", v=4.0), Row(name="a", v=10.0)]
    assert repr(got[0]) == "Row(name='a', v=2.0)" and got[0].as_dict() == {"name": "a", "v": 2.0}

    env = StreamExecutionEnvironment(batch_size=2)
    lists = env.from_collection([[1, 5], [2, 6], [1, 7]]).key_by(0).sum(1)
    assert list(lists.execute_and_collect()) == [[1, 5], [2, 6], [1, 12]]

    env = StreamExecutionEnvironment(batch_size=2)
    wrong = env.from_collection([1, 2]).map(str, output_type=Types.INT())
    with pytest.raises(TypeError, match=r"'1' is not of the declared type Types.INT\(\)"):
        list(wrong.execute_and_collect())
    with pytest.raises(TypeError, match="Types"):
        env.from_collection([1]).map(str, output_type="int")


def test_a_window_column_clash_names_both_columns():
    with pytest.raises(ValueError, match="'key' clashes with the window column 'key'"):
        Aggregations(with_window=True, key=("sum", "f2"))
    Aggregations(key=("sum", "f2"))  # without the window's columns there is no clash


def test_a_parallel_collection_source():
    env = StreamExecutionEnvironment(parallelism=2, batch_size=3)
    src = env.from_collection(list(range(20)))
    assert src.get_parallelism() == 1  # Flink's fromCollection is not parallel by default
    sink = src.set_parallelism(2).map(lambda x: x * 10).collect()
    assert src.get_parallelism() == 2
    env.execute()
    assert sorted(sink.records()) == [x * 10 for x in range(20)]


class KeepEven(Evictor):
    """A user evictor: only even values reach the window function."""

    def evict_before(self, elements, window, ctx):
        return [(r, ts) for r, ts in elements if r[1] % 2 == 0]


def test_a_user_evictor_matches_the_reference():
    def job(env):
        s = WatermarkStrategy.for_bounded_out_of_orderness(15).with_timestamp_assigner("f2")
        w = env.from_collection(EVENTS, s).key_by(0).window(TumblingEventTimeWindows.of(40)).evictor(KeepEven())
        return [w.reduce(lambda a, b: (a[0], a[1] + b[1], b[2])).collect()]

    got, want = engine_and_reference(job, 2, 8)
    assert got == want and want[0] and all(r[1] % 2 == 0 for r, _ in want[0])


def fail_once(at, failed):
    """A map that raises once, at the ``at``-th record it sees (a plain function:
    subtasks and restarts share it, as they would share an outside cause)."""
    seen = [0]

    def check(r):
        seen[0] += 1
        if seen[0] == at and not failed:
            failed.append(at)
            raise RuntimeError("injected failure")
        return r

    return check


def restarting_job(tmp_path, strategy, fail_at):
    env = StreamExecutionEnvironment(batch_size=10, clock=SimulatedClock(step_ms=100))
    env.enable_checkpointing(200, str(tmp_path / "ckpt"))
    if strategy is not None:
        env.set_restart_strategy(strategy)
    failed = []
    env.from_collection([(i % 3, i) for i in range(60)]).map(fail_once(fail_at, failed)) \
        .key_by(0).sum(1).sink_to(FileSink(tmp_path / "out", "json"))
    return env, failed


def test_a_fixed_delay_restart_resumes_from_the_last_checkpoint(tmp_path):
    env, failed = restarting_job(tmp_path, RestartStrategies.fixed_delay_restart(2, 500), fail_at=35)
    result = env.execute()
    assert failed == [35] and result.restarts == 1 and result.restored_from is not None
    got = read_committed(tmp_path / "out").to_pylist()
    sums, want = {}, []
    for i in range(60):
        sums[i % 3] = sums.get(i % 3, 0) + i
        want.append({"f0": i % 3, "f1": sums[i % 3]})
    assert multiset(got) == multiset(want)  # exactly once across the restart


def test_no_restart_strategy_or_a_spent_one_fails_the_job(tmp_path):
    env, _ = restarting_job(tmp_path / "a", None, fail_at=5)
    with pytest.raises(Exception, match="injected failure"):
        env.execute()
    env, _ = restarting_job(tmp_path / "b", RestartStrategies.failure_rate_restart(0, 60_000, 10), fail_at=5)
    with pytest.raises(Exception, match="injected failure"):
        env.execute()
    with pytest.raises(TypeError, match="RestartStrategies"):
        env.set_restart_strategy(3)
