"""Small Triton kernels for the profile tests, importable by name
(``tests.profile.kernels_for_test:scale_kernel``) from a compile child."""

import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * alpha, mask=mask)


@triton.jit
def hog_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # the whole tile stays live across the reduction: BLOCK / 32 values a thread
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    total = tl.sum(x * x, axis=0)
    tl.store(y_ptr + offs, x / total)
