"""Shared builders for the stream tests: random out-of-order event streams."""

from __future__ import annotations

import random

import pytest

from opforge.stream import AggregateFunction, StreamExecutionEnvironment
from opforge.stream.reference import run_reference


def out_of_order_events(n: int, keys: int, bound: int, seed: int, late: float = 0.0):
    """``n`` records ``(key, value, ts)`` with timestamps rising by 0..9 ms and
    shuffled within ``bound`` ms; a ``late`` share is pushed back by up to 8x
    ``bound`` (beyond the watermark)."""
    rng = random.Random(seed)
    t, events = 0, []
    for i in range(n):
        t += rng.randint(0, 9)
        jitter = rng.randint(0, bound)
        if rng.random() < late:
            jitter = rng.randint(bound + 1, 8 * bound + 1)
        events.append((rng.randrange(keys), rng.randint(-50, 100), max(0, t - jitter)))
    return events


def permute_within(events, bound: int, seed: int):
    """A permutation where every record moves by less than ``bound`` ms of
    event time relative to the records it overtakes (sort by a jittered time)."""
    rng = random.Random(seed)
    return [e for _, e in sorted(((e[2] + rng.uniform(0, bound / 2), e) for e in events),
                                 key=lambda p: p[0])]


def multiset(records):
    return sorted(records, key=repr)


class Avg(AggregateFunction):
    """The mean, as an AggregateFunction of (sum, count) accumulators."""

    def create_accumulator(self):
        return (0, 0)

    def add(self, v, acc):
        return (acc[0] + v, acc[1] + 1)

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


def reference_outputs(job, events, batch_size: int, watermark_granularity: str = "record"):
    """The (record, timestamp) multiset that the record-at-a-time reference
    executor gives for ``job(env, events)``'s sink (record granularity by
    default, as the engine's: a two-input operator meets both inputs' records
    in the source's order, as the reference does)."""
    env = StreamExecutionEnvironment(batch_size=batch_size, watermark_granularity=watermark_granularity)
    sink = job(env, events)
    return multiset(run_reference(env)[sink])


def run_with_failures(make_env, build, tmp_path, fail_ats, error):
    """Run ``build(env, out_dir, fail_at)`` once without failure (outputs under
    ``tmp_path / "ref"``), then once per ``fail_ats`` entry, failing there with
    ``error`` and restoring from the latest checkpoint each time, then to the end
    (outputs under ``tmp_path / "out"``). Returns the two output directories."""
    env = make_env().enable_checkpointing(200, str(tmp_path / "ref-ckpt"))
    build(env, tmp_path / "ref", None)
    env.execute()
    ckpt = str(tmp_path / "ckpt")
    for at in fail_ats:
        env = make_env().enable_checkpointing(200, ckpt)
        build(env, tmp_path / "out", at)
        with pytest.raises(error):
            env.execute(restore_from=ckpt)
    env = make_env().enable_checkpointing(200, ckpt)
    build(env, tmp_path / "out", None)
    assert env.execute(restore_from=ckpt).restored_from is not None
    return tmp_path / "ref", tmp_path / "out"


def record_cold_rows(monkeypatch, module) -> list:
    """Every ``ColdRows`` the operators of ``module`` make from now on, to read their counters
    (spilled files, evicted and restored rows) after a job."""
    from opforge.stream.state_budget import ColdRows

    made = []

    class Recorded(ColdRows):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(module, "ColdRows", Recorded)
    return made


def simulated_env(batch_size: int, budget: tuple | None = None, parallelism: int = 2):
    """A two-subtask environment on a simulated clock (100 ms a step), under ``budget``
    (``set_state_budget``'s arguments) when given: the kill-and-restore tests' job."""
    from opforge.stream import SimulatedClock

    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size, clock=SimulatedClock(step_ms=100))
    return env if budget is None else env.set_state_budget(*budget)
