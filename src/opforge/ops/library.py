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


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_stack = torch._C._functorch.peek_interpreter_stack
_torch_function_mode = torch._C._is_torch_function_mode_enabled
_grad_enabled = torch.is_grad_enabled


def direct_ok(a, b=None) -> bool:
    """True when calling the dispatcher directly is indistinguishable from
    going through ``torch.ops.opforge``: plain tensors, no autograd to record,
    no tracing, no modes or functorch transforms. The public API then skips
    torch's Python autograd wrapper, which costs about 6 µs a call."""
    if type(a) is not _Tensor or (b is not None and type(b) is not _Tensor and isinstance(b, _Tensor)):
        return False
    if _grad_enabled() and (a.requires_grad or (type(b) is _Tensor and b.requires_grad)):
        return False
    return not (_is_compiling() or _dispatch_stack_len() or _functorch_stack() is not None
                or _torch_function_mode())


KEY_DTYPES = (torch.int32, torch.int64)  # the integer keys the hash-table and Bloom ops take


def check_keys(where: str, arg: str, t) -> None:
    """A key argument: a 1-D int32 or int64 tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in KEY_DTYPES:
        raise TypeError(f"{where}: {arg} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{where}: {arg} must be 1-D, got shape {tuple(t.shape)}")


def check_valid(where: str, arg: str, valid, keys: torch.Tensor, keys_arg: str) -> None:
    """A NULL mask argument: None, or a bool tensor shaped and placed like the keys it marks."""
    if valid is None:
        return
    if not isinstance(valid, torch.Tensor):
        raise TypeError(f"{where}: {arg} must be a bool torch.Tensor or None, got {type(valid).__name__}")
    if valid.dtype != torch.bool:
        raise TypeError(f"{where}: {arg} must be a bool tensor, got {valid.dtype}")
    if valid.shape != keys.shape:
        raise ValueError(f"{where}: {arg} has shape {tuple(valid.shape)} but {keys_arg} has {tuple(keys.shape)}")
    if valid.device != keys.device:
        raise ValueError(f"{where}: {arg} is on {valid.device} but {keys_arg} is on {keys.device}")
