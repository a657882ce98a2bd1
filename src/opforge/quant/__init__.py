"""Quantization: the ops (``quantize`` / ``dequantize``, ``QuantizedTensor``)
and calibration helpers (observers, SmoothQuant factors, percentile clipping)."""

from opforge.ops.quant import QuantizedTensor, dequantize, quantize
from opforge.quant.calibration import (
    ActivationObserver,
    apply_smoothing,
    percentile_clip,
    percentile_threshold,
    smooth_factors,
)

__all__ = ["QuantizedTensor", "quantize", "dequantize", "ActivationObserver", "smooth_factors",
           "apply_smoothing", "percentile_clip", "percentile_threshold"]
