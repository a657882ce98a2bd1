"""Rescaling: a job checkpointed at parallelism 2 restores at 3 and at 1 (key
groups move between subtasks) and its committed output equals a failure-free
run at parallelism 1: keyed state of every kind with TTL, event- and
processing-time timers, window contents (record and columnar), rolling sums,
watermarks (late data) and the file sink's pending files all follow their keys."""

import pytest
import torch

from checkpoint_job import per_subtask_rows
from opforge.stream import (Aggregations, CheckpointRestoreError, CollectionSource, EventTimeSessionWindows,
                            FileSink, OutputTag, SimulatedClock, SlidingEventTimeWindows, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy)
from opforge.stream.checkpoint import completed_checkpoints, read_checkpoint
from opforge.stream.partitioning import MAX_PARALLELISM, key_group_targets
from opforge.stream.rescale import key_group_range
from test_checkpoint import Boom, EveryState, FailAt, Sessions, events

SINKS = ["state", "sessions", "sliding", "late", "columnar", "rolling"]


def build(env, evs, out, fail_at):
    """The source side keeps parallelism 2; every keyed operator and sink takes the job's."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
    src = env.from_source(CollectionSource(evs), strategy, "events").set_parallelism(2)
    keyed = src.map(FailAt(fail_at)).name("fail").set_parallelism(2).key_by("key")
    keyed.process(EveryState()).name("every state").sink_to(FileSink(out / "state", "json"))
    keyed.window(EventTimeSessionWindows.with_gap(15)).process(Sessions()).sink_to(FileSink(out / "sessions", "json"))
    late = OutputTag("late")
    w = keyed.window(SlidingEventTimeWindows.of(40, 20)).allowed_lateness(10).side_output_late_data(late) \
        .reduce(lambda a, b: {"key": a["key"], "value": a["value"] + b["value"], "ts": max(a["ts"], b["ts"]),
                              "seq": min(a["seq"], b["seq"])})
    w.sink_to(FileSink(out / "sliding", "json"))
    w.get_side_output(late).sink_to(FileSink(out / "late", "json"))
    keyed.window(TumblingEventTimeWindows.of(30)) \
        .aggregate(Aggregations(with_window=True, n=("count",), top=("max", "value"))) \
        .sink_to(FileSink(out / "columnar", "json"))
    keyed.sum("value").sink_to(FileSink(out / "rolling", "json"))


def env_at(parallelism, ckpt):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=8, clock=SimulatedClock(step_ms=100))
    return env.enable_checkpointing(200, ckpt)


def rows(out):
    """Every sink's committed rows as a sorted multiset (subtasks differ between parallelisms)."""
    return {s: sorted(repr(sorted(r.items())) for rs in per_subtask_rows(out / s).values() for r in rs)
            for s in SINKS}


@pytest.fixture(scope="module")
def rescale_runs(tmp_path_factory):
    """Module-scoped, so set up before conftest's per-test fold-by-reference: set it here too."""
    from opforge.runtime import dispatch

    with dispatch.force_variant("segment_reduce", "reference"):
        yield _rescale_runs(tmp_path_factory.mktemp("rescale"))


def _rescale_runs(tmp):
    evs = events(120, 9, 4, late=0.08)
    env = env_at(1, str(tmp / "ref-ckpt"))
    build(env, evs, tmp / "ref", None)
    env.execute()
    runs = {}
    for p_new in (3, 1):
        ckpt, out = str(tmp / f"ckpt-{p_new}"), tmp / f"out-{p_new}"
        env = env_at(2, ckpt)
        build(env, evs, out, 70)
        with pytest.raises(Boom):
            env.execute(restore_from=ckpt)
        (_, path), = completed_checkpoints(ckpt)
        saved = read_checkpoint(path, "cpu")[1]
        env = env_at(p_new, ckpt)
        build(env, evs, out, None)
        res = env.execute(restore_from=ckpt)
        assert res.restored_from == path and res.checkpoints
        runs[p_new] = (out, saved)
    return rows(tmp / "ref"), runs


@pytest.mark.parametrize("p_new", [3, 1])
def test_restore_at_another_parallelism_is_exactly_once(rescale_runs, p_new):
    ref, runs = rescale_runs
    out, _ = runs[p_new]
    assert rows(out) == ref
    assert all(ref[s] for s in SINKS) and ref["late"]  # every sink had output, late data included


def test_checkpoint_records_key_group_ranges(rescale_runs):
    _, runs = rescale_runs
    _, tree = runs[3]
    assert tree["max_parallelism"] == MAX_PARALLELISM
    op = tree["operators"][next(u for u in tree["operators"] if u.endswith(":every state"))]
    assert [s["key_groups"] for s in op] == [[0, 64], [64, 128]]
    # a subtask's keyed state holds only keys of its key-group range
    for i, s in enumerate(op):
        keys = [e[0] for e in s["operator"]["keyed_state"]["count"]["entries"]]
        assert keys and set(key_group_targets(torch.tensor(keys), 2).tolist()) == {i}


def test_key_group_ranges_cover_every_group_once():
    for p in (1, 2, 3, 7, 128):
        ranges = [key_group_range(i, p) for i in range(p)]
        assert ranges[0][0] == 0 and ranges[-1][1] == MAX_PARALLELISM
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        for i, (lo, hi) in enumerate(ranges):
            assert all(g * p // MAX_PARALLELISM == i for g in range(lo, hi))


def test_a_source_that_cannot_deal_positions_anew_keeps_its_parallelism(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    evs = events(30, 3, 1)
    env = env_at(2, ckpt)
    env.from_source(CollectionSource(evs), WatermarkStrategy.no_watermarks(), "s").key_by("key").sum("value") \
        .sink_to(FileSink(tmp_path / "o", "json"))
    env.execute()
    env = env_at(3, ckpt)
    env.from_source(CollectionSource(evs), WatermarkStrategy.no_watermarks(), "s").key_by("key").sum("value") \
        .sink_to(FileSink(tmp_path / "o2", "json"))
    with pytest.raises(CheckpointRestoreError, match="parallelism.*set_parallelism"):
        env.execute(restore_from=ckpt)
