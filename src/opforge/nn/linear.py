"""``opforge.nn.Linear``: ``nn.Linear`` with the bias and activation fused into the GEMM.

Same parameters, initialization and ``state_dict`` keys as ``torch.nn.Linear``
(``weight [out_features, in_features]``, ``bias [out_features]``), so a
checkpoint of one loads into the other. The forward is one
``opforge.matmul(x, weight.t(), bias=bias, activation=activation)``: the
weight is read through its transposed view (K-major, which the TMA kernel
loads as is), and leading dims of ``x`` collapse into one GEMM.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from opforge.ops.matmul import ACTIVATIONS, matmul


def _check_activation(activation) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"opforge.nn.Linear: activation must be None or one of "
                         f"{', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")


class Linear(nn.Module):
    """``y = act(x @ weight.T + bias)``, fused. ``activation`` is None,
    ``"gelu"``, ``"gelu_tanh"``, ``"silu"`` or ``"relu"``."""

    __constants__ = ["in_features", "out_features", "activation"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        _check_activation(activation)
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialization: Kaiming-uniform weight, uniform bias in ±1/sqrt(fan_in)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> "Linear":
        """A fused Linear sharing ``linear``'s parameters (no copy: optimizers
        holding them keep working), followed by ``activation``."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"opforge.nn.Linear.from_linear: expected a torch.nn.Linear, got {type(linear).__name__}")
        _check_activation(activation)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features = linear.in_features
        new.out_features = linear.out_features
        new.activation = activation
        new.weight = linear.weight
        if linear.bias is not None:
            new.bias = linear.bias
        else:
            new.register_parameter("bias", None)
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return matmul(input, self.weight.t(), bias=self.bias, activation=self.activation)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}")
