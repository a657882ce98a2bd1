"""Keyed state with Flink's names: ``ValueState``, ``ListState``, ``MapState``,
``ReducingState``, ``AggregatingState``, their descriptors, and TTL.

State is scoped to the current key: the operator sets the key before it
calls the user function. This backend holds
values in host memory, one Python dict per state name (the foundation; columnar
device-resident state is the windows' ``Aggregations`` path).

TTL (``StateTtlConfig``) is measured in processing time, like Flink: a value
written at ``t`` expires at ``t + ttl``; ``update_type`` says whether reads
refresh it (``OnReadAndWrite``) or only writes (``OnCreateAndWrite``, the
default). Expired values are never returned and are dropped when touched.

Checkpoints (``snapshot`` / ``restore``) keep every entry with its write
stamp and the state's kind and TTL, so TTL runs on after a restore; a restored
state the function has not declared yet waits for its ``get_state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class StateTtlConfig:
    ttl_ms: int
    update_type: str = "OnCreateAndWrite"

    def __post_init__(self):
        if not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0:
            raise ValueError(f"StateTtlConfig: ttl_ms must be a positive int, got {self.ttl_ms!r}")
        if self.update_type not in ("OnCreateAndWrite", "OnReadAndWrite"):
            raise ValueError("StateTtlConfig: update_type is OnCreateAndWrite or OnReadAndWrite, "
                             f"got {self.update_type!r}")


class StateDescriptor:
    kind = ""

    def __init__(self, name: str, type_info=None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{type(self).__name__}: name must be a non-empty str")
        self.name = name
        self.type_info = type_info
        self.ttl: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        if not isinstance(ttl_config, StateTtlConfig):
            raise TypeError(f"{type(self).__name__}.enable_time_to_live: expected StateTtlConfig")
        self.ttl = ttl_config


class ValueStateDescriptor(StateDescriptor):
    kind = "value"


class ListStateDescriptor(StateDescriptor):
    kind = "list"


class MapStateDescriptor(StateDescriptor):
    kind = "map"

    def __init__(self, name: str, key_type_info=None, value_type_info=None):
        super().__init__(name, (key_type_info, value_type_info))


class ReducingStateDescriptor(StateDescriptor):
    kind = "reducing"

    def __init__(self, name: str, reduce_function, type_info=None):
        super().__init__(name, type_info)
        self.reduce_function = getattr(reduce_function, "reduce", reduce_function)


class AggregatingStateDescriptor(StateDescriptor):
    kind = "aggregating"

    def __init__(self, name: str, agg_function, type_info=None):
        super().__init__(name, type_info)
        self.agg_function = agg_function


_MISSING = object()


class _Cell:
    """One state's values across keys, with TTL bookkeeping."""

    def __init__(self, backend: "KeyedStateBackend", descriptor: StateDescriptor):
        self.backend = backend
        self.descriptor = descriptor
        self.values: dict = {}  # (key, namespace) -> (value, written_at)

    def _slot(self):
        return (self.backend.current_key, self.backend.namespace)

    def read(self):
        slot = self._slot()
        entry = self.values.get(slot, _MISSING)
        if entry is _MISSING:
            return _MISSING
        value, stamp = entry
        ttl = self.descriptor.ttl
        if ttl is not None:
            now = self.backend.clock.now()
            if now >= stamp + ttl.ttl_ms:
                del self.values[slot]
                return _MISSING
            if ttl.update_type == "OnReadAndWrite":
                self.values[slot] = (value, now)
        return value

    def write(self, value) -> None:
        self.values[self._slot()] = (value, self.backend.clock.now())

    def clear(self) -> None:
        self.values.pop(self._slot(), None)


class ValueState:
    def __init__(self, cell: _Cell):
        self._cell = cell

    def value(self):
        v = self._cell.read()
        return None if v is _MISSING else v

    def update(self, value) -> None:
        self._cell.write(value)

    def clear(self) -> None:
        self._cell.clear()


class ListState:
    def __init__(self, cell: _Cell):
        self._cell = cell

    def get(self) -> list:
        v = self._cell.read()
        return [] if v is _MISSING else list(v)

    def add(self, value) -> None:
        self._cell.write(self.get() + [value])

    def add_all(self, values) -> None:
        self._cell.write(self.get() + list(values))

    def update(self, values) -> None:
        self._cell.write(list(values))

    def clear(self) -> None:
        self._cell.clear()


class MapState:
    def __init__(self, cell: _Cell):
        self._cell = cell

    def _map(self) -> dict:
        v = self._cell.read()
        return {} if v is _MISSING else v

    def get(self, key):
        return self._map().get(key)

    def put(self, key, value) -> None:
        m = dict(self._map())
        m[key] = value
        self._cell.write(m)

    def put_all(self, mapping) -> None:
        m = dict(self._map())
        m.update(mapping)
        self._cell.write(m)

    def remove(self, key) -> None:
        m = dict(self._map())
        m.pop(key, None)
        self._cell.write(m)

    def contains(self, key) -> bool:
        return key in self._map()

    def keys(self):
        return list(self._map().keys())

    def values(self):
        return list(self._map().values())

    def items(self):
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()

    def clear(self) -> None:
        self._cell.clear()


class ReducingState:
    def __init__(self, cell: _Cell, reduce: Callable):
        self._cell = cell
        self._reduce = reduce

    def get(self):
        v = self._cell.read()
        return None if v is _MISSING else v

    def add(self, value) -> None:
        cur = self._cell.read()
        self._cell.write(value if cur is _MISSING else self._reduce(cur, value))

    def clear(self) -> None:
        self._cell.clear()


class AggregatingState:
    def __init__(self, cell: _Cell, agg):
        self._cell = cell
        self._agg = agg

    def get(self):
        acc = self._cell.read()
        return None if acc is _MISSING else self._agg.get_result(acc)

    def add(self, value) -> None:
        acc = self._cell.read()
        if acc is _MISSING:
            acc = self._agg.create_accumulator()
        self._cell.write(self._agg.add(value, acc))

    def clear(self) -> None:
        self._cell.clear()


class KeyedStateBackend:
    """All keyed state of one operator subtask, in host memory."""

    def __init__(self, clock, where: str):
        self.clock = clock
        self.where = where
        self.current_key: Any = None
        self.namespace: Any = None
        self.cells: dict[str, _Cell] = {}
        self.pending: dict[str, dict] = {}  # restored states not yet declared

    def set_current_key(self, key) -> None:
        self.current_key = key

    def get_state(self, descriptor: StateDescriptor):
        if not isinstance(descriptor, StateDescriptor):
            raise TypeError(f"{self.where}: expected a state descriptor, got {type(descriptor).__name__}")
        cell = self.cells.get(descriptor.name)
        if cell is None:
            cell = self.cells[descriptor.name] = _Cell(self, descriptor)
            if descriptor.name in self.pending:
                self._fill(cell, self.pending.pop(descriptor.name))
        elif cell.descriptor.kind != descriptor.kind:
            raise ValueError(f"{self.where}: state {descriptor.name!r} is already a {cell.descriptor.kind} state")
        kind = descriptor.kind
        if kind == "value":
            return ValueState(cell)
        if kind == "list":
            return ListState(cell)
        if kind == "map":
            return MapState(cell)
        if kind == "reducing":
            return ReducingState(cell, descriptor.reduce_function)
        return AggregatingState(cell, descriptor.agg_function)

    # -- checkpoints ------------------------------------------------------------
    def snapshot(self) -> dict:
        """Every state's entries ``[key, namespace, value, written_at]`` with its
        kind and TTL; TTL stamps are processing time, kept as they are."""
        out = {}
        for name, cell in self.cells.items():
            d = cell.descriptor
            ttl = None if d.ttl is None else {"ttl_ms": d.ttl.ttl_ms, "update_type": d.ttl.update_type}
            out[name] = {"kind": d.kind, "ttl": ttl,
                         "entries": [[k, ns, v, stamp] for (k, ns), (v, stamp) in cell.values.items()]}
        out.update({n: s for n, s in self.pending.items() if n not in out})
        return out

    def restore(self, snapshot: dict) -> None:
        """Put back ``snapshot``'s entries; a state the function has not asked
        for yet waits until ``get_state`` names it (with the same kind)."""
        for name, s in snapshot.items():
            cell = self.cells.get(name)
            if cell is None:
                self.pending[name] = s
            else:
                self._fill(cell, s)

    def _fill(self, cell: "_Cell", s: dict) -> None:
        if s["kind"] != cell.descriptor.kind:
            raise ValueError(f"{self.where}: state {cell.descriptor.name!r} was a {s['kind']} state in the "
                             f"checkpoint, the job now declares a {cell.descriptor.kind} state")
        cell.values = {(k, ns): (v, stamp) for k, ns, v, stamp in s["entries"]}
