"""The columnar interval join (``opforge.stream.columnar_interval_join``)
against its record-at-a-time form (``IntervalJoinFunction`` with a plain
``ProcessJoinFunction``): the same records, times and order at every batch
size and both watermark granularities, late rows to side outputs, against
brute-force pairs, and across a failure, restore and rescale."""

from collections import Counter

import pytest
import torch

from opforge.stream import (CollectionSource, FileSink, OutputTag, ProcessJoinFunction, SimulatedClock,
                            StreamExecutionEnvironment, WatermarkStrategy, vectorized)
from opforge.stream.columnar_interval_join import IntervalJoinOperator
from opforge.stream.operators import CoProcessOperator
from stream_helpers import multiset, out_of_order_events, reference_outputs, run_with_failures
from test_columnar_joins import _Boom, _FailAt, operator_of

BOUND = 15
LEFT_LATE, RIGHT_LATE = OutputTag("left-late"), OutputTag("right-late")


@vectorized
def vector_pair(left, right):
    return {"f0": left["f0"], "f1": left["f1"], "f2": right["f1"], "f3": right["f2"] - left["f2"]}


class Pair(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        assert ctx.get_timestamp() == max(left[2], right[2])
        yield (left[0], left[1], right[1], right[2] - left[2])


@vectorized
def vector_bigger(left, right):
    """A flat join: only pairs whose left value is the larger."""
    rows = torch.nonzero(left["f1"] > right["f1"]).flatten()
    return {"f0": left["f0"][rows], "f1": (left["f1"] - right["f1"])[rows], "__row__": rows}


class Bigger(ProcessJoinFunction):
    def process_element(self, left, right, ctx):
        if left[1] > right[1]:
            yield (left[0], left[1] - right[1])


def interval_job(fn, lower, upper, exclusive=(False, False), sides=True):
    """Even values left, odd values right (one source), joined on the key within ``[lower, upper]``."""

    def job(env, events):
        s = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f2")
        src = env.from_collection(events, s)
        left = src.filter(lambda r: r[1] % 2 == 0).set_parallelism(1).key_by(0)
        right = src.filter(lambda r: r[1] % 2 != 0).set_parallelism(1).key_by(lambda r: r[0])
        joined = left.interval_join(right).between(lower, upper)
        if exclusive[0]:
            joined = joined.lower_bound_exclusive()
        if exclusive[1]:
            joined = joined.upper_bound_exclusive()
        if sides:
            joined = joined.side_output_left_late_data(LEFT_LATE).side_output_right_late_data(RIGHT_LATE)
        out = joined.process(fn)
        job.sinks = [out.collect()]
        if sides:
            job.sinks += [out.get_side_output(LEFT_LATE).collect(), out.get_side_output(RIGHT_LATE).collect()]
        return job.sinks[0]

    return job


def engine(job, events, parallelism, batch_size, granularity="record"):
    """Each sink's (record, timestamp) pairs in arrival order (the main output first)."""
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size,
                                     watermark_granularity=granularity)
    job(env, events)
    env.execute()
    return [list(zip(s.records(), s.timestamps())) for s in job.sinks]


def brute_force(events, lower, upper):
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]
    return multiset([((a[0], a[1], b[1], b[2] - a[2]), max(a[2], b[2])) for a in left for b in right
                     if a[0] == b[0] and a[2] + lower <= b[2] <= a[2] + upper])


BOUNDS = [(-20, 10, (False, False)), (-30, -5, (True, True)), (3, 40, (True, False)), (0, 0, (False, False))]


@pytest.fixture(scope="module")
def late_events():
    return out_of_order_events(150, keys=3, bound=BOUND, seed=21, late=0.12)


@pytest.mark.parametrize("lower,upper,exclusive", BOUNDS)
def test_columnar_interval_join_equals_the_record_path(late_events, lower, upper, exclusive):
    want_late = None
    for parallelism, batch_size, granularity in ((1, 1, "record"), (2, 37, "record"), (1, 1024, "record"),
                                                 (2, 37, "batch"), (1, 1024, "batch")):
        got = engine(interval_job(vector_pair, lower, upper, exclusive), late_events, parallelism, batch_size,
                     granularity)
        want = engine(interval_job(Pair(), lower, upper, exclusive), late_events, parallelism, batch_size,
                      granularity)
        assert got == want, (parallelism, batch_size, granularity)
        late = (multiset(got[1]), multiset(got[2]))
        if granularity == "record":  # what is late does not depend on the batching
            assert want_late is None or late == want_late, batch_size
            want_late, joined = late, got[0]
    assert want_late[0] and want_late[1], "the events have late rows on both sides"
    late = Counter(r for r, _ in want_late[0] + want_late[1])
    on_time = list((Counter(late_events) - late).elements())
    pairs = brute_force(on_time, lower + exclusive[0], upper - exclusive[1])
    # Flink's quirk: a row goes when the watermark reaches its time + upper bound, so an on-time row of
    # the other input at exactly that time misses it
    assert set(multiset(joined)) <= set(pairs) and len(joined) >= 0.9 * len(pairs) and pairs


def test_in_order_events_give_every_pair_and_the_reference_agrees():
    events = out_of_order_events(200, keys=3, bound=BOUND, seed=5)
    want = brute_force(events, -25, 12)
    assert len(want) > 100
    for batch_size in (1, 37, 1024):
        got = engine(interval_job(vector_pair, -25, 12, sides=False), events, 2, batch_size)[0]
        assert multiset(got) == want, batch_size
    assert reference_outputs(interval_job(vector_pair, -25, 12, sides=False), events, 37) == want


def test_vectorized_flat_process_join_equals_the_record_path(late_events):
    for parallelism, batch_size in ((1, 1), (3, 64)):
        got = engine(interval_job(vector_bigger, -10, 20), late_events, parallelism, batch_size)
        assert got[0] and got == engine(interval_job(Bigger(), -10, 20), late_events, parallelism, batch_size)


def test_a_vectorized_process_join_function_gets_the_columnar_operator():
    env = StreamExecutionEnvironment()
    interval_job(vector_pair, -1, 1, sides=False)(env, [(0, 0, 0)])
    assert isinstance(operator_of(env, "IntervalJoin"), IntervalJoinOperator)
    env = StreamExecutionEnvironment()
    interval_job(Pair(), -1, 1, sides=False)(env, [(0, 0, 0)])
    assert type(operator_of(env, "IntervalJoin")) is CoProcessOperator


def test_buckets_made_out_of_time_order_keep_the_record_paths_order():
    """Right rows at 20 then 10 (one key): a left row meets the bucket made first first."""
    events = [(1, 1, 20), (1, 3, 10), (1, 5, 20), (1, 0, 15), (1, 2, 16)]
    for batch_size in (1, 2, 5):
        got = engine(interval_job(vector_pair, -10, 10, sides=False), events, 1, batch_size)
        want = engine(interval_job(Pair(), -10, 10, sides=False), events, 1, batch_size)
        assert got == want
        assert [r[2] for r, _ in got[0][:3]] == [1, 5, 3]


def test_a_record_without_a_timestamp_is_refused():
    env = StreamExecutionEnvironment()
    src = env.from_collection([(0, 0, 0), (0, 1, 0)])
    left = src.filter(lambda r: r[1] % 2 == 0).key_by(0)
    right = src.filter(lambda r: r[1] % 2 != 0).key_by(0)
    left.interval_join(right).between(-1, 1).process(vector_pair).collect()
    with pytest.raises(Exception, match="no timestamp"):
        env.execute()


# -- checkpoints and rescaling -------------------------------------------------------

@vectorized
def _dict_pair(left, right):
    return {"key": left["key"], "a": left["value"], "b": right["value"]}


def test_interval_join_state_survives_a_failure_restore_and_rescale(tmp_path):
    """Fail at parallelism 2, restore from the latest checkpoint at 2 (``run_with_failures``)
    and, in a second run, at 3: the exactly-once sink holds the failure-free output."""
    from checkpoint_job import per_subtask_rows

    evs = [{"key": k, "value": v, "ts": t}
           for k, v, t in out_of_order_events(220, keys=5, bound=20, seed=13, late=0.05)]

    def build(env, out, fail_at):
        s = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
        src = env.from_source(CollectionSource(evs), s, "events").uid("events").set_parallelism(1)
        left = src.filter(lambda r: r["value"] % 2 == 0).key_by("key")
        right = src.filter(lambda r: r["value"] % 2 != 0).key_by("key")
        left.interval_join(right).between(-15, 25).process(_dict_pair).uid("ij") \
            .map(_FailAt(fail_at)).uid("fail").sink_to(FileSink(out / "ij", "json")).uid("sink")

    def env_(p=2):
        return StreamExecutionEnvironment(parallelism=p, batch_size=32, clock=SimulatedClock(step_ms=100))

    def rows(path):
        return multiset([r for part in per_subtask_rows(path).values() for r in part])

    ref, out = run_with_failures(env_, build, tmp_path, (40,), _Boom)
    want = rows(ref / "ij")
    assert len(want) > 50 and rows(out / "ij") == want
    ckpt, out = str(tmp_path / "ckpt3"), tmp_path / "out3"
    env = env_().enable_checkpointing(200, ckpt)
    build(env, out, 40)
    with pytest.raises(_Boom):
        env.execute()
    env = env_(3).enable_checkpointing(200, ckpt)
    build(env, out, None)
    assert env.execute(restore_from=ckpt).restored_from is not None
    assert rows(out / "ij") == want


def test_rescaled_state_deals_rows_by_key_group():
    """A parallelism-2 snapshot restored at 3: every row lands on its key's new subtask, once."""
    from opforge.stream.partitioning import key_group_targets

    def state(keys, ts, seq0):
        n = len(keys)
        rows = {"columns": {"f0": torch.tensor(keys)}, "ts": torch.tensor(ts), "key": torch.tensor(keys),
                "seq": torch.arange(seq0, seq0 + n), "death": torch.tensor(ts) + 5}
        return {"schemas": [None, None], "next_seq": seq0 + n, "inputs": [rows, {**rows, "seq": rows["seq"] + n}]}

    olds = [state([0, 0, 2, 4], [5, 1, 3, 3], 0), state([1, 3, 3, 5, 7], [9, 2, 8, 1, 4], 100)]
    parts = IntervalJoinOperator.rescale_state(olds, 3)
    assert max(p["next_seq"] for p in parts) == 105
    for side in (0, 1):
        seen = []
        for i, p in enumerate(parts):
            s = p["inputs"][side]
            assert (key_group_targets(s["key"], 3) == i).all()
            pairs = list(zip(s["key"].tolist(), s["ts"].tolist()))
            assert pairs == sorted(pairs)  # (key, ts) order
            seen += pairs
        assert sorted(seen) == sorted([(0, 5), (0, 1), (2, 3), (4, 3), (1, 9), (3, 2), (3, 8), (5, 1), (7, 4)])


def test_two_sources_meet_in_the_record_paths_order():
    """Each input its own source (``process_merged`` gets both sources' batches of a poll)."""
    from opforge.stream import SplitSource

    events = out_of_order_events(120, keys=3, bound=BOUND, seed=17, late=0.1)
    left = [e for e in events if e[1] % 2 == 0]
    right = [e for e in events if e[1] % 2 != 0]

    def job(fn, batch):
        def build(env, _):
            s = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f2")
            sides = []
            for recs in (left, right):
                src = SplitSource([[recs[i:i + batch] for i in range(0, len(recs), batch)]])
                src.max_parallelism = 1
                sides.append(env.from_source(src, s).key_by(0))
            out = sides[0].interval_join(sides[1]).between(-12, 7).side_output_right_late_data(RIGHT_LATE) \
                .process(fn)
            build.sinks = [out.collect(), out.get_side_output(RIGHT_LATE).collect()]
            return build.sinks[0]

        return build

    for batch in (1, 37):
        got = engine(job(vector_pair, batch), events, 2, batch)
        assert got[0] and got == engine(job(Pair(), batch), events, 2, batch), batch


@pytest.mark.parametrize("key_step,ts_step", [(1, 1), (2**61, 1), (2**61, 2**60)])
def test_buffer_ranges_for_any_key_and_time_spread(key_step, ts_step):
    """(key, ts) ranges found by packed codes (by key value, by key rank) or a binary search on the pairs."""
    from opforge.stream.columnar_interval_join import Buffer
    from opforge.stream.columnar_join import Rows

    g = torch.Generator().manual_seed(3)
    key = (torch.randint(-3, 4, (60,), generator=g) * key_step)
    ts = torch.randint(-5, 6, (60,), generator=g) * ts_step
    rows = Rows({}, ts, key, torch.arange(60))
    buf = Buffer.sorted_of(rows, torch.zeros(60, dtype=torch.int64))
    qk = torch.tensor([-3, 0, 2, 3, 5, -4]) * key_step
    lo, hi = torch.tensor([-5, 0, 2, -1, 0, 0]) * ts_step, torch.tensor([5, 0, 1, 3, 9, 0]) * ts_step
    start, count = buf.ranges(qk, lo, hi)
    bk, bt = buf.rows.key.tolist(), buf.rows.ts.tolist()
    for i in range(len(qk)):
        want = [j for j in range(60) if bk[j] == qk[i] and lo[i] <= bt[j] <= hi[i]]
        assert list(range(start[i], start[i] + count[i])) == want or (count[i] == 0 and not want), i
