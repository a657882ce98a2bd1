"""KeyedStream rolling aggregates, keyed state (with TTL) and timers."""

import pytest
import torch

from opforge.stream import (AggregatingStateDescriptor, KeyedProcessFunction,
                            ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor, SimulatedClock,
                            SplitSource, StateTtlConfig, StreamExecutionEnvironment, ValueStateDescriptor,
                            WatermarkStrategy)
from opforge.stream.reference import run_reference
from stream_helpers import Avg, multiset, out_of_order_events

DATA = [(i % 4, (i * 37) % 11, i) for i in range(40)]


@pytest.mark.parametrize("op", ["sum", "min", "max"])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_rolling_aggregates_keep_the_first_record(op, parallelism):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=6)
    sink = getattr(env.from_collection(DATA).key_by(0), op)(1).collect()
    env.execute()
    fold = {"sum": lambda a, b: a + b, "min": min, "max": max}[op]
    acc, want = {}, []
    for k, v, i in DATA:
        first = acc.get(k)
        acc[k] = (k, v, i) if first is None else (k, fold(first[1], v), first[2])
        want.append(acc[k])
    assert multiset(sink.records()) == multiset(want)
    per_key = [r for r in sink.records() if r[0] == 1]
    assert per_key == [r for r in want if r[0] == 1]  # per-key order is kept


def test_reduce_on_dict_records_by_name():
    recs = [{"user": u, "n": 1} for u in "abcabca"]
    env = StreamExecutionEnvironment(parallelism=2, batch_size=2)
    sink = env.from_collection(recs).key_by("user").reduce(lambda a, b: {"user": a["user"], "n": a["n"] + b["n"]}).collect()
    env.execute()
    assert max(r["n"] for r in sink.records() if r["user"] == "a") == 3
    assert sorted(r["n"] for r in sink.records()) == [1, 1, 1, 2, 2, 2, 3]


class EveryState(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.seen = ctx.get_list_state(ListStateDescriptor("seen"))
        self.by_value = ctx.get_map_state(MapStateDescriptor("by_value"))
        self.total = ctx.get_reducing_state(ReducingStateDescriptor("total", lambda a, b: a + b))
        self.avg = ctx.get_aggregating_state(AggregatingStateDescriptor("avg", Avg()))

    def process_element(self, value, ctx):
        k, v, _ = value
        self.count.update((self.count.value() or 0) + 1)
        self.seen.add(v)
        self.by_value.put(v, (self.by_value.get(v) or 0) + 1)
        self.total.add(v)
        self.avg.add(v)
        yield (ctx.get_current_key(), self.count.value(), tuple(self.seen.get()),
               tuple(sorted(self.by_value.items())), self.total.get(), self.avg.get())


def test_keyed_state_kinds_match_python():
    env = StreamExecutionEnvironment(parallelism=2, batch_size=5)
    sink = env.from_collection(DATA).key_by(0).process(EveryState()).collect()
    env.execute()
    hist, want = {}, []
    for k, v, _ in DATA:
        hist.setdefault(k, []).append(v)
        vs = hist[k]
        counts = {}
        for x in vs:
            counts[x] = counts.get(x, 0) + 1
        want.append((k, len(vs), tuple(vs), tuple(sorted(counts.items())), sum(vs), sum(vs) / len(vs)))
    assert multiset(sink.records()) == multiset(want)


class Ttl(KeyedProcessFunction):
    def __init__(self, update_type):
        self.update_type = update_type

    def open(self, ctx):
        d = ValueStateDescriptor("last")
        d.enable_time_to_live(StateTtlConfig(250, self.update_type))
        self.last = ctx.get_state(d)

    def process_element(self, value, ctx):
        yield (value, self.last.value())
        if value != "read":
            self.last.update(value)


@pytest.mark.parametrize("update_type,want_last", [("OnCreateAndWrite", None), ("OnReadAndWrite", "w")])
def test_state_ttl_in_processing_time(update_type, want_last):
    # one batch per 100 ms round: write at 100, read at 300 (alive), read at 400:
    # 300 ms after the write (expired) unless the read at 300 refreshed it
    splits = [[["w"], [], ["read"], ["read"]]]
    env = StreamExecutionEnvironment(clock=SimulatedClock(step_ms=100))
    sink = env.from_source(SplitSource(splits)).key_by(lambda r: 0).process(Ttl(update_type)).collect()
    env.execute()
    assert sink.records() == [("w", None), ("read", "w"), ("read", want_last)]


class Timers(KeyedProcessFunction):
    """Registers a timer at ts+10 (twice: deduplicated), deletes timers of
    records with a negative value, and counts records per firing."""

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n"))

    def process_element(self, value, ctx):
        k, v, ts = value
        self.n.update((self.n.value() or 0) + 1)
        ts_svc = ctx.timer_service()
        ts_svc.register_event_time_timer(ctx.timestamp() + 10)
        ts_svc.register_event_time_timer(ctx.timestamp() + 10)
        if v < 0:
            ts_svc.delete_event_time_timer(ctx.timestamp() + 10)
        return ()

    def on_timer(self, timestamp, ctx):
        yield (ctx.get_current_key(), timestamp, self.n.value(), ctx.timestamp())


def timer_job(env, events):
    s = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner(lambda r, _: r[2])
    return env.from_collection(events, s).key_by(0).process(Timers()).collect()


def test_event_time_timers_fire_once_per_key_and_time():
    events = [(0, 1, 100), (0, 1, 100), (1, 1, 105), (0, -1, 120), (0, 1, 200)]
    env = StreamExecutionEnvironment(batch_size=1)
    sink = timer_job(env, events)
    env.execute()
    # key 0's timer at 110 fires once (registered by two records); the one at 130
    # was deleted; the watermark (max_ts - 21) passes 110 only after the record
    # at 200 was counted, and the end of input fires the timer at 210
    assert sink.records() == [(0, 110, 4, 110), (1, 115, 1, 115), (0, 210, 4, 210)]


@pytest.mark.parametrize("seed", [1, 2])
def test_timers_match_the_reference_executor(seed):
    events = out_of_order_events(300, keys=5, bound=20, seed=seed, late=0.05)
    outs = []
    for parallelism in (1, 3):
        env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=16)
        sink = timer_job(env, events)
        env.execute()
        outs.append(multiset(zip(sink.records(), sink.timestamps())))
    env = StreamExecutionEnvironment(batch_size=16)
    sink = timer_job(env, events)
    ref = multiset(run_reference(env)[sink])
    assert outs[0] == ref and outs[1] == ref and len(ref) > 50


def test_processing_time_timers():
    class Later(KeyedProcessFunction):
        def process_element(self, value, ctx):
            now = ctx.timer_service().current_processing_time()
            ctx.timer_service().register_processing_time_timer(now + 150)
            return ()

        def on_timer(self, ts, ctx):
            yield (ctx.get_current_key(), ts, ctx.time_domain())

    splits = [[["a"], [], [], [], []]]
    env = StreamExecutionEnvironment(clock=SimulatedClock(step_ms=100))
    sink = env.from_source(SplitSource(splits)).key_by(lambda r: r).process(Later()).collect()
    env.execute()
    assert sink.records() == [("a", 250, "processing_time")]


def test_timers_on_a_non_keyed_stream_are_an_error():
    class P(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service().register_event_time_timer(5)
            return ()

    env = StreamExecutionEnvironment()
    env.from_collection([1]).process(P()).collect()
    with pytest.raises(TypeError, match="timers need a keyed stream"):
        env.execute()


@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_rolling_tensor_path_with_tuple_keys_and_string_columns(op):
    recs = [{"k": ("ab"[i % 2], i % 3), "v": (i * 7919) % 101 - 50, "tag": f"t{i}"} for i in range(90)]
    env = StreamExecutionEnvironment(parallelism=2, batch_size=7)
    fast = getattr(env.from_collection(recs).key_by(lambda r: r["k"]), op)("v").collect()
    env.execute()
    fold = {"sum": lambda a, b: a + b, "min": min, "max": max}[op]
    acc, want = {}, []
    for r in recs:
        first = acc.get(r["k"])
        acc[r["k"]] = dict(r) if first is None else {**first, "v": fold(first["v"], r["v"])}
        want.append(acc[r["k"]])
    assert multiset(fast.records()) == multiset(want)


def test_rolling_record_path_on_non_number_fields():
    recs = [(i % 2, f"{i}") for i in range(6)]
    env = StreamExecutionEnvironment(batch_size=4)
    sink = env.from_collection(recs).key_by(0).sum(1).collect()
    env.execute()
    assert sink.records() == [(0, "0"), (1, "1"), (0, "02"), (1, "13"), (0, "024"), (1, "135")]


def test_segmented_scan():
    from opforge.stream.rolling import segmented_scan

    g = torch.Generator().manual_seed(3)
    seg = torch.sort(torch.randint(0, 9, (200,), generator=g)).values
    v = torch.randint(-20, 20, (200,), generator=g)
    for op, fold in (("sum", lambda a, b: a + b), ("min", min), ("max", max)):
        want, prev = [], None
        for s, x in zip(seg.tolist(), v.tolist()):
            cur = x if prev is None or prev[0] != s else fold(prev[1], x)
            want.append(cur)
            prev = (s, cur)
        assert segmented_scan(v, seg, op).tolist() == want


def test_non_int_key_ids_hash_the_value_the_same_in_every_process():
    from opforge.stream.keys import KeyCodec

    one, two = KeyCodec(), KeyCodec()
    keys = ["a", "ü", b"a", ("a", 2.5, None), 1.0, True, 1, -0.0, 0, float("nan"), float("nan")]
    ids = one.encode(keys, "cpu").tolist()
    assert two.encode(keys[::-1], "cpu").tolist() == ids[::-1]  # not by first sight
    assert ids[0] == 99937443907769475  # pinned: checkpoints and the workers of a cluster rely on it
    assert len(set(ids[:5])) == 5 and len({ids[4], ids[5], ids[6]}) == 1 and ids[7] == ids[8] and ids[9] == ids[10]
    assert one.values[ids[3]] == ("a", 2.5, None) and one.local is None
    [local] = one.encode([frozenset([1])], "cpu").tolist()  # by first sight: this process's own id
    assert one.values[local] == frozenset([1]) and one.local == frozenset([1])
    with pytest.raises(TypeError, match="not hashable"):
        one.encode([["a"]], "cpu")
    old = KeyCodec()
    old.restore(None, ["x", "y"])  # a checkpoint of dense ids keeps them: its state is keyed by them
    assert old.encode(["y", "x", "z"], "cpu").tolist()[:2] == [1, 0]


def test_every_nan_key_is_one_key():
    recs = [{"k": v, "n": 1} for v in [float("nan"), 1.5, float("nan"), 1.5, float("nan")]]
    env = StreamExecutionEnvironment(parallelism=2, batch_size=2)
    sink = env.from_collection(recs).key_by("k").reduce(lambda a, b: {"k": a["k"], "n": a["n"] + b["n"]}).collect()
    env.execute()
    assert sorted(r["n"] for r in sink.records()) == [1, 1, 2, 2, 3]
