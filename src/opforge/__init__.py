"""opforge: a GPU operator runtime for Python.

Tensor ops are exposed torch-style (``opforge.gelu(x)``) and registered as
``torch.library`` custom ops in the ``opforge`` namespace.
"""

import os as _os

if _os.environ.get("OPFORGE_INTERPRET", "0") not in ("", "0", "false", "off"):
    # Triton reads this when kernels are decorated, so it must be set first.
    _os.environ["TRITON_INTERPRET"] = "1"

from opforge.version import __version__  # noqa: E402
from opforge.ops.elementwise import (  # noqa: E402
    abs, add, div, exp, gelu, gelu_backward, gelu_tanh, log, maximum, minimum, mul, neg, relu,
    rsqrt, sigmoid, silu, silu_backward, sqrt, sub, tanh,
)
from opforge.ops.attention import attention  # noqa: E402
from opforge.ops.attention_decode import attention_decode  # noqa: E402
from opforge.ops.bloom import blocked_bloom_probe  # noqa: E402
from opforge.ops.nexmark import nexmark_events  # noqa: E402
from opforge.ops.cross_entropy import cross_entropy  # noqa: E402
from opforge.ops.fused import bias_gelu, swiglu  # noqa: E402
from opforge.ops.grouped_matmul import grouped_matmul  # noqa: E402
from opforge.ops.hashing import group_by, hash_join, segment_reduce  # noqa: E402
from opforge.ops.matmul import matmul  # noqa: E402
from opforge.ops.norm import layer_norm, rms_norm  # noqa: E402
from opforge.ops.quant import QuantizedTensor, dequantize, quantize  # noqa: E402
from opforge.ops.reduce import amax, amin, argmax, argmin, max, mean, min, std, sum, var  # noqa: E402
from opforge.ops.residual_norm import add_layer_norm, add_rms_norm  # noqa: E402
from opforge.ops.scaled_matmul import quantized_matmul, scaled_matmul  # noqa: E402
from opforge.ops.compact import compact, nonzero  # noqa: E402
from opforge.ops.scan import cummax, cummin, cumprod, cumsum, segmented_cumsum  # noqa: E402
from opforge.ops.softmax import log_softmax, softmax  # noqa: E402
from opforge.ops.transpose import permute, transpose  # noqa: E402
from opforge.runtime.dispatch import explain  # noqa: E402
from opforge.fusion import fuse  # noqa: E402
from opforge import nn  # noqa: E402
from opforge.sql import connect  # noqa: E402
from opforge import dist  # noqa: E402
from opforge import stream  # noqa: E402

__all__ = [
    "__version__", "explain", "fuse", "nn", "connect", "stream", "dist",
    # elementwise
    "abs", "add", "div", "exp", "gelu", "gelu_backward", "gelu_tanh", "log", "maximum", "minimum",
    "mul", "neg", "relu", "rsqrt", "sigmoid", "silu", "silu_backward", "sqrt", "sub", "tanh",
    "bias_gelu", "swiglu",
    # row-wise, reductions, scans, data movement, losses
    "softmax", "log_softmax", "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
    "amax", "amin", "argmax", "argmin", "max", "mean", "min", "std", "sum", "var",
    "compact", "cummax", "cummin", "cumprod", "cumsum", "nonzero", "segmented_cumsum",
    "transpose", "permute", "cross_entropy",
    # attention
    "attention", "attention_decode",
    # GEMM and quantization
    "matmul", "grouped_matmul", "scaled_matmul", "quantized_matmul", "quantize", "dequantize", "QuantizedTensor",
    # relational kernels
    "hash_join", "group_by", "segment_reduce", "blocked_bloom_probe", "nexmark_events",
]
