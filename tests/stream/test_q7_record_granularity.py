"""Nexmark q7 at record watermark granularity (issue 26): the pre-filter
before its window (``_batch_top``) takes whole batches whose records carry
the watermarks they saw, so its output must not depend on how the bids are
batched — also with late bids, whose window's end the watermark passed
inside a batch (a top price among them must not hide an on-time bid)."""

from __future__ import annotations

import random

import pytest

from opforge.stream import StreamExecutionEnvironment, WatermarkStrategy, vectorized
from opforge.stream.nexmark import NexmarkConfig, generate, q7

SIZE_MS = 200
CONFIG = NexmarkConfig(events=300, events_per_second=100, seed=3)


def late_bids(seed: int = 7) -> list[dict]:
    """The bids with 10 % pushed up to 0.6 s back: past the 30 ms bound, so
    late, and some late ones the highest of their window."""
    rng = random.Random(seed)
    out = []
    for r in generate(CONFIG, "bid", 0, CONFIG.events, "cpu").records():
        if rng.random() < 0.1:
            r = {**r, "date_time": max(0, r["date_time"] - rng.randint(31, 600)), "price": r["price"] * 10}
        out.append(r)
    return out


BIDS = late_bids()


def run_q7(batch_size: int, granularity: str = "record") -> list[dict]:
    env = StreamExecutionEnvironment(batch_size=batch_size, watermark_granularity=granularity)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(30).with_timestamp_assigner("date_time")
    sink = q7(env, CONFIG, SIZE_MS, source=lambda env, config, kind: env.from_collection(BIDS, strategy)).collect()
    env.execute("q7")
    return sink.records()


@pytest.fixture(scope="module")
def at_one_record():
    return run_q7(1)


@pytest.mark.parametrize("batch_size", [37, 1024])
def test_q7_record_output_does_not_depend_on_batch_size(at_one_record, batch_size):
    assert len(at_one_record) > 10
    assert run_q7(batch_size) == at_one_record


def test_q7_case_separates_granularities(at_one_record):
    """The late bids matter here: per-batch watermarks give another output."""
    assert run_q7(1024, "batch") != at_one_record


def test_record_watermark_flat_map_without_rows_is_refused():
    """Outputs with no input row could not carry a watermark: a clear error, not a guess."""

    @vectorized(record_watermarks=True)
    def no_rows(batch):
        return {"price": batch["price"]}

    env = StreamExecutionEnvironment(batch_size=64)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(30).with_timestamp_assigner("date_time")
    env.from_collection(BIDS[:100], strategy).flat_map(no_rows).collect()
    with pytest.raises(ValueError, match="__row__"):
        env.execute("no rows")
