"""torch.nn-style modules whose forward runs opforge ops."""

from opforge.nn.linear import Linear
from opforge.nn.quant_linear import QuantLinear, quantize_linears

__all__ = ["Linear", "QuantLinear", "quantize_linears"]
