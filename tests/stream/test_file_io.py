"""File sources (Parquet, CSV, JSON lines; a file or a directory; bounded or
monitored) and the transactional file sink (two-phase commit)."""

import json
import os
import time

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

from checkpoint_job import per_subtask_rows
from opforge.stream import (Batch, CollectionSource, FileSink, FileSource, JobStatus, RecordSchema,
                            StreamExecutionEnvironment, read_committed)
from opforge.stream.file_sink import committed_files
from stream_helpers import multiset

ROWS = [{"id": i, "name": f"n{i % 7}", "price": i * 0.5, "ok": i % 3 == 0} for i in range(53)]


def write(path, rows, fmt):
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "arrow":
        feather.write_feather(table, path)
    elif fmt == "csv":
        pcsv.write_csv(table, path)
    else:
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


EXT = {"parquet": "parquet", "arrow": "arrow", "csv": "csv", "json": "jsonl"}


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "csv", "json"])
def test_bounded_file_and_directory_sources(tmp_path, fmt):
    one = tmp_path / f"one.{EXT[fmt]}"
    write(one, ROWS, fmt)
    env = StreamExecutionEnvironment(batch_size=10)
    sink = env.from_file(str(one)).collect()  # format from the extension
    env.execute()
    assert sink.records() == ROWS  # one subtask: file order
    d = tmp_path / "dir"
    d.mkdir()
    for i in range(4):
        write(d / f"part-{i}.{EXT[fmt]}", ROWS[i * 14:(i + 1) * 14], fmt)
    write(d / f".hidden.{EXT[fmt]}", ROWS[:3], fmt)  # skipped, like _x files
    env = StreamExecutionEnvironment(parallelism=2, batch_size=5)
    sink = env.from_source(FileSource(d, fmt)).collect()
    env.execute()
    assert multiset(sink.records()) == multiset(ROWS)


def test_file_source_errors(tmp_path):
    with pytest.raises(ValueError, match="format"):
        FileSource(tmp_path)
    with pytest.raises(ValueError, match="format must be"):
        FileSource(tmp_path, "xml")
    with pytest.raises(ValueError, match="does not exist"):
        FileSource(tmp_path / "nope.csv")
    f = tmp_path / "x.csv"
    write(f, ROWS, "csv")
    with pytest.raises(ValueError, match="directory"):
        FileSource(f, monitor_interval_ms=10)


def test_file_split_position_and_seek(tmp_path):
    for i in range(3):
        write(tmp_path / f"f{i}.parquet", ROWS[i * 10:(i + 1) * 10], "parquet")
    split, = FileSource(tmp_path, "parquet").splits(1, 4, "cpu")
    taken = [next(split).num_rows for _ in range(4)]  # 4 + 4 + 2 of f0, 4 of f1
    assert taken == [4, 4, 2, 4]
    pos = split.position()
    assert pos == {"done": ["f0.parquet"], "file": "f1.parquet", "row": 4}
    rest = [r for t in split for r in t.to_pylist()]
    again, = FileSource(tmp_path, "parquet").splits(1, 4, "cpu")
    again.seek(json.loads(json.dumps(pos)))
    assert [r for t in again for r in t.to_pylist()] == rest == ROWS[14:30]


def test_monitored_directory_picks_up_new_files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write(d / "a.jsonl", ROWS[:20], "json")
    env = StreamExecutionEnvironment(parallelism=2, batch_size=8)
    sink = env.from_source(FileSource(d, "json", monitor_interval_ms=5)).collect()
    client = env.execute_async("monitor")

    def wait_rows(n):
        end = time.monotonic() + 20
        while len(sink.records()) < n:
            assert time.monotonic() < end and client.get_job_status() == JobStatus.RUNNING
            time.sleep(0.01)

    wait_rows(20)
    write(d / ".b.jsonl.tmp", ROWS[20:45], "json")
    os.rename(d / ".b.jsonl.tmp", d / "b.jsonl")  # appear atomically
    write(d / "c.jsonl", ROWS[45:], "json")
    wait_rows(len(ROWS))
    time.sleep(0.05)
    client.cancel()
    with pytest.raises(Exception):
        client.get_job_execution_result(timeout=20)
    assert client.get_job_status() == JobStatus.CANCELED
    assert multiset(sink.records()) == multiset(ROWS)  # each file read once


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "csv", "json"])
def test_file_sink_commits_at_the_end_without_checkpointing(tmp_path, fmt):
    env = StreamExecutionEnvironment(parallelism=2, batch_size=7)
    env.from_source(CollectionSource(ROWS)).sink_to(FileSink(tmp_path / "out", fmt))
    env.execute()
    files = committed_files(tmp_path / "out")
    assert [os.path.basename(f) for f in files] == [f"part-0-00000000.{EXT[fmt]}", f"part-1-00000000.{EXT[fmt]}"]
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".")]
    got = read_committed(tmp_path / "out").to_pylist()
    assert multiset(got) == multiset(ROWS)


def batch(rows):
    return Batch.from_records(rows, "cpu")


def test_two_phase_commit_protocol(tmp_path):
    sink = FileSink(tmp_path, "json")
    sink.open(0, 1)
    sink.write(batch(ROWS[:5]), 0)
    assert committed_files(tmp_path) == [] and os.listdir(tmp_path) == [".part-0.inprogress"]
    state = sink.snapshot_state(0, 7)  # pre-commit
    assert state["pending"] == [[7, ".part-0-00000007.jsonl.pending"]]
    assert committed_files(tmp_path) == []  # not visible before the checkpoint completes
    sink.write(batch(ROWS[5:9]), 0)
    sink.notify_checkpoint_complete(0, 7)  # commit
    assert [os.path.basename(f) for f in committed_files(tmp_path)] == ["part-0-00000007.jsonl"]
    assert read_committed(tmp_path).to_pylist() == ROWS[:5]
    state8 = sink.snapshot_state(0, 8)
    # crash before checkpoint 8 completes; data of a later checkpoint is in progress
    sink.write(batch(ROWS[9:12]), 0)
    sink.snapshot_state(0, 9)
    sink.write(batch(ROWS[12:14]), 0)
    # restore from checkpoint 8 (it did complete, but the commit never ran)
    fresh = FileSink(tmp_path, "json")
    fresh.open(0, 1)
    fresh.restore_state(0, json.loads(json.dumps(state8)))
    assert sorted(os.listdir(tmp_path)) == ["part-0-00000007.jsonl", "part-0-00000008.jsonl"]
    assert read_committed(tmp_path).to_pylist() == ROWS[:9]
    # restoring the same checkpoint again is harmless (its files are committed already)
    fresh.restore_state(0, json.loads(json.dumps(state8)))
    assert read_committed(tmp_path).to_pylist() == ROWS[:9]


def test_file_sink_arguments_and_schema_changes(tmp_path):
    with pytest.raises(ValueError, match="format"):
        FileSink(tmp_path, "xml")
    with pytest.raises(ValueError, match="prefix"):
        FileSink(tmp_path, prefix="../x")
    sink = FileSink(tmp_path, "parquet")
    sink.open(0, 1)
    sink.write(Batch({"a": torch.tensor([1, 2])}, torch.zeros(2, dtype=torch.int64), RecordSchema("dict", ("a",))), 0)
    sink.write(Batch({"a": torch.tensor([3], dtype=torch.int32)}, torch.zeros(1, dtype=torch.int64),
                     RecordSchema("dict", ("a",))), 0)  # cast to the file's int64
    with pytest.raises(ValueError, match="changed shape"):
        sink.write(Batch({"a": torch.tensor([1.5])}, torch.zeros(1, dtype=torch.int64),
                         RecordSchema("dict", ("a",))), 0)
    with pytest.raises(ValueError, match="changed shape"):
        sink.write(Batch({"b": ["x"]}, torch.zeros(1, dtype=torch.int64), RecordSchema("dict", ("b",))), 0)
    sink.finish()
    assert read_committed(tmp_path).column("a").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "csv", "json"])
def test_file_to_file_job_restores_file_positions(tmp_path, fmt):
    """A file source read half way, a failure, a restore: (file, row) positions
    and the sink's transactions give the failure-free output exactly."""
    d = tmp_path / "in"
    d.mkdir()
    for i in range(5):
        write(d / f"p{i}.{EXT[fmt]}", ROWS[i * 11:(i + 1) * 11], fmt)

    class FailOn:
        def __init__(self, at):
            self.at = at

        def __call__(self, r):
            if r["id"] == self.at:
                raise KeyError(f"injected at {self.at}")
            return {"id": r["id"], "twice": r["id"] * 2, "name": r["name"]}

    def run(out, ckpt, at, restore):
        from opforge.stream import SimulatedClock

        env = StreamExecutionEnvironment(parallelism=2, batch_size=3, clock=SimulatedClock())
        env.enable_checkpointing(200, ckpt)
        env.from_source(FileSource(d, fmt)).map(FailOn(at)).sink_to(FileSink(out, fmt))
        return env.execute(restore_from=ckpt if restore else None)

    run(tmp_path / "ref", tmp_path / "ref-ckpt", None, False)
    for at in (17, 40):
        with pytest.raises(KeyError):
            run(tmp_path / "out", tmp_path / "ckpt", at, True)
    res = run(tmp_path / "out", tmp_path / "ckpt", None, True)
    assert res.restored_from is not None
    want = per_subtask_rows(tmp_path / "ref")
    assert per_subtask_rows(tmp_path / "out") == want
    assert sorted(r["id"] for rows in want.values() for r in rows) == list(range(53))
