"""opforge.nn.Linear: nn.Linear's parameters and state_dict, forward and
gradients equal to nn.Linear followed by the activation (float64 oracle)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opforge.bench.case import rel_err
from opforge.nn import Linear

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
ACT = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu,
       "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


def test_state_dict_round_trips_with_nn_linear():
    torch.manual_seed(0)
    ref = nn.Linear(24, 16)
    ours = Linear(24, 16, activation="gelu")
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    assert ours.weight.shape == (16, 24) and ours.bias.shape == (16,)
    ours.load_state_dict(ref.state_dict())
    assert torch.equal(ours.weight, ref.weight) and torch.equal(ours.bias, ref.bias)
    back = nn.Linear(24, 16)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, ref.weight)
    # nn.Linear's initialization bounds.
    fresh = Linear(100, 8)
    assert fresh.weight.abs().max() <= 0.1 and fresh.bias.abs().max() <= 0.1


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_forward_and_gradients_match_nn_linear(activation):
    torch.manual_seed(1)
    ref = nn.Linear(32, 24, dtype=F64)
    ours = Linear(32, 24, activation=activation)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(2, 5, 32)
    xr = x.double().requires_grad_()
    xo = x.clone().requires_grad_()
    out = ours(xo)
    want = ACT[activation](ref(xr))
    assert out.shape == (2, 5, 24) and rel_err(out, want) <= 1e-5
    g = torch.randn(2, 5, 24)
    out.backward(g)
    want.backward(g.double())
    assert rel_err(xo.grad, xr.grad) <= 1e-5
    assert rel_err(ours.weight.grad, ref.weight.grad) <= 1e-5
    assert rel_err(ours.bias.grad, ref.bias.grad) <= 1e-5


def test_from_linear_shares_parameters_and_no_bias():
    torch.manual_seed(2)
    lin = nn.Linear(16, 8, bias=False)
    fused = Linear.from_linear(lin, activation="silu")
    assert fused.weight is lin.weight and fused.bias is None
    assert list(fused.state_dict()) == ["weight"]
    x = torch.randn(3, 16)
    assert rel_err(fused(x), F.silu(x.double() @ lin.weight.double().t())) <= 1e-5
    assert "activation='silu'" in repr(fused) and "bias=False" in repr(fused)


def test_bf16_module_and_errors():
    m = Linear(48, 16, dtype=BF16)
    x = torch.randn(4, 48, dtype=BF16)
    out = m(x)
    assert out.dtype == BF16
    assert rel_err(out, x.double() @ m.weight.double().t() + m.bias.double()) <= 1e-2
    with pytest.raises(ValueError, match="opforge.nn.Linear: activation must be None or one of"):
        Linear(4, 4, activation="tanh")
    with pytest.raises(TypeError, match="opforge.nn.Linear.from_linear: expected a torch.nn.Linear"):
        Linear.from_linear(nn.Conv1d(1, 1, 1))
    with pytest.raises(TypeError, match="opforge.matmul: a is torch.float32 but b is torch.bfloat16"):
        m(torch.randn(4, 48))
