"""torch.nn-style modules whose forward runs opforge ops."""

from opforge.nn.linear import Linear

__all__ = ["Linear"]
