"""Elementwise ops: ``opforge.add``, ``opforge.gelu``, ... with torch semantics.

Each op is a registry entry with four variants, in dispatch order:
``triton_flat`` (dense operands of one layout: wide vector loads),
``triton_strided`` (any strides, broadcasting: 2-D tiles over a collapsed
index space), ``torch_eager`` (torch's own kernel: least host overhead, so
measured tuning picks it for tiny tensors) and ``reference`` (plain torch: the
CPU fallback and the oracle). Binary ops take a tensor or a Python number as ``other``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from numbers import Number

import torch
import torch.nn.functional as F

from opforge.kernels import elementwise as K
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.launch import Launcher
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, sum_to

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
KERNEL_DTYPES = FLOATS | {torch.int32, torch.int64}
GRADIENTS = frozenset({"gelu_backward", "silu_backward"})  # (grad, x): both tensors
INT_OK = frozenset({"neg", "abs", "relu", "add", "sub", "mul", "div", "maximum", "minimum"})


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _as_tensor(a, b):
    """``b`` as a 0-dim tensor of the promoted dtype (torch.maximum takes no scalars)."""
    if isinstance(b, torch.Tensor):
        return b
    return torch.tensor(b, dtype=torch.result_type(a, b), device=a.device)


def _gelu_backward_ref(g, x):
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return g * (cdf + x * pdf)


def _silu_backward_ref(g, x):
    s = torch.sigmoid(x)
    return g * (s * (1.0 + x * (1.0 - s)))


REFERENCE = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": lambda a, b: torch.maximum(a, _as_tensor(a, b)),
    "minimum": lambda a, b: torch.minimum(a, _as_tensor(a, b)),
    "gelu_backward": _gelu_backward_ref,
    "silu_backward": _silu_backward_ref,
}
# torch's out= kernels: the vendor variant, one launch, written into our output.
EAGER_OUT = {
    "neg": lambda a, b, out: torch.neg(a, out=out),
    "abs": lambda a, b, out: torch.abs(a, out=out),
    "exp": lambda a, b, out: torch.exp(a, out=out),
    "log": lambda a, b, out: torch.log(a, out=out),
    "sqrt": lambda a, b, out: torch.sqrt(a, out=out),
    "rsqrt": lambda a, b, out: torch.rsqrt(a, out=out),
    "sigmoid": lambda a, b, out: torch.sigmoid(a, out=out),
    "tanh": lambda a, b, out: torch.tanh(a, out=out),
    "relu": lambda a, b, out: torch.clamp_min(a, 0, out=out),
    "gelu": lambda a, b, out: torch.ops.aten.gelu.out(a, out=out),
    "gelu_tanh": lambda a, b, out: torch.ops.aten.gelu.out(a, approximate="tanh", out=out),
    "silu": lambda a, b, out: torch.ops.aten.silu.out(a, out=out),
    "add": lambda a, b, out: torch.add(a, b, out=out),
    "sub": lambda a, b, out: torch.sub(a, b, out=out),
    "mul": lambda a, b, out: torch.mul(a, b, out=out),
    "div": lambda a, b, out: torch.div(a, b, out=out),
    "maximum": lambda a, b, out: torch.maximum(a, b, out=out) if isinstance(b, torch.Tensor)
    else torch.clamp_min(a, b, out=out),
    "minimum": lambda a, b, out: torch.minimum(a, b, out=out) if isinstance(b, torch.Tensor)
    else torch.clamp_max(a, b, out=out),
    "gelu_backward": lambda g, x, out: torch.ops.aten.gelu_backward.grad_input(g, x, grad_input=out),
    "silu_backward": lambda g, x, out: torch.ops.aten.silu_backward.grad_input(g, x, grad_input=out),
}
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "gelu", "gelu_tanh", "silu")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "gelu_backward", "silu_backward")


def result_dtype(name: str, a: torch.Tensor, b) -> torch.dtype:
    if b is None:
        return a.dtype
    dt = torch.result_type(a, b)
    if name == "div" and not dt.is_floating_point:
        return torch.get_default_dtype()
    return dt


def out_shape(a: torch.Tensor, b) -> tuple[int, ...]:
    if isinstance(b, torch.Tensor) and b.shape != a.shape:
        return tuple(torch.broadcast_shapes(a.shape, b.shape))
    return tuple(a.shape)


def _dense_like(a: torch.Tensor, b) -> bool:
    """Operands the flat kernel can walk as one 1-D range in one layout."""
    if isinstance(b, torch.Tensor) and (b.shape != a.shape or b.stride() != a.stride()):
        return False
    return a.is_contiguous() or (a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last))


def allocate_out(name: str, a: torch.Tensor, b) -> torch.Tensor:
    """The output: a's layout when the operands are dense alike, else contiguous."""
    dtype = result_dtype(name, a, b)
    if _dense_like(a, b):
        return torch.empty_like(a, dtype=dtype)
    return torch.empty(out_shape(a, b), dtype=dtype, device=a.device)


def validate(name: str, a, b=None, binary: bool = False) -> None:
    where = f"opforge.{name}"
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{where}: input must be a torch.Tensor, got {type(a).__name__}")
    if a.is_complex():
        raise TypeError(f"{where}: complex tensors are not supported (got {a.dtype})")
    if name not in INT_OK and not a.dtype.is_floating_point:
        raise TypeError(f"{where}: input must be a floating-point tensor, got {a.dtype}")
    if binary:
        if isinstance(b, torch.Tensor):
            if b.device != a.device:
                raise ValueError(f"{where}: other is on {b.device} but input is on {a.device}; move them to one device")
            if b.is_complex():
                raise TypeError(f"{where}: complex tensors are not supported (got other of {b.dtype})")
            try:
                torch.broadcast_shapes(a.shape, b.shape)
            except RuntimeError:
                raise ValueError(
                    f"{where}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast"
                ) from None
        elif name in GRADIENTS:
            raise TypeError(f"{where}: x must be a tensor, got {type(b).__name__}")
        elif not isinstance(b, Number) or isinstance(b, complex):
            raise TypeError(f"{where}: other must be a tensor or a real number, got {type(b).__name__}")


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def _is_tensor(b) -> bool:
    return isinstance(b, torch.Tensor)


def _out_strides(a: torch.Tensor, b) -> tuple[int, ...]:
    """Strides of ``allocate_out(name, a, b)``, without allocating it."""
    return tuple(a.stride()) if _dense_like(a, b) else _contiguous_strides(out_shape(a, b))


def geometry(a: torch.Tensor, b):
    """The strided kernel's view of the operands: (4 dims, strides of a, b, out), or None."""
    b_shape, b_stride = (tuple(b.shape), tuple(b.stride())) if _is_tensor(b) else (None, None)
    return _geometry(tuple(a.shape), tuple(a.stride()), b_shape, b_stride, _out_strides(a, b))


@functools.lru_cache(maxsize=4096)
def _geometry(a_shape, a_stride, b_shape, b_stride, out_stride):
    shape = tuple(torch.broadcast_shapes(a_shape, b_shape)) if b_shape is not None else a_shape
    operands = [_expanded_stride(shape, a_shape, a_stride)]
    if b_shape is not None:
        operands.append(_expanded_stride(shape, b_shape, b_stride))
    operands.append(list(out_stride))
    dims, strides = K.collapse(list(shape), operands)
    if len(dims) > 4:
        return None
    pad = 4 - len(dims)
    dims = [1] * pad + dims
    strides = [[0] * pad + st for st in strides]
    if len(strides) == 2:
        strides.insert(1, [0, 0, 0, 0])
    return dims, strides


def _expanded_stride(shape, t_shape, t_stride):
    """Strides of a tensor broadcast to ``shape`` (0 along broadcast dims)."""
    lead = len(shape) - len(t_shape)
    out = [0] * lead
    for n, s, target in zip(t_shape, t_stride, shape[lead:]):
        out.append(0 if n == 1 and target != 1 else s)
    return out


@dataclass(frozen=True, slots=True)
class Facts:
    """One call's shape facts (the family geometry; ``geometry`` above is the
    strided kernel's view): the op, the result dtype, whether the operands
    are dense alike (``triton_flat``), whether ``other`` is a tensor and its
    dtype, the element count, and the key of the strided view (``strided()``,
    cached). All determined by the memo key (dtypes, shapes, strides, the
    scalar's type)."""

    name: str
    dtype: torch.dtype
    dense: bool
    tensor_b: bool
    b_dtype: torch.dtype | None
    scalar: bool
    numel: int
    key: tuple

    def strided(self):
        return _geometry(*self.key)


def facts(name: str):
    return functools.partial(_facts, name)


def _facts(name: str, a: torch.Tensor, b=None) -> Facts:
    tb = _is_tensor(b)
    b_shape, b_stride = (tuple(b.shape), tuple(b.stride())) if tb else (None, None)
    return Facts(name, result_dtype(name, a, b), _dense_like(a, b), tb, b.dtype if tb else None,
                 b is not None and not tb, a.numel(),
                 (tuple(a.shape), tuple(a.stride()), b_shape, b_stride, _out_strides(a, b)))


def scalar_check(g: Facts) -> str | None:
    if g.tensor_b and g.b_dtype not in KERNEL_DTYPES:
        return f"dtype {g.b_dtype} of other has no kernel"
    if g.scalar and g.dtype == torch.float64:
        return "a Python scalar with a float64 result (Triton passes scalars as fp32)"
    if g.dtype not in KERNEL_DTYPES:
        return f"result dtype {g.dtype} has no kernel"
    return None


def flat_check(g: Facts) -> str | None:
    if not g.dense:
        return "operands are not dense with one shared layout"
    return scalar_check(g)


def _out(g: Facts, a: torch.Tensor, b) -> torch.Tensor:
    """``allocate_out``, with the dtype and layout already known."""
    if g.dense:
        return torch.empty_like(a, dtype=g.dtype)
    return torch.empty(out_shape(a, b), dtype=g.dtype, device=a.device)


def flat_run(g: Facts, cfg, a, b=None):
    out = _out(g, a, b)
    K.launch_flat(g.name, a, b, out, cfg)
    return out


def _bind_flat(g: Facts, cfg, args):
    """``flat_run`` for one decision: grid, constexprs and launcher fixed, and
    the output allocated as ``_out`` does for dense operands."""
    if g.numel == 0:
        return None
    b = args[1] if len(args) > 1 else None
    mode = K.b_mode(b)
    grid, kw = K.flat_options(g.name, mode, g.dtype, g.numel, cfg)
    go, dtype, n, empty_like = Launcher(K.flat_kernel, **kw), g.dtype, g.numel, torch.empty_like

    if mode == 1:
        def run(a, b):
            out = empty_like(a, dtype=dtype)
            go(grid, a, b, 0, out, n)
            return out
    elif mode == 2:
        scalar_arg = K.scalar_arg

        def run(a, b):
            out = empty_like(a, dtype=dtype)
            go(grid, a, a, scalar_arg(b), out, n)
            return out
    else:
        def run(a, b=None):
            out = empty_like(a, dtype=dtype)
            go(grid, a, a, 0, out, n)
            return out
    return run


flat_run.bind = _bind_flat


def flat_configs(g: Facts):
    return [{"BLOCK": blk, "num_warps": w} for blk in (1024, 2048, 4096, 8192) for w in (4, 8)
            if blk // (32 * w) >= 4]


def flat_default(g: Facts):
    return {"BLOCK": 4096, "num_warps": 8} if g.numel >= (1 << 20) else {"BLOCK": 1024, "num_warps": 4}


def flat_bucket(g: Facts) -> str:
    return bucket_size(g.numel)


def strided_check(g: Facts) -> str | None:
    if g.numel and g.strided() is None:
        return "more than 4 dims remain after collapsing the layout"
    return scalar_check(g)


def strided_run(g: Facts, cfg, a, b=None):
    out = _out(g, a, b)
    if out.numel():
        K.launch_strided(g.name, a, b, out, cfg, g.strided())
    return out


def strided_configs(g: Facts):
    tiles = [(1, 1024, 4), (1, 2048, 8), (2, 1024, 8), (4, 512, 8), (8, 256, 4), (16, 128, 4),
             (32, 64, 4), (64, 32, 4), (64, 64, 8), (128, 32, 8)]
    return [{"BLOCK_R": r, "BLOCK_C": c, "num_warps": w} for r, c, w in tiles]


def strided_default(g: Facts):
    view = g.strided()
    d = view[0] if view else [1, 1, 1, max(g.numel, 1)]
    return K.strided_default_config(d[0] * d[1] * d[2], d[3])


def strided_bucket(g: Facts) -> str:
    view = g.strided()
    if view is None:
        return "nd"
    dims, strides = view
    rows = dims[0] * dims[1] * dims[2]
    layout = "".join(_axis_code(st) for st in strides[: 2 if g.tensor_b else 1])
    return f"{bucket_size(rows)}x{bucket_size(dims[3])}:{layout}"


def eager_bucket(g: Facts) -> str:
    # Dense operands share triton_flat's buckets, so their times compare;
    # other layouts share triton_strided's.
    return bucket_size(g.numel) if g.dense else strided_bucket(g)


def eager_run(g: Facts, cfg, a, b=None):
    out = _out(g, a, b)
    EAGER_OUT[g.name](a, b, out)
    return out


# torch's functional form of an op whose result, for contiguous operands of one
# shape, is the very tensor ``EAGER_OUT`` writes into ``_out``: same kernel,
# same dtype, contiguous. The pre-bound vendor variant returns it directly.
EAGER_DIRECT = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
                "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
                "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def _bind_eager(g: Facts, cfg, args):
    fn = EAGER_DIRECT.get(g.name)
    if fn is None or not g.dense or not args[0].is_contiguous():
        return None
    if len(args) > 1 and args[1] is not None:
        return fn
    return lambda a, b=None: fn(a)


eager_run.bind = _bind_eager


def reference_run(g: Facts, cfg, a, b=None):
    out = _out(g, a, b)
    ref = REFERENCE[g.name](a) if b is None else REFERENCE[g.name](a, b)
    return out.copy_(ref)


def specs(name: str) -> list[Spec]:
    """The variants of every elementwise op, in dispatch order."""
    return [
        Spec("triton_flat", flat_run, version=K.FLAT_VERSION, dtypes=KERNEL_DTYPES, check=flat_check,
             configs=flat_configs, default_config=flat_default, bucket=flat_bucket,
             description="dense operands of one layout as a 1-D range; wide vector loads"),
        Spec("triton_strided", strided_run, version=K.STRIDED_VERSION, dtypes=KERNEL_DTYPES,
             check=strided_check, configs=strided_configs, default_config=strided_default,
             bucket=strided_bucket,
             description="any strides and broadcasting; 2-D tiles over a collapsed index space"),
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=KERNEL_DTYPES,
             check=scalar_check, bucket=eager_bucket,
             description="torch's own kernel (TensorIterator) writing into our output; "
                         "lowest host overhead, wins on tiny tensors"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _axis_code(st) -> str:
    """How an operand walks the tile: c = unit stride along columns, r = along rows,
    b = broadcast along one axis, g = neither (gather-like)."""
    if st[3] == 1:
        return "c"
    if st[2] == 1:
        return "r"
    if st[2] == 0 or st[3] == 0:
        return "b"
    return "g"


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op + autograd
# ---------------------------------------------------------------------------
def _grad_unary(name: str, g, a, out):
    ops = torch.ops.opforge
    if name == "neg":
        return ops.neg(g)
    if name == "abs":
        return ops.mul(g, torch.sign(a))
    if name == "exp":
        return ops.mul(g, out)
    if name == "log":
        return ops.div(g, a)
    if name == "sqrt":
        return ops.div(g, ops.mul(out, 2.0))
    if name == "rsqrt":
        return ops.mul(ops.mul(g, -0.5), ops.mul(ops.mul(out, out), out))
    if name == "sigmoid":
        return ops.mul(g, ops.mul(out, ops.sub(torch.ones_like(out), out)))
    if name == "tanh":
        return ops.mul(g, ops.sub(torch.ones_like(out), ops.mul(out, out)))
    if name == "relu":
        return ops.mul(g, (a > 0).to(g.dtype))
    if name == "gelu":
        return ops.gelu_backward(g, a)
    if name == "silu":
        return ops.silu_backward(g, a)
    if name == "gelu_tanh":
        return torch.ops.aten.gelu_backward(g, a, approximate="tanh")
    raise NotImplementedError(name)


def _grad_binary(name: str, g, a, b):
    ops = torch.ops.opforge
    bt = b if _is_tensor(b) else None
    if name == "add":
        return g, g
    if name == "sub":
        return g, ops.neg(g)
    if name == "mul":
        return ops.mul(g, b), (ops.mul(g, a) if bt is not None else None)
    if name == "div":
        ga = ops.div(g, b)
        return ga, (ops.neg(ops.mul(ga, ops.div(a, b))) if bt is not None else None)
    if name in ("maximum", "minimum"):
        other = bt if bt is not None else torch.full_like(a, b)
        win = (a > other) if name == "maximum" else (a < other)
        tie = a == other
        wa = win.to(g.dtype) + 0.5 * tie.to(g.dtype)
        return ops.mul(g, wa), (ops.mul(g, 1.0 - wa) if bt is not None else None)
    raise NotImplementedError(f"opforge.{name} has no derivative")


def sample_inputs(name: str, binary: bool, device: torch.device) -> list[tuple]:
    """Random inputs that reach every variant: dense, broadcast, transposed, scalar;
    each float dtype, and int32 where the op takes ints. Sizes avoid tile multiples."""
    g = torch.Generator(device="cpu").manual_seed(hash(name) % (2**31))

    def rand(shape, dtype):
        x = torch.randn(shape, generator=g) * 3
        if name in ("log", "sqrt", "rsqrt"):
            x = x.abs() + 0.05
        if not dtype.is_floating_point:
            x = (x * 20).round()
            x[x == 0] = 7
        return x.to(dtype).to(device)

    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    if name in INT_OK:
        dtypes.append(torch.int32)
    out = []
    for dt in dtypes:
        a = rand((67, 130), dt)
        if not binary:
            out += [(a, None), (rand((130, 67), dt).t(), None), (rand((3, 5, 7, 11, 2), dt)[:, ::2], None)]
            continue
        out += [(a, rand((67, 130), dt)), (a, rand((130,), dt)), (rand((130, 67), dt).t(), rand((67, 1), dt))]
        if name not in GRADIENTS:
            out.append((a, 2.5 if dt.is_floating_point else 3))
        if name in ("div",):
            out = [(x, y) for x, y in out if not isinstance(y, torch.Tensor) or bool((y != 0).all())]
    return out


def _grad_of_gradient_op(name: str, gg, g, x):
    """Derivatives of gelu_backward(g, x) / silu_backward(g, x) in g and x
    (second derivatives of gelu / silu), in plain torch."""
    if name == "gelu_backward":
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
        return gg * (cdf + x * pdf), gg * g * pdf * (2.0 - x * x)
    s = torch.sigmoid(x)
    return gg * (s * (1.0 + x * (1.0 - s))), gg * g * s * (1.0 - s) * (2.0 + x * (1.0 - 2.0 * s))


def _tensors(a, b=None):
    return (a, b) if _is_tensor(b) else (a,)


def _memo_key(a, b=None):
    # A CUDA device as its index: building and comparing torch.device objects costs more than the rest.
    if type(b) is _Tensor or isinstance(b, torch.Tensor):
        return (a.dtype, a.shape, a.stride(), a.get_device() if a.is_cuda else a.device,
                b.dtype, b.shape, b.stride(), b.get_device() if b.is_cuda else b.device)
    return (a.dtype, a.shape, a.stride(), a.get_device() if a.is_cuda else a.device, type(b))


_Tensor = torch.Tensor


def _dtype_key(a, b=None):
    return f"{a.dtype}".replace("torch.", "") + (f",{b.dtype}".replace("torch.", "") if _is_tensor(b) else "")


OPS = registry.register_family(
    UNARY + BINARY, specs, geometry=facts, reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors, memo_key=lambda name: _memo_key, dtype_key=lambda name: _dtype_key,
    validate=lambda name: functools.partial(validate, name, binary=name in BINARY),
    samples=lambda name: functools.partial(sample_inputs, name, name in BINARY),
    doc=lambda name: f"elementwise {name}",
)


def _define(name: str, binary: bool) -> None:
    """The torch.library op(s) of ``name`` and their autograd."""
    op = OPS[name]

    def fake(a, b=None):
        validate(name, a, b, binary=binary)
        return allocate_out(name, a, b)

    def impl(a, b=None):
        return dispatch.call(op, a, b)

    if binary:
        def setup(ctx, inputs, output):
            a, b = inputs
            ctx.save_for_backward(a, b if _is_tensor(b) else None)
            ctx.scalar = None if _is_tensor(b) else b
            ctx.a_shape = a.shape

        def backward(ctx, g):
            a, bt = ctx.saved_tensors
            b = bt if bt is not None else ctx.scalar
            if name in GRADIENTS:
                ga, gb = _grad_of_gradient_op(name, g, a, bt)
            else:
                ga, gb = _grad_binary(name, g, a, b)
            ga = sum_to(ga, ctx.a_shape) if ctx.needs_input_grad[0] else None
            gb = sum_to(gb, bt.shape) if bt is not None and ctx.needs_input_grad[1] else None
            return ga, gb

        overloads = (("Tensor", "Tensor"),) if name in GRADIENTS else (("Tensor", "Tensor"), ("Scalar", "Scalar"))
        for overload, other_type in overloads:
            define(f"{name}.{overload}(Tensor self, {other_type} other) -> Tensor", impl, fake, backward, setup)
    else:
        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], output)

        def backward(ctx, g):
            a, out = ctx.saved_tensors
            return _grad_unary(name, g, a, out)

        define(f"{name}(Tensor self) -> Tensor", impl, fake, backward, setup)


for _n in UNARY + BINARY:
    _define(_n, _n in BINARY)


def _public(name: str, binary: bool):
    """The torch-style function: the registered op, with a direct path to the
    dispatcher when nothing (autograd, tracing, modes) needs torch.library."""
    packet = getattr(torch.ops.opforge, name)
    op = OPS[name]
    call = dispatch.call
    if binary:
        tensor_op = packet.Tensor
        scalar_op = None if name in GRADIENTS else packet.Scalar

        def fn(input: torch.Tensor, other) -> torch.Tensor:
            if direct_ok(input, other):
                return call(op, input, other)
            if not isinstance(input, torch.Tensor):
                raise TypeError(f"opforge.{name}: input must be a torch.Tensor, got {type(input).__name__}")
            if isinstance(other, torch.Tensor):
                return tensor_op(input, other)
            validate(name, input, other, binary=True)
            return scalar_op(input, other)
    else:
        single = packet.default

        def fn(input: torch.Tensor) -> torch.Tensor:
            if direct_ok(input):
                return call(op, input, None)
            if not isinstance(input, torch.Tensor):
                raise TypeError(f"opforge.{name}: input must be a torch.Tensor, got {type(input).__name__}")
            return single(input)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{name}`` with torch's semantics, run by opforge's dispatcher."
    return fn


neg, abs, exp, log, sqrt, rsqrt, sigmoid, tanh, relu, gelu, gelu_tanh, silu = (_public(n, False) for n in UNARY)
add, sub, mul, div, maximum, minimum, gelu_backward, silu_backward = (_public(n, True) for n in BINARY)

__all__ = list(UNARY + BINARY)
