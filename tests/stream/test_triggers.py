"""Triggers and evictors as classes (issue 22): a trigger's per-element
methods drive the record-at-a-time operator and the reference executor alike,
a built-in vectorized trigger's batch decisions equal its per-element ones,
the columnar path stays columnar, and a user's trigger needs no engine change."""

import random

import pytest
import torch

import opforge.stream.executor as executor
from opforge.stream import (Aggregations, CountEvictor, CountTrigger, EventTimeSessionWindows, EventTimeTrigger,
                            GlobalWindows, ProcessWindowFunction, PurgingTrigger, SlidingEventTimeWindows,
                            StreamExecutionEnvironment, TimeEvictor, TimeWindow, Trigger, TriggerResult,
                            TumblingEventTimeWindows, WatermarkStrategy)
from opforge.stream.columnar_windows import ColumnarWindows
from opforge.stream.reference import run_reference
from opforge.stream.triggers import NeverTrigger, fire_mask
from opforge.stream.window_operator import WindowOperator
from stream_helpers import multiset, out_of_order_events


class _Ctx:
    """A trigger context over plain fields (what the operators give a trigger)."""

    def __init__(self, wm):
        self.wm, self.timers = wm, []

    def get_current_watermark(self):
        return self.wm

    def register_event_time_timer(self, t):
        self.timers.append(t)


def test_event_time_trigger_batch_decisions_equal_its_per_element_ones():
    rng = random.Random(3)
    trig = EventTimeTrigger.create()
    assert trig.vectorized
    for _ in range(50):
        ends = [rng.randint(-20, 60) for _ in range(40)]
        before = rng.randint(-30, 40)
        wm = before + rng.randint(0, 30)
        max_ts = torch.tensor(ends)
        windows = [TimeWindow(e - 9, e + 1) for e in ends]
        el = trig.on_element_batch(max_ts, wm)
        assert el.dtype == torch.int8
        assert el.tolist() == [int(trig.on_element(None, 0, w, _Ctx(wm))) for w in windows]
        # a window's timer (registered by on_element while it was on time) fires when due
        want = []
        for w in windows:
            ctx = _Ctx(before)
            res = trig.on_element(None, 0, w, ctx)
            due = [t for t in ctx.timers if before < t <= wm]
            want.append(int(trig.on_event_time(due[0], w, ctx)) if res == TriggerResult.CONTINUE and due else 0)
        got = trig.on_event_time_batch(max_ts, before, wm)
        assert got.tolist() == want
        assert fire_mask(got).tolist() == [bool(v) for v in want]
        after, upto = trig.fire_range(before, wm)
        assert all(after < e <= upto for e, v in zip(ends, want) if v)


def test_trigger_results_and_purging():
    assert TriggerResult.FIRE.is_fire() and not TriggerResult.FIRE.is_purge()
    assert TriggerResult.FIRE_AND_PURGE.is_fire() and TriggerResult.FIRE_AND_PURGE.is_purge()
    assert not TriggerResult.CONTINUE.is_fire() and TriggerResult.PURGE.is_purge()
    p = PurgingTrigger.of(EventTimeTrigger.create())
    w = TimeWindow(0, 10)
    assert p.on_element(None, 0, w, _Ctx(100)) == TriggerResult.FIRE_AND_PURGE
    assert p.on_event_time(9, w, _Ctx(0)) == TriggerResult.FIRE_AND_PURGE
    assert p.on_element(None, 0, w, _Ctx(0)) == TriggerResult.CONTINUE
    with pytest.raises(TypeError, match="expected a Trigger"):
        PurgingTrigger.of(3)


def _build(env, window, trigger=None, evictor=None, fn=None):
    ws = env.from_collection(EVENTS, WatermarkStrategy.for_bounded_out_of_orderness(10)
                             .with_timestamp_assigner("f2")).key_by(0).window(window)
    if trigger is not None:
        ws = ws.trigger(trigger)
    if evictor is not None:
        ws = ws.evictor(evictor)
    return ws.aggregate(fn or Aggregations(with_window=True, n=("count",), total=("sum", "f1"))).collect()


EVENTS = out_of_order_events(200, keys=3, bound=10, seed=5, late=0.1)


def _engine_and_reference(window, trigger=None, evictor=None, fn=None, batch_size=7):
    env = StreamExecutionEnvironment(batch_size=batch_size)
    sink = _build(env, window, trigger, evictor, fn)
    env.execute()
    got = list(zip(sink.records(), sink.timestamps()))
    env = StreamExecutionEnvironment(batch_size=batch_size)
    _build(env, window, trigger, evictor, fn)
    (ref,) = run_reference(env).values()
    return got, ref


def _operator_of(window, trigger=None, evictor=None):
    env = StreamExecutionEnvironment()
    _build(env, window, trigger, evictor)
    t = next(t for t in env.transformations if t.kind == "window")
    return executor.build_operator(t, t.inputs[0].key)


def test_the_columnar_path_is_chosen_by_the_trigger_not_a_kind_string():
    assert isinstance(_operator_of(TumblingEventTimeWindows.of(20)), ColumnarWindows)
    op = _operator_of(SlidingEventTimeWindows.of(30, 10), EventTimeTrigger.create())
    assert isinstance(op, ColumnarWindows) and isinstance(op.trigger, EventTimeTrigger)
    assert isinstance(_operator_of(TumblingEventTimeWindows.of(20), CountTrigger.of(3)), WindowOperator)
    assert isinstance(_operator_of(TumblingEventTimeWindows.of(20), evictor=CountEvictor.of(2)), WindowOperator)


class EveryThirdOrAtTheEnd(Trigger):
    """A user's trigger: early firings every 3 records of a window, and the
    final one when the watermark passes the window's end."""

    def on_element(self, element, timestamp, window, ctx):
        seen = ctx.get_partitioned_state("seen")
        n = seen.value(0) + 1
        seen.update(n)
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.FIRE if n % 3 == 0 else TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def clear(self, window, ctx):
        ctx.get_partitioned_state("seen").clear()
        ctx.delete_event_time_timer(window.max_timestamp())


@pytest.mark.parametrize("window", [TumblingEventTimeWindows.of(40), SlidingEventTimeWindows.of(40, 15)])
def test_a_user_trigger_runs_on_the_engine_and_the_reference_alike(window):
    got, ref = _engine_and_reference(window, EveryThirdOrAtTheEnd())
    assert multiset(got) == multiset(ref)
    final, _ = _engine_and_reference(window)
    assert len(got) > len(final)  # the early firings came on top of the final ones
    assert set(map(repr, final)) <= set(map(repr, got))


@pytest.mark.parametrize("trigger", [None, CountTrigger.of(3), PurgingTrigger.of(CountTrigger.of(2))])
def test_session_windows_merge_trigger_state_through_the_assigner(trigger):
    got, ref = _engine_and_reference(EventTimeSessionWindows.with_gap(12), trigger)
    assert multiset(got) == multiset(ref) and got


def test_merging_windows_need_a_mergeable_trigger():
    env = StreamExecutionEnvironment()
    ks = env.from_collection([(1, 1, 1)]).key_by(0)
    with pytest.raises(TypeError, match="cannot merge"):
        ks.window(EventTimeSessionWindows.with_gap(5)).trigger(EveryThirdOrAtTheEnd())
    assert isinstance(GlobalWindows.create().get_default_trigger(), NeverTrigger)


def test_the_assigner_merges_windows():
    a = EventTimeSessionWindows.with_gap(10)
    live = {TimeWindow(0, 10), TimeWindow(30, 40), TimeWindow(60, 70)}
    assert a.merge_into(live, TimeWindow(5, 15)) == (TimeWindow(0, 15), [TimeWindow(0, 10)])
    merged, hits = a.merge_into(live, TimeWindow(10, 30))  # touches both neighbours
    assert merged == TimeWindow(0, 40) and sorted(hits) == [TimeWindow(0, 10), TimeWindow(30, 40)]
    assert a.merge_into(live, TimeWindow(45, 55)) == (TimeWindow(45, 55), [])
    calls = []
    a.merge_windows([TimeWindow(0, 5), TimeWindow(3, 8), TimeWindow(20, 25)], lambda run, r: calls.append((run, r)))
    assert calls == [([TimeWindow(0, 5), TimeWindow(3, 8)], TimeWindow(0, 8))]


class Collect(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield (key, context.window().start, sorted(e[1] for e in elements))


def test_count_and_time_evictors_on_engine_and_reference():
    events = [("a", i, t) for i, t in enumerate([1, 3, 5, 7, 9, 11, 13])]

    def job(env, evictor, trigger=None):
        ws = env.from_collection(events, WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("f2")) \
            .key_by(0).window(TumblingEventTimeWindows.of(100))
        if trigger is not None:
            ws = ws.trigger(trigger)
        return ws.evictor(evictor).process(Collect()).collect()

    for evictor, trigger, want in (
            (CountEvictor.of(2), None, [("a", 0, [5, 6])]),
            (TimeEvictor.of(4), None, [("a", 0, [5, 6])]),  # kept: ts > 13 - 4
            # every 3 records; what the evictor keeps stays: [0 1 2] -> [1 2], + 3 4 5 -> [4 5], + 6 (no firing)
            (CountEvictor.of(2), CountTrigger.of(3), [("a", 0, [1, 2]), ("a", 0, [4, 5])]),
            (CountEvictor.of(1, do_evict_after=True), CountTrigger.of(3),
             [("a", 0, [0, 1, 2]), ("a", 0, [2, 3, 4, 5])])):
        env = StreamExecutionEnvironment(batch_size=3)
        sink = job(env, evictor, trigger)
        env.execute()
        assert sink.records() == want, (evictor, trigger)
        env = StreamExecutionEnvironment(batch_size=3)
        job(env, evictor, trigger)
        assert [r for r, _ in next(iter(run_reference(env).values()))] == want
    with pytest.raises(ValueError, match="CountEvictor"):
        CountEvictor.of(0)


def test_an_evictor_with_an_aggregate_function_folds_the_kept_records():
    got, ref = _engine_and_reference(TumblingEventTimeWindows.of(40), evictor=CountEvictor.of(2))
    assert multiset(got) == multiset(ref)
    assert all(r["n"] <= 2 for r, _ in got)
