"""``opforge.layout`` shared layouts as Gluon's (``triton.experimental.gluon``).

Gluon's ``SwizzledSharedLayout(vec, per_phase, max_phase, order)`` stores element
``(r, c)`` of a row-major ``rows x cols`` tile at ``r*cols + (c ^ vec*((r//per_phase)
% max_phase))``: on the offset ``r*cols + c`` that is CuTe's ``Swizzle<B,M,S>`` with
``vec = 2**M``, ``max_phase = 2**B`` and ``per_phase = 2**(M+S-log2 cols)``.
``PaddedSharedLayout`` with an identity order and one ``[interval, padding]``
pair is the layout ``(rows, cols):(cols+padding, 1)`` when ``interval == cols``.
The numbers are plain ints, so a kernel takes them as constexprs.
"""

from __future__ import annotations

from opforge.layout.algebra import Layout, LayoutError
from opforge.layout.swizzle import ComposedLayout, Swizzle, row_swizzle


def _log2(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise LayoutError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def swizzle_params(swizzle: Swizzle, rows: int, cols: int) -> tuple[int, int, int]:
    """``(vec, per_phase, max_phase)`` of Gluon's SwizzledSharedLayout for ``swizzle`` on a
    row-major ``rows x cols`` tile; ``LayoutError`` when Gluon's form cannot express it."""
    c = _log2(cols, "the tile's row length")
    _log2(rows, "the tile's row count")
    b, m, s = swizzle.bits, swizzle.base, swizzle.shift
    if b == 0:
        return 1, 1, 1
    if s < 0 or m + s < c:
        raise LayoutError(f"{swizzle} on {cols}-element rows: Gluon's swizzle reads row bits, which needs "
                          f"M+S >= log2(cols) = {c}")
    if m + b > c:
        raise LayoutError(f"{swizzle} on {cols}-element rows: the XORed bits [M, M+B) must lie in a row "
                          f"(M+B <= {c})")
    return 1 << m, 1 << (m + s - c), 1 << b


def swizzle_of(vec: int, per_phase: int, max_phase: int, cols: int) -> Swizzle:
    """The CuTe swizzle of Gluon's ``SwizzledSharedLayout(vec, per_phase, max_phase)`` on ``cols``-element rows."""
    m, c = _log2(vec, "vec"), _log2(cols, "cols")
    b = _log2(max_phase, "max_phase")
    return Swizzle(b, m, _log2(per_phase, "per_phase") + c - m)


def swizzled_tile(swizzle: Swizzle, rows: int, cols: int) -> ComposedLayout:
    """The tile as the analyzer sees it (checked to be expressible in Gluon)."""
    swizzle_params(swizzle, rows, cols)
    return row_swizzle(rows, cols, swizzle)


def padding_params(layout: Layout) -> tuple[int, int]:
    """``(interval, padding)`` of Gluon's PaddedSharedLayout for a padded row-major tile
    ``(rows, cols):(cols + padding, 1)``."""
    shape, stride = layout.shape, layout.stride
    if isinstance(shape, int) or len(shape) != 2 or stride[1] != 1 or stride[0] < shape[1]:
        raise LayoutError(f"a padded tile is (rows, cols):(cols + padding, 1), got {layout}")
    _log2(shape[1], "the padded tile's row length")
    pad = stride[0] - shape[1]
    _log2(pad, "the padding")
    return shape[1], pad


def gluon_swizzled(swizzle: Swizzle, rows: int, cols: int):
    from triton.experimental.gluon import language as gl

    return gl.SwizzledSharedLayout(*swizzle_params(swizzle, rows, cols), order=[1, 0])


def gluon_padded(layout: Layout):
    from triton.experimental.gluon import language as gl

    interval, pad = padding_params(layout)
    return gl.PaddedSharedLayout.with_identity_for([[interval, pad]], list(layout.shape), [1, 0])


def compile_ptx(kernel, arg_types: dict, constexprs: dict, *, num_warps: int, arch: int = 90) -> str:
    """PTX of a Gluon kernel compiled for ``GPUTarget("cuda", arch, 32)``: no GPU needed
    (as ``opforge.warmup.compile`` does for Triton kernels)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = dict(arg_types) | {name: "constexpr" for name in constexprs}
    compiled = triton.compile(GluonASTSource(kernel, signature, dict(constexprs)),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    return compiled.asm["ptx"]
