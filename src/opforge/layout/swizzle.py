"""Swizzles: ``Swizzle<B,M,S>`` XORs the ``B`` bits at ``[M+S, M+S+B)`` of an offset into
the bits at ``[M, M+B)``, permuting ``2**M``-element vectors inside each row of
``2**(M+S)`` elements so that a column of rows falls into different banks
(CuTe's ``cute/swizzle.hpp``). ``ComposedLayout(swizzle, offset, layout)`` is
``c -> swizzle(offset + layout(c))``, CuTe's swizzled layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.layout.algebra import Layout, LayoutError, composition


@dataclass(frozen=True)
class Swizzle:
    bits: int  # B: how many bits are XORed
    base: int  # M: vectors of 2**M elements stay whole
    shift: int  # S: distance from the bits read to the bits written

    def __post_init__(self):
        if self.bits < 0 or self.base < 0:
            raise ValueError(f"opforge.layout: Swizzle<{self.bits},{self.base},{self.shift}>: B and M must be >= 0")
        if abs(self.shift) < self.bits:
            raise ValueError(f"opforge.layout: Swizzle<{self.bits},{self.base},{self.shift}>: |S| must be >= B "
                             f"(the bits read and the bits written would overlap)")

    @property
    def read_mask(self) -> int:
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    def __call__(self, offset: int) -> int:
        moved = offset & self.read_mask
        moved = moved >> self.shift if self.shift >= 0 else moved << -self.shift
        return offset ^ moved

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    __repr__ = __str__


@dataclass(frozen=True)
class ComposedLayout:
    """``swizzle o (offset + layout)``: the layout's shape, the swizzle's permutation of offsets."""

    swizzle: Swizzle
    offset: int
    layout: Layout

    def __call__(self, *crd) -> int:
        return self.swizzle(self.offset + self.layout(*crd))

    @property
    def shape(self):
        return self.layout.shape

    def size(self) -> int:
        return self.layout.size()

    def cosize(self) -> int:
        return max(self(i) for i in range(self.size())) + 1

    def rank(self) -> int:
        return self.layout.rank()

    def compose_inner(self, b) -> ComposedLayout:
        """``(Sw o L) o B = Sw o (L o B)``: the swizzle stays outermost."""
        return ComposedLayout(self.swizzle, self.offset, composition(self.layout, b))

    def __str__(self) -> str:
        return f"{self.swizzle} o {self.offset} o {self.layout}"

    __repr__ = __str__


def swizzled(swizzle: Swizzle, layout: Layout, offset: int = 0) -> ComposedLayout:
    return ComposedLayout(swizzle, offset, layout)



def row_swizzle(rows: int, cols: int, swizzle: Swizzle) -> ComposedLayout:
    """A ``rows x cols`` row-major tile (coordinates ``(row, col)``) swizzled by ``swizzle``;
    ``LayoutError`` when the swizzle reads offset bits past the tile (it would not permute it)."""
    tile = Layout((rows, cols), (cols, 1))
    top = swizzle.base + max(0, swizzle.shift) + swizzle.bits  # one past the highest bit read
    if swizzle.bits and (1 << top) > rows * cols:
        raise LayoutError(f"{swizzle} reads offset bits up to 2**{top - 1}, past the {rows}x{cols} tile {tile}")
    return ComposedLayout(swizzle, 0, tile)
