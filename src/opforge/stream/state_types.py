"""The classes a checkpoint may construct when it is read back.

A checkpoint names a dataclass or namedtuple value by ``"module:qualname"``.
Restoring never imports a module or looks a name up from that text: the name
must be in this registry, which holds the project's own state types, every
class this process has encoded into a checkpoint or seen as a record class
(``RecordSchema``), and the classes a user registers with
``register_state_type`` (a job restored in a fresh process whose state holds
its own dataclasses registers them before ``execute``). Anything else is a
``CheckpointRestoreError``, raised before any code runs.
"""

from __future__ import annotations

import dataclasses

# the project's own types that state may hold, by name: imported (from
# opforge only) the first time a checkpoint names one of them
_PROJECT = {
    "opforge.stream.functions:TimestampedValue": ("opforge.stream.functions", "TimestampedValue"),
    "opforge.stream.graph:OutputTag": ("opforge.stream.graph", "OutputTag"),
    "opforge.stream.nexmark:NexmarkConfig": ("opforge.stream.nexmark", "NexmarkConfig"),
    "opforge.stream.state:StateTtlConfig": ("opforge.stream.state", "StateTtlConfig"),
}
_REGISTERED: dict[str, type] = {}


def is_state_class(cls) -> bool:
    return isinstance(cls, type) and (dataclasses.is_dataclass(cls) or
                                      (issubclass(cls, tuple) and hasattr(cls, "_fields")))


def state_type_name(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_state_type(cls: type) -> type:
    """Allow checkpoints to construct ``cls`` (a dataclass or a namedtuple
    defined at module level) when they are restored; usable as a decorator."""
    if not is_state_class(cls):
        raise TypeError(f"register_state_type: expected a dataclass or a namedtuple class, got {cls!r}")
    _REGISTERED[state_type_name(cls)] = cls
    return cls


def registered_state_type(name: str):
    """The registered class named ``name``, or None (nothing is imported
    unless ``name`` is one of the project's own types)."""
    cls = _REGISTERED.get(name)
    if cls is None and name in _PROJECT:
        import importlib

        module, qual = _PROJECT[name]
        cls = _REGISTERED[name] = getattr(importlib.import_module(module), qual)
    return cls
