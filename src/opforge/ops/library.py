"""Registration of opforge ops as ``torch.library`` custom ops.

Every op lives in the ``opforge`` namespace so it works under
``torch.compile(fullgraph=True)`` (through its fake implementation), inside
CUDA-graph capture, and with autograd. We use the low-level ``Library`` API
rather than ``torch.library.custom_op``: the latter adds about 6 µs of Python
per call, which the dispatch-overhead budget (10 µs) cannot afford.
"""

from __future__ import annotations

from typing import Callable

import torch

from opforge.runtime.registry import NAMESPACE

_LIB = torch.library.Library(NAMESPACE, "DEF")


def define(
    schema: str,
    impl: Callable,
    fake: Callable,
    backward: Callable | None = None,
    setup_context: Callable | None = None,
) -> None:
    """Define ``opforge::<schema>`` with one implementation for CPU and CUDA."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CPU")
    _LIB.impl(name, impl, "CUDA")
    qualname = f"{NAMESPACE}::{name}"
    torch.library.register_fake(qualname, fake, lib=_LIB)
    if backward is not None:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=_LIB)
