"""Argument checks, dim handling and shape buckets shared by the tensor ops.

Every op that reduces or scans along a dim views its input as ``[rows, cols]``
with the dim last and unit column stride; its tuning key buckets sizes to
powers of two. These are the helpers for that, in one place.
"""

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


def norm_dim(t: torch.Tensor, dim: int) -> int:
    return dim % t.dim() if t.dim() else 0


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bucket_size(n: int) -> str:
    """A size as the tuning key sees it: exact up to 16, then the next power of two."""
    return str(n) if n <= 16 else str(pow2(n))


def rows_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as ``[rows, cols]`` (``cols`` = the size of ``dim``) with unit column
    stride: a view when the layout allows, else a contiguous copy."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    m = t.movedim(norm_dim(t, dim), -1)
    cols = m.shape[-1]
    rows = m.numel() // cols if cols else 0
    if m.stride(-1) == 1 or cols <= 1:
        try:
            v = m.view(rows, cols)
            if v.stride(1) == 1 or cols <= 1:
                return v
        except RuntimeError:
            pass
    return m.contiguous().view(rows, cols)


def empty_moved(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An output of ``x``'s shape, dense with ``dim`` innermost, returned with
    ``dim`` back in place (for the last dim: a contiguous tensor)."""
    dtype = dtype or x.dtype
    if x.dim() == 0:
        return torch.empty((), dtype=dtype, device=x.device)
    d = norm_dim(x, dim)
    shape = list(x.shape)
    moved = shape[:d] + shape[d + 1:] + [shape[d]]
    return torch.empty(moved, dtype=dtype, device=x.device).movedim(-1, d)
