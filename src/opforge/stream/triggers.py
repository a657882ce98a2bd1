"""Window triggers, Flink's model: a trigger decides, per key and window,
when the window's function runs (FIRE) and when its contents go (PURGE).

A trigger is a class. Per element and per timer it returns a
``TriggerResult`` (``CONTINUE``, ``FIRE``, ``PURGE``, ``FIRE_AND_PURGE``):

* ``on_element(element, timestamp, window, ctx)``: a record went into ``window``;
* ``on_event_time(time, window, ctx)`` / ``on_processing_time(time, window, ctx)``:
  a timer the trigger registered through ``ctx`` is due;
* ``on_merge(window, ctx)`` (session windows; ``can_merge()``): windows were
  merged into ``window``; ``clear(window, ctx)``: the window is gone.

``ctx`` (a ``TriggerContext``) gives the time (``get_current_watermark``,
``get_current_processing_time``), timers for this key and window
(``register_event_time_timer``, ``delete_event_time_timer``, and the
processing-time pair) and the trigger's own state of this key and window
(``get_partitioned_state(name)``: ``value()``, ``update(v)``, ``clear()``;
``merge_partitioned_state(name, combine)`` in ``on_merge``). Both the
record-at-a-time window operator and the reference executor drive triggers
through these methods, so a user's ``Trigger`` subclass runs on both.

**Columnar evaluation.** The columnar window operators (``Aggregations``
over event-time sliding / tumbling windows, the GPU path) never call a
trigger per record. A trigger with ``vectorized = True`` also gives its
decision over a whole batch of windows, each given by its last timestamp
(``window.max_timestamp()``), as a tensor of ``TriggerResult`` codes (int8):
``on_element_batch(max_ts, watermark)`` for (record, window) pairs and
``on_event_time_batch(max_ts, before, watermark)`` for the windows whose
timers come due as the watermark moves from ``before`` to ``watermark``;
``fire_range(before, watermark)`` bounds the windows that may fire (so cold
state is fetched for those only). A built-in vectorized trigger's batch
decisions equal its per-element ones (tested); the columnar operators act on
FIRE (a vectorized trigger used there returns no PURGE).

Adding a trigger: a subclass here (and its name in ``opforge.stream``'s
exports); no operator changes.
"""

from __future__ import annotations

import enum
from functools import reduce

import torch


class TriggerResult(enum.IntEnum):
    """What a trigger asks for (PyFlink's ``TriggerResult``): bit 1 fires the
    window, bit 2 purges its contents."""

    CONTINUE = 0
    FIRE = 1
    PURGE = 2
    FIRE_AND_PURGE = 3

    def is_fire(self) -> bool:
        return bool(self & 1)

    def is_purge(self) -> bool:
        return bool(self & 2)


def fire_mask(codes: torch.Tensor) -> torch.Tensor:
    """Where a batch of ``TriggerResult`` codes fires."""
    return (codes & int(TriggerResult.FIRE)) != 0


def _codes(mask: torch.Tensor, result: TriggerResult = TriggerResult.FIRE) -> torch.Tensor:
    return mask.to(torch.int8) * int(result)


class TriggerState:
    """A trigger's value for one key and window (``ctx.get_partitioned_state``),
    kept in ``store[slot][name]`` (checkpointed with the window operator)."""

    __slots__ = ("store", "slot", "name")

    def __init__(self, store: dict, slot, name: str):
        self.store, self.slot, self.name = store, slot, name

    def value(self, default=None):
        return self.store.get(self.slot, {}).get(self.name, default)

    def update(self, value) -> None:
        self.store.setdefault(self.slot, {})[self.name] = value

    def clear(self) -> None:
        own = self.store.get(self.slot)
        if own is not None:
            own.pop(self.name, None)
            if not own:
                del self.store[self.slot]


def state_name(descriptor) -> str:
    """A state's name from a name or a state descriptor."""
    return descriptor if isinstance(descriptor, str) else descriptor.name


def merge_state(store: dict, slot, merged: list, descriptor, combine) -> None:
    """``ctx.merge_partitioned_state``: the value of ``slot`` becomes
    ``combine`` over the merged windows' values (``merged``: their states,
    taken before they were cleared) and its own."""
    name = state_name(descriptor)
    vals = [s[name] for s in merged if s and name in s]
    own = store.get(slot, {})
    if name in own:
        vals.append(own[name])
    if vals:
        store.setdefault(slot, {})[name] = reduce(combine, vals)


class Trigger:
    """The base class: override ``on_element`` and the timer methods you use."""

    #: the columnar operators can evaluate it over batches of windows
    vectorized = False

    def on_element(self, element, timestamp: int, window, ctx) -> TriggerResult:
        raise NotImplementedError(f"{type(self).__name__}.on_element")

    def on_event_time(self, time: int, window, ctx) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window, ctx) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return False

    def on_merge(self, window, ctx) -> None:
        raise TypeError(f"{type(self).__name__} does not support merging windows")

    def clear(self, window, ctx) -> None:
        pass

    # -- columnar (``vectorized``) ------------------------------------------------------
    def on_element_batch(self, max_ts: torch.Tensor, watermark: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no columnar form")

    def on_event_time_batch(self, max_ts: torch.Tensor, before: int, watermark: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no columnar form")

    def fire_range(self, before: int, watermark: int) -> tuple[int, int]:
        raise NotImplementedError(f"{type(self).__name__} has no columnar form")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NeverTrigger(Trigger):
    """Never fires (``GlobalWindows``' default: give them a real trigger)."""

    def on_element(self, element, timestamp, window, ctx):
        return TriggerResult.CONTINUE

    def can_merge(self):
        return True

    def on_merge(self, window, ctx):
        pass


class EventTimeTrigger(Trigger):
    """Fires a window once the watermark passes its end (its last timestamp),
    and again for each record that arrives after that within the allowed
    lateness (Flink's ``EventTimeTrigger``)."""

    vectorized = True

    @classmethod
    def create(cls):
        return cls()

    def on_element(self, element, timestamp, window, ctx):
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE  # a late record: the window fires again
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self):
        return True

    def on_merge(self, window, ctx):
        if window.max_timestamp() > ctx.get_current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window, ctx):
        ctx.delete_event_time_timer(window.max_timestamp())

    def on_element_batch(self, max_ts, watermark):
        return _codes(max_ts <= watermark)

    def on_event_time_batch(self, max_ts, before, watermark):
        after, upto = self.fire_range(before, watermark)
        return _codes((max_ts > after) & (max_ts <= upto))

    def fire_range(self, before, watermark):
        return before, watermark  # the timers at max_ts in (before, watermark]


class ProcessingTimeTrigger(Trigger):
    """Fires a window when the processing-time clock passes its end."""

    @classmethod
    def create(cls):
        return cls()

    def on_element(self, element, timestamp, window, ctx):
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.FIRE

    def can_merge(self):
        return True

    def on_merge(self, window, ctx):
        if window.max_timestamp() > ctx.get_current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window, ctx):
        ctx.delete_processing_time_timer(window.max_timestamp())


class CountTrigger(Trigger):
    """Fires every ``count`` records of a key's window (Flink's ``CountTrigger``)."""

    def __init__(self, count: int):
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ValueError(f"CountTrigger.of: count must be a positive int, got {count!r}")
        self.count = count

    @classmethod
    def of(cls, count: int):
        return cls(count)

    def on_element(self, element, timestamp, window, ctx):
        seen = ctx.get_partitioned_state("count")
        n = seen.value(0) + 1
        if n >= self.count:
            seen.clear()
            return TriggerResult.FIRE
        seen.update(n)
        return TriggerResult.CONTINUE

    def can_merge(self):
        return True

    def on_merge(self, window, ctx):
        ctx.merge_partitioned_state("count", lambda a, b: a + b)

    def clear(self, window, ctx):
        ctx.get_partitioned_state("count").clear()

    def __repr__(self):
        return f"CountTrigger.of({self.count})"


class PurgingTrigger(Trigger):
    """Turns each FIRE of ``nested`` into FIRE_AND_PURGE."""

    def __init__(self, nested: Trigger):
        if not isinstance(nested, Trigger):
            raise TypeError(f"PurgingTrigger.of: expected a Trigger, got {type(nested).__name__}")
        self.nested = nested

    @classmethod
    def of(cls, nested: Trigger):
        return cls(nested)

    @staticmethod
    def _purging(result):
        return TriggerResult.FIRE_AND_PURGE if TriggerResult(result).is_fire() else result

    def on_element(self, element, timestamp, window, ctx):
        return self._purging(self.nested.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time, window, ctx):
        return self._purging(self.nested.on_event_time(time, window, ctx))

    def on_processing_time(self, time, window, ctx):
        return self._purging(self.nested.on_processing_time(time, window, ctx))

    def can_merge(self):
        return self.nested.can_merge()

    def on_merge(self, window, ctx):
        self.nested.on_merge(window, ctx)

    def clear(self, window, ctx):
        self.nested.clear(window, ctx)

    def __repr__(self):
        return f"PurgingTrigger.of({self.nested!r})"
