"""Calibration for static quantization and outlier handling.

* :class:`ActivationObserver` keeps the running per-channel absmax (the last
  dim is the channel) of the activations it sees over calibration batches,
  and turns it into the static scale that ``opforge.quantize(..., scale=)``
  takes -- the same ``max(absmax / qmax, FLT_MIN)`` rule as dynamic
  quantization, so a calibrated scale equals the dynamic one on the same data.
* :func:`smooth_factors` (SmoothQuant): activation outliers live in a few
  input channels; ``s_j = amax|X_j|^alpha / amax|W_:,j|^(1 - alpha)`` moves
  part of their range into the weight. ``X / s`` and ``W * s`` (``s`` along
  the weight's input dim) leave ``X @ W.T`` unchanged up to rounding while
  flattening the activation's per-channel range.
* :func:`percentile_clip` / :func:`percentile_threshold`: clip at the q-th
  percentile of ``|x|`` so one outlier does not set the whole scale.

Statistics ignore NaN and +-inf, as the quantize kernels do.
"""

from __future__ import annotations

import math

import torch

from opforge.ops.quant import FLT_MIN, QMAX

_W = "opforge.quant"


def _finite_abs(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().to(torch.float32).abs()
    return torch.where(a < math.inf, a, torch.zeros((), dtype=torch.float32, device=a.device))


class ActivationObserver:
    """Running per-channel absmax of activations ``[..., C]``."""

    def __init__(self) -> None:
        self.absmax: torch.Tensor | None = None
        self.batches = 0

    def observe(self, x: torch.Tensor) -> torch.Tensor:
        """Fold one batch in; returns ``x`` unchanged (usable inside forward hooks)."""
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{_W}.ActivationObserver.observe: expected a floating-point tensor, "
                            f"got {type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
        if x.dim() == 0:
            raise ValueError(f"{_W}.ActivationObserver.observe: needs at least 1 dim (the channel), got 0-dim")
        if self.absmax is not None and x.shape[-1] != self.absmax.numel():
            raise ValueError(f"{_W}.ActivationObserver.observe: batch has {x.shape[-1]} channels, "
                             f"earlier batches had {self.absmax.numel()}")
        a = _finite_abs(x).reshape(-1, x.shape[-1])
        cur = a.amax(dim=0) if a.shape[0] else torch.zeros(x.shape[-1], device=x.device)
        self.absmax = cur if self.absmax is None else torch.maximum(self.absmax, cur)
        self.batches += 1
        return x

    def reset(self) -> None:
        self.absmax, self.batches = None, 0

    def hook(self, module: torch.nn.Module):
        """Observe ``module``'s first input on every forward; returns the handle."""
        return module.register_forward_pre_hook(lambda m, args: (self.observe(args[0]), None)[1])

    def scale(self, dtype: torch.dtype = torch.int8, granularity: str = "tensor") -> torch.Tensor:
        """The static scale for ``quantize(x, dtype, granularity, scale=...)`` of
        2-D activations ``[M, C]``: shape ``()`` per tensor, ``[1, C]`` per channel."""
        if self.absmax is None:
            raise ValueError(f"{_W}.ActivationObserver.scale: no batch observed yet")
        if dtype not in QMAX:
            raise TypeError(f"{_W}.ActivationObserver.scale: dtype must be int8 or float8, got {dtype}")
        if granularity == "tensor":
            amax = self.absmax.amax()
        elif granularity == "channel":
            amax = self.absmax.reshape(1, -1)
        else:
            raise ValueError(f"{_W}.ActivationObserver.scale: granularity must be 'tensor' or 'channel', "
                             f"got {granularity!r}")
        return (amax / QMAX[dtype]).clamp_min(FLT_MIN).contiguous()


def smooth_factors(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5,
                   eps: float = 1e-5) -> torch.Tensor:
    """SmoothQuant factors ``s`` [C] for a linear layer ``y = x @ weight.T``
    (``weight`` [N, C]): quantize ``x / s`` and ``weight * s``. Channels where
    either side is all zero get ``s = 1``."""
    where = f"{_W}.smooth_factors"
    if not isinstance(act_absmax, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"{where}: act_absmax and weight must be tensors")
    if weight.dim() != 2:
        raise ValueError(f"{where}: weight must be 2-D [out, in], got {weight.dim()} dims")
    if act_absmax.dim() != 1 or act_absmax.numel() != weight.shape[1]:
        raise ValueError(f"{where}: act_absmax must be 1-D with {weight.shape[1]} values (weight's input dim), "
                         f"got shape {tuple(act_absmax.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{where}: alpha must be in [0, 1], got {alpha}")
    a = act_absmax.to(torch.float32)
    w = _finite_abs(weight).amax(dim=0) if weight.shape[0] else torch.zeros_like(a)
    s = a.clamp_min(eps).pow(alpha) / w.clamp_min(eps).pow(1.0 - alpha)
    return torch.where((a > 0) & (w > 0), s, torch.ones_like(s))


def apply_smoothing(weight: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``weight * s`` along the input dim (the activation is divided by ``s``)."""
    return (weight.to(torch.float32) * factors.to(torch.float32)[None, :]).to(weight.dtype)


def percentile_threshold(x: torch.Tensor, q: float = 99.99) -> torch.Tensor:
    """The q-th percentile of ``|x|`` over finite values (nearest rank), fp32."""
    if not 0.0 < q <= 100.0:
        raise ValueError(f"{_W}.percentile_clip: q must be in (0, 100], got {q}")
    a = _finite_abs(x).reshape(-1)
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    k = min(a.numel(), max(1, math.ceil(q / 100.0 * a.numel())))
    return a.kthvalue(k).values


def percentile_clip(x: torch.Tensor, q: float = 99.99) -> torch.Tensor:
    """``x`` clamped to +-(the q-th percentile of |x|): outliers no longer set the scale."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{_W}.percentile_clip: expected a floating-point tensor")
    t = percentile_threshold(x, q).to(x.dtype)
    return torch.maximum(torch.minimum(x, t), -t)
