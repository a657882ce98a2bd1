"""torch.nn-style modules whose forward runs opforge ops."""

from opforge.nn.generate import generate
from opforge.nn.linear import Linear
from opforge.nn.patch import Patch, PatchReport, patch, unpatch
from opforge.nn.quant_linear import QuantLinear, quantize_linears

__all__ = ["Linear", "Patch", "PatchReport", "QuantLinear", "generate", "patch", "quantize_linears", "unpatch"]
