"""Schedulers: each looks at the cluster and proposes operators toward one goal.

``SCHEDULERS`` maps PD's scheduler names to their classes; ``create(name,
**args)`` builds one (``args`` are the class's keyword arguments, e.g.
``create("evict-leader", store_ids=[3])``).

Schedulers are found by discovery: every module of this package that defines
a class with a string ``name`` and a ``schedule`` method registers it under
that name (the class must be defined in that module, not imported into it).
Adding a scheduler is one new module here plus its tests; nothing else
lists them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil


def _discover() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not isinstance(getattr(cls, "name", None), str) \
                    or not callable(getattr(cls, "schedule", None)):
                continue
            if cls.name in found:
                raise ImportError(f"two schedulers named {cls.name!r}: {found[cls.name].__qualname__} and "
                                  f"{cls.__qualname__}")
            found[cls.name] = cls
    return found


SCHEDULERS: dict[str, type] = _discover()
globals().update({cls.__name__: cls for cls in SCHEDULERS.values()})  # e.g. schedulers.BalanceLeaderScheduler


def create(name: str, **args):
    """A new scheduler by its PD name, with its keyword arguments."""
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise ValueError(f"unknown scheduler {name!r}; known: {sorted(SCHEDULERS)}")
    try:
        return cls(**args)
    except TypeError as e:
        raise ValueError(f"scheduler {name!r}: bad arguments {sorted(args)}: {e}") from None


__all__ = ["SCHEDULERS", "create", *sorted(cls.__name__ for cls in SCHEDULERS.values())]
