"""Shape facts shared by the ops, the fusion compiler and the kernels' launchers.

The runtime owns them (not ``opforge.ops``) so that ``fusion`` and
``kernels`` can use them without importing the public API they sit under:
tuning-key buckets (powers of two), dims seen as ``[rows, cols]`` with the dim
last and unit column stride, and broadcast gradients summed back. Bucket
strings are part of the autotune cache key: changing them orphans the tuned
entries shipped in ``runtime/tuned``.
"""

from __future__ import annotations

import torch


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


def rows_cols(t: torch.Tensor, dim: int) -> tuple[int, int]:
    """``(rows, cols)`` of ``t`` seen as ``[rows, cols]`` with ``dim`` last."""
    cols = t.shape[norm_dim(t, dim)] if t.dim() else 1
    return (t.numel() // cols if cols else 0), cols


def sum_to(g: torch.Tensor, shape) -> torch.Tensor:
    """Reduce a broadcast gradient back to an operand's shape."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = g.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1]
    return g.sum(dims, keepdim=True).reshape(shape) if dims else g.reshape(shape)


def bucket_dims(*sizes: int) -> str:
    """Several sizes as the tuning key sees them, joined by ``x`` (``"1x64x128"``)."""
    return "x".join(bucket_size(n) for n in sizes)


def major(t: torch.Tensor) -> str:
    """A matrix operand's layout in a GEMM bucket: ``r`` when the last dim has
    unit stride (or size 1), ``c`` when the one before has, else ``s``."""
    if t.dim() < 2:
        return "r"
    if t.stride(-1) == 1 or t.shape[-1] == 1:
        return "r"
    return "c" if t.stride(-2) == 1 or t.shape[-2] == 1 else "s"
