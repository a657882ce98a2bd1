"""Timers per key, with Flink's semantics: an event-time timer for ``t`` fires
when the watermark reaches ``t`` (``watermark >= t``); a processing-time timer
when the clock does. A key has at most one timer per (timestamp, domain):
registering it twice fires it once. ``delete_*`` removes a pending timer.
Timers fire in timestamp order (ties in registration order); a checkpoint
stores them in that order, so a restored job fires them in the same order.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from opforge.stream.time import MIN_WATERMARK


class InternalTimers:
    """The pending timers of one domain (event or processing time)."""

    def __init__(self):
        self.heap: list = []
        self.live: set = set()  # (timestamp, key, namespace)
        self.seq = itertools.count()

    def register(self, ts: int, key: Any, namespace: Any = None) -> None:
        ident = (ts, key, namespace)
        if ident in self.live:
            return
        self.live.add(ident)
        heapq.heappush(self.heap, (ts, next(self.seq), key, namespace))

    def delete(self, ts: int, key: Any, namespace: Any = None) -> None:
        self.live.discard((ts, key, namespace))

    def pop_due(self, time: int):
        """Yield (ts, key, namespace) of every timer with ``ts <= time``; timers
        registered while firing are seen too if due."""
        while self.heap and self.heap[0][0] <= time:
            ts, _, key, ns = heapq.heappop(self.heap)
            if (ts, key, ns) in self.live:
                self.live.discard((ts, key, ns))
                yield ts, key, ns

    def __len__(self) -> int:
        return len(self.live)

    def snapshot(self) -> list:
        """The pending timers ``[ts, key, namespace]`` in firing order."""
        return [[ts, key, ns] for ts, _, key, ns in sorted(self.heap, key=lambda e: e[:2])
                if (ts, key, ns) in self.live]

    def restore(self, timers: list) -> None:
        self.heap, self.live, self.seq = [], set(), itertools.count()
        for ts, key, ns in timers:
            self.register(ts, key, ns)


class TimerService:
    """What ``ctx.timer_service()`` returns: timers for the current key."""

    def __init__(self, clock, event: InternalTimers, processing: InternalTimers):
        self.clock = clock
        self.event = event
        self.processing = processing
        self.key: Any = None
        self.watermark = MIN_WATERMARK

    def current_processing_time(self) -> int:
        return self.clock.now()

    def current_watermark(self) -> int:
        return self.watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        self.event.register(int(timestamp), self.key)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self.processing.register(int(timestamp), self.key)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self.event.delete(int(timestamp), self.key)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self.processing.delete(int(timestamp), self.key)
