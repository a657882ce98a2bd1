"""`opforge profile`: why a kernel is as fast as it is.

Compiled resources and theoretical occupancy of Triton kernels (opforge ops
and user kernels, without a GPU), achieved bandwidth per config (``sweep``),
the roofline, Nsight Compute's figures (``ncu``), NVTX ranges around opforge
ops (``nvtx``), a CUDA-event timeline of a block of code (``timeline``), and
reports as tables, JSON, HTML and PNG (``report``).

Modules here import the runtime lazily: ``runtime.dispatch`` imports
``opforge.runtime.hooks`` for its hook list. ``opforge.profile.timeline`` is the
function (``with opforge.profile.timeline() as tl``); the module of the same
name is ``importlib.import_module("opforge.profile.timeline")``.
"""

from opforge.profile import nvtx
from opforge.profile.compare import Built, Step, profile_kernel
from opforge.profile.ncu import NcuError, find_ncu
from opforge.profile.occupancy import Limits, Occupancy, theoretical_occupancy
from opforge.profile.resources import (ProfileError, Resources, compile_resources, kernel_resources,
                                       op_resources, parse_ptxas, ptxas_path)
from opforge.profile.sweep import Sweep
from opforge.profile.sweep import sweep as config_sweep
from opforge.profile.timeline import Timeline, timeline  # the function; the module is importlib's

__all__ = ["Limits", "Occupancy", "theoretical_occupancy", "ProfileError", "Resources", "compile_resources",
           "kernel_resources", "op_resources", "parse_ptxas", "ptxas_path", "NcuError", "find_ncu", "Sweep",
           "config_sweep", "Timeline", "timeline", "nvtx", "Built", "Step", "profile_kernel"]
