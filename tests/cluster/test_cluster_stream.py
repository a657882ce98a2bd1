"""Stream jobs on a local Ray cluster of 3 CPU workers (Gloo): ``StreamExecutionEnvironment(cluster=c)``.

The job (a keyed tumbling event-time window and a keyed reduce over a source of 6 subtasks, then a
keyed reduce over the windows: two hops between workers) keeps
its state in 6 key-group regions placed by the placement driver, 2 replicas each; its subtasks run
on the regions' leaders (following them when the driver moves one) and records cross workers over
the process group. Its output equals the
single-process engine's on the same input (that engine is checked against PyFlink elsewhere),
without failures and with a worker SIGKILLed mid-job: the job then restores from the last
completed checkpoint on the new leaders and the sinks see every record exactly once. String keys
too: their ids hash the value, so every worker puts a key in the same key group. A second job of
two sources checks the operators of two inputs (a union, a keyed co-process function with state
and timers, interval and window joins, record path and columnar) the same way, with and without a
worker killed.
"""
import random
import time

import pytest

from opforge.stream import (Aggregations, BroadcastProcessFunction, CollectionSource, FileSink, KeyedCoProcessFunction,
                            MapStateDescriptor, SimulatedClock, StreamExecutionEnvironment, TumblingEventTimeWindows,
                            Types, ValueStateDescriptor, WatermarkStrategy, vectorized)

BOUND = 30


def _events(n: int, seed: int) -> list[dict]:
    """Rising event time, jittered past the watermark bound now and then (some records are late)."""
    rng = random.Random(seed)
    t, out = 0, []
    for _ in range(n):
        t += rng.randint(0, 6)
        out.append({"key": rng.randrange(11), "value": rng.randint(-20, 100), "ts": max(0, t - rng.randint(0, 40))})
    return out


EVENTS = _events(400, 3)
# string keys: their ids hash the value, the same on every worker (not ids by first sight)
NAMED = [{**e, "key": f"user-{e['key']}" if e["key"] % 3 else f"üser-{e['key']}"} for e in _events(200, 5)]


def _build(env, files=None, events=EVENTS):
    """``files``: a directory the windows also go to through a transactional FileSink."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("ts")
    keyed = env.from_source(CollectionSource(events), strategy, "events").uid("events").key_by("key")
    windows = keyed.window(TumblingEventTimeWindows.of(50)) \
        .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "value"))).uid("windows")
    if files is not None:
        windows.sink_to(FileSink(str(files), "json")).uid("files")
    running = keyed.reduce(lambda a, b: {"key": a["key"], "value": a["value"] + b["value"], "ts": b["ts"]}) \
        .uid("running").collect()
    # a second keyed hop: running totals per window count, in the order the windows arrive
    per_count = windows.key_by("n").reduce(lambda a, b: {**b, "total": a["total"] + b["total"]}) \
        .uid("per count").collect()
    return windows.collect(), running, per_count


def _committed_rows(directory) -> list:
    return sorted(line for f in sorted(directory.glob("part-*.jsonl")) for line in f.read_text().splitlines())


def _env(checkpoints, **kw):
    """Checkpoints every round (on a cluster they live in the job's regions, not in ``checkpoints``)."""
    env = StreamExecutionEnvironment(batch_size=24, clock=SimulatedClock(step_ms=100), **kw)
    env.enable_checkpointing(100, str(checkpoints))
    return env


def _outputs(windows, running, per_count):
    """Window results as a multiset; each reduce's running values per key in the order emitted."""
    return sorted(map(repr, windows.records())), _per_key(running, "key"), _per_key(per_count, "n")


def _per_key(sink, key: str) -> dict:
    out: dict = {}
    for r in sink.records():
        out.setdefault(r[key], []).append(repr(r))
    return out


def _single_process(tmp_path_factory, events):
    env = _env(tmp_path_factory.mktemp("checkpoints"), parallelism=6)
    files = tmp_path_factory.mktemp("single-files")
    sinks = _build(env, files, events)
    res = env.execute("single process")
    return _outputs(*sinks), _committed_rows(files), _counts(res)


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    return _single_process(tmp_path_factory, EVENTS)


def _counts(res) -> dict:
    return {name: (m.records_in, m.records_out) for name, m in res.metrics.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import opforge.cluster as C

    c = C.start(workers=3, env={"OPFORGE_INTERPRET": "0"}, temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield c
    c.stop()


def _run(cluster, after_round, files, events=EVENTS):
    from opforge.cluster.stream_job import ClusterStreamJob

    env = _env(files, cluster=cluster)
    sinks = _build(env, files, events)
    job = ClusterStreamJob(env, env._take_graph("keyed"), "keyed")
    return job, job.run(after_round), _outputs(*sinks)


def test_a_job_on_three_workers_equals_the_single_process_engine(cluster, expected, tmp_path):
    seen = []

    def look(job, n):  # the key-group regions, as the placement driver and the workers hold them
        ids = cluster.tables[job.table]["regions"]
        assert len(ids) == 6 and set(ids) <= set(cluster.pd.driver.cluster.regions)
        held = [cluster.held_by(w) for w in range(cluster.size)]
        for rid in ids:
            stores = [p["store_id"] for p in cluster.regions[rid].peers]
            assert len(set(stores)) == 2  # replicated on two workers, each holding the region's checkpoints
            assert all(held[cluster.worker_of(s)][rid] >= 1 for s in stores)
        seen.append(job.leaders())
        if len(seen) == 1:  # an admin moves range 0's leader: the job follows at its next checkpoint
            meta = cluster.regions[ids[0]]
            follower = next(p["store_id"] for p in meta.peers if p["id"] != meta.leader_peer_id)
            cluster.pd.service.add_operator({"kind": "transfer-leader", "region_id": ids[0], "to_store": follower})

    job, res, got = _run(cluster, look, tmp_path)
    assert got == expected[0] and _committed_rows(tmp_path) == expected[1]
    assert seen and all(sorted(set(leaders)) == [0, 1, 2] for leaders in seen)  # subtasks on every worker
    assert job.moves >= 1 and seen[-1][0] != seen[0][0]  # range 0's subtasks moved with its leader
    assert res.restarts == 0 and len(res.checkpoints) >= 3 and res.source_records == len(EVENTS)
    assert _counts(res) == expected[2]  # records in / out of every operator, each record once
    assert 0 < job.exchanged["records"] < 2 * len(EVENTS)  # the keyed edges crossed workers
    assert job.table not in cluster.tables  # the job's regions go with it


def _race():
    """A keyed co-process function (defined here: the workers cannot import this module, so Ray
    ships it by value)."""

    class Race(KeyedCoProcessFunction):
        """Counts each input per key in shared keyed state; an event-time timer after each record of the
        second input reports both counts (state and timers of two inputs, on the key's worker)."""

        def open(self, ctx):
            self.left = ctx.get_state(ValueStateDescriptor("left"))
            self.right = ctx.get_state(ValueStateDescriptor("right"))

        def process_element1(self, value, ctx):
            self.left.update((self.left.value() or 0) + 1)
            return ()

        def process_element2(self, value, ctx):
            self.right.update((self.right.value() or 0) + 1)
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 25)
            yield {"side": "right", "key": ctx.get_current_key(), "n": self.right.value()}

        def on_timer(self, ts, ctx):
            yield {"side": "timer", "key": ctx.get_current_key(), "ts": ts, "left": self.left.value() or 0,
                   "right": self.right.value()}

    return Race()


BIDS = _events(300, 8)


def _build_merging(env):
    """Two sources into a union (then a keyed reduce: each key's order counts), a keyed connect
    with a co-process function, an interval join and a window join."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("ts")
    a = env.from_source(CollectionSource(EVENTS), strategy, "events").uid("events")
    b = env.from_source(CollectionSource(BIDS), strategy, "bids").uid("bids")
    union = a.union(b).uid("union")
    running = union.key_by("key").reduce(lambda x, y: {**y, "value": x["value"] + y["value"]}).uid("totals").collect()
    race = a.connect(b).key_by("key", "key").process(_race()).uid("race").collect()
    pairs = a.key_by("key").interval_join(b.key_by("key")).between(-8, 5) \
        .process(lambda x, y, ctx: {"key": x["key"], "a": x["value"], "b": y["value"], "ts": y["ts"]}).uid("ij").collect()
    windowed = a.join(b).where("key").equal_to("key").window(TumblingEventTimeWindows.of(40)) \
        .apply(lambda x, y: {"key": x["key"], "sum": x["value"] + y["value"]}).uid("wj").collect()
    # the same joins with vectorized functions: the columnar interval join and window join operators
    columns = vectorized(lambda x, y: {"key": x["key"], "a": x["value"], "b": y["value"]})
    pairs_c = a.key_by("key").interval_join(b.key_by("key")).between(-8, 5).process(columns).uid("ij columns").collect()
    windowed_c = a.join(b).where("key").equal_to("key").window(TumblingEventTimeWindows.of(40)) \
        .apply(columns).uid("wj columns").collect()
    return union.collect(), running, race, pairs, windowed, pairs_c, windowed_c


def _merging_outputs(union, running, race, *joins):
    """Multisets, and each key's running totals and co-process output in the order emitted."""
    return (sorted(map(repr, union.records())), _per_key(running, "key"), _per_key(race, "key"),
            *(sorted(map(repr, j.records())) for j in joins))


@pytest.fixture(scope="module")
def merging_expected(tmp_path_factory):
    env = _env(tmp_path_factory.mktemp("checkpoints"), parallelism=6)
    sinks = _build_merging(env)
    res = env.execute("single process")
    return _merging_outputs(*sinks), _counts(res)


def _run_merging(cluster, tmp_path, after_round=None):
    from opforge.cluster.stream_job import ClusterStreamJob

    env = _env(tmp_path, cluster=cluster)
    sinks = _build_merging(env)
    job = ClusterStreamJob(env, env._take_graph("merging"), "merging")
    return job, job.run(after_round), _merging_outputs(*sinks)


def test_unions_connects_and_joins_on_three_workers_equal_the_single_process_engine(cluster, merging_expected,
                                                                                    tmp_path):
    job, res, got = _run_merging(cluster, tmp_path)
    union, running, race, *joins = got
    assert len(union) == len(EVENTS) + len(BIDS) and all(joins) and any("timer" in r for v in race.values() for r in v)
    assert got == merging_expected[0] and _counts(res) == merging_expected[1]
    assert res.restarts == 0 and len(res.checkpoints) >= 3
    assert res.source_records == len(EVENTS) + len(BIDS) and job.exchanged["records"] > 0


def test_a_worker_killed_under_joins_gives_exactly_the_failure_free_output(cluster, merging_expected, tmp_path):
    killed = []

    def kill(job, n):
        if n == 3 and not killed:
            assert job.completed >= 1  # a checkpoint holding both inputs' state to restore from
            killed.append(cluster.store_of[0])
            cluster.kill_worker(0)

    job, res, got = _run_merging(cluster, tmp_path, kill)
    assert killed and res.restarts == 1
    assert got == merging_expected[0] and _counts(res) == merging_expected[1]  # nothing lost, nothing twice
    assert res.source_records == len(EVENTS) + len(BIDS)


class _Rules(BroadcastProcessFunction):
    def process_element(self, value, ctx):
        yield value

    def process_broadcast_element(self, value, ctx):
        return ()


def test_what_a_cluster_cannot_run_is_refused(cluster, tmp_path):
    env = _env(tmp_path, cluster=cluster)
    env.from_collection([("a", 1), ("b", 2)]).key_by(lambda r: frozenset(r[0])).reduce(lambda a, b: a).collect()
    with pytest.raises(TypeError, match="key frozenset.* is a frozenset"):  # its id is by first sight: per worker
        env.execute("frozenset keys")
    rules = MapStateDescriptor("rules", Types.INT(), Types.INT())
    env.from_collection([1, 2]).connect(env.from_collection([3]).broadcast(rules)).process(_Rules()).collect()
    with pytest.raises(NotImplementedError, match="'BroadcastProcess' uses broadcast state"):
        env.execute("broadcast state")


def test_an_operators_error_is_the_jobs_own_not_a_lost_worker(cluster, tmp_path):
    env = _env(tmp_path, cluster=cluster)
    env.from_source(CollectionSource(EVENTS), source_name="events").key_by("key") \
        .map(lambda r: r["value"] // (r["key"] - 5)).name("divide").collect()
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match=r"divide.*\(on worker \d\)"):  # raised once, not retried
        env.execute("divide by zero")
    assert time.monotonic() - t0 < 10  # key 5's worker fails alone: its peers do not wait out the group's timeout


def test_a_worker_failing_alone_mid_job_gives_exactly_the_failure_free_output(cluster, expected, tmp_path):
    injected = []

    def fail(job, n):
        if n == 2 and not injected:
            injected.append(n)
            cluster.inject_failure(1, "disk on fire")  # its next round raises while its peers exchange

    job, res, got = _run(cluster, fail, tmp_path)
    assert injected and res.restarts == 1  # retried from the last checkpoint, no process lost
    assert got == expected[0] and _committed_rows(tmp_path) == expected[1]
    assert res.source_records == len(EVENTS) and _counts(res) == expected[2]


def test_a_worker_killed_mid_job_gives_exactly_the_failure_free_output(cluster, expected, tmp_path):
    killed = {}

    def kill(job, n):
        if n == 2 and not killed:
            assert job.completed >= 1  # a checkpoint to restore from
            killed["store"] = cluster.store_of[1]
            cluster.kill_worker(1)

    job, res, got = _run(cluster, kill, tmp_path)
    assert killed and res.restarts == 1
    assert got == expected[0]  # nothing lost, nothing twice
    assert _committed_rows(tmp_path) == expected[1] and len(expected[1]) == len(got[0])  # the FileSink's too
    assert res.source_records == len(EVENTS) and _counts(res) == expected[2]  # counted once, replays not again
    assert killed["store"] in cluster.dead_stores and cluster.store_of[1] != killed["store"]
    states = {s["store_id"]: s["state"] for s in cluster.status()["stores"]}
    assert states[killed["store"]] in ("offline", "tombstone")


def test_string_keys_with_a_worker_killed_give_the_single_process_output(cluster, tmp_path_factory, tmp_path):
    expected = _single_process(tmp_path_factory, NAMED)
    killed = []

    def kill(job, n):
        if n == 3 and not killed:
            killed.append(cluster.store_of[2])
            cluster.kill_worker(2)

    job, res, got = _run(cluster, kill, tmp_path, NAMED)
    assert killed and res.restarts == 1 and job.exchanged["records"] > 0
    assert got == expected[0] and _committed_rows(tmp_path) == expected[1]  # keys decode on the new leaders too
    assert any("'üser-3'" in w for w in got[0]) and "üser-3" in got[1]  # the user's keys, decoded
