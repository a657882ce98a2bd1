"""opforge: a GPU operator runtime for Python.

Tensor ops are exposed torch-style (``opforge.gelu(x)``) and registered as
``torch.library`` custom ops in the ``opforge`` namespace.

The names below are loaded on first use (PEP 562), so importing a part that
does not need torch -- ``opforge.placement.client`` on a worker, ``pd ctl`` --
does not pay for torch and Triton. ``opforge.runtime.registry`` imports every
op module itself before it lists or looks up ops.
"""

import importlib as _importlib
import importlib.util  # noqa: F401  (find_spec)
import os as _os

if _os.environ.get("OPFORGE_INTERPRET", "0") not in ("", "0", "false", "off"):
    # Triton reads this when kernels are decorated, so it must be set first.
    _os.environ["TRITON_INTERPRET"] = "1"

from opforge.version import __version__  # noqa: E402

# public name -> "module:attribute", or "module" for a subpackage
_LAZY = {
    'abs': 'opforge.ops.elementwise:abs',
    'add': 'opforge.ops.elementwise:add',
    'div': 'opforge.ops.elementwise:div',
    'exp': 'opforge.ops.elementwise:exp',
    'gelu': 'opforge.ops.elementwise:gelu',
    'gelu_backward': 'opforge.ops.elementwise:gelu_backward',
    'gelu_tanh': 'opforge.ops.elementwise:gelu_tanh',
    'log': 'opforge.ops.elementwise:log',
    'maximum': 'opforge.ops.elementwise:maximum',
    'minimum': 'opforge.ops.elementwise:minimum',
    'mul': 'opforge.ops.elementwise:mul',
    'neg': 'opforge.ops.elementwise:neg',
    'relu': 'opforge.ops.elementwise:relu',
    'rsqrt': 'opforge.ops.elementwise:rsqrt',
    'sigmoid': 'opforge.ops.elementwise:sigmoid',
    'silu': 'opforge.ops.elementwise:silu',
    'silu_backward': 'opforge.ops.elementwise:silu_backward',
    'sqrt': 'opforge.ops.elementwise:sqrt',
    'sub': 'opforge.ops.elementwise:sub',
    'tanh': 'opforge.ops.elementwise:tanh',
    'attention': 'opforge.ops.attention:attention',
    'attention_decode': 'opforge.ops.attention_decode:attention_decode',
    'blocked_bloom_probe': 'opforge.ops.bloom:blocked_bloom_probe',
    'nexmark_events': 'opforge.ops.nexmark:nexmark_events',
    'cross_entropy': 'opforge.ops.cross_entropy:cross_entropy',
    'bias_gelu': 'opforge.ops.fused:bias_gelu',
    'swiglu': 'opforge.ops.fused:swiglu',
    'grouped_matmul': 'opforge.ops.grouped_matmul:grouped_matmul',
    'group_by': 'opforge.ops.hashing:group_by',
    'hash_join': 'opforge.ops.hashing:hash_join',
    'segment_reduce': 'opforge.ops.hashing:segment_reduce',
    'matmul': 'opforge.ops.matmul:matmul',
    'layer_norm': 'opforge.ops.norm:layer_norm',
    'rms_norm': 'opforge.ops.norm:rms_norm',
    'QuantizedTensor': 'opforge.ops.quant:QuantizedTensor',
    'dequantize': 'opforge.ops.quant:dequantize',
    'quantize': 'opforge.ops.quant:quantize',
    'amax': 'opforge.ops.reduce:amax',
    'amin': 'opforge.ops.reduce:amin',
    'argmax': 'opforge.ops.reduce:argmax',
    'argmin': 'opforge.ops.reduce:argmin',
    'max': 'opforge.ops.reduce:max',
    'mean': 'opforge.ops.reduce:mean',
    'min': 'opforge.ops.reduce:min',
    'std': 'opforge.ops.reduce:std',
    'sum': 'opforge.ops.reduce:sum',
    'var': 'opforge.ops.reduce:var',
    'add_layer_norm': 'opforge.ops.residual_norm:add_layer_norm',
    'add_rms_norm': 'opforge.ops.residual_norm:add_rms_norm',
    'quantized_matmul': 'opforge.ops.scaled_matmul:quantized_matmul',
    'scaled_matmul': 'opforge.ops.scaled_matmul:scaled_matmul',
    'compact': 'opforge.ops.scan:compact',
    'cummax': 'opforge.ops.scan:cummax',
    'cummin': 'opforge.ops.scan:cummin',
    'cumprod': 'opforge.ops.scan:cumprod',
    'cumsum': 'opforge.ops.scan:cumsum',
    'nonzero': 'opforge.ops.scan:nonzero',
    'segmented_cumsum': 'opforge.ops.scan:segmented_cumsum',
    'log_softmax': 'opforge.ops.softmax:log_softmax',
    'softmax': 'opforge.ops.softmax:softmax',
    'permute': 'opforge.ops.transpose:permute',
    'transpose': 'opforge.ops.transpose:transpose',
    'explain': 'opforge.runtime.dispatch:explain',
    'fuse': 'opforge.fusion:fuse',
    'nn': 'opforge.nn',
    'connect': 'opforge.sql:connect',
    'dist': 'opforge.dist',
    'stream': 'opforge.stream',
}

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


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        # a subpackage used as an attribute after a bare ``import opforge`` (``opforge.sql.connect``), as
        # when this file imported them all
        if name.startswith("_") or _importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'opforge' has no attribute {name!r}")
        target = f"{__name__}.{name}"
    module, _, attr = target.partition(":")
    value = _importlib.import_module(module)
    if attr:
        value = getattr(value, attr)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
