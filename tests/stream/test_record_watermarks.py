"""Event time independent of batch size (issue 26), without Flink.

With ``watermark_granularity="record"`` (the default) every record of a
micro-batch sees the watermark the records before it produced, so a job's
output at any batch size must equal its output at one record per batch —
the positions of Flink's watermarks, which ``test_flink_oracle`` checks
against Flink itself. Here random streams (out of order, late records,
allowed lateness, side outputs, timers) run at several batch sizes and are
compared with batch size 1, so a regression shows without Java or PyFlink.
"""

from __future__ import annotations

import random

import pytest
import torch

from flink_oracle.cases import events
from opforge.stream import (Aggregations, OutputTag, ProcessWindowFunction, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy)
from opforge.stream.time import MIN_WATERMARK, WatermarkGenerator
from test_flink_oracle import multiset, run_opforge

# window -> (assigner, seed); each seed's stream gives another output per
# batch size under watermark_granularity="batch" (checked when written), so
# the comparison can fail
WINDOWS = {
    "tumbling": ({"kind": "tumbling", "size": 1000}, 100),
    "sliding": ({"kind": "sliding", "size": 1000, "slide": 250}, 101),
    "sliding_uneven": ({"kind": "sliding", "size": 1000, "slide": 300}, 102),
    "session": ({"kind": "session", "gap": 150}, 110),
}


def _case(seed: int, job: str, window: str | None = None) -> dict:
    rng = random.Random(seed)
    bound = rng.choice([0, 50, 100])
    evs = events(seed, rng.randint(150, 300), rng.randint(1, 5), bound, late=rng.choice([0.1, 0.25]),
                 late_max=rng.choice([400, 1500]))
    case = {"name": f"{job}-{window}-{seed}", "job": job, "bound": bound, "idle_ms": None, "sources": [evs],
            "late": True}
    if job == "process":
        return {**case, "timer_gap": rng.choice([0, 150, 300])}
    return {**case, "window": WINDOWS[window][0], "lateness": rng.choice([0, 200, 400]), "side_output": True}


def _cases():
    out = []
    for window, (_, seed) in WINDOWS.items():
        for impl in ("aggregate", "process"):
            out.append(pytest.param(_case(seed, "window", window), impl, id=f"{window}-{impl}"))
    out += [pytest.param(_case(200 + s, "process"), "process", id=f"timers-{s}") for s in range(2)]
    return out


@pytest.mark.parametrize("case,impl", _cases())
def test_output_does_not_depend_on_batch_size(case, impl):
    want = multiset(run_opforge(case, impl, batch_size=1))
    assert want, f"{case['name']}: no output"
    for batch_size in (5, 37, 1024):
        got = multiset(run_opforge(case, impl, batch_size=batch_size))
        assert got == want, f"batch_size {batch_size}: {len(got)} rows vs {len(want)} at batch size 1"


def test_record_watermarks_are_the_running_maximum():
    """The watermark each record sees: the one after the record before it
    (a loop over the records, one at a time, as the reference)."""
    rng = random.Random(7)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(30)
    gen, ref = WatermarkGenerator(strategy, "t"), WatermarkGenerator(strategy, "ref")
    for _ in range(5):
        ts = torch.tensor([rng.randint(0, 2000) for _ in range(rng.randint(1, 40))], dtype=torch.int64)
        want = []
        for t in ts.tolist():
            want.append(ref.emitted)
            ref.on_batch(torch.tensor([t]))
            ref.current()
        assert gen.record_watermarks(ts).tolist() == want
        gen.on_batch(ts)
        gen.current()
    assert WatermarkGenerator(strategy, "t").record_watermarks(torch.tensor([5, 9])).tolist() == \
        [MIN_WATERMARK, 5 - 31]


def _late_count(granularity: str, batch_size: int) -> int:
    env = StreamExecutionEnvironment(batch_size=batch_size, watermark_granularity=granularity)
    evs = events(31, 400, 3, 100, late=0.2, late_max=1500)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(100).with_timestamp_assigner("ts")
    tag = OutputTag("late")
    result = env.from_collection(evs, strategy).key_by(lambda r: r["k"]) \
        .window(TumblingEventTimeWindows.of(1000)).side_output_late_data(tag).aggregate(Aggregations(n=("count",)))
    late = result.get_side_output(tag).collect()
    result.collect()
    env.execute("late count")
    return len(late.records())


def test_batch_granularity_moves_event_time_between_batches_only():
    """``watermark_granularity="batch"``: the old, explicit mode — records of
    one batch all see the watermark from before it, so fewer are late."""
    per_record = _late_count("record", 1)
    assert per_record > 0
    assert _late_count("record", 400) == per_record
    assert _late_count("batch", 1) == per_record
    assert _late_count("batch", 400) < per_record
    with pytest.raises(ValueError, match="watermark_granularity"):
        StreamExecutionEnvironment(watermark_granularity="row")


class _Count(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield {"k": key, "end": context.window().end, "n": len(list(elements))}


def _count_per_window(batch_size: int):
    env = StreamExecutionEnvironment(batch_size=batch_size)
    evs = [{"k": i % 2, "ts": i * 100} for i in range(60)]  # 6 windows of 1 s, in order
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_assigner("ts")
    out = env.from_collection(evs, strategy).key_by(lambda r: r["k"]) \
        .window(TumblingEventTimeWindows.of(1000)).process(_Count()).collect()
    env.execute("count per window")
    return out


def test_window_firings_inside_a_batch_leave_as_one_batch():
    """The record-at-a-time window fires windows 0..4 inside a batch of all 60
    records (their records' watermarks pass 999 .. 4999); their results go on
    as one batch, not one per firing (issue 26: q7's small batches cost the
    host more than its whole device work), the last window's at end of input."""
    want = sorted((k, end, 5) for k in (0, 1) for end in range(1000, 7000, 1000))
    whole = _count_per_window(60)
    assert sorted((r["k"], r["end"], r["n"]) for r in whole.records()) == want
    assert sorted((r["k"], r["end"], r["n"]) for r in _count_per_window(1).records()) == want
    assert len(whole.batches) == 2
