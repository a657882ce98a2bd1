"""``opforge.nn.QuantLinear``: a W8A8 (INT8 or FP8) Linear converted from ``nn.Linear``.

Weights are quantized once, at conversion, per output channel (symmetric:
one fp32 scale per row of ``W [N, K]``). Activations are quantized on every
forward, either per token from their own range ("dynamic", no calibration
needed) or with one per-tensor scale calibrated beforehand ("static"). The
product is one ``opforge.scaled_matmul``: 8-bit tensor cores, the token and
channel scales, the bias and the activation applied in its epilogue, one
rounding to the output dtype:

    q, s_x = quantize(x / s)            (dynamic: s_x [M, 1]; static: fixed)
    y = act((q * s_x) @ (Wq * s_w).T + bias)

SmoothQuant (``smoothing_alpha``): activation outliers sit in a few input
channels and would set a coarse activation scale. With calibration statistics
``s_j = amax|X_j|^alpha / amax|W_:,j|^(1-alpha)`` the weight is folded as
``W * s`` before quantization and the activation is divided by ``s`` before
its quantization, which leaves the product unchanged and flattens the
activation's channel ranges (``opforge.quant.calibration``).

State (buffers, so ``state_dict`` round-trips and ``.to(device)`` moves them):
``weight`` [N, K] int8 / fp8, ``weight_scale`` [1, N] fp32, ``bias`` [N] fp32
(optional), ``input_scale`` () fp32 (static only), ``smooth`` [K] fp32 (the
``1 / s`` multiplier, SmoothQuant only); ``.half()`` and friends keep these
dtypes (the output dtype follows the input). Inference only: no gradients.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from opforge.nn.linear import Linear as FusedLinear
from opforge.ops.matmul import ACTIVATIONS
from opforge.ops.quant import FLT_MIN, QMAX, quantize
from opforge.ops.scaled_matmul import scaled_matmul
from opforge.quant.calibration import ActivationObserver, smooth_factors

WEIGHT_DTYPES = (torch.int8, torch.float8_e4m3fn)
SCALE_MODES = ("dynamic", "static")
_OUT = (torch.bfloat16, torch.float16, torch.float32)
_W = "opforge.nn.QuantLinear"


def _check_config(where, dtype, activation_scale, activation, out_dtype) -> None:
    if dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{where}: dtype must be torch.int8 or torch.float8_e4m3fn, got {dtype}")
    if activation_scale not in SCALE_MODES:
        raise ValueError(f"{where}: activation_scale must be 'dynamic' or 'static', got {activation_scale!r}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"{where}: activation must be None or one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {activation!r}")
    if out_dtype is not None and out_dtype not in _OUT:
        raise TypeError(f"{where}: out_dtype must be None, torch.bfloat16, torch.float16 or torch.float32, "
                        f"got {out_dtype!r}")


def _observer(where: str, calibration, in_features: int) -> ActivationObserver:
    """An ActivationObserver as given, or one fed with an iterable of input batches."""
    if isinstance(calibration, ActivationObserver):
        obs = calibration
    elif isinstance(calibration, torch.Tensor):
        obs = ActivationObserver()
        obs.observe(calibration)
    else:
        try:
            batches = iter(calibration)
        except TypeError:
            raise TypeError(f"{where}: calibration must be an ActivationObserver or an iterable of input "
                            f"tensors, got {type(calibration).__name__}") from None
        obs = ActivationObserver()
        for x in batches:
            obs.observe(x)
    if obs.absmax is None:
        raise ValueError(f"{where}: calibration saw no batch")
    if obs.absmax.numel() != in_features:
        raise ValueError(f"{where}: calibration has {obs.absmax.numel()} channels but the layer has "
                         f"in_features={in_features}")
    return obs


class QuantLinear(nn.Module):
    """``y = act(x @ W.T + bias)`` with W8A8 quantization (module docstring).

    Build one with :meth:`from_linear`; the constructor makes an empty shell
    with the right buffers (for ``load_state_dict``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: torch.dtype = torch.int8,
                 activation_scale: str = "dynamic", smoothing: bool = False, activation: str | None = None,
                 out_dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        _check_config(_W, dtype, activation_scale, activation, out_dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.qdtype = dtype
        self.activation_scale = activation_scale
        self.activation = activation
        self.out_dtype = out_dtype
        f32 = {"dtype": torch.float32, "device": device}
        self.register_buffer("weight", torch.zeros((out_features, in_features), device=device).to(dtype))
        self.register_buffer("weight_scale", torch.ones((1, out_features), **f32))
        self.register_buffer("bias", torch.zeros(out_features, **f32) if bias else None)
        self.register_buffer("input_scale", torch.ones((), **f32) if activation_scale == "static" else None)
        self.register_buffer("smooth", torch.ones(in_features, **f32) if smoothing else None)

    @classmethod
    def from_linear(cls, linear: nn.Module, dtype: torch.dtype = torch.int8, *, activation_scale: str = "dynamic",
                    calibration=None, smoothing_alpha: float | None = None, activation: str | None = None,
                    out_dtype: torch.dtype | None = None) -> "QuantLinear":
        """Quantize ``linear`` (``torch.nn.Linear`` or ``opforge.nn.Linear``, whose
        activation carries over unless ``activation`` is given).

        ``calibration``: an :class:`ActivationObserver` that watched this
        layer's inputs, or an iterable of input batches ``[..., in_features]``;
        needed for ``activation_scale="static"`` and for ``smoothing_alpha``
        (SmoothQuant's alpha in [0, 1], typically 0.5)."""
        where = f"{_W}.from_linear"
        if not isinstance(linear, (nn.Linear, FusedLinear)):
            raise TypeError(f"{where}: expected a torch.nn.Linear or opforge.nn.Linear, got {type(linear).__name__}")
        if activation is None and isinstance(linear, FusedLinear):
            activation = linear.activation
        _check_config(where, dtype, activation_scale, activation, out_dtype)
        if smoothing_alpha is not None and not (isinstance(smoothing_alpha, (int, float))
                                                and 0.0 <= smoothing_alpha <= 1.0):
            raise ValueError(f"{where}: smoothing_alpha must be None or a number in [0, 1], got {smoothing_alpha!r}")
        needs = activation_scale == "static" or smoothing_alpha is not None
        if needs and calibration is None:
            raise ValueError(f"{where}: activation_scale='static' and smoothing_alpha need calibration data "
                             f"(an ActivationObserver or an iterable of input batches)")
        K, N = linear.in_features, linear.out_features
        obs = _observer(where, calibration, K) if calibration is not None else None
        w = linear.weight.detach().to(torch.float32)
        dev = w.device
        new = cls(K, N, linear.bias is not None, dtype=dtype, activation_scale=activation_scale,
                  smoothing=smoothing_alpha is not None, activation=activation, out_dtype=out_dtype, device=dev)
        absmax = obs.absmax.to(device=dev, dtype=torch.float32) if obs is not None else None
        if smoothing_alpha is not None:
            s = smooth_factors(absmax, w, float(smoothing_alpha))
            w = w * s[None, :]
            new.smooth.copy_(1.0 / s)
            absmax = absmax / s
        qw = quantize(w, dtype, "channel", axis=0)
        with torch.no_grad():
            new.weight.copy_(qw.data)
            new.weight_scale.copy_(qw.scale.reshape(1, N))
            if linear.bias is not None:
                new.bias.copy_(linear.bias.detach().to(torch.float32))
            if activation_scale == "static":
                new.input_scale.copy_((absmax.amax() / QMAX[dtype]).clamp_min(FLT_MIN))
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dtype.itemsize < 2:
            raise TypeError(f"{_W}: input must be a float16, bfloat16, float32 or float64 tensor, "
                            f"got {x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{_W}: input has shape {tuple(x.shape)}; its last dim must be "
                             f"in_features={self.in_features}")
        x2 = x.reshape(-1, self.in_features)
        if self.smooth is not None:
            x2 = x2.to(torch.float32) * self.smooth
        if self.input_scale is not None:
            q = quantize(x2, self.qdtype, "tensor", scale=self.input_scale)
        else:
            q = quantize(x2, self.qdtype, "token")
        out_dtype = self.out_dtype or (x.dtype if x.dtype in _OUT else torch.float32)
        y = scaled_matmul(q.data, self.weight.t(), q.scale, self.weight_scale, bias=self.bias,
                          out_dtype=out_dtype, activation=self.activation)
        return y.reshape(tuple(x.shape[:-1]) + (self.out_features,))

    def _apply(self, fn, recurse=True):
        """``.to(device)`` moves the state; ``.half()`` / ``.to(dtype)`` leave its
        dtypes alone (a cast would turn the fp8 weight or the fp32 scales into
        something the GEMM does not take, or lose scale precision)."""
        def keep_dtype(t):
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(device=out.device)

        return super()._apply(keep_dtype, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={str(self.qdtype).replace('torch.', '')}, weight=per-channel, "
                f"activation_scale={self.activation_scale!r}, smoothing={self.smooth is not None}, "
                f"activation={self.activation!r}")


def quantize_linears(module: nn.Module, dtype: torch.dtype = torch.int8, *, calibration: Iterable | None = None,
                     filter: Callable[[str, nn.Module], bool] | None = None, activation_scale: str = "dynamic",
                     smoothing_alpha: float | None = None) -> nn.Module:
    """Swap every ``nn.Linear`` / ``opforge.nn.Linear`` inside ``module`` for a
    :class:`QuantLinear`, in place (like ``torch.ao.quantization.convert``);
    returns ``module``.

    ``calibration``: an iterable of inputs to ``module`` (a tensor, or a tuple
    of positional arguments, per batch): each is run once under
    ``torch.no_grad()`` with observers on the Linears' inputs. ``filter(name,
    linear)`` returns False to keep a layer in full precision."""
    where = "opforge.nn.quantize_linears"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{where}: expected an nn.Module, got {type(module).__name__}")
    if isinstance(module, (nn.Linear, FusedLinear)):
        raise TypeError(f"{where}: module is itself a Linear and cannot be swapped in place; "
                        f"use QuantLinear.from_linear")
    _check_config(where, dtype, activation_scale, None, None)
    targets = [(name, m) for name, m in module.named_modules()
               if name and isinstance(m, (nn.Linear, FusedLinear)) and (filter is None or filter(name, m))]
    observers: dict[str, ActivationObserver] = {}
    if calibration is not None:
        handles = []
        for name, m in targets:
            observers[name] = ActivationObserver()
            handles.append(observers[name].hook(m))
        try:
            with torch.no_grad():
                for batch in calibration:
                    module(*batch) if isinstance(batch, (tuple, list)) else module(batch)
        finally:
            for h in handles:
                h.remove()
    for name, m in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        obs = observers.get(name)
        calib = obs if obs is not None and obs.absmax is not None else None
        setattr(parent, leaf, QuantLinear.from_linear(m, dtype, activation_scale=activation_scale, calibration=calib,
                                                      smoothing_alpha=smoothing_alpha))
    return module


__all__ = ["QuantLinear", "quantize_linears"]
