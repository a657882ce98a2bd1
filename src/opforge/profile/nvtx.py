"""NVTX ranges around opforge ops, so Nsight Systems shows op names on its timeline.

``enable()`` (or ``OPFORGE_NVTX=1`` in the environment) adds a dispatch hook
(``opforge.runtime.hooks.HOOKS``) that pushes ``opforge::<op> [<variant>]``
before the variant launches and pops it after. Off by default: a push and a
pop cost about a microsecond of host time per call, which the dispatch
overhead budget (< 10 µs) should not pay when nobody is profiling.

Without CUDA every call here is a no-op (torch's NVTX binding needs a CUDA
build and device), so code may call them unconditionally.
"""

from __future__ import annotations

import contextlib

from opforge.runtime import hooks as _hooks


def available() -> bool:
    """True when NVTX ranges reach a profiler (a CUDA device is present)."""
    import torch

    return torch.cuda.is_available()


def range_push(name: str) -> None:
    if available():
        import torch

        torch.cuda.nvtx.range_push(name)


def range_pop() -> None:
    if available():
        import torch

        torch.cuda.nvtx.range_pop()


@contextlib.contextmanager
def nvtx_range(name: str):
    """``with nvtx_range("step 3"): ...``: a named range, a no-op without CUDA."""
    range_push(name)
    try:
        yield
    finally:
        range_pop()


def range_name(decision) -> str:
    return f"{decision.op.qualname} [{decision.variant.name}]"


def _hook(phase: str, decision) -> None:
    if phase == "enter":
        range_push(range_name(decision))
    else:
        range_pop()


def enable() -> None:
    """Put an NVTX range around every opforge op from now on (idempotent)."""
    if _hook not in _hooks.HOOKS:
        _hooks.HOOKS.append(_hook)


def disable() -> None:
    if _hook in _hooks.HOOKS:
        _hooks.HOOKS.remove(_hook)


def enabled() -> bool:
    return _hook in _hooks.HOOKS


@contextlib.contextmanager
def ranges():
    """NVTX ranges around every opforge op inside the block."""
    was = enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()
