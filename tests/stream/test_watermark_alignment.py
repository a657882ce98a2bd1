"""Watermark alignment (Flink's ``WatermarkStrategy.with_watermark_alignment``):
a source whose watermark runs ahead of its group by more than the drift pauses."""

import pytest

from opforge.stream import (Aggregations, MIN_WATERMARK, Source, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy)

OOO = 5


class LoggedSource(Source):
    """Lists of ``(name, ts)`` records; notes ``(name, max ts)`` of each batch as it is polled."""

    max_parallelism = 1

    def __init__(self, name, step, n, log):
        self.name, self.step, self.n, self.log = name, step, n, log

    def splits(self, parallelism, batch_size, device):
        def gen():
            recs = [(self.name, i * self.step) for i in range(self.n)]
            for s in range(0, self.n, batch_size):
                part = recs[s:s + batch_size]
                self.log.append((self.name, part[-1][1]))
                yield part
            self.log.append((self.name, None))  # finished

        return [gen()]


def run(drift, batch_size=4):
    log = []
    env = StreamExecutionEnvironment(batch_size=batch_size)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(OOO).with_timestamp_assigner(lambda r, _: r[1])
    if drift is not None:
        strategy = strategy.with_watermark_alignment("nexmark", drift)
    fast = env.from_source(LoggedSource("fast", 100, 120, log), strategy, "fast")
    slow = env.from_source(LoggedSource("slow", 7, 600, log), strategy, "slow")
    sink = fast.union(slow).key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(1000)) \
        .aggregate(Aggregations(with_window=True, n=("count",))).collect()
    result = env.execute()
    return log, sorted(sink.records(), key=repr), result


def max_lead(log):
    """The most the fast source's watermark was ahead of the slow one's when it was polled."""
    wm = {"fast": MIN_WATERMARK, "slow": MIN_WATERMARK}
    done = set()
    lead = -(2**62)
    for name, ts in log:
        if ts is None:
            done.add(name)
            continue
        if name == "fast" and "slow" not in done and wm["fast"] != MIN_WATERMARK and wm["slow"] != MIN_WATERMARK:
            lead = max(lead, wm["fast"] - wm["slow"])
        wm[name] = max(wm[name], ts - OOO - 1)
    return lead


@pytest.mark.parametrize("drift", [0, 250, 1000])
def test_fast_source_pauses_within_the_drift(drift):
    log, records, result = run(drift)
    assert max_lead(log) <= drift
    assert result.metrics["fast"].alignment_pauses > 0
    # whichever is ahead waits: mostly the fast one (the slow one only when one
    # of its batches overtook a paused fast source by more than the drift)
    assert result.metrics["slow"].alignment_pauses < result.metrics["fast"].alignment_pauses
    if drift >= 100:  # beyond the slow source's step per batch: it never gets that far ahead
        assert result.metrics["slow"].alignment_pauses == 0
    # same results as without alignment; every record counted once
    _, unaligned, plain = run(None)
    assert records == unaligned
    assert sum(r["n"] for r in records) == 120 + 600
    assert plain.metrics["fast"].alignment_pauses == 0
    assert max_lead(run(None)[0]) > 10 * max(drift, 100)  # without alignment it runs far ahead


def test_alignment_groups_are_independent_and_a_finished_source_frees_the_others():
    log = []
    env = StreamExecutionEnvironment(batch_size=4)
    base = WatermarkStrategy.for_bounded_out_of_orderness(OOO).with_timestamp_assigner(lambda r, _: r[1])
    a = env.from_source(LoggedSource("fast", 100, 40, log), base.with_watermark_alignment("a", 100), "fast")
    b = env.from_source(LoggedSource("slow", 7, 400, log), base.with_watermark_alignment("b", 100), "slow")
    sink = a.union(b).map(lambda r: r).collect()
    result = env.execute()
    assert len(sink.records()) == 440
    assert result.metrics["fast"].alignment_pauses == 0  # different groups: no pause

    log = []
    env = StreamExecutionEnvironment(batch_size=4)
    short = env.from_source(LoggedSource("slow", 1, 8, log), base.with_watermark_alignment("g", 10), "slow")
    long = env.from_source(LoggedSource("fast", 100, 40, log), base.with_watermark_alignment("g", 10), "fast")
    sink = short.union(long).map(lambda r: r).collect()
    env.execute()  # the short source finishes; the other is then polled to its end
    assert len(sink.records()) == 48


def test_alignment_arguments_are_checked():
    with pytest.raises(ValueError, match="watermark_group"):
        WatermarkStrategy.for_bounded_out_of_orderness(1).with_watermark_alignment("", 10)
    with pytest.raises(ValueError, match="with_watermark_alignment"):
        WatermarkStrategy.for_bounded_out_of_orderness(1).with_watermark_alignment("g", -1)
    import datetime

    s = WatermarkStrategy.for_bounded_out_of_orderness(1).with_watermark_alignment("g", datetime.timedelta(seconds=2))
    assert (s.alignment_group, s.max_allowed_drift_ms) == ("g", 2000)
