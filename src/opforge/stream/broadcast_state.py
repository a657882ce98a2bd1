"""Broadcast state (Flink's broadcast state pattern): a low-volume stream
(rules, configuration) sent to every subtask of an operator, kept there in
map state that every subtask holds alike, and read while the main stream's
records are processed.

``rules.broadcast(MapStateDescriptor("rules"))`` gives a ``BroadcastStream``;
``events.connect(rules_b).process(fn)``: ``fn`` is a
``BroadcastProcessFunction`` (``events`` not keyed) or a
``KeyedBroadcastProcessFunction`` (``events`` keyed: keyed state and timers as
in a ``KeyedProcessFunction``). ``process_broadcast_element(value, ctx)``
may change the state (``ctx.get_broadcast_state(descriptor)``: ``put``,
``remove``, ``clear``, ...); ``process_element(value, ctx)`` only reads it,
so every subtask keeps the same state (Flink's rule). Both inputs' records
meet in the order of the watermarks they saw (record granularity), so the
result does not depend on batch size. The state is checkpointed with the
operator (``operator_state.py``).
"""

from __future__ import annotations

from typing import Iterable

from opforge.stream.functions import Function, as_callable
from opforge.stream.operators import CoProcessOperator, ProcessContext, ProcessOperator
from opforge.stream.state import MapStateDescriptor


class BroadcastProcessFunction(Function):
    def process_element(self, value, ctx) -> Iterable:
        raise NotImplementedError

    def process_broadcast_element(self, value, ctx) -> Iterable:
        raise NotImplementedError


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    def on_timer(self, timestamp: int, ctx) -> Iterable:
        return ()


class ReadOnlyBroadcastState:
    """One broadcast map state as ``process_element`` sees it."""

    def __init__(self, values: dict, name: str):
        self._values, self._name = values, name

    def get(self, key):
        return self._values.get(key)

    def contains(self, key) -> bool:
        return key in self._values

    def items(self):
        return list(self._values.items())

    def keys(self):
        return list(self._values)

    def values(self):
        return list(self._values.values())

    def is_empty(self) -> bool:
        return not self._values

    def __iter__(self):
        return iter(self.keys())

    def _read_only(self, *_):
        raise TypeError(f"broadcast state {self._name!r}: process_element may only read it (change it in "
                        "process_broadcast_element, so every subtask keeps the same state)")

    put = put_all = remove = clear = _read_only


class BroadcastState(ReadOnlyBroadcastState):
    def put(self, key, value) -> None:
        self._values[key] = value

    def put_all(self, mapping: dict) -> None:
        self._values.update(mapping)

    def remove(self, key) -> None:
        self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()


def broadcast_descriptors(descriptors: tuple, where: str) -> tuple:
    if not descriptors:
        raise ValueError(f"{where}: give at least one MapStateDescriptor")
    for d in descriptors:
        if not isinstance(d, MapStateDescriptor):
            raise TypeError(f"{where}: broadcast state is map state; expected MapStateDescriptor, got {d!r}")
    return descriptors


class BroadcastStream:
    """What ``DataStream.broadcast(descriptor, ...)`` returns: only for ``connect``."""

    def __init__(self, stream, descriptors: tuple):
        self.stream, self.descriptors = stream, descriptors


class BroadcastConnectedStream:
    def __init__(self, first, broadcast: BroadcastStream):
        self.first, self.broadcast = first, broadcast

    def process(self, func, output_type=None):
        from opforge.stream.datastream import _typed

        for m in ("process_element", "process_broadcast_element"):
            if not hasattr(func, m):
                raise TypeError(f"BroadcastConnectedStream.process: expected a (Keyed)BroadcastProcessFunction "
                                f"with {m}()")
        keyed = self.first._key is not None
        if keyed != isinstance(func, KeyedBroadcastProcessFunction) and \
                isinstance(func, BroadcastProcessFunction):
            want = "KeyedBroadcastProcessFunction" if keyed else "BroadcastProcessFunction"
            raise TypeError(f"BroadcastConnectedStream.process: a {'keyed' if keyed else 'non-keyed'} stream "
                            f"takes a {want}, got {type(func).__name__}")
        name = "KeyedBroadcastProcess" if keyed else "BroadcastProcess"
        return self.first._add("broadcast_process", name,
                               {"fn": func, "descriptors": self.broadcast.descriptors,
                                "output_type": _typed(output_type, name)},
                               [self.first._input(), self.broadcast.stream._input()])


class BroadcastContext(ProcessContext):
    """``ctx`` of both methods: ``get_broadcast_state(descriptor)``, writable
    in ``process_broadcast_element`` only."""

    def get_broadcast_state(self, descriptor):
        return self._op.broadcast_view(descriptor)


class BroadcastProcessOperator(CoProcessOperator):
    def __init__(self, name, fn, descriptors, key_selector=None):
        ProcessOperator.__init__(self, name, fn, key_selector)
        self.process = (as_callable(fn, "process_element", name), as_callable(fn, "process_broadcast_element", name))
        self.descriptors = {d.name: d for d in descriptors}
        self.broadcast_state = {n: {} for n in self.descriptors}
        self.writing = False

    def open(self):
        super().open()
        self.ctx = BroadcastContext(self, self.collector)

    def broadcast_view(self, descriptor):
        name = descriptor if isinstance(descriptor, str) else descriptor.name
        if name not in self.broadcast_state:
            raise ValueError(f"{self.name}: no broadcast state {name!r} (broadcast with {list(self.descriptors)})")
        cls = BroadcastState if self.writing else ReadOnlyBroadcastState
        return cls(self.broadcast_state[name], name)

    def process_input(self, batch, input_index):
        if input_index == 0:
            self._run(batch, self.process[0])
            return
        self.writing = True  # the broadcast side: no key, may change the state
        self.ctx._key = None
        try:
            self._run(batch.with_keys(None), self.process[1])
        finally:
            self.writing = False
