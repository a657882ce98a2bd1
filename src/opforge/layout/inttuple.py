"""Hierarchical integer tuples (CuTe's ``IntTuple``): an int, or a tuple of IntTuples.

Shapes, strides and coordinates are all IntTuples; a layout's shape and stride
are *congruent* (the same nesting). Coordinates are colexicographic: the
leftmost mode varies fastest, as in CuTe.
"""

from __future__ import annotations

from typing import Union

IntTuple = Union[int, tuple]


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def flatten(t: IntTuple) -> tuple[int, ...]:
    """The leaves of ``t`` in order."""
    if is_int(t):
        return (t,)
    return tuple(leaf for sub in t for leaf in flatten(sub))


def product(t: IntTuple) -> int:
    n = 1
    for leaf in flatten(t):
        n *= leaf
    return n


def rank(t: IntTuple) -> int:
    return 1 if is_int(t) else len(t)


def depth(t: IntTuple) -> int:
    return 0 if is_int(t) else 1 + max((depth(sub) for sub in t), default=0)


def congruent(a: IntTuple, b: IntTuple) -> bool:
    if is_int(a) or is_int(b):
        return is_int(a) and is_int(b)
    return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))


def check(t: IntTuple, what: str) -> IntTuple:
    """``t`` with lists turned into tuples; a clear error for anything that is not an IntTuple."""
    if is_int(t):
        return t
    if isinstance(t, (tuple, list)):
        return tuple(check(sub, what) for sub in t)
    raise TypeError(f"opforge.layout: {what} must be an int or a (nested) tuple of ints, got {t!r}")


def idx2crd(idx: int, shape: IntTuple) -> IntTuple:
    """The natural (hierarchical) coordinate of the 1-D index ``idx`` in ``shape``; the last
    mode absorbs an index past the size, as CuTe's does."""
    if is_int(shape):
        return idx
    out = []
    for i, sub in enumerate(shape):
        n = product(sub)
        if i == len(shape) - 1:
            out.append(idx2crd(idx, sub))
        else:
            out.append(idx2crd(idx % n, sub))
            idx //= n
    return tuple(out)


def crd2idx(crd: IntTuple, shape: IntTuple, stride: IntTuple) -> int:
    """The index of coordinate ``crd`` (congruent to ``shape``, or an int at any level,
    unfolded colexicographically) under ``stride``."""
    if is_int(crd):
        crd = idx2crd(crd, shape)
    if is_int(shape):
        if not is_int(crd):
            raise ValueError(f"opforge.layout: coordinate {crd!r} is deeper than the shape {shape}")
        return crd * stride
    if len(crd) != len(shape):
        raise ValueError(f"opforge.layout: coordinate {crd!r} has {len(crd)} modes, the shape {shape!r} {len(shape)}")
    return sum(crd2idx(c, s, d) for c, s, d in zip(crd, shape, stride))


def compact_col_major(shape: IntTuple, start: int = 1) -> IntTuple:
    """Strides of the column-major (leftmost fastest) compact layout of ``shape``."""
    if is_int(shape):
        return start
    out = []
    for sub in shape:
        out.append(compact_col_major(sub, start))
        start *= product(sub)
    return tuple(out)


def compact_row_major(shape: IntTuple) -> IntTuple:
    """Strides of the row-major (rightmost fastest) compact layout of a flat ``shape``."""
    if is_int(shape):
        return 1
    out, step = [], 1
    for s in reversed(shape):
        if not is_int(s):
            raise ValueError(f"opforge.layout: row-major strides are for flat shapes, got {shape!r}")
        out.append(step)
        step *= s
    return tuple(reversed(out))


def fmt(t: IntTuple) -> str:
    return str(t) if is_int(t) else "(" + ",".join(fmt(sub) for sub in t) + ")"
