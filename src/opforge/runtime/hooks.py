"""The hook list dispatch calls around every opforge op (NVTX ranges, timelines).

``dispatch.call`` runs ``run_hooked(decision, fn, *args)`` instead of
``fn(*args)`` while ``HOOKS`` is non-empty: one list test on the hot path when
nothing listens. Each hook is called as ``hook("enter", decision)`` before the
variant runs and ``hook("exit", decision)`` after it (exits in reverse order,
also when the op raises). This module imports nothing, so the runtime can
import it first.
"""

from __future__ import annotations

from typing import Any, Callable

HOOKS: list[Callable[[str, Any], None]] = []


def run_hooked(decision, fn: Callable, *args):
    """``fn(*args)`` between the hooks' enter and exit calls (dispatch's slow path)."""
    hooks = tuple(HOOKS)
    for h in hooks:
        h("enter", decision)
    try:
        return fn(*args)
    finally:
        for h in reversed(hooks):
            h("exit", decision)
