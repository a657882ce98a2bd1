"""The columnar joins' buffered rows under a state budget (``env.set_state_budget``):
rows over ``device_bytes`` wait in host memory and Arrow IPC files, come back
before they are needed (a window join's when their windows fire, a regular
join's when a batch meets their key), and the outputs — records, order,
timestamps — are those of the job without a budget; checkpoints hold every tier."""

import os

import pytest
import torch

import opforge.stream.columnar_join as columnar_join
from opforge.stream import (CollectionSource, SlidingEventTimeWindows, StateBudget,
                            StreamExecutionEnvironment, TumblingEventTimeWindows, WatermarkStrategy, vectorized)
from opforge.stream.columnar_join import RegularJoinOperator, WindowJoinOperator
from opforge.stream.keys import KeySelector
from opforge.stream.records import Batch
from opforge.stream.state_budget import ColdRows
from stream_helpers import (multiset, out_of_order_events, record_cold_rows, reference_outputs, run_with_failures,
                            simulated_env)
from test_columnar_joins import (WINDOWS, _Boom, _rows, both_joins, regular_join, vector_difference, vector_pair,
                                 window_join)

BOUND = 15
# windows long enough that a subtask buffers more than the tiny budgets below
LONG = {
    "tumbling": lambda: TumblingEventTimeWindows.of(300),
    "sliding": lambda: SlidingEventTimeWindows.of(400, 100),
    "sliding-ragged": lambda: SlidingEventTimeWindows.of(350, 100, 30),
}
TINY = (2048, 4096)  # device, host bytes per subtask


def files_under(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


@pytest.fixture
def long_windows(monkeypatch):
    for name, make in LONG.items():
        monkeypatch.setitem(WINDOWS, f"long-{name}", make)


@pytest.fixture
def tiers(monkeypatch):
    """Every ColdRows a join operator makes during the test (their counters: spills, evictions, restores)."""
    return record_cold_rows(monkeypatch, columnar_join)


def engine(job, events, parallelism, batch_size, budget=None):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    if budget is not None:
        env.set_state_budget(*budget)
    sink = job(env, events)
    env.execute()
    return list(zip(sink.records(), sink.timestamps()))


def check_budgets(job, events, parallelism, batch_size, tiers, spill, budgets):
    """The job's output under each budget equals the one without; returns the
    total (spilled files, evicted rows, restored rows) over the budgets."""
    want = engine(job, events, parallelism, batch_size)
    totals = [0, 0, 0]
    for budget in budgets:
        tiers.clear()
        assert engine(job, events, parallelism, batch_size, budget) == want, (parallelism, batch_size, budget)
        assert tiers and all(len(c) == 0 and c.host is None for c in tiers)  # nothing left behind
        for i, n in enumerate((sum(c.spilled_files for c in tiers), sum(c.evicted_rows for c in tiers),
                               sum(c.restored_rows for c in tiers))):
            totals[i] += n
        assert files_under(spill) == [], budget  # every spill file deleted by the job's end
    return want, totals


# -- window joins ----------------------------------------------------------------------

@pytest.mark.parametrize("window", ["tumbling", "sliding", "sliding-ragged"])
@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_window_join_under_a_tiny_budget_gives_the_same_output(window, batch_size, tmp_path, tiers, long_windows):
    spill = tmp_path / "spill"
    events = out_of_order_events(500, keys=6, bound=BOUND, seed=batch_size + len(window), late=0.1)
    job = window_join(vector_pair, f"long-{window}")
    budgets = [(*TINY, spill), (0,), (0, 0, spill), (1024, 1024, spill)]
    want, (spilled, evicted, restored) = check_budgets(job, events, 2, batch_size, tiers, spill, budgets)
    assert len(want) > 500
    assert multiset(want) == reference_outputs(job, events, batch_size)  # the record form, late rows dropped
    assert spilled > 0 and evicted > 0 and restored > 0  # rows did go cold, to disk, and came back


@pytest.mark.parametrize("window", ["tumbling", "sliding-ragged"])
def test_short_windows_and_a_flat_join_under_a_budget(window, tmp_path, tiers):
    """The windows of the record-path tests (many fire per batch) and a flat join."""
    spill = tmp_path / "spill"
    events = out_of_order_events(300, keys=4, bound=BOUND, seed=5, late=0.1)
    for job in (window_join(vector_pair, window), window_join(vector_difference, window, flat=True)):
        for parallelism, batch_size in ((1, 1), (3, 64)):
            check_budgets(job, events, parallelism, batch_size, tiers, spill, [(0, 0, spill), (256, 512, spill)])


def _window_operator(budget, assigner):
    keys = KeySelector(0)
    op = WindowJoinOperator("join", assigner, vector_pair, keys)
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.state_budget = budget
    op.open()
    emitted = []
    op.out = type("Out", (), {"emit": lambda self, b: emitted.append(b), "emit_watermark": lambda self, w: None})()
    return op, emitted


def _side(keys, values, ts):
    t = torch.tensor(ts, dtype=torch.int64)
    cols = {"f0": torch.tensor(keys), "f1": torch.tensor(values), "f2": t}
    return Batch(cols, t, None, keys=torch.tensor(keys))


def test_a_firing_brings_back_exactly_its_rows_and_opens_only_their_files(tmp_path):
    """Every row on disk (budget 0, 0): a watermark firing window [0, 100) reads
    the files of times below 100 only, brings back those rows only, and drops
    them once their window has fired."""
    op, emitted = _window_operator(StateBudget(0, 0, str(tmp_path)), TumblingEventTimeWindows.of(100))
    for lo in range(0, 400, 50):  # one file per batch and input, 50 ms of event time each
        ts = list(range(lo, lo + 50, 5))
        op.process_input(_side([t % 3 for t in ts], [2 * t for t in ts], ts), 0)
        op.process_input(_side([t % 3 for t in ts], [2 * t + 1 for t in ts], ts), 1)
    assert len(op._input(0)) == len(op._input(1)) == 0
    files = [len(c.files) for c in op.cold]
    assert files == [8, 8] and len(files_under(tmp_path)) == 16
    op.on_watermark(99)
    assert [c.restored_rows for c in op.cold] == [20, 20]  # times 0 .. 95: 20 rows a side
    assert [len(c.files) for c in op.cold] == [6, 6] and [len(c) for c in op.cold] == [60, 60]
    out = Batch.concat(emitted)
    got = sorted(zip(out["f0"].tolist(), out["f1"].tolist(), out["f2"].tolist()))
    want = sorted((a % 3, 2 * a, 2 * b + 1) for a in range(0, 100, 5) for b in range(0, 100, 5) if a % 3 == b % 3)
    assert got == want and set(out.timestamps.tolist()) == {99}
    assert len(op._input(0)) == 0  # fired rows gone (their only window fired), back to disk nothing
    op.on_watermark(150)  # no window ends in (99, 150]: nothing read
    assert [len(c.files) for c in op.cold] == [6, 6]
    op.dispose()
    assert files_under(tmp_path) == []


def test_cold_late_rows_are_forgotten_when_windows_fire(tmp_path):
    """A late row (all its windows fired) that went cold never pairs and is dropped at the next firing."""
    op, emitted = _window_operator(StateBudget(0, 0, str(tmp_path)), TumblingEventTimeWindows.of(100))
    op.process_input(_side([1], [2], [10]), 0)
    op.process_input(_side([1], [3], [20]), 1)
    op.on_watermark(150)
    assert len(Batch.concat(emitted)) == 1
    op.process_input(_side([1], [4], [30]), 0)  # late: window [0, 100) has fired
    op.process_input(_side([1], [5], [160]), 1)
    assert [len(c) for c in op.cold] == [1, 1]
    op.on_watermark(199)
    assert len(Batch.concat(emitted)) == 1  # no new pair
    assert [len(c) for c in op.cold] == [0, 0] and files_under(tmp_path) == []
    op.dispose()


# -- regular join -------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 7, 1000])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_regular_join_under_a_tiny_budget_gives_the_same_output(batch_size, parallelism, tmp_path, tiers):
    spill = tmp_path / "spill"
    events = out_of_order_events(400, keys=25, bound=BOUND, seed=batch_size + parallelism, late=0.1)
    job = regular_join(vector_pair)
    budgets = [(*TINY, spill), (0,), (0, 0, spill), (512, 1024, spill)]
    want, (spilled, evicted, restored) = check_budgets(job, events, parallelism, batch_size, tiers, spill, budgets)
    assert len(want) > 1000
    if batch_size == 1:  # the engine meets the records in the reference's order: same times too
        assert multiset(want) == reference_outputs(job, events, 1)
    assert spilled > 0 and evicted > 0 and restored > 0


def test_regular_join_evicts_whole_keys_met_longest_ago(tmp_path):
    op = RegularJoinOperator("join", vector_pair, KeySelector(0))
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.state_budget = StateBudget(600, 0, str(tmp_path))  # host 0: each eviction a file
    op.open()
    emitted = []
    op.out = type("Out", (), {"emit": lambda self, b: emitted.append(b)})()
    for key in range(5):  # keys 0..4 met in turn, 2 rows a side each: 4 rows a key, 56 bytes a row
        op.process_input(_side([key, key], [0, 2], [key, key]), 0)
        op.process_input(_side([key, key], [1, 3], [key, key]), 1)
    on_device = [sorted(set(t.rows.key.tolist())) for t in op.inputs]
    assert on_device == [[3, 4], [3, 4]]  # 600 bytes hold two whole keys: the two met last
    assert [len(c) for c in op.cold] == [6, 6]
    assert [sorted((f["kmin"], f["kmax"]) for f in c.files) for c in op.cold] == [[(0, 0), (1, 1), (2, 2)]] * 2
    emitted.clear()
    op.process_input(_side([0], [9], [50]), 1)  # key 0 comes back, both inputs
    # key 0 (met last, 5 rows) and key 4 (4 rows) fit in 600 bytes; key 3 went cold
    assert [sorted(set(t.rows.key.tolist())) for t in op.inputs] == [[0, 4], [0, 4]]
    assert [c.restored_rows for c in op.cold] == [2, 2]  # only key 0's files were read
    assert [sorted((f["kmin"], f["kmax"]) for f in c.files) for c in op.cold] == [[(1, 1), (2, 2), (3, 3)]] * 2
    out = Batch.concat(emitted)
    assert out["f1"].tolist() == [0, 2] and out["f2"].tolist() == [9, 9]  # key 0's first-input rows, in arrival order
    op.dispose()
    assert files_under(tmp_path) == []


@vectorized
def _named_pair(first, second):
    return {"key": first["key"], "a": first["name"], "b": second["name"], "value": second["value"]}


def test_text_fields_and_text_keys_go_cold_and_come_back(tmp_path, tiers):
    """List columns (strings, None) through the host tier and Arrow files, keys by a codec."""
    spill = tmp_path / "spill"
    evs = [{"key": f"k{k}", "value": v, "ts": t, "name": None if v % 7 == 0 else f"n{v}"}
           for k, v, t in out_of_order_events(300, keys=10, bound=20, seed=4, late=0.05)]

    def job(env, _):
        s = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_assigner("ts")
        src = env.from_source(CollectionSource(evs), s, "events")
        left = src.filter(lambda r: r["value"] % 2 == 0)
        right = src.filter(lambda r: r["value"] % 2 != 0)
        windowed = left.join(right).where("key").equal_to("key").window(SlidingEventTimeWindows.of(300, 100)) \
            .apply(_named_pair)
        regular = left.connect(right).key_by("key", "key").process(columnar_join.RegularJoin(_named_pair))
        return windowed.union(regular).collect()

    want, (spilled, _, restored) = check_budgets(job, None, 2, 16, tiers, spill, [(256, 512, spill)])
    assert spilled and restored and any(r["a"] is None for r, _ in want) and any(r["b"] for r, _ in want)


# -- Nexmark --------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["q3", "q8"])
def test_nexmark_joins_under_a_tiny_budget(query, tmp_path, tiers):
    from opforge.stream import nexmark

    config = nexmark.NexmarkConfig(events=20_000, events_per_second=1000, max_out_of_orderness_ms=300, seed=3)

    def go(budget):
        env = StreamExecutionEnvironment(parallelism=2, batch_size=300)
        if budget is not None:
            env.set_state_budget(*budget)
        sink = getattr(nexmark, query)(env, config).collect()
        env.execute()
        return list(zip(sink.records(), sink.timestamps()))

    want = go(None)
    assert want
    tiers.clear()
    assert go((512, 1024, tmp_path / "spill")) == want
    assert sum(c.evicted_rows for c in tiers) > 0
    assert files_under(tmp_path / "spill") == []


# -- checkpoints ------------------------------------------------------------------------

def test_join_state_under_a_budget_survives_a_failure_and_restore(tmp_path, tiers):
    """Kill and restore twice, with a budget: the output is the failure-free run's
    without a budget (checkpoints gathered every tier)."""
    evs = [{"key": k, "value": v, "ts": t}
           for k, v, t in out_of_order_events(500, keys=12, bound=20, seed=12, late=0.05)]
    spill = tmp_path / "spill"
    build = both_joins(evs, 300, 100)

    plain = simulated_env(16)
    build(plain, tmp_path / "plain", None)
    plain.execute()
    tiers.clear()
    ref, out = run_with_failures(lambda: simulated_env(16, (1024, 2048, spill)), build, tmp_path / "budget", (60, 400), _Boom)
    assert sum(c.spilled_files for c in tiers) > 0 and sum(c.restored_rows for c in tiers) > 0
    for sink in ("window", "regular"):
        want = _rows(tmp_path / "plain" / sink)
        assert want and _rows(ref / sink) == want and _rows(out / sink) == want, sink
    assert files_under(spill) == []


def test_a_checkpoint_holds_every_tier_in_the_order_without_a_budget(tmp_path):
    """``snapshot_state`` with rows cold equals the state of the same operator without a budget."""
    def fed(budget, make):
        op = make()
        op.setup(None, 0, 1, None, torch.device("cpu"))
        op.state_budget = budget
        op.open()
        op.out = type("Out", (), {"emit": lambda self, b: None, "emit_watermark": lambda self, w: None})()
        for i in range(6):
            ts = [40 * i + 7 * j for j in range(5)]
            op.process_input(_side([(i * j) % 4 for j in range(5)], list(range(5)), ts), i % 2)
            if i == 3:
                op.on_watermark(80)
        return op

    def tensors(state):
        return [[(n, c.tolist() if isinstance(c, torch.Tensor) else c) for n, c in sorted(side["columns"].items())]
                + [side[n].tolist() for n in ("ts", "key", "seq")] for side in state["inputs"]]

    for make in (lambda: WindowJoinOperator("w", SlidingEventTimeWindows.of(120, 40), vector_pair, KeySelector(0)),
                 lambda: RegularJoinOperator("r", vector_pair, KeySelector(0))):
        plain = fed(None, make)
        cold = fed(StateBudget(100, 200, str(tmp_path)), make)
        assert sum(len(c) for c in cold.cold) > 0
        assert tensors(cold.snapshot_state()) == tensors(plain.snapshot_state())
        restored = make()
        restored.setup(None, 0, 1, None, torch.device("cpu"))
        restored.state_budget = StateBudget(100, 200, str(tmp_path))
        restored.open()
        restored.restore_state(plain.snapshot_state())
        assert sum(len(c) for c in restored.cold) > 0  # the budget applies again after a restore
        assert tensors(restored.snapshot_state()) == tensors(plain.snapshot_state())
        for op in (cold, restored):
            op.dispose()
    assert files_under(tmp_path) == []


# -- ColdRows ------------------------------------------------------------------------

def test_cold_rows_zone_map_on_other_columns_and_a_shared_host_budget(tmp_path):
    a = ColdRows(StateBudget(0, 64, str(tmp_path)), "a", zone=("key", "ts"))
    b = ColdRows(StateBudget(0, 64, str(tmp_path)), "b", zone=("key", "ts"))
    a.share_host_budget(b)
    a.add({"key": torch.tensor([1, 2]), "ts": torch.tensor([10, 20])})  # 32 bytes: stays on the host
    assert a.files == [] and a.host_bytes() == 32
    b.add({"key": torch.tensor([3, 4, 5]), "ts": torch.tensor([30, 40, 50]), "name": ["x", "y", "z"]})
    # 32 + 48 > 64: the largest host tier (b's) went to disk, a's stayed
    assert a.host_bytes() == 32 and b.host is None and len(b.files) == 1
    assert (b.files[0]["smin"], b.files[0]["smax"], b.files[0]["kmin"], b.files[0]["kmax"]) == (30, 50, 3, 5)
    back = b.take(lambda r: r["ts"] >= 40, lambda f: f["smax"] >= 40)
    assert back["key"].tolist() == [4, 5] and back["name"] == ["y", "z"]
    for c in (a, b):
        c.clear()
    assert files_under(tmp_path) == []
