"""Window assigners with Flink's names (triggers: ``triggers.py``).

* ``TumblingEventTimeWindows.of(size, offset=0)`` / ``TumblingProcessingTimeWindows``:
  ``[start, start + size)`` with ``start = t - (t - offset) mod size``.
* ``SlidingEventTimeWindows.of(size, slide, offset=0)`` / processing-time:
  each record is in ``ceil(size / slide)`` windows (fewer when ``size`` is not a
  multiple of ``slide``).
* ``EventTimeSessionWindows.with_gap(gap)`` / processing-time: a record opens
  ``[t, t + gap)``; overlapping windows of a key merge (``merge_windows``,
  Flink's ``MergingWindowAssigner``; both window executors merge through it).
* ``GlobalWindows.create()``: one window per key, fired by a ``CountTrigger``.

A time window's results carry the timestamp ``end - 1`` (``max_timestamp``),
and an event-time window fires when the watermark reaches it. With
``allowed_lateness(L)`` its state lives until the watermark passes
``end - 1 + L``; each late record in that span fires the window again with
the updated result; later records are dropped or sent to
``side_output_late_data``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.stream.triggers import EventTimeTrigger, NeverTrigger, ProcessingTimeTrigger, Trigger

GLOBAL_START = -(2**63)
GLOBAL_END = 2**63 - 1


@dataclass(frozen=True, order=True)
class TimeWindow:
    start: int
    end: int

    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: "TimeWindow") -> bool:
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: "TimeWindow") -> "TimeWindow":
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


GLOBAL_WINDOW = TimeWindow(GLOBAL_START, GLOBAL_END)


def output_timestamp(window: TimeWindow) -> int:
    """A window result's timestamp: its last timestamp (a global window's end)."""
    return GLOBAL_END if window.end == GLOBAL_END else window.max_timestamp()


def _ms(value, where):
    from opforge.stream.time import _millis

    return _millis(value, where)


class WindowAssigner:
    event_time = True
    merging = False

    def get_default_trigger(self) -> Trigger:
        return EventTimeTrigger() if self.event_time else ProcessingTimeTrigger()

    def assign(self, ts: torch.Tensor):
        """(row, start, end): int64 tensors, one entry per (record, window)."""
        raise NotImplementedError

    def assign_one(self, ts: int) -> list[TimeWindow]:
        raise NotImplementedError


class SlidingEventTimeWindows(WindowAssigner):
    def __init__(self, size: int, slide: int, offset: int = 0):
        where = type(self).__name__
        self.size, self.slide, self.offset = _ms(size, where), _ms(slide, where), _ms(offset, where)
        if self.size <= 0 or self.slide <= 0:
            raise ValueError(f"{where}: size and slide must be positive, got {size}, {slide}")
        if self.offset >= self.slide:
            raise ValueError(f"{where}: offset {offset} must be smaller than the slide {slide}")

    @classmethod
    def of(cls, size, slide, offset=0):
        return cls(size, slide, offset)

    def assign(self, ts):
        n_win = -(-self.size // self.slide)
        last = ts - torch.remainder(ts - self.offset, self.slide)
        k = torch.arange(n_win, device=ts.device, dtype=torch.int64)
        starts = last[:, None] - k[None, :] * self.slide
        rows = torch.arange(ts.shape[0], device=ts.device).unsqueeze(1).expand_as(starts)
        if self.size % self.slide == 0:
            # every record lies in exactly size / slide windows: no mask, so no
            # boolean indexing (a device-to-host sync); same rows, same order
            starts = starts.reshape(-1)
            return rows.reshape(-1), starts, starts + self.size
        keep = starts + self.size > ts[:, None]
        return rows[keep], starts[keep], starts[keep] + self.size

    def assign_one(self, ts):
        last = ts - (ts - self.offset) % self.slide
        out, start = [], last
        while start > ts - self.size:
            out.append(TimeWindow(start, start + self.size))
            start -= self.slide
        return out


class TumblingEventTimeWindows(SlidingEventTimeWindows):
    def __init__(self, size: int, offset: int = 0):
        super().__init__(size, size, offset)

    @classmethod
    def of(cls, size, offset=0):
        return cls(size, offset)


class SlidingProcessingTimeWindows(SlidingEventTimeWindows):
    event_time = False


class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    event_time = False


class MergingWindowAssigner(WindowAssigner):
    """An assigner whose windows of a key merge (Flink's ``MergingWindowAssigner``)."""

    merging = True

    def merge_windows(self, windows, callback) -> None:
        """Flink's ``TimeWindow.mergeWindows``: the windows sorted by start,
        each run of overlapping (or touching) ones is merged into their cover:
        ``callback(merged_windows, result)`` for each run of two or more."""
        run, cover = [], None
        for w in sorted(windows, key=lambda w: w.start):
            if cover is not None and cover.intersects(w):
                run.append(w)
                cover = cover.cover(w)
                continue
            if len(run) > 1:
                callback(run, cover)
            run, cover = [w], w
        if len(run) > 1:
            callback(run, cover)

    def merge_into(self, live, window: TimeWindow) -> tuple[TimeWindow, list[TimeWindow]]:
        """A new ``window`` among a key's ``live`` (disjoint) windows: the
        window it becomes and the live windows merged into it (one equal to
        ``window`` included), by ``merge_windows``."""
        found = [window, []]

        def on_merge(run, result):
            if any(w is window for w in run):
                found[0], found[1] = result, [w for w in run if w is not window]

        self.merge_windows(list(live) + [window], on_merge)
        return found[0], found[1]


class EventTimeSessionWindows(MergingWindowAssigner):

    def __init__(self, gap: int):
        self.gap = _ms(gap, type(self).__name__)
        if self.gap <= 0:
            raise ValueError(f"{type(self).__name__}: the gap must be positive, got {gap}")

    @classmethod
    def with_gap(cls, gap):
        return cls(gap)

    def assign(self, ts):
        return torch.arange(ts.shape[0], device=ts.device), ts, ts + self.gap

    def assign_one(self, ts):
        return [TimeWindow(ts, ts + self.gap)]


class ProcessingTimeSessionWindows(EventTimeSessionWindows):
    event_time = False


class GlobalWindows(WindowAssigner):
    """One window per key that never ends; give it a ``CountTrigger``."""

    event_time = False

    def get_default_trigger(self) -> Trigger:
        return NeverTrigger()

    @classmethod
    def create(cls):
        return cls()

    def assign(self, ts):
        n = ts.shape[0]
        return (torch.arange(n, device=ts.device), torch.full_like(ts, GLOBAL_START),
                torch.full_like(ts, GLOBAL_END))

    def assign_one(self, ts):
        return [GLOBAL_WINDOW]
