"""`opforge profile`: compiled resources and theoretical occupancy of Triton
kernels (opforge ops and user kernels), computed without a GPU."""

from opforge.profile.occupancy import Limits, Occupancy, theoretical_occupancy
from opforge.profile.resources import (ProfileError, Resources, compile_resources, op_resources,
                                       parse_ptxas, ptxas_path)

__all__ = ["Limits", "Occupancy", "theoretical_occupancy", "ProfileError", "Resources",
           "compile_resources", "op_resources", "parse_ptxas", "ptxas_path"]
