"""Checkpoints in one process: a job fails (an exception at a chosen record),
is restored from its latest checkpoint, and its committed file-sink output
must equal a failure-free run's. Covers every keyed state kind with TTL,
event- and processing-time timers, window contents of each window operator,
watermarks (late data), the codec, no pickle, clear errors, retention and
crash debris."""

import json
import os
from collections import namedtuple
from dataclasses import dataclass

import pyarrow as pa
import pytest
import torch

from checkpoint_job import per_subtask_rows
from opforge.stream import (AggregatingStateDescriptor, Aggregations, CheckpointRestoreError,
                            CheckpointSerializationError, CollectionSource, EventTimeSessionWindows, FileSink,
                            KeyedProcessFunction, ListStateDescriptor, MapFunction, MapStateDescriptor,
                            NumberSequenceSource, OutputTag, ProcessWindowFunction, ReducingStateDescriptor,
                            SimulatedClock, SlidingEventTimeWindows, StateTtlConfig, StreamExecutionEnvironment,
                            TimeWindow, TumblingEventTimeWindows, ValueStateDescriptor, WatermarkStrategy)
from opforge.stream.checkpoint import StateEncoder, completed_checkpoints, decode, read_checkpoint
from stream_helpers import Avg, out_of_order_events


class Boom(RuntimeError):
    pass


class FailAt(MapFunction):
    """Raises on the record whose ``seq`` field is ``at`` (a crash mid-job)."""

    def __init__(self, at):
        self.at = at

    def map(self, value):
        if value["seq"] == self.at:
            raise Boom(f"injected failure at record {self.at}")
        return value


def events(n, keys, seed, late=0.0):
    return [{"key": k, "value": v, "ts": t, "seq": i}
            for i, (k, v, t) in enumerate(out_of_order_events(n, keys, 20, seed, late))]


def make_env(ckpt, parallelism=2, batch=4, interval=200):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch, clock=SimulatedClock(step_ms=100))
    return env.enable_checkpointing(interval, ckpt)


def fail_and_restore(tmp_path, build, fail_ats, **env_args):
    """(failure-free output, output of runs failing at ``fail_ats`` and restored), per sink."""
    ref_out, out, ckpt = tmp_path / "ref", tmp_path / "out", str(tmp_path / "ckpt")
    env = make_env(str(tmp_path / "ref-ckpt"), **env_args)
    sinks = build(env, ref_out, None)
    env.execute()
    for at in fail_ats:
        env = make_env(ckpt, **env_args)
        build(env, out, at)
        with pytest.raises(Boom):
            env.execute(restore_from=ckpt)
    env = make_env(ckpt, **env_args)
    build(env, out, None)
    res = env.execute(restore_from=ckpt)
    assert res.restored_from is not None and os.path.basename(res.restored_from).startswith("chk-")
    return ({s: per_subtask_rows(ref_out / s) for s in sinks}, {s: per_subtask_rows(out / s) for s in sinks}, ckpt)


def source(env, evs, fail_at, strategy=None):
    strategy = strategy or WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
    return env.from_source(CollectionSource(evs), strategy, "events").map(FailAt(fail_at)).name("fail")


# -- keyed state of every kind, TTL, timers ------------------------------------------------

class EveryState(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.seen = ctx.get_list_state(ListStateDescriptor("seen"))
        self.by_value = ctx.get_map_state(MapStateDescriptor("by_value"))
        self.total = ctx.get_reducing_state(ReducingStateDescriptor("total", lambda a, b: a + b))
        self.avg = ctx.get_aggregating_state(AggregatingStateDescriptor("avg", Avg()))
        ttl = ValueStateDescriptor("recent")
        ttl.enable_time_to_live(StateTtlConfig(250))
        self.recent = ctx.get_state(ttl)

    def process_element(self, value, ctx):
        v = value["value"]
        self.count.update((self.count.value() or 0) + 1)
        self.seen.add(v % 5)
        self.by_value.put(v % 3, (self.by_value.get(v % 3) or 0) + 1)
        self.total.add(v)
        self.avg.add(v)
        recent = self.recent.value()
        self.recent.update(v)
        ts = ctx.timer_service()
        ts.register_event_time_timer(value["ts"] // 50 * 50 + 49)
        ts.register_processing_time_timer(ts.current_processing_time() // 300 * 300 + 300)
        yield {"key": ctx.get_current_key(), "seq": value["seq"], "count": self.count.value(),
               "seen": str(self.seen.get()[-6:]), "by_value": str(sorted(self.by_value.items())),
               "total": self.total.get(), "avg": self.avg.get(), "recent": -1 if recent is None else recent,
               "timer": -1, "domain": ""}

    def on_timer(self, timestamp, ctx):
        yield {"key": ctx.get_current_key(), "seq": -1, "count": self.count.value(), "seen": "", "by_value": "",
               "total": self.total.get(), "avg": 0.0, "recent": -1, "timer": timestamp,
               "domain": str(ctx.time_domain())}


def state_job(evs):
    def build(env, out, fail_at):
        source(env, evs, fail_at).key_by("key").process(EveryState()).name("every state") \
            .sink_to(FileSink(out / "state", "json"))
        return ["state"]
    return build


def test_every_state_kind_ttl_and_timers_survive_a_failure(tmp_path):
    evs = events(240, 9, 1)
    ref, got, ckpt = fail_and_restore(tmp_path, state_job(evs), [70, 170])
    assert got == ref
    rows = [r for rows in ref["state"].values() for r in rows]
    assert {r["domain"] for r in rows if r["seq"] == -1} == {"event_time", "processing_time"}
    assert any(r["recent"] == -1 and r["count"] > 1 for r in rows)  # TTL expired some values
    assert sum(1 for r in rows if r["seq"] >= 0) == len(evs)


def test_checkpoint_holds_state_kinds_ttl_timers_and_watermarks(tmp_path):
    evs = events(120, 5, 2)
    env = make_env(str(tmp_path / "ckpt"), interval=100000)
    state_job(evs)(env, tmp_path / "out", 80)
    with pytest.raises(Boom):
        env.execute()
    assert completed_checkpoints(str(tmp_path / "ckpt")) == []  # the interval never elapsed
    env = make_env(str(tmp_path / "ckpt"), interval=300)
    state_job(evs)(env, tmp_path / "out2", 80)
    with pytest.raises(Boom):
        env.execute()
    (cid, path), = completed_checkpoints(str(tmp_path / "ckpt"))
    meta, tree = read_checkpoint(path, "cpu")
    assert meta["checkpoint_id"] == cid and meta["type"] == "checkpoint"
    op = tree["operators"][next(u for u in tree["operators"] if u.endswith(":every state"))]
    assert len(op) == 2
    states = op[0]["operator"]["keyed_state"]
    assert {n: s["kind"] for n, s in states.items()} == {
        "count": "value", "seen": "list", "by_value": "map", "total": "reducing", "avg": "aggregating",
        "recent": "value"}
    assert states["recent"]["ttl"] == {"ttl_ms": 250, "update_type": "OnCreateAndWrite"}
    assert states["count"]["ttl"] is None
    assert all(isinstance(e[2], tuple) for e in states["avg"]["entries"])  # the accumulator, as it was
    assert op[0]["operator"]["event_timers"] and op[0]["operator"]["processing_timers"]
    assert op[0]["current"] > -(2**63) and op[0]["operator"]["watermark"] == op[0]["current"]
    src = tree["sources"][next(u for u in tree["sources"])]
    assert [s["position"] for s in src] and all(isinstance(s["position"], int) for s in src)
    assert tree["clock"] > 0


# -- windows and watermarks -------------------------------------------------------------------

class Sessions(ProcessWindowFunction):
    def process(self, key, context, elements):
        vals = [e["value"] for e in elements]
        w = context.window()
        yield {"key": key, "start": w.start, "end": w.end, "n": len(vals), "sum": sum(vals), "kind": "session"}


def window_job(evs):
    late = OutputTag("late")

    def build(env, out, fail_at):
        keyed = source(env, evs, fail_at).key_by("key")
        keyed.window(EventTimeSessionWindows.with_gap(15)).process(Sessions()) \
            .sink_to(FileSink(out / "sessions", "parquet"))
        w = keyed.window(SlidingEventTimeWindows.of(40, 20)).allowed_lateness(10).side_output_late_data(late) \
            .reduce(lambda a, b: {"key": a["key"], "value": a["value"] + b["value"], "ts": max(a["ts"], b["ts"]),
                                  "seq": min(a["seq"], b["seq"])})
        w.sink_to(FileSink(out / "sliding", "csv"))
        w.get_side_output(late).sink_to(FileSink(out / "late", "json"))
        keyed.window(TumblingEventTimeWindows.of(30)) \
            .aggregate(Aggregations(with_window=True, n=("count",), top=("max", "value"), mean=("mean", "value"))) \
            .sink_to(FileSink(out / "columnar", "json"))
        return ["sessions", "sliding", "late", "columnar"]
    return build


def test_window_contents_and_watermarks_survive_a_failure(tmp_path):
    evs = events(300, 6, 3, late=0.08)
    ref, got, _ = fail_and_restore(tmp_path, window_job(evs), [90, 200])
    assert got == ref
    assert all(ref[s] for s in ("sessions", "sliding", "late", "columnar"))  # each sink had output
    # late data is decided by the restored watermark: without it, late records would be taken in
    assert sum(len(v) for v in ref["late"].values()) > 0


def test_restored_watermark_decides_late_data_right_after_restore(tmp_path):
    """Fail on a late record with a checkpoint every round: the first batch after
    the restore holds it, and only the restored watermark makes it late."""
    evs = events(200, 4, 8, late=0.1)
    build = window_job(evs)
    env = make_env(str(tmp_path / "probe-ckpt"), parallelism=1, interval=0)
    build(env, tmp_path / "probe", None)
    env.execute()
    late = [r["seq"] for rows in per_subtask_rows(tmp_path / "probe" / "late").values() for r in rows]
    assert len(late) >= 2
    ref, got, _ = fail_and_restore(tmp_path, build, [late[len(late) // 2]], parallelism=1, interval=0)
    assert got == ref


def test_restore_with_one_subtask_and_number_sequence_source(tmp_path):
    """A NumberSequenceSource (range position) into a rolling sum, parallelism 1."""
    def build(env, out, fail_at):
        ds = env.from_source(NumberSequenceSource(0, 399), source_name="numbers") \
            .map(lambda x: {"key": x % 3, "value": x, "seq": x}).map(FailAt(fail_at)).name("fail")
        ds.key_by("key").sum("value").sink_to(FileSink(out / "sums", "json"))
        return ["sums"]
    ref, got, _ = fail_and_restore(tmp_path, build, [150, 333], parallelism=1, batch=16)
    assert got == ref
    want = {}
    for x in range(400):
        want[x % 3] = want.get(x % 3, 0) + x
    last = {}
    for r in ref["sums"][0]:
        last[r["key"]] = r["value"]
    assert last == want


# -- the codec, no pickle, errors ----------------------------------------------------------------

Point = namedtuple("Point", "x y")


@dataclass
class Reading:
    sensor: str
    value: float


def test_codec_round_trips_every_supported_value():
    value = {"none": None, "flag": True, "int": 2**62, "float": 1.5, "nan": float("nan"), "inf": float("-inf"),
             "str": "é", "list": [1, [2, 3]], "tuple": (1, ("a", None)), "set": {1, 2}, "fset": frozenset({"x"}),
             "bytes": b"\x00\xff", "dict_int_keys": {1: "a", (2, 3): "b"}, "$dollar": 1, "window": TimeWindow(0, 10),
             "point": Point(1, 2), "reading": Reading("s", 2.5), "v": {"v": 1, "$t": 2},
             "tensors": [torch.arange(5), torch.tensor([True, False]), torch.ones(2, 3, dtype=torch.bfloat16),
                         torch.empty(0, dtype=torch.float64)]}
    enc = StateEncoder()
    doc = json.loads(json.dumps(enc.encode(value, "test")))
    back = decode(doc, dict(enc.tensors))
    tensors = back.pop("tensors")
    want = dict(value)
    want_t = want.pop("tensors")
    assert back.pop("nan") != back.pop("nan", 0)  # nan round-trips as nan
    want.pop("nan")
    assert back == want
    assert isinstance(back["tuple"], tuple) and isinstance(back["point"], Point)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(tensors, want_t))


class Opaque:
    pass


class HoldsOpaque(KeyedProcessFunction):
    def open(self, ctx):
        self.thing = ctx.get_state(ValueStateDescriptor("thing"))

    def process_element(self, value, ctx):
        self.thing.update(Opaque())
        return ()


def test_unserializable_state_is_a_clear_error_naming_operator_and_state(tmp_path):
    env = make_env(str(tmp_path / "ckpt"), interval=0)
    env.from_collection([(1, 2), (2, 3)]).key_by(0).process(HoldsOpaque()).name("holder") \
        .sink_to(FileSink(tmp_path / "out", "json"))
    with pytest.raises(CheckpointSerializationError) as e:
        env.execute()
    msg = str(e.value)
    assert "operator 'holder' (subtask " in msg and "state 'thing'" in msg and "Opaque" in msg and "pickle" in msg
    assert completed_checkpoints(str(tmp_path / "ckpt")) == []
    assert not [n for n in os.listdir(tmp_path / "ckpt")]  # nothing half-written


def test_local_classes_are_refused_with_a_clear_error():
    @dataclass
    class Local:
        a: int

    with pytest.raises(CheckpointSerializationError, match="inside a function"):
        StateEncoder().encode(Local(1), "x")


def test_checkpoint_files_hold_no_pickle(tmp_path):
    evs = events(150, 5, 4)
    env = make_env(str(tmp_path / "ckpt"), interval=0)
    window_job(evs)(env, tmp_path / "out", None)
    env.execute()
    (_, path), = completed_checkpoints(str(tmp_path / "ckpt"))
    assert sorted(os.listdir(path)) == ["_metadata", "state.json", "tensors.arrow"]
    for name in ("_metadata", "state.json"):
        with open(os.path.join(path, name), encoding="utf-8") as f:
            json.load(f)
    with pa.memory_map(os.path.join(path, "tensors.arrow")) as f:
        table = pa.ipc.open_file(f).read_all()
    assert table.column_names == ["name", "dtype", "shape", "data"] and table.num_rows > 0
    for name in os.listdir(path):
        data = open(os.path.join(path, name), "rb").read()
        assert b"pickle" not in data and not data.startswith(b"\x80")
        assert b"\x80\x04\x95" not in data and b"\x80\x05\x95" not in data  # pickle protocol 4/5 frames


# -- storage: retention, debris, mismatches ------------------------------------------------------

def simple_job(env, out, fail_at=None):
    evs = events(80, 3, 5)
    source(env, evs, fail_at).key_by("key").window(TumblingEventTimeWindows.of(30)) \
        .aggregate(Aggregations(n=("count",))).sink_to(FileSink(out, "json"))


def test_retention_and_crash_debris_are_ignored(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = make_env(str(ckpt), interval=0)
    simple_job(env, tmp_path / "out", 60)
    with pytest.raises(Boom):
        env.execute()
    (cid, path), = completed_checkpoints(str(ckpt))  # max_retained_checkpoints=1
    # debris of a crash while writing the next checkpoint
    os.makedirs(ckpt / f".chk-{cid + 1}.tmp-999")
    os.makedirs(ckpt / f"chk-{cid + 1}")
    (ckpt / f"chk-{cid + 1}" / "state.json").write_text("{")
    env = make_env(str(ckpt), interval=0)
    simple_job(env, tmp_path / "out", None)
    res = env.execute(restore_from=str(ckpt))
    assert res.restored_from == path
    assert [os.path.basename(p) for _, p in completed_checkpoints(str(ckpt))] == \
        [os.path.basename(res.checkpoints[-1])]
    assert not any(n.startswith(".") for n in os.listdir(ckpt))
    with pytest.raises(CheckpointRestoreError, match="incomplete"):
        os.makedirs(ckpt / "chk-999")
        env = make_env(str(ckpt))
        simple_job(env, tmp_path / "x", None)
        env.execute(restore_from=str(ckpt / "chk-999"))


def test_restore_into_a_different_job_is_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    env = make_env(ckpt, interval=0)
    simple_job(env, tmp_path / "out", None)
    env.execute()
    env = make_env(ckpt)
    source(env, events(10, 2, 1), None).key_by("key").process(EveryState()).sink_to(FileSink(tmp_path / "o2"))
    with pytest.raises(CheckpointRestoreError, match="job graph differs"):
        env.execute(restore_from=ckpt)
    env = make_env(ckpt, parallelism=3)
    simple_job(env, tmp_path / "o3", None)
    with pytest.raises(CheckpointRestoreError, match="parallelism"):
        env.execute(restore_from=ckpt)
    with pytest.raises(CheckpointRestoreError, match="does not exist"):
        env = make_env(ckpt)
        simple_job(env, tmp_path / "o4", None)
        env.execute(restore_from=str(tmp_path / "nowhere"))


def test_enable_checkpointing_validates_its_arguments(tmp_path):
    env = StreamExecutionEnvironment()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        env.enable_checkpointing(100)
    with pytest.raises(ValueError, match="interval_ms"):
        env.enable_checkpointing(-1, tmp_path)
    with pytest.raises(ValueError, match="mode"):
        env.enable_checkpointing(10, tmp_path, mode="SOMETIMES")
    cfg = env.enable_checkpointing(10, tmp_path, mode="AT_LEAST_ONCE").get_checkpoint_config()
    assert (cfg.interval_ms, cfg.mode, cfg.checkpoint_dir) == (10, "AT_LEAST_ONCE", str(tmp_path))


# -- Nexmark: the generator's position ------------------------------------------------------------

class FailOnWindow(MapFunction):
    def __init__(self, start):
        self.start = start

    def map(self, value):
        if value["window_start"] == self.start:
            raise Boom(f"injected failure at window {self.start}")
        return value


def test_nexmark_q5_restores_generator_positions_and_sliding_windows(tmp_path):
    from opforge.stream import nexmark

    cfg = nexmark.NexmarkConfig(events=6000, events_per_second=1000, max_out_of_orderness_ms=300)
    split, = nexmark.NexmarkSource(cfg).splits(1, 250, "cpu")
    next(split)
    pos = split.position()
    assert pos == 250
    after = next(split)
    again, = nexmark.NexmarkSource(cfg).splits(1, 250, "cpu")
    again.seek(pos)
    assert torch.equal(next(again)["price"], after["price"])

    def build(env, out, fail_at):
        nexmark.q5(env, cfg, size_ms=2000, slide_ms=500).map(FailOnWindow(fail_at)).name("fail") \
            .sink_to(FileSink(out / "q5", "json"))
        return ["q5"]

    ref, got, _ = fail_and_restore(tmp_path, build, [1500, 3500], batch=100)
    assert got == ref
    assert sum(len(v) for v in ref["q5"].values()) >= 10
