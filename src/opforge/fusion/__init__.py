"""Kernel fusion: ``opforge.fuse`` turns a Python function of elementwise
tensor expressions into one generated Triton kernel.

Modules, in the order a call goes through them: ``expr`` traces the function
into a DAG of primitives with torch's type rules; ``autodiff`` derives the
backward DAG; ``codegen`` writes Triton source for a DAG (calling the device
functions in ``device_fns``); ``compiler`` turns the source into
``triton.jit`` kernels, cached in memory and on disk; ``function`` holds the
public decorator ``fuse`` (trace cache, registry ops, dispatch, launch,
autograd). ``bias_grad`` is the hand-written bias+GELU backward kernel (it
reduces, which generated kernels do not) used by ``opforge.ops.fused``.
"""

from opforge.fusion.function import FusedFunction, fuse

__all__ = ["fuse", "FusedFunction"]
