"""Evictors (Flink's ``Evictor``): drop records of a firing window before
and / or after its function runs. A window with an evictor keeps its records
with their timestamps (the record-at-a-time ``WindowOperator``; Flink's
``EvictingWindowOperator``), so ``WindowedStream.evictor`` takes a job off
the columnar path.

``evict_before(elements, window, ctx)`` / ``evict_after(...)`` get the
window's ``[(record, timestamp), ...]`` in arrival order and return those to
keep; what ``evict_after`` keeps stays in the window for its next firing.
"""

from __future__ import annotations


class Evictor:
    def evict_before(self, elements: list, window, ctx) -> list:
        return elements

    def evict_after(self, elements: list, window, ctx) -> list:
        return elements


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: do_evict_after must be a bool, got {value!r}")
    return value


class CountEvictor(Evictor):
    """Keeps the last ``max_count`` records of the window (before the
    function, or after it with ``do_evict_after``)."""

    def __init__(self, max_count: int, do_evict_after: bool = False):
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count <= 0:
            raise ValueError(f"CountEvictor.of: max_count must be a positive int, got {max_count!r}")
        self.max_count, self.after = max_count, _flag(do_evict_after, "CountEvictor.of")

    @classmethod
    def of(cls, max_count: int, do_evict_after: bool = False):
        return cls(max_count, do_evict_after)

    def _evict(self, elements):
        return elements[-self.max_count:] if len(elements) > self.max_count else elements

    def evict_before(self, elements, window, ctx):
        return elements if self.after else self._evict(elements)

    def evict_after(self, elements, window, ctx):
        return self._evict(elements) if self.after else elements


class TimeEvictor(Evictor):
    """Keeps the records within ``window_size`` ms of the window's newest
    one: drops those with ``timestamp <= max timestamp - window_size``."""

    def __init__(self, window_size, do_evict_after: bool = False):
        from opforge.stream.time import _millis

        self.size = _millis(window_size, "TimeEvictor.of")
        self.after = _flag(do_evict_after, "TimeEvictor.of")

    @classmethod
    def of(cls, window_size, do_evict_after: bool = False):
        return cls(window_size, do_evict_after)

    def _evict(self, elements):
        from opforge.stream.records import NO_TIMESTAMP

        stamped = [ts for _, ts in elements if ts != NO_TIMESTAMP]
        if not stamped:
            return elements
        cutoff = max(stamped) - self.size
        return [(r, ts) for r, ts in elements if ts == NO_TIMESTAMP or ts > cutoff]

    def evict_before(self, elements, window, ctx):
        return elements if self.after else self._evict(elements)

    def evict_after(self, elements, window, ctx):
        return self._evict(elements) if self.after else elements
