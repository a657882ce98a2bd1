"""CuTe's layout algebra in Python, and what a warp's memory accesses cost.

``Layout(shape, stride)`` with nested modes; ``coalesce``, ``composition``,
``complement``, ``logical_divide`` / ``zipped_divide`` / ``tiled_divide`` /
``flat_divide``, ``logical_product`` / ``zipped_product`` / ``tiled_product`` /
``blocked_product`` / ``raked_product``,
``right_inverse`` / ``left_inverse``; ``Swizzle`` and swizzled
``ComposedLayout``s. ``opforge.layout.analyze`` turns a thread -> address
layout into shared-memory wavefronts and bank conflicts and global-memory
sectors per request; ``opforge.layout.gluon`` gives the matching Gluon shared
layouts. Pure Python: importing it loads neither torch nor Triton.
"""

from opforge.layout.algebra import (Layout, LayoutError, blocked_product, coalesce, complement, composition,
                                    filter_zeros, flat_divide, left_inverse, logical_divide, logical_product,
                                    make_layout, raked_product, right_inverse, tiled_divide, tiled_product,
                                    zipped_divide, zipped_product)
from opforge.layout.swizzle import ComposedLayout, Swizzle, row_swizzle, swizzled

__all__ = ["Layout", "LayoutError", "ComposedLayout", "Swizzle", "blocked_product", "coalesce", "complement",
           "composition", "filter_zeros", "flat_divide", "left_inverse", "logical_divide", "logical_product",
           "make_layout", "raked_product", "right_inverse", "row_swizzle", "swizzled", "tiled_divide", "tiled_product",
           "zipped_divide", "zipped_product"]
