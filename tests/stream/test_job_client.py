"""``execute_async`` and ``JobClient``: status, result, live metrics, cancel,
savepoints (trigger, stop-with-savepoint, restore from one)."""

import time

import pytest

from checkpoint_job import per_subtask_rows
from opforge.stream import (Aggregations, FileSink, JobCancellationException, JobStatus, NumberSequenceSource,
                            SimulatedClock, StreamExecutionEnvironment, TumblingEventTimeWindows, WatermarkStrategy,
                            vectorized)
from opforge.stream.checkpoint import read_checkpoint


@vectorized
def slow_keyed(batch):
    time.sleep(0.002)  # a job long enough to be stopped half way
    x = batch["f0"]
    return {"key": x % 5, "value": x, "ts": x}


def wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def env_for(ckpt=None, parallelism=2):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=16, clock=SimulatedClock(step_ms=10))
    return env.enable_checkpointing(10_000, ckpt) if ckpt else env


def timestamped(env, n, sink_dir=None):
    s = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("f0")
    ds = env.from_source(NumberSequenceSource(0, n - 1), s, "numbers").map(slow_keyed)
    w = ds.key_by("key").window(TumblingEventTimeWindows.of(100)) \
        .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "value")))
    return w.sink_to(FileSink(sink_dir, "json")) if sink_dir else w.collect()


def test_execute_async_gives_the_same_result_and_metrics():
    env = env_for()
    sink = timestamped(env, 800)
    client = env.execute_async("async job")
    res = client.get_job_execution_result(timeout=60)
    assert client.get_job_status() == JobStatus.FINISHED and client.get_job_status().is_globally_terminal_state()
    env2 = env_for()
    sink2 = timestamped(env2, 800)
    env2.execute()
    assert sorted(map(repr, sink.records())) == sorted(map(repr, sink2.records()))
    assert sum(r["n"] for r in sink.records()) == 800
    m = client.get_metrics()
    assert m["source_records"] == 800 == res.source_records
    assert m["operators"]["numbers"]["records_out"] == 800
    assert m["operators"]["WindowAggregate"]["records_in"] == 800
    assert m["operators"]["WindowAggregate"]["records_out"] == len(sink.records())
    assert m["events_per_second"] > 0 and res.events_per_second() > 0
    assert res.get_job_name() == "async job" and client.get_job_id().startswith("job-")


def test_metrics_grow_while_running_and_cancel_stops_the_job():
    env = env_for()
    timestamped(env, 200_000)
    client = env.execute_async()
    wait_for(lambda: client.get_metrics()["source_records"] > 100)
    assert client.get_job_status() == JobStatus.RUNNING
    first = client.get_metrics()["source_records"]
    wait_for(lambda: client.get_metrics()["source_records"] > first)
    client.cancel()
    with pytest.raises(JobCancellationException):
        client.get_job_execution_result(timeout=30)
    assert client.get_job_status() == JobStatus.CANCELED
    assert client.get_metrics()["source_records"] < 200_000
    fut = client.trigger_savepoint("/nonexistent-dir-never-written")
    with pytest.raises(RuntimeError, match="CANCELED"):
        fut.result(timeout=1)


def test_a_failing_job_reports_failed():
    @vectorized
    def bad(batch):
        raise ValueError("broken map")

    env = env_for()
    env.from_source(NumberSequenceSource(0, 9)).map(bad).collect()
    client = env.execute_async()
    with pytest.raises(ValueError, match="broken map"):
        client.get_job_execution_result(timeout=30)
    assert client.get_job_status() == JobStatus.FAILED


def test_stop_with_savepoint_then_restore_gives_the_failure_free_output(tmp_path):
    n = 3000
    env = env_for(str(tmp_path / "ref-ckpt"))
    timestamped(env, n, tmp_path / "ref")
    env.execute()
    want = per_subtask_rows(tmp_path / "ref")

    env = env_for(str(tmp_path / "ckpt"))
    timestamped(env, n, tmp_path / "out")
    client = env.execute_async("stoppable")
    wait_for(lambda: client.get_metrics()["source_records"] > 300)
    path = client.stop_with_savepoint(tmp_path / "savepoints").result(timeout=30)
    res = client.get_job_execution_result(timeout=30)
    assert client.get_job_status() == JobStatus.FINISHED
    assert res.source_records < n  # stopped half way, without draining
    meta, tree = read_checkpoint(path, "cpu")
    assert meta["type"] == "savepoint"
    partial = per_subtask_rows(tmp_path / "out")
    assert partial != want  # the savepoint committed only the first part

    env = env_for(str(tmp_path / "ckpt2"))
    timestamped(env, n, tmp_path / "out")
    res2 = env.execute(restore_from=path)
    assert res2.restored_from == path
    assert res.source_records + res2.source_records == n
    assert per_subtask_rows(tmp_path / "out") == want


def test_trigger_savepoint_keeps_the_job_running(tmp_path):
    env = env_for()
    sink = timestamped(env, 4000)
    client = env.execute_async()
    wait_for(lambda: client.get_metrics()["source_records"] > 600)  # some windows have fired
    path = client.trigger_savepoint(str(tmp_path / "sp")).result(timeout=30)
    res = client.get_job_execution_result(timeout=60)
    assert res.source_records == 4000 and sum(r["n"] for r in sink.records()) == 4000
    meta, tree = read_checkpoint(path, "cpu")
    positions = [s["position"] for s in next(iter(tree["sources"].values()))]
    assert 0 < sum(p - lo for p, lo in zip(positions, (0, 2000))) < 4000
    plain = env_for()
    sink_plain = timestamped(plain, 4000)
    plain.execute()
    assert sorted(map(repr, sink.records())) == sorted(map(repr, sink_plain.records()))  # undisturbed
    # a job restored from the savepoint finishes the rest: complete windows only (their
    # counts include the records before the savepoint), none of those fired before it
    env2 = env_for()
    sink2 = timestamped(env2, 4000)
    res2 = env2.execute(restore_from=path)
    assert res2.source_records == 4000 - sum(p - lo for p, lo in zip(positions, (0, 2000)))
    rest = sorted(map(repr, sink2.records()))
    assert rest and len(rest) < len(sink.records())
    remaining = sorted(map(repr, sink.records()))
    for r in rest:
        remaining.remove(r)  # each is one of the failure-free run's records
