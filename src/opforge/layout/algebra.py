"""CuTe's layout algebra: a layout is a function from coordinates to indices given by a
(shape, stride) pair of congruent IntTuples; composition, complement, divide and
product build tilings and partitions out of layouts (CUTLASS ``media/docs/cpp/cute``
``01_layout`` and ``02_layout_algebra``).

Operations that CuTe leaves undefined (composition whose stride or shape
divisibility condition fails, a complement of a non-injective layout) raise
``LayoutError`` naming the condition, instead of returning a wrong layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.layout.inttuple import (IntTuple, check, compact_col_major, congruent, crd2idx, depth, flatten, fmt,
                                     idx2crd, is_int, product, rank)


class LayoutError(ValueError):
    """An operation of the algebra that is undefined for its arguments."""


@dataclass(frozen=True)
class Layout:
    """``shape:stride``; call it with a coordinate (congruent to the shape, or a 1-D index)."""

    shape: IntTuple
    stride: IntTuple

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None):
        shape = check(shape, "shape")
        stride = compact_col_major(shape) if stride is None else check(stride, "stride")
        if not congruent(shape, stride):
            raise ValueError(f"opforge.layout: shape {fmt(shape)} and stride {fmt(stride)} are not congruent")
        if any(s < 1 for s in flatten(shape)):
            raise ValueError(f"opforge.layout: shape {fmt(shape)} has a mode of size < 1")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)

    def __call__(self, *crd) -> int:
        c = crd[0] if len(crd) == 1 else tuple(crd)
        return crd2idx(c, self.shape, self.stride)

    def __str__(self) -> str:
        return f"{fmt(self.shape)}:{fmt(self.stride)}"

    __repr__ = __str__

    def __len__(self) -> int:
        return rank(self.shape)

    def __getitem__(self, i: int) -> Layout:
        return self.mode(i)

    def mode(self, i: int) -> Layout:
        """Top-level mode ``i`` as a layout."""
        if is_int(self.shape):
            if i != 0:
                raise IndexError(f"opforge.layout: {self} has one mode, asked for mode {i}")
            return self
        return Layout(self.shape[i], self.stride[i])

    def modes(self) -> list[Layout]:
        return [self.mode(i) for i in range(len(self))]

    def size(self) -> int:
        return product(self.shape)

    def cosize(self) -> int:
        """One past the largest index (strides are non-negative here)."""
        return 1 + sum((s - 1) * abs(d) for s, d in zip(flatten(self.shape), flatten(self.stride)))

    def rank(self) -> int:
        return rank(self.shape)

    def depth(self) -> int:
        return depth(self.shape)

    def coordinate(self, idx: int) -> IntTuple:
        """The natural coordinate of the 1-D index ``idx``."""
        return idx2crd(idx, self.shape)

    def indices(self) -> list[int]:
        return [self(i) for i in range(self.size())]

    def flat(self) -> list[tuple[int, int]]:
        """The (size, stride) leaves."""
        return list(zip(flatten(self.shape), flatten(self.stride)))


def make_layout(*layouts: Layout) -> Layout:
    """The concatenation ``(L0, L1, ...)``: one mode per argument."""
    if len(layouts) == 1:
        return layouts[0]
    return Layout(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def _from_leaves(leaves: list[tuple[int, int]]) -> Layout:
    if not leaves:
        return Layout(1, 0)
    if len(leaves) == 1:
        return Layout(*leaves[0])
    return Layout(tuple(s for s, _ in leaves), tuple(d for _, d in leaves))


# ---------------------------------------------------------------------------
# coalesce
# ---------------------------------------------------------------------------
def coalesce(layout: Layout, profile: IntTuple | None = None) -> Layout:
    """The same function of a 1-D index with the fewest modes (depth <= 1): size-1 modes
    dropped, ``s0:d0 ++ s1:s0*d0`` merged into ``s0*s1:d0``. With ``profile`` (an
    IntTuple of flags), coalesce each mode the profile's ints name, keeping the rank."""
    if profile is not None and not is_int(profile):
        modes = layout.modes()
        out = [coalesce(m, p) for m, p in zip(modes, profile)] + modes[len(profile):]
        return make_layout(*out) if len(out) > 1 else Layout((out[0].shape,), (out[0].stride,))
    leaves: list[tuple[int, int]] = []
    for s, d in layout.flat():
        if s == 1:
            continue
        if leaves and d == leaves[-1][0] * leaves[-1][1]:
            leaves[-1] = (leaves[-1][0] * s, leaves[-1][1])
        else:
            leaves.append((s, d))
    return _from_leaves(leaves)


def filter_zeros(layout: Layout) -> Layout:
    """``layout`` without its stride-0 and size-1 modes, coalesced (the image it reaches)."""
    return coalesce(_from_leaves([(s, d) for s, d in layout.flat() if d != 0 and s != 1]))


# ---------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------


def _as_layout(b) -> Layout:
    return b if isinstance(b, Layout) else Layout(b, 1) if is_int(b) else Layout(b)


def composition(a: Layout, b) -> Layout:
    """``R = A o B``: ``R(c) = A(B(c))`` with ``R`` of ``B``'s shape. ``b`` is a layout, an int
    (``b:1``), or a tuple (a *tiler*) composed mode by mode with ``a``'s modes.

    As in CuTe, a ``B`` of several modes gives the concatenation ``(A o B0, A o B1, ...)``:
    that is ``A o B`` when ``B``'s modes step through ``A`` without carrying across ``A``'s
    mode boundaries (a compact reshape, a tiler, a divide's ``(B, B*)``), not for every ``B``."""
    if hasattr(a, "compose_inner"):  # a swizzled (composed) layout
        return a.compose_inner(b)
    if isinstance(b, tuple):
        if len(b) > a.rank():
            raise LayoutError(f"composition: the tiler has {len(b)} modes, the layout {a} only {a.rank()}")
        modes = a.modes()
        return make_layout(*[composition(m, t) if t is not None else m for m, t in zip(modes, b)],
                           *modes[len(b):]) if a.rank() > 1 else composition(a, b[0])
    b = _as_layout(b)
    if not is_int(b.shape):
        parts = [composition(a, m) for m in b.modes()]
        return Layout(tuple(p.shape for p in parts), tuple(p.stride for p in parts))
    return _compose_mode(a, b.shape, b.stride)


def _compose_mode(a: Layout, s: int, d: int) -> Layout:
    """``A o s:d`` for one integral mode: divide ``d`` out of ``A``'s flat shape from the
    left, then keep the first ``s`` elements of what is left."""
    if d == 0:
        return Layout(s, 0)
    leaves = coalesce(a).flat()
    out: list[tuple[int, int]] = []
    rest_shape, rest_stride = s, d
    for i, (ash, ast) in enumerate(leaves):
        last = i == len(leaves) - 1
        if last:
            if rest_shape > 1 or not out:
                out.append((rest_shape, rest_stride * ast))
            break
        if rest_shape == 1:
            break
        if ash % rest_stride and rest_stride % ash:
            raise LayoutError(f"composition {a} o {s}:{d}: stride divisibility condition fails: "
                              f"stride {rest_stride} neither divides nor is a multiple of the mode size {ash}")
        left = max(1, ash // rest_stride)
        take = min(left, rest_shape)
        if take < rest_shape and rest_shape % take:
            raise LayoutError(f"composition {a} o {s}:{d}: shape divisibility condition fails: "
                              f"{rest_shape} elements are not a multiple of the {take} left in a mode")
        if take > 1:
            out.append((take, rest_stride * ast))
        rest_shape //= take
        rest_stride = -(-rest_stride // ash)
    return _from_leaves(out)


# ---------------------------------------------------------------------------
# complement, divide, product
# ---------------------------------------------------------------------------
def complement(a: Layout, cotarget: IntTuple | None = None) -> Layout:
    """``A*``: the ordered layout, with a codomain disjoint from ``A``'s, that completes ``A``
    up to ``size(cotarget)`` (default: ``cosize(A)``)."""
    m = a.cosize() if cotarget is None else product(cotarget)
    leaves = sorted(filter_zeros(a).flat(), key=lambda sd: (sd[1], sd[0]))
    if leaves == [(1, 0)]:
        leaves = []
    out: list[tuple[int, int]] = []
    covered = 1
    for s, d in leaves:
        if d % covered:
            raise LayoutError(f"complement of {a}: stride {d} is not a multiple of {covered}, the extent "
                              f"of the smaller modes (the layout is not injective or not a tiling)")
        out.append((d // covered, covered))
        covered = s * d
    out.append((-(-m // covered), covered))
    return coalesce(_from_leaves(out))


def logical_divide(a: Layout, tiler) -> Layout:
    """``A / B = A o (B, B*)``: mode 0 the tile ``B`` selects, mode 1 the tiles' layout.
    A tuple tiler divides mode by mode."""
    if isinstance(tiler, tuple):
        modes = a.modes()
        if len(tiler) > len(modes):
            raise LayoutError(f"logical_divide: the tiler has {len(tiler)} modes, the layout {a} only {len(modes)}")
        return make_layout(*[logical_divide(m, t) for m, t in zip(modes, tiler)], *modes[len(tiler):]) \
            if len(modes) > 1 else logical_divide(a, tiler[0])
    b = _as_layout(tiler)
    return composition(a, make_layout(b, complement(b, a.size())))


def zipped_divide(a: Layout, tiler) -> Layout:
    """``((tiles...), (rests...))``."""
    return _gather(logical_divide(a, tiler), tiler, "zipped")


def tiled_divide(a: Layout, tiler) -> Layout:
    """``((tiles...), rest0, rest1, ...)``."""
    return _gather(logical_divide(a, tiler), tiler, "tiled")


def flat_divide(a: Layout, tiler) -> Layout:
    """``(tile0, tile1, ..., rest0, rest1, ...)``."""
    return _gather(logical_divide(a, tiler), tiler, "flat")


def _gather(r: Layout, tiler, how: str) -> Layout:
    """Regroup a by-mode divide or product ``((t0, r0), (t1, r1), ..., L...)``: ``zipped``
    gives ``((t0, t1, ...), (r0, r1, ..., L...))``, ``tiled`` ``((t0, t1, ...), r0, r1, ..., L...)``,
    ``flat`` ``(t0, t1, ..., r0, r1, ..., L...)``."""
    if not isinstance(tiler, tuple):
        return r if how != "flat" else make_layout(*r.modes())
    n = len(tiler)
    modes = r.modes()
    firsts = [m.mode(0) for m in modes[:n]]
    rests = [m.mode(1) for m in modes[:n]] + modes[n:]
    if how == "flat":
        return make_layout(*firsts, *rests)
    first = make_layout(*firsts) if n > 1 else _wrap(firsts[0])
    if how == "tiled":
        return make_layout(first, *rests)
    return make_layout(first, make_layout(*rests) if len(rests) > 1 else _wrap(rests[0]))


def _wrap(x: Layout) -> Layout:
    return Layout((x.shape,), (x.stride,))


def logical_product(a: Layout, tiler) -> Layout:
    """``A x B = (A, A* o B)``: ``A`` repeated as ``B`` says. A tuple tiler multiplies mode by mode."""
    if isinstance(tiler, tuple):
        modes = a.modes()
        return make_layout(*[logical_product(m, t) for m, t in zip(modes, tiler)], *modes[len(tiler):])
    b = _as_layout(tiler)
    return make_layout(a, composition(complement(a, a.size() * b.cosize()), b))


def zipped_product(a: Layout, tiler: tuple) -> Layout:
    """``((A0, A1, ...), (B'0, B'1, ...))`` of a by-mode product."""
    return _gather(logical_product(a, tiler), tiler, "zipped")


def tiled_product(a: Layout, tiler: tuple) -> Layout:
    """``((A0, A1, ...), B'0, B'1, ...)`` of a by-mode product."""
    return _gather(logical_product(a, tiler), tiler, "tiled")


def _rank_matched(a: Layout, b: Layout) -> tuple[list[Layout], list[Layout]]:
    n = max(a.rank(), b.rank())
    pad = [Layout(1, 0)]
    return a.modes() + pad * (n - a.rank()), b.modes() + pad * (n - b.rank())


def blocked_product(a: Layout, b: Layout) -> Layout:
    """Tile ``A`` as blocks arranged by ``B``: mode ``i`` is ``(A_i, B'_i)``, mode 0 coalesced."""
    am, bm = _rank_matched(a, b)
    reps = composition(complement(make_layout(*am), a.size() * b.cosize()), make_layout(*bm)).modes()
    out = [make_layout(x, y) for x, y in zip(am, reps)]
    return make_layout(*[coalesce(m) for m in out]) if len(out) > 1 else coalesce(out[0])


def raked_product(a: Layout, b: Layout) -> Layout:
    """Interleave ``A`` with ``B`` (cyclic distribution): mode ``i`` is ``(B'_i, A_i)``."""
    am, bm = _rank_matched(a, b)
    reps = composition(complement(make_layout(*am), a.size() * b.cosize()), make_layout(*bm)).modes()
    out = [make_layout(y, x) for x, y in zip(am, reps)]
    return make_layout(*[coalesce(m) for m in out]) if len(out) > 1 else coalesce(out[0])


# ---------------------------------------------------------------------------
# inverses
# ---------------------------------------------------------------------------
def right_inverse(a: Layout) -> Layout:
    """The largest ``R`` with ``A(R(i)) == i`` for ``i < size(R)``: follow the contiguous
    chain of ``A``'s strides 1, s0, s0*s1, ... (``1:0`` when ``A`` never reaches 1)."""
    leaves = coalesce(a).flat()
    domain_strides = []
    step = 1
    for s, _ in leaves:
        domain_strides.append(step)
        step *= s
    out: list[tuple[int, int]] = []
    reached = 1
    for (s, d), r in sorted(zip(leaves, domain_strides), key=lambda x: x[0][1]):
        if d != reached or s == 1:
            if d < reached:
                continue
            break
        out.append((s, r))
        reached = s * d
    return coalesce(_from_leaves(out))


def left_inverse(a: Layout) -> Layout:
    """``L`` with ``L(A(i)) == i`` for every ``i < size(A)`` (``A`` injective)."""
    return right_inverse(make_layout(a, complement(a)))
