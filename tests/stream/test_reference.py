"""The micro-batch engine against the record-at-a-time reference executor on
random out-of-order streams, and the properties of event time: any order
within the out-of-orderness bound, and any micro-batch size, give the same
windows."""

import zlib

import pytest

from opforge.stream import (AggregateFunction, Aggregations, EventTimeSessionWindows, KeyedProcessFunction,
                            OutputTag, ProcessWindowFunction, SlidingEventTimeWindows,
                            StreamExecutionEnvironment, TumblingEventTimeWindows, ValueStateDescriptor,
                            WatermarkStrategy)
from opforge.stream.reference import run_reference
from stream_helpers import multiset, out_of_order_events, permute_within

BOUND = 20
LATE = OutputTag("late")


class SumCount(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        return [acc[0] + value[1], acc[1] + 1]

    def get_result(self, acc):
        return tuple(acc)

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


class Describe(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield (key, w.start, w.end, len(elements), sum(e[1] for e in elements))


WINDOWS = {
    "tumbling": lambda: TumblingEventTimeWindows.of(50),
    "sliding": lambda: SlidingEventTimeWindows.of(60, 25),
    "session": lambda: EventTimeSessionWindows.with_gap(15),
}
FUNCTIONS = {
    "columnar": lambda w: w.aggregate(Aggregations(with_window=True, n=("count",), s=("sum", "f1"),
                                                   lo=("min", "f1"), hi=("max", "f1"))),
    "aggregate": lambda w: w.aggregate(SumCount()),
    "reduce": lambda w: w.reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2]))),
    "process": lambda w: w.process(Describe()),
}


def build(env, events, window, function, lateness, bound=BOUND):
    s = WatermarkStrategy.for_bounded_out_of_orderness(bound).with_timestamp_assigner("f2")
    w = env.from_collection(events, s).key_by(0).window(WINDOWS[window]()).allowed_lateness(lateness) \
        .side_output_late_data(LATE)
    out = FUNCTIONS[function](w)
    return out.collect(), out.get_side_output(LATE).collect()


def engine(events, window, function, lateness=0, parallelism=1, batch_size=16, bound=BOUND):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    main, side = build(env, events, window, function, lateness, bound)
    env.execute()
    return multiset(zip(main.records(), main.timestamps())), multiset(side.records())


def reference(events, window, function, lateness=0, batch_size=16, bound=BOUND):
    env = StreamExecutionEnvironment(batch_size=batch_size)
    main, side = build(env, events, window, function, lateness, bound)
    out = run_reference(env)
    return multiset(out.get(main, [])), multiset(r for r, _ in out.get(side, []))


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_engine_matches_reference_with_late_data(window, function):
    events = out_of_order_events(250, keys=4, bound=BOUND, seed=zlib.crc32(f"{window}-{function}".encode()), late=0.15)
    want = reference(events, window, function, lateness=10, batch_size=4)
    assert want[0] and want[1], "the stream should fire windows and have late records"
    assert engine(events, window, function, lateness=10, parallelism=1, batch_size=4) == want
    assert engine(events, window, function, lateness=10, parallelism=3, batch_size=4) == want


@pytest.mark.parametrize("window", list(WINDOWS))
def test_any_permutation_within_the_bound_gives_the_same_windows(window):
    events = out_of_order_events(300, keys=5, bound=BOUND // 2, seed=11, late=0.0)
    base = reference(sorted(events, key=lambda e: e[2]), window, "columnar")
    assert base[0] and not base[1]
    for seed in range(3):
        shuffled = permute_within(events, BOUND, seed)
        assert shuffled != events
        assert reference(shuffled, window, "columnar") == base
        assert engine(shuffled, window, "columnar", parallelism=2, batch_size=7 + seed) == base


@pytest.mark.parametrize("function", ["columnar", "process"])
def test_micro_batch_size_does_not_change_results(function):
    events = out_of_order_events(300, keys=3, bound=BOUND, seed=5, late=0.0)
    results = {engine(events, "sliding", function, batch_size=b)[0].__repr__() for b in (1, 4, 33, 1000)}
    assert len(results) == 1


def test_empty_stream_and_single_event_keys():
    assert engine([], "tumbling", "columnar") == ([], [])
    events = [(k, k, k * 100) for k in range(5)]
    got = engine(events, "tumbling", "columnar", batch_size=2)
    assert got == reference(events, "tumbling", "columnar", batch_size=2)
    assert [r["n"] for r, _ in got[0]] == [1] * 5


class Flag(KeyedProcessFunction):
    """Main output: running count per key; side output: records below zero;
    a timer 30 ms after each record reports the key's count then."""

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n"))

    def process_element(self, value, ctx):
        self.n.update((self.n.value() or 0) + 1)
        if value[1] < 0:
            ctx.output(NEGATIVE, value)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 30)
        yield (ctx.get_current_key(), self.n.value())

    def on_timer(self, ts, ctx):
        yield ("timer", ctx.get_current_key(), ts, self.n.value())


NEGATIVE = OutputTag("negative")


@pytest.mark.parametrize("parallelism,batch_size", [(1, 1), (2, 5), (4, 64)])
def test_process_function_and_rolling_outputs_match_reference(parallelism, batch_size):
    events = out_of_order_events(200, keys=5, bound=BOUND, seed=parallelism, late=0.1)

    def job(env):
        s = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f2")
        ks = env.from_collection(events, s).key_by(0)
        proc = ks.process(Flag())
        return [proc.collect(), proc.get_side_output(NEGATIVE).collect(), ks.sum(1).collect(),
                ks.max(1).collect(), ks.reduce(lambda a, b: (a[0], a[1] - b[1], b[2])).collect()]

    # record granularity: a timer registered behind the watermark (a late record) fires at the next advance,
    # not when the end of its batch delivers a watermark equal to one its records already saw (seed 2 here)
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sinks = job(env)
    env.execute()
    got = [multiset(zip(s.records(), s.timestamps())) for s in sinks]
    ref_env = StreamExecutionEnvironment(batch_size=batch_size)
    ref_sinks = job(ref_env)
    out = run_reference(ref_env)
    want = [multiset(out.get(s, [])) for s in ref_sinks]
    assert got == want and all(want)
