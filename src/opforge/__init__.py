"""opforge: a GPU operator runtime for Python.

Tensor ops are exposed torch-style (``opforge.gelu(x)``) and registered as
``torch.library`` custom ops in the ``opforge`` namespace.

Every public name loads on first use (PEP 562): ``import opforge`` costs
nothing, a part that needs no torch (``opforge.placement.client`` on a
worker, ``pd ctl``) never imports torch or Triton, and a user of the tensor
ops never imports sqlglot, pyarrow or fastapi. The first op used imports
``opforge.ops``, which registers every op (``torch.ops.opforge.*`` included);
``import opforge.ops`` does that up front.
"""

import importlib as _importlib
import importlib.util  # noqa: F401  (find_spec)
import os as _os

if _os.environ.get("OPFORGE_INTERPRET", "0") not in ("", "0", "false", "off"):
    # Triton reads this when kernels are decorated, so it must be set first.
    _os.environ["TRITON_INTERPRET"] = "1"

from opforge.version import __version__  # noqa: E402

# module -> the public names it defines; a name of an ``opforge.ops`` module first imports
# ``opforge.ops`` (all ops registered at once, as when this file imported them eagerly)
_PUBLIC = {
    "opforge.ops.elementwise": (
        "abs", "add", "div", "exp", "gelu", "gelu_backward", "gelu_tanh", "log", "maximum", "minimum",
        "mul", "neg", "relu", "rsqrt", "sigmoid", "silu", "silu_backward", "sqrt", "sub", "tanh"),
    "opforge.ops.fused": ("bias_gelu", "geglu", "swiglu"),
    "opforge.ops.softmax": ("softmax", "log_softmax"),
    "opforge.ops.norm": ("layer_norm", "rms_norm"),
    "opforge.ops.residual_norm": ("add_layer_norm", "add_rms_norm"),
    "opforge.ops.reduce": ("amax", "amin", "argmax", "argmin", "max", "mean", "min", "std", "sum", "var"),
    "opforge.ops.scan": ("cummax", "cummin", "cumprod", "cumsum", "segmented_cumsum"),
    "opforge.ops.compact": ("compact", "nonzero"),
    "opforge.ops.transpose": ("transpose", "permute"),
    "opforge.ops.cross_entropy": ("cross_entropy",),
    "opforge.ops.rope": ("rope", "rope_"),
    "opforge.ops.embedding": ("embedding",),
    "opforge.ops.topk": ("topk",),
    "opforge.ops.moe": ("moe_route", "moe_permute", "moe_unpermute", "moe_experts"),
    "opforge.ops.fused_linear_cross_entropy": ("fused_linear_cross_entropy",),
    "opforge.ops.attention": ("attention",),
    "opforge.ops.attention_decode": ("attention_decode",),
    "opforge.ops.matmul": ("matmul",),
    "opforge.ops.grouped_matmul": ("grouped_matmul",),
    "opforge.ops.scaled_matmul": ("scaled_matmul", "quantized_matmul"),
    "opforge.ops.quant": ("quantize", "dequantize", "QuantizedTensor"),
    "opforge.ops.hashing": ("hash_join", "group_by", "segment_reduce"),
    "opforge.ops.bloom": ("blocked_bloom_probe",),
    "opforge.ops.nexmark": ("nexmark_events",),
    "opforge.runtime.dispatch": ("explain",),
    "opforge.fusion": ("fuse",),
    "opforge.sql": ("connect",),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
_SUBPACKAGES = ("nn", "sql", "stream", "distributed", "placement", "layout")

__all__ = ["__version__", *_HOME, *_SUBPACKAGES]


def __getattr__(name: str):
    if name in _HOME:
        module = _HOME[name]
        if module.startswith("opforge.ops."):
            _importlib.import_module("opforge.ops")
        value = getattr(_importlib.import_module(module), name)
    elif not name.startswith("_") and _importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = _importlib.import_module(f"{__name__}.{name}")  # ``opforge.sql`` after a bare import
    else:
        raise AttributeError(f"module 'opforge' has no attribute {name!r}")
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
