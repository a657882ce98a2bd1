"""Pane (slice) aggregation of sliding windows whose size is a multiple of the
slide (``PanedWindowOperator``): the same result rows, in the same order,
with the same timestamps, late firings and late side output as the table of
one row per window (``ColumnarWindowOperator``), the same multiset as the
record-at-a-time reference executor, and the same output after a failure
and a restore from a checkpoint."""

import zlib

import pytest
import torch

import opforge.stream.executor as executor
from opforge.stream import (Aggregations, CheckpointRestoreError, FileSink, OutputTag, SlidingEventTimeWindows,
                            StreamExecutionEnvironment, WatermarkStrategy)
from opforge.stream.reference import run_reference
from opforge.stream.columnar_window_operator import ColumnarWindowOperator
from opforge.stream.paned_window_operator import PanedWindowOperator
from stream_helpers import multiset, out_of_order_events

BOUND = 30
LATENESS = 40  # late records are pushed back by up to 8 x BOUND: some within the lateness, some beyond
LATE = OutputTag("late")
AGG = dict(n=("count",), total=("sum", "f1"), low=("min", "f1"), high=("max", "f1"), avg=("mean", "f1"))
# (size, slide, offset): 5, 2 and 1 panes per window, and a grid off zero
SHAPES = [(100, 20, 0), (60, 30, 0), (40, 40, 0), (100, 20, 7)]


def build(env, events, shape):
    size, slide, offset = shape
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(BOUND).with_timestamp_assigner("f2")
    out = env.from_collection(events, strategy).key_by(0).window(SlidingEventTimeWindows.of(size, slide, offset)) \
        .allowed_lateness(LATENESS).side_output_late_data(LATE).aggregate(Aggregations(with_window=True, **AGG))
    return out.collect(), out.get_side_output(LATE).collect()


def run_engine(events, shape, batch_size, parallelism=1, per_window=False):
    """(results with timestamps in emission order, side output) of the engine;
    ``per_window``: with the one-row-per-window table instead of panes."""
    with pytest.MonkeyPatch.context() as mp:
        if per_window:
            mp.setattr(executor, "columnar_window_operator", ColumnarWindowOperator)
        env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
        main, side = build(env, events, shape)
        t = next(t for t in env.transformations if t.kind == "window")
        op = executor.build_operator(t, t.inputs[0].key)
        assert type(op) is (ColumnarWindowOperator if per_window else PanedWindowOperator)
        env.execute()
    return list(zip(main.records(), main.timestamps())), side.records()


def stream(shape, batch_size):
    n = 3000 if batch_size >= 1000 else 700
    return out_of_order_events(n, keys=5, bound=BOUND, seed=zlib.crc32(repr((shape, batch_size)).encode()),
                               late=0.12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "/".join(map(str, s)))
@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_panes_give_the_per_window_tables_rows_in_its_order(shape, batch_size):
    events = stream(shape, batch_size)
    got, got_side = run_engine(events, shape, batch_size)
    want, want_side = run_engine(events, shape, batch_size, per_window=True)
    assert got == want  # rows, values, timestamps and order (late firings where they happen)
    assert got_side == want_side
    fired = [(r["key"], r["window_start"]) for r, _ in got]
    assert len(set(fired)) > 20
    if batch_size < 1000:  # a batch's own records are never late to it: small batches see late data
        assert len(fired) > len(set(fired)), "some windows should fire again for late records"
        assert got_side, "and some records should be past the lateness"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "/".join(map(str, s)))
@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_panes_match_the_reference_executor(shape, batch_size):
    events = stream(shape, batch_size)
    env = StreamExecutionEnvironment(batch_size=batch_size)
    main, side = build(env, events, shape)
    out = run_reference(env)
    want, want_side = multiset(out[main]), multiset(r for r, _ in out.get(side, []))
    for parallelism in (1, 2):
        got, got_side = run_engine(events, shape, batch_size, parallelism)
        assert multiset(got) == want and multiset(got_side) == want_side, parallelism


def test_a_late_records_pane_takes_its_place_among_the_batchs_new_rows():
    """A record late for some windows and on time for others makes its
    on-time windows' rows with the batch's other new rows (in key order), so
    they fire in that order: key 1's windows before key 2's."""
    from opforge.stream import SplitSource

    # size 100, slide 20, lateness 50; after batch 1 the watermark is 199:
    # (1, 150) is late for windows ending 159..199 and on time for [120, 220), [140, 240);
    # (2, 210) is on time for all of its windows, two of them the same
    batches = [[(9, 1, 200)], [(2, 5, 210), (1, 3, 150)], [(9, 1, 1000)]]
    got = []
    for per_window in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            if per_window:
                mp.setattr(executor, "columnar_window_operator", ColumnarWindowOperator)
            # both records of batch 2 see the watermark 199 (per record, (1, 150) would see 209)
            env = StreamExecutionEnvironment(watermark_granularity="batch")
            strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner("f2")
            sink = env.from_source(SplitSource([batches]), strategy).key_by(0) \
                .window(SlidingEventTimeWindows.of(100, 20)).allowed_lateness(50) \
                .aggregate(Aggregations(with_window=True, n=("count",))).collect()
            env.execute()
        got.append([(r["window_start"], r["key"], r["n"]) for r in sink.records()])
    assert got[0] == got[1]
    on_time = [(s, k) for s, k, _ in got[0][3:] if s in (120, 140) and k != 9]  # after the late firings
    assert got[0][:3] == [(100, 1, 1), (80, 1, 1), (60, 1, 1)]  # latest start first
    assert on_time == [(120, 1), (120, 2), (140, 1), (140, 2)]


def test_panes_survive_a_failure_and_a_restore(tmp_path):
    import test_checkpoint as tc

    evs = tc.events(400, 6, 11, late=0.15)

    def build_job(env, out, fail_at):
        w = tc.source(env, evs, fail_at).key_by("key").window(SlidingEventTimeWindows.of(100, 20)) \
            .allowed_lateness(10).side_output_late_data(LATE) \
            .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "value"), low=("min", "value"),
                                    high=("max", "value"), mean=("mean", "value")))
        w.sink_to(FileSink(out / "panes", "json"))
        w.get_side_output(LATE).sink_to(FileSink(out / "late", "json"))
        return ["panes", "late"]

    ref, got, _ = tc.fail_and_restore(tmp_path / "plain", build_job, [70, 150, 320])
    assert got == ref
    assert all(ref[s] for s in ("panes", "late"))
    plain = tc.make_env
    with pytest.MonkeyPatch.context() as mp:  # and with every row pushed to the host and disk tiers
        mp.setattr(tc, "make_env", lambda *a, **kw: plain(*a, **kw).set_state_budget(0, 0, tmp_path / "spill"))
        ref_b, got_b, _ = tc.fail_and_restore(tmp_path / "budget", build_job, [70, 150, 320])
    assert got_b == ref_b == ref


def test_a_per_window_table_does_not_restore_into_panes():
    op = PanedWindowOperator("w", SlidingEventTimeWindows.of(100, 20), Aggregations(n=("count",)), None)
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.open()
    old = {"key": torch.tensor([1]), "start": torch.tensor([0]), "fired": torch.tensor([False]),
           "count": torch.tensor([3]), "acc": {}}
    with pytest.raises(CheckpointRestoreError, match="per key and 'windows'"):
        op.restore_table(old)
    op.restore_table({**old, "layout": "panes"})
    assert op.t_count.tolist() == [3] and op.t_seq.tolist() == [0]
