"""Operator uids: a job fails, its graph is changed, and it is restored from
the checkpoint; state is matched by uid. A stateless map inserted before the
keyed operator (same and another parallelism) gives the failure-free output;
state of a removed operator fails the restore unless
``allow_non_restored_state``; uids are unique; stateful operators without a
uid are warned about."""

import pytest

from checkpoint_job import per_subtask_rows
from opforge.stream import (Aggregations, CheckpointRestoreError, CollectionSource, FileSink, MapFunction,
                            MissingUidWarning, SimulatedClock, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy)
from test_checkpoint import Boom, EveryState, FailAt, events

EVENTS = events(90, 5, 3)


class Tag(MapFunction):
    """A stateless map inserted into the job after its checkpoint: leaves records as they are."""

    def map(self, value):
        return dict(value)


def env_at(ckpt, parallelism=2):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=4, clock=SimulatedClock(step_ms=100))
    return env.enable_checkpointing(200, ckpt)


def build(env, out, fail_at, inserted_map=False, windows=True, keyed_uid="counts"):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
    s = env.from_source(CollectionSource(EVENTS), strategy, "events").set_parallelism(2).uid("events")
    s = s.map(FailAt(fail_at)).name("fail").set_parallelism(2)
    if inserted_map:  # a forward edge: a rebalance would change what event-time timers see, failure or not
        s = s.map(Tag()).name("tag").set_parallelism(2)
    keyed = s.key_by("key")
    counts = keyed.process(EveryState()).name("every state")
    if keyed_uid is not None:
        counts = counts.uid(keyed_uid)
    counts.sink_to(FileSink(out / "state", "json")).uid("state-sink")
    if windows:
        keyed.window(TumblingEventTimeWindows.of(30)).aggregate(Aggregations(n=("count",))).uid("windows") \
            .sink_to(FileSink(out / "windows", "json")).uid("windows-sink")


def rows(out, sink):
    """A sink's committed rows as a sorted multiset (subtasks differ between parallelisms)."""
    return sorted(repr(sorted(r.items())) for rs in per_subtask_rows(out / sink).values() for r in rs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The failure-free output of the original job."""
    tmp = tmp_path_factory.mktemp("uids-ref")
    env = env_at(str(tmp / "ckpt"))
    build(env, tmp / "out", None)
    env.execute()
    return {s: rows(tmp / "out", s) for s in ("state", "windows")}


def failed_run(tmp_path):
    """The original job, failed mid-way: its checkpoint directory and output."""
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "out"
    env = env_at(ckpt)
    build(env, out, 50)
    with pytest.raises(Boom):
        env.execute()
    return ckpt, out


@pytest.mark.parametrize("parallelism", [2, 3])
def test_a_map_inserted_before_the_keyed_operator_restores_by_uid(tmp_path, reference, parallelism):
    ckpt, out = failed_run(tmp_path)
    env = env_at(ckpt, parallelism)
    build(env, out, None, inserted_map=True, keyed_uid=None)
    with pytest.raises(CheckpointRestoreError, match="'counts'"):  # its id from the graph: state not matched
        env.execute(restore_from=ckpt)
    env = env_at(ckpt, parallelism)
    build(env, out, None, inserted_map=True)
    res = env.execute(restore_from=ckpt)
    assert res.restored_from is not None
    assert rows(out, "state") == reference["state"]
    assert rows(out, "windows") == reference["windows"]


def test_state_of_a_removed_operator_needs_allow_non_restored_state(tmp_path, reference):
    ckpt, out = failed_run(tmp_path)
    env = env_at(ckpt)
    build(env, out, None, windows=False)
    with pytest.raises(CheckpointRestoreError, match="'windows'.*allow_non_restored_state"):
        env.execute(restore_from=ckpt)
    env = env_at(ckpt)
    build(env, out, None, windows=False)
    env.execute(restore_from=ckpt, allow_non_restored_state=True)
    assert rows(out, "state") == reference["state"]


def test_uids_are_unique_and_stateful_operators_without_one_warn(tmp_path):
    env = env_at(str(tmp_path / "ckpt"))
    s = env.from_collection([{"key": 1, "value": 2}]).uid("a")
    with pytest.raises(ValueError, match="unique"):
        s.map(Tag()).uid("a")
    with pytest.raises(TypeError, match="no operator of its own"):
        s.key_by("key").uid("b")
    s.key_by("key").sum("value").sink_to(FileSink(tmp_path / "out", "json")).uid("sink")
    with pytest.warns(MissingUidWarning, match="'Sum'.*no uid"):
        env.execute()
