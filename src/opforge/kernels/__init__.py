"""Triton kernels, one module per family. No front-end imports these directly.

Importing the package puts the memoized Triton installation hash in place before any kernel
compiles or is looked up in Triton's cache (``runtime/triton_key.py``)."""

from opforge.runtime import triton_key as _triton_key

_triton_key.install()
