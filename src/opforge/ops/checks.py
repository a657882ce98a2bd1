"""Argument checks shared by the tensor ops: each raises a clear error that
names the op (``where``), the argument and what was expected."""

from __future__ import annotations

import torch


def check_tensor(where: str, arg: str, t, *, floating: bool = True) -> None:
    """``t`` is a real tensor (floating point unless ``floating=False``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_complex():
        raise TypeError(f"{where}: complex tensors are not supported (got {arg} of {t.dtype})")
    if floating and not t.dtype.is_floating_point:
        raise TypeError(f"{where}: {arg} must be a floating-point tensor, got {t.dtype}")


def check_dim(where: str, x: torch.Tensor, dim) -> None:
    """``dim`` is an int in range for ``x`` (a 0-dim tensor accepts 0 and -1, as torch does)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{where}: dim must be an int, got {type(dim).__name__}")
    n = max(x.dim(), 1)
    if not -n <= dim < n:
        raise ValueError(f"{where}: dim {dim} is out of range for a tensor with {x.dim()} dims "
                         f"(expected {-n} <= dim < {n})")
