"""Columnar joins (``opforge.stream.columnar_join``) against their record-at-a-time
forms on the engine (the same records, times and order), against the
reference executor and against brute-force pairs; checkpoints taken
mid-stream; Nexmark q3 / q4 / q8 columnar against their record forms."""

import pytest
import torch

from opforge.stream import (CoGroupFunction, CollectionSource, FileSink, FlatJoinFunction, JoinFunction, SimulatedClock,
                            SlidingEventTimeWindows, SplitSource, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy, vectorized)
from opforge.stream.columnar_join import RegularJoin, RegularJoinOperator, WindowJoinOperator
from opforge.stream.executor import build_operator
from opforge.stream.nexmark import (NexmarkConfig, RunningAverageOperator, WinningBidsOperator, generate, q3, q4,
                                    q8)
from opforge.stream.operators import CoProcessOperator, ProcessOperator
from stream_helpers import multiset, out_of_order_events, reference_outputs, run_with_failures

BOUND = 15
WINDOWS = {
    "tumbling": lambda: TumblingEventTimeWindows.of(30),
    "sliding": lambda: SlidingEventTimeWindows.of(60, 20),
    "sliding-ragged": lambda: SlidingEventTimeWindows.of(50, 20, 5),  # size not a multiple of the slide
}


@vectorized
def vector_pair(first, second):
    return {"f0": first["f0"], "f1": first["f1"], "f2": second["f1"]}


class Pair(JoinFunction):
    def join(self, first, second):
        return (first[0], first[1], second[1])


@vectorized
def vector_difference(first, second):
    """The flat join: pairs whose first value is larger, with the difference."""
    rows = torch.nonzero(first["f1"] > second["f1"]).flatten()
    return {"f0": first["f0"][rows], "f1": (first["f1"] - second["f1"])[rows], "__row__": rows}


class Difference(FlatJoinFunction):
    def join(self, first, second):
        if first[1] > second[1]:
            yield (first[0], first[1] - second[1])


def two_sides(env, events, batches=None):
    """Even values left, odd values right, from one source (the reference models
    one); ``batches``: the source's micro-batches exactly (empty ones too)."""
    s = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f2")
    if batches is None:
        src = env.from_collection(events, s)
    else:
        source = SplitSource([batches])
        source.max_parallelism = 1
        src = env.from_source(source, s)
    left = src.filter(lambda r: r[1] % 2 == 0).set_parallelism(1)
    right = src.filter(lambda r: r[1] % 2 != 0).set_parallelism(1)
    return left, right


def window_join(fn, window, flat=False, batches=None):
    def job(env, events):
        left, right = two_sides(env, events, batches)
        joined = left.join(right).where(0).equal_to(lambda r: r[0]).window(WINDOWS[window]())
        return (joined.with_flat_join(fn) if flat else joined.apply(fn)).collect()

    return job


def regular_join(fn):
    def job(env, events):
        left, right = two_sides(env, events)
        return left.connect(right).key_by(0, 0).process(RegularJoin(fn)).collect()

    return job


def engine(job, events, parallelism, batch_size, granularity="record"):
    """The sink's (record, timestamp) pairs in arrival order."""
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size,
                                     watermark_granularity=granularity)
    sink = job(env, events)
    env.execute()
    return list(zip(sink.records(), sink.timestamps()))


def window_pairs(events, size, slide, offset=0):
    """Brute force: every (left, right) of a key in a common window, at its end - 1."""
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]
    out = []
    for a in left:
        for b in right:
            if a[0] != b[0]:
                continue
            start = a[2] - (a[2] - offset) % slide
            while start > a[2] - size:
                if start <= b[2] < start + size:
                    out.append(((a[0], a[1], b[1]), start + size - 1))
                start -= slide
    return multiset(out)


def brute_force(events, window):
    w = WINDOWS[window]()
    return window_pairs(events, w.size, w.slide, w.offset)


def operator_of(env, name):
    t = next(t for t in env.transformations if t.name == name)
    return build_operator(t, next(i.key for i in t.inputs if i.key is not None))


# -- window join ---------------------------------------------------------------------

def test_a_vectorized_join_function_gets_the_columnar_operator():
    env = StreamExecutionEnvironment()
    left, right = two_sides(env, [(0, 0, 0)])
    left.join(right).where(0).equal_to(0).window(TumblingEventTimeWindows.of(10)).apply(vector_pair).name("V")
    left.join(right).where(0).equal_to(0).window(TumblingEventTimeWindows.of(10)).apply(Pair()).name("R")
    left.co_group(right).where(0).equal_to(0).window(TumblingEventTimeWindows.of(10)) \
        .apply(lambda a, b: [len(a)]).name("G")
    assert isinstance(operator_of(env, "V"), WindowJoinOperator)
    assert type(operator_of(env, "R")) is CoProcessOperator
    assert type(operator_of(env, "G")) is CoProcessOperator


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("late", [0.0, 0.1])
def test_vectorized_window_join_equals_the_record_path(window, late):
    events = out_of_order_events(300, keys=5, bound=BOUND, seed=len(window) + int(late * 10), late=late)
    for parallelism, batch_size in ((1, 1), (1, 7), (2, 32), (3, 500)):
        got = engine(window_join(vector_pair, window), events, parallelism, batch_size)
        assert got == engine(window_join(Pair(), window), events, parallelism, batch_size), (parallelism, batch_size)
    got = multiset(engine(window_join(vector_pair, window), events, 2, 9))
    assert got == reference_outputs(window_join(vector_pair, window), events, 9)  # the record form, late rows dropped
    everything = brute_force(events, window)
    if late:
        assert len(got) < len(everything) and all(g in everything for g in got)
    else:
        assert got == everything and len(got) > 50


@pytest.mark.parametrize("window", ["tumbling", "sliding-ragged"])
def test_micro_batch_size_does_not_change_the_window_join(window):
    events = out_of_order_events(250, keys=4, bound=BOUND, seed=7)
    want = brute_force(events, window)
    for batch_size in (1, 4, 33, 1000):
        assert multiset(engine(window_join(vector_pair, window), events, 2, batch_size)) == want, batch_size


def test_empty_batches_and_keys_with_one_row():
    events = out_of_order_events(120, keys=3, bound=BOUND, seed=3)
    events += [(100 + i, 2 * i, 40 * i) for i in range(10)]  # keys seen once, left only
    events += [(200, 4, 95), (200, 5, 99)]  # one row a side, in one window
    events.sort(key=lambda e: e[2])
    batches = [[]] + [events[i:i + 9] for i in range(0, len(events), 9)]
    for i in range(len(batches) - 1, 0, -3):
        batches.insert(i, [])  # nothing polled these rounds
    want = brute_force(events, "tumbling")
    assert ((200, 4, 5), 119) in want
    for fn in (vector_pair, Pair()):
        assert multiset(engine(window_join(fn, "tumbling", batches=batches), events, 1, 9)) == want
    assert engine(window_join(vector_pair, "tumbling"), [], 1, 9) == []


def test_vectorized_flat_join_equals_the_record_path():
    events = out_of_order_events(250, keys=3, bound=BOUND, seed=8, late=0.05)
    for parallelism, batch_size in ((1, 11), (3, 64)):
        got = engine(window_join(vector_difference, "sliding", flat=True), events, parallelism, batch_size)
        assert got and got == engine(window_join(Difference(), "sliding", flat=True), events, parallelism,
                                     batch_size)
    assert multiset(got) == reference_outputs(window_join(vector_difference, "sliding", flat=True), events, 64)


# -- regular join ----------------------------------------------------------------------

def test_regular_join_equals_its_record_form_and_every_pair():
    events = out_of_order_events(200, keys=6, bound=BOUND, seed=9)  # many rows per key on both sides
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]
    want = multiset([(a[0], a[1], b[1]) for a in left for b in right if a[0] == b[0]])
    for parallelism, batch_size in ((1, 1), (2, 13), (3, 500)):
        got = engine(regular_join(vector_pair), events, parallelism, batch_size)
        assert got == engine(regular_join(Pair()), events, parallelism, batch_size)
        assert multiset(r for r, _ in got) == want
    # one record a batch: the engine sees the records in the reference's order, so
    # a pair's time (its later record's) is the same too
    got = engine(regular_join(vector_pair), events, 2, 1)
    assert multiset(got) == reference_outputs(regular_join(vector_pair), events, 1)
    env = StreamExecutionEnvironment()
    regular_join(vector_pair)(env, events)
    assert isinstance(operator_of(env, "KeyedCoProcess"), RegularJoinOperator)


# -- checkpoints -------------------------------------------------------------------------

class _FailAt:
    """A map that fails at its ``at``-th record (None: never)."""

    def __init__(self, at):
        self.at, self.seen = at, 0

    def map(self, value):
        self.seen += 1
        if self.seen == self.at:
            raise _Boom(f"injected failure at record {self.at}")
        return value


class _Boom(RuntimeError):
    pass


def _rows(path):
    from checkpoint_job import per_subtask_rows

    return multiset([r for part in per_subtask_rows(path).values() for r in part])


def _crash_and_restore(tmp_path, build, fail_ats, sinks):
    """Outputs of an uninterrupted run, and of runs that fail at ``fail_ats`` and
    restore from the latest checkpoint (one each round or two), then finish."""

    def env_():
        return StreamExecutionEnvironment(parallelism=2, batch_size=64, clock=SimulatedClock(step_ms=100))

    ref, out = run_with_failures(env_, build, tmp_path, fail_ats, _Boom)
    for sink in sinks:
        want = _rows(ref / sink)
        assert want and _rows(out / sink) == want, sink


@vectorized
def _dict_pair(first, second):
    return {"key": first["key"], "a": first["value"], "b": second["value"]}


def both_joins(evs, size, slide):
    """A job of ``run_with_failures``' shape: a sliding window join and a regular join of the even- and
    odd-valued events of ``evs`` (event time ``ts``, bound 20), each into its exactly-once sink."""
    def build(env, out, fail_at):
        s = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
        src = env.from_source(CollectionSource(evs), s, "events")
        left = src.filter(lambda r: r["value"] % 2 == 0)
        right = src.filter(lambda r: r["value"] % 2 != 0)
        left.join(right).where("key").equal_to("key").window(SlidingEventTimeWindows.of(size, slide)) \
            .apply(_dict_pair).map(_FailAt(fail_at)).sink_to(FileSink(out / "window", "json"))
        left.connect(right).key_by("key", "key").process(RegularJoin(_dict_pair)) \
            .sink_to(FileSink(out / "regular", "json"))

    return build


def test_columnar_join_state_survives_a_failure_and_restore(tmp_path):
    evs = [{"key": k, "value": v, "ts": t}
           for k, v, t in out_of_order_events(400, keys=4, bound=20, seed=12, late=0.05)]
    _crash_and_restore(tmp_path, both_joins(evs, 40, 20), (40, 300), ("window", "regular"))


@pytest.mark.parametrize("query", [q3, q4, q8])
def test_nexmark_join_state_survives_a_failure_and_restore(tmp_path, query):
    config = NexmarkConfig(events=12_000, events_per_second=1000, max_out_of_orderness_ms=300, seed=2)

    def build(env, out, fail_at):
        query(env, config).map(_FailAt(fail_at)).set_parallelism(1).sink_to(FileSink(out / "q", "json"))

    _crash_and_restore(tmp_path, build, (3, 6) if query is q3 else (30, 120), ("q",))


# -- Nexmark q3, q4, q8 ------------------------------------------------------------------

def nexmark(query, config, columnar, parallelism=2, batch_size=1000, source=None, watermark_granularity="record"):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size,
                                     watermark_granularity=watermark_granularity)
    sink = (query(env, config) if source is None else query(env, config, source=source)).collect()
    kinds = set()
    for t in env.transformations:
        fn = t.params.get("fn")
        if hasattr(fn, "columnar"):
            fn.columnar = columnar
        if t.kind in ("process", "co_process"):
            kinds.add(type(operator_of(env, t.name)))
    env.execute(query.__name__)
    return list(zip(sink.records(), sink.timestamps())), kinds


@pytest.mark.parametrize("query,operators", [(q3, {RegularJoinOperator}), (q8, {WindowJoinOperator}),
                                             (q4, {WinningBidsOperator, RunningAverageOperator})])
def test_nexmark_joins_run_columnar_and_equal_their_record_forms(query, operators):
    """Same records, times and order (q4's running averages depend on the order
    in which auctions close) as the record-at-a-time functions."""
    for seed, ooo, parallelism, batch_size in ((0, 300, 1, 997), (1, 0, 2, 300), (2, 1000, 3, 5000)):
        config = NexmarkConfig(events=20_000, events_per_second=1000, max_out_of_orderness_ms=ooo, seed=seed)
        got, kinds = nexmark(query, config, True, parallelism, batch_size)
        assert kinds == operators
        want, kinds = nexmark(query, config, False, parallelism, batch_size)
        assert kinds == ({CoProcessOperator, ProcessOperator} if query is q4 else {CoProcessOperator})
        assert got and got == want, (seed, parallelism, batch_size)


def lagging_source(config, lag_rounds, batch):
    """Each kind's events in ``batch``-sized micro-batches; auctions start
    ``lag_rounds`` rounds late (bids come before their auctions and wait)."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(config.max_out_of_orderness_ms) \
        .with_timestamp_assigner("date_time")

    def source(env, config, kind):
        recs = generate(config, kind, 0, config.events, "cpu").records()
        batches = [recs[i:i + batch] for i in range(0, len(recs), batch)]
        if kind == "auction":
            batches = [[]] * lag_rounds + batches
        split = SplitSource([batches])
        split.max_parallelism = 1
        return env.from_source(split, strategy, f"{kind}s")

    return source


def test_q4_bids_before_their_auctions():
    from test_nexmark_queries import check_q4

    config = NexmarkConfig(events=15_000, events_per_second=1000, max_out_of_orderness_ms=200, seed=4)
    source = lagging_source(config, lag_rounds=3, batch=150)
    got, _ = nexmark(q4, config, True, 2, 100, source)
    assert got == nexmark(q4, config, False, 2, 100, source)[0]
    check_q4([r for r, _ in got], config)


def test_q4_closes_auctions_in_the_record_paths_timer_order():
    """Two auctions close at the same time: the one whose timer a waiting bid
    registered first (``date_time + 1 == expires``) closes first."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner("date_time")
    auctions = [[], [], [{"id": 1, "seller": 0, "category": 11, "initial_bid": 0, "reserve": 0, "date_time": 10,
                          "expires": 100},
                         {"id": 2, "seller": 0, "category": 11, "initial_bid": 0, "reserve": 0, "date_time": 12,
                          "expires": 100}]]
    bids = [[{"auction": 2, "bidder": 0, "price": 7, "date_time": 99}], [],
            [{"auction": 1, "bidder": 0, "price": 5, "date_time": 50},
             {"auction": 2, "bidder": 0, "price": 3, "date_time": 60}],
            [{"auction": 9, "bidder": 0, "price": 3, "date_time": 120}]]

    def source(env, config, kind):
        split = SplitSource([auctions if kind == "auction" else bids])
        split.max_parallelism = 1
        return env.from_source(split, strategy, f"{kind}s")

    config = NexmarkConfig(events=0)
    got, _ = nexmark(q4, config, True, 1, 10, source)
    assert got == nexmark(q4, config, False, 1, 10, source)[0]
    assert [r for r, _ in got] == [{"category": 11, "avg": 7.0, "auctions": 1},
                                   {"category": 11, "avg": 6.0, "auctions": 2}]


# -- co-group ------------------------------------------------------------------------------

@vectorized
def vector_summary(first, second, groups):
    """Per group: its key, row counts, the first input's value sum, the second's largest value (or None-ish -999)."""
    g = groups.count
    s0 = torch.zeros(g, dtype=torch.int64).index_add_(0, groups.first_group, first["f1"]) if len(first) else \
        torch.zeros(g, dtype=torch.int64)
    m1 = torch.full((g,), -999, dtype=torch.int64)
    if len(second):
        m1 = m1.scatter_reduce(0, groups.second_group, second["f1"], "amax")
    n0, n1 = groups.first_offsets.diff(), groups.second_offsets.diff()
    key = torch.full((g,), -1, dtype=torch.int64)
    if len(first):
        key = key.scatter_reduce(0, groups.first_group, first["f0"], "amax")
    if len(second):
        key = key.scatter_reduce(0, groups.second_group, second["f0"], "amax")
    return {"f0": key, "f1": n0, "f2": n1, "f3": s0, "f4": m1}


class Summary(CoGroupFunction):
    def co_group(self, first, second):
        key = (first or second)[0][0]
        yield (key, len(first), len(second), sum(r[1] for r in first), max((r[1] for r in second), default=-999))


@vectorized
def vector_each_first(first, second, groups):
    """A flat co-group: one row per first-input record of groups with at least two second-input records."""
    n1 = groups.second_offsets.diff()
    rows = torch.nonzero(n1.index_select(0, groups.first_group) >= 2).flatten()
    return {"f0": first["f0"][rows], "f1": first["f1"][rows], "__group__": groups.first_group[rows]} \
        if len(first) else {"f0": torch.zeros(0, dtype=torch.int64), "f1": torch.zeros(0, dtype=torch.int64),
                             "__group__": torch.zeros(0, dtype=torch.int64)}


class EachFirst(CoGroupFunction):
    def co_group(self, first, second):
        if len(second) >= 2:
            for r in first:
                yield (r[0], r[1])


def co_group_job(fn, window):
    def job(env, events):
        left, right = two_sides(env, events)
        return left.co_group(right).where(0).equal_to(lambda r: r[0]).window(WINDOWS[window]()).apply(fn).collect()

    return job


@pytest.mark.parametrize("window", ["tumbling", "sliding-ragged"])
def test_vectorized_co_group_equals_the_record_path(window):
    from opforge.stream.columnar_cogroup import WindowCoGroupOperator

    events = out_of_order_events(150, keys=4, bound=BOUND, seed=31, late=0.1)
    shapes = ((1, 1, "record"), (2, 37, "record"), (1, 1024, "record"), (2, 37, "batch"), (1, 1024, "batch"))
    for parallelism, batch_size, granularity in shapes if window != "tumbling" else shapes[1:4]:
        for vector, record in ((vector_summary, Summary()), (vector_each_first, EachFirst())):
            got = engine(co_group_job(vector, window), events, parallelism, batch_size, granularity)
            assert got and got == engine(co_group_job(record, window), events, parallelism, batch_size, granularity)
    got = multiset(engine(co_group_job(vector_summary, window), events, 2, 37))
    assert got == reference_outputs(co_group_job(vector_summary, window), events, 37)
    assert any(r[1] == 0 for r, _ in got) and any(r[2] == 0 for r, _ in got)  # groups with one side empty
    env = StreamExecutionEnvironment()
    co_group_job(vector_summary, window)(env, events)
    assert isinstance(operator_of(env, "WindowCoGroup"), WindowCoGroupOperator)
