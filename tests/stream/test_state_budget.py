"""Keyed columnar state over a budget (``env.set_state_budget``): the window
table's cold rows move to host memory and to Arrow IPC files, come back when
touched, and results are the same as without a budget, in the same order."""

import os

import pytest

from opforge.stream import (Aggregations, CollectionSource, OutputTag, SlidingEventTimeWindows,
                            StateBudget, StreamExecutionEnvironment, TumblingEventTimeWindows, WatermarkStrategy)
from stream_helpers import out_of_order_events


def files_under(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def window_job(env, evs, assigner, observe=None):
    late = OutputTag("late")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
    src = env.from_source(CollectionSource(evs), strategy, "events")
    if observe is not None:  # called per record ahead of the window, while the job runs
        src = src.map(lambda r: (observe(), r)[1])
    w = src.key_by("key").window(assigner) \
        .allowed_lateness(15).side_output_late_data(late) \
        .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "value"), low=("min", "value"),
                                high=("max", "value"), mean=("mean", "value")))
    return w.collect(), w.get_side_output(late).collect()


def run(evs, assigner, budget=None, parallelism=2, batch=16, observe=None):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch)
    if budget is not None:
        env.set_state_budget(*budget)
    out, late = window_job(env, evs, assigner, observe)
    result = env.execute()
    return out.records(), late.records(), result


def events(n=1500, keys=40, seed=3, late=0.05):
    return [{"key": k, "value": v, "ts": t} for k, v, t in out_of_order_events(n, keys, 20, seed, late)]


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows.of(50), SlidingEventTimeWindows.of(60, 20)],
                         ids=["tumbling", "sliding"])
def test_results_identical_with_a_tiny_budget(assigner, tmp_path):
    evs = events()
    ref, ref_late, _ = run(evs, assigner)
    assert len(ref) > 100  # windows fired
    if isinstance(assigner, TumblingEventTimeWindows):
        assert ref_late  # and some records were late (the side output is compared too)
    for budget in [(0,), (64,), (0, 0, tmp_path / "a"), (300, 2_000, tmp_path / "b")]:
        got, got_late, _ = run(evs, assigner, budget)
        assert got == ref, budget  # same rows, same order
        assert got_late == ref_late, budget


def test_spill_files_appear_during_the_job_and_are_removed(tmp_path):
    spill = tmp_path / "spill"
    seen = []

    def observe():
        seen.append(len(files_under(spill)))

    evs = events(2000, 60, 5, late=0.0)
    ref, _, _ = run(evs, TumblingEventTimeWindows.of(40), parallelism=1)
    got, _, _ = run(evs, TumblingEventTimeWindows.of(40), (0, 0, spill), parallelism=1, observe=observe)
    assert got == ref
    assert max(seen) > 0  # rows went to disk (Arrow IPC files)
    assert files_under(spill) == []  # and every spill file is gone at the end


def test_spill_files_are_arrow_ipc_not_pickle(tmp_path):
    import pyarrow as pa
    import torch

    from opforge.stream.state_budget import ColdRows

    cold = ColdRows(StateBudget(0, 0, str(tmp_path)), "op")
    rows = {"key": torch.tensor([5, 1, 9]), "start": torch.tensor([0, 10, 20]),
            "fired": torch.tensor([False, True, False]), "acc.total": torch.tensor([1.5, 2.5, 3.5])}
    cold.add(rows)
    paths = files_under(tmp_path)
    assert len(paths) == 1 and cold.host is None and len(cold) == 3
    with pa.memory_map(paths[0], "r") as src:
        table = pa.ipc.open_file(src).read_all()
    assert table.column("key").to_pylist() == [5, 1, 9]
    # a zone map keeps files out of lookups that cannot hit them
    assert cold.take(lambda r: r["key"] == 100, lambda f: f["kmin"] <= 100 <= f["kmax"]) is None
    assert files_under(tmp_path) == paths
    before = paths[0]
    back = cold.take(lambda r: r["key"] == 9, lambda f: f["kmin"] <= 9 <= f["kmax"])
    assert back["key"].tolist() == [9] and back["acc.total"].tolist() == [3.5]
    # the file was read back and deleted; the rows not taken went back to disk (host budget 0)
    paths = files_under(tmp_path)
    assert len(paths) == 1 and paths[0] != before and cold.host is None and len(cold) == 2
    with pa.memory_map(paths[0], "r") as src:
        assert pa.ipc.open_file(src).read_all().column("key").to_pylist() == [5, 1]
    assert [(f["kmin"], f["kmax"]) for f in cold.files] == [(1, 5)]
    cold.clear()
    assert len(cold) == 0 and not os.path.exists(str(tmp_path / "x"))


def test_rows_read_back_but_not_taken_stay_within_the_host_budget(tmp_path):
    import torch

    from opforge.stream.state_budget import ColdRows

    limit = 200  # bytes: 12 rows of two int64 columns (16 bytes a row) fit, 16 do not
    cold = ColdRows(StateBudget(0, limit, str(tmp_path)), "op")
    for i in range(4):  # 4 files of 16 rows: keys 100 i .. 100 i + 15
        cold.add({"key": torch.arange(100 * i, 100 * i + 16), "start": torch.full((16,), i)})
    assert len(cold.files) == 4 and cold.host is None
    everything = set(range(0, 16)) | set(range(100, 116)) | set(range(200, 216)) | set(range(300, 316))
    back = cold.take(lambda r: r["key"] % 100 == 3, lambda f: True)  # reads every file, takes 4 rows
    assert sorted(back["key"].tolist()) == [3, 103, 203, 303]
    assert cold.host_bytes() <= limit and len(cold) == 60
    cold.drop(lambda r: r["key"] < 100, lambda f: False, lambda f: f["kmin"] < 100)
    assert cold.host_bytes() <= limit and len(cold) == 45
    left = cold.take_all()["key"].tolist()
    assert sorted(left) == sorted(everything - {3, 103, 203, 303} - set(range(16)))
    cold.clear()


def test_nexmark_q5_with_a_tiny_budget(tmp_path):
    from opforge.stream.nexmark import NexmarkConfig, q5

    cfg = NexmarkConfig(events=6000, events_per_second=1000, max_out_of_orderness_ms=300)

    def go(budget):
        env = StreamExecutionEnvironment(batch_size=250)
        if budget:
            env.set_state_budget(*budget)
        sink = q5(env, cfg, size_ms=2000, slide_ms=500).collect()
        env.execute()
        return sink.records()

    ref = go(None)
    assert len(ref) >= 10
    assert go((256, 1024, tmp_path)) == ref
    assert files_under(tmp_path) == []


def test_budget_survives_checkpoint_and_restore(tmp_path, monkeypatch):
    import test_checkpoint as tc

    plain = tc.make_env

    def with_budget(*args, **kwargs):
        return plain(*args, **kwargs).set_state_budget(0, 0, tmp_path / "spill")

    evs = tc.events(300, 6, 3, late=0.08)
    ref, got, _ = tc.fail_and_restore(tmp_path / "plain", tc.window_job(evs), [90, 200])
    monkeypatch.setattr(tc, "make_env", with_budget)
    ref_b, got_b, _ = tc.fail_and_restore(tmp_path / "budget", tc.window_job(evs), [90, 200])
    assert got_b == ref_b == ref == got
    assert files_under(tmp_path / "spill") == []


def test_set_state_budget_validates():
    env = StreamExecutionEnvironment()
    with pytest.raises(ValueError, match="device_bytes"):
        env.set_state_budget(-1)
    with pytest.raises(ValueError, match="host_bytes"):
        env.set_state_budget(10, 1.5)
    assert env.set_state_budget(10).get_state_budget() == StateBudget(10)
    assert env.set_state_budget(None).get_state_budget() is None


def rolling_job(env, evs, field="value"):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
    src = env.from_source(CollectionSource(evs), strategy, "events")
    keyed = src.key_by("key")
    return keyed.sum(field).collect(), keyed.max(field).collect()


@pytest.mark.parametrize("with_strings", [False, True], ids=["numbers", "strings"])
def test_rolling_table_under_a_tiny_budget_gives_the_same_results(with_strings, tmp_path, monkeypatch):
    """The rolling aggregates' per-key table (running value, first record) moves its coldest keys
    to host memory and Arrow files and brings them back when met again: same output, same order."""
    evs = events(1500, 200, 9, late=0.0)
    if with_strings:  # first records with a text field: list columns in every tier
        evs = [dict(e, name=f"k{e['key']}") for e in evs]

    def go(budget, observe=None):
        env = StreamExecutionEnvironment(parallelism=2, batch_size=16)
        if budget is not None:
            env.set_state_budget(*budget)
        sums, maxes = rolling_job(env, evs)
        env.execute()
        return sums.records(), maxes.records()

    from opforge.stream.state_budget import ColdRows

    ref = go(None)
    assert len(ref[0]) == len(evs)
    evicted = []
    real_add = ColdRows.add
    monkeypatch.setattr(ColdRows, "add", lambda self, rows: (evicted.append(len(rows["key"])), real_add(self, rows)))
    spill = tmp_path / "spill"
    for budget in [(0,), (512,), (0, 0, spill), (400, 1_000, tmp_path / "b")]:
        evicted.clear()
        assert go(budget) == ref, budget
        assert sum(evicted) > 0, budget  # rows did leave the device
    assert files_under(spill) == []


def test_rolling_table_evicts_and_brings_keys_back(tmp_path):
    """The operator itself: after a batch over budget, most keys are cold; meeting one again
    restores its running value."""
    import torch

    from opforge.stream.records import Batch
    from opforge.stream.rolling import RollingOperator

    op = RollingOperator("sum", None, op="sum", field="value")
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.state_budget = StateBudget(64, 0, str(tmp_path))
    op.open()
    emitted = []
    op.out = type("Out", (), {"emit": lambda self, b: emitted.append(b)})()
    keys = torch.arange(50)
    batch = Batch({"value": torch.ones(50, dtype=torch.int64) * 2}, torch.zeros(50, dtype=torch.int64), None,
                  keys=keys)
    op.process_batch(batch)
    assert len(op.slot_of) < 50 and len(op.cold) == 50 - len(op.slot_of)  # evicted past 64 bytes
    assert files_under(tmp_path)  # host budget 0: straight to disk
    op.process_batch(Batch({"value": torch.tensor([5])}, torch.zeros(1, dtype=torch.int64), None,
                           keys=torch.tensor([0])))
    assert emitted[-1].columns["value"].tolist() == [7]  # key 0's running 2, back from disk, + 5
    op.dispose()
    assert files_under(tmp_path) == []


def test_rolling_budget_survives_checkpoint_and_restore(tmp_path, monkeypatch):
    import test_checkpoint as tc

    plain = tc.make_env

    def with_budget(*args, **kwargs):
        return plain(*args, **kwargs).set_state_budget(0, 0, tmp_path / "spill")

    def job(env, out, fail_at):
        from opforge.stream import FileSink, NumberSequenceSource

        ds = env.from_source(NumberSequenceSource(0, 399), source_name="numbers") \
            .map(lambda x: {"key": x % 7, "value": x, "seq": x}).map(tc.FailAt(fail_at)).name("fail")
        ds.key_by("key").sum("value").sink_to(FileSink(out / "sums", "json"))
        return ["sums"]

    ref, got, _ = tc.fail_and_restore(tmp_path / "plain", job, [150, 333], parallelism=1, batch=16)
    monkeypatch.setattr(tc, "make_env", with_budget)
    ref_b, got_b, _ = tc.fail_and_restore(tmp_path / "budget", job, [150, 333], parallelism=1, batch=16)
    assert got_b == ref_b == ref == got
    assert files_under(tmp_path / "spill") == []
