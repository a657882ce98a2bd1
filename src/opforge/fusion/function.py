"""``opforge.fuse``: a Python function of elementwise tensor expressions -> one
generated Triton kernel, dispatched, tuned and differentiable.

    @opforge.fuse
    def f(x, y, scale):
        return torch.where(x > 0, x * scale, torch.exp(y)).to(torch.bfloat16)

    f(a, b, 0.5)          # traces once for these dtypes, compiles, launches
    f(a, b, 0.25)         # same kernel: the number is a kernel argument
    print(f.source(a, b, 0.5)); print(f.explain(a, b, 0.5))

Each call binds the arguments and forms a *spec*: per argument, the dtype
of a tensor and whether it is 0-dim (torch promotes 0-dim tensors below
dimensioned ones), the Python type of a number, or the value of anything
else (a string, a dtype: a static argument baked into the trace). The
spec keys the trace cache; shapes and the broadcast pattern are not in it
because every primitive is elementwise and the kernels take strides (see
``codegen``). A trace generates one module (``fused_flat`` and
``fused_strided``), cached by the hash of its source (``compiler``).

Registry design. Every fused function is its own operator, so one registry
op per function is created when ``fuse`` is applied: ``fused.<name>``
(forward) and ``fused.<name>_backward``, each with the variants
``triton_flat`` (dense operands of one layout), ``triton_strided`` (any
strides, broadcasting), ``torch_eager`` (the traced DAG run by torch eager,
CUDA) and ``reference`` (the same on CPU or CUDA: the fallback with no GPU
and no interpreter). A single ``fused_elementwise`` op would put unrelated
expressions in one tuning bucket; per-function ops give ``explain`` a name,
and autotune tunes BLOCK / tile shape / num_warps per function, dtypes and
size bucket. The op's arguments are the function's bound arguments, flattened.

Autograd: when a floating tensor argument requires grad, the call runs
inside an ``autograd.Function`` whose backward is the generated backward
program (``autodiff``): one kernel that recomputes the forward from the
saved inputs (no saved intermediates). Broadcast inputs get their gradient
summed back to their shape. The backward is not itself differentiable
(``once_differentiable``).

torch.compile: fused functions are not torch.library ops (each is an
arbitrary user function). Under ``torch.compile`` the call steps aside and
runs the undecorated function, so Dynamo traces the user's own code and
Inductor fuses it -- ``fullgraph=True`` works and nothing is lost.
"""

from __future__ import annotations

import functools
import inspect
import re
import struct
import threading
from typing import Any, Callable

import torch

from opforge.fusion import autodiff, codegen, compiler
from opforge.fusion.expr import SUPPORTED_DTYPES, Program, evaluate, trace
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Op, Variant
from opforge.runtime.shapes import bucket_size, sum_to

FLAT_VERSION = "1"
STRIDED_VERSION = "1"
_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Compiled programs
# ---------------------------------------------------------------------------
class Compiled:
    """A program with its generated module (compiled on first launch)."""

    def __init__(self, program: Program, where: str):
        self.program = program
        self.where = where
        self.passing = codegen.scalar_passing(program)
        self._source: str | None = None
        self._module = None

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = codegen.generate(self.program, self.where)
        return self._source

    @property
    def module(self):
        if self._module is None:
            self._module = compiler.load(self.source)
        return self._module

    def scalar_args(self, scalars) -> list:
        out = []
        for how, v in zip(self.passing, scalars):
            if how == "bits":
                out.append(struct.unpack("<q", struct.pack("<d", float(v)))[0])
            elif how == "float":
                out.append(float(v))
            else:
                out.append(int(v))
        return out


def _is_dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def dense_alike(tensors) -> bool:
    """Every tensor of one shape and one dense layout: the flat kernel's case."""
    t0 = tensors[0]
    return _is_dense(t0) and all(t.shape == t0.shape and t.stride() == t0.stride() for t in tensors[1:])


def out_shape(tensors) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[t.shape for t in tensors]))


def allocate(tensors, dtypes) -> list[torch.Tensor]:
    """Outputs: the inputs' layout when they are dense alike, else contiguous."""
    if dense_alike(tensors):
        return [torch.empty_like(tensors[0], dtype=dt) for dt in dtypes]
    shape = out_shape(tensors)
    return [torch.empty(shape, dtype=dt, device=tensors[0].device) for dt in dtypes]


def geometry(tensors, outs):
    """(4 dims, [4 strides per tensor then per output]) over the collapsed
    broadcast index space, or None when more than 4 dims remain."""
    return _geometry(tuple(tuple(t.shape) for t in tensors), tuple(t.stride() for t in tensors),
                     tuple(o.stride() for o in outs), out_shape(tensors))


@functools.lru_cache(maxsize=4096)
def _geometry(shapes, strides, out_strides, shape):
    from opforge.kernels.elementwise import collapse

    operands = []
    for t_shape, t_stride in zip(shapes, strides):
        lead = len(shape) - len(t_shape)
        operands.append([0] * lead + [0 if n == 1 and target != 1 else s
                                      for n, s, target in zip(t_shape, t_stride, shape[lead:])])
    operands += [list(s) for s in out_strides]
    dims, st = collapse(list(shape), operands)
    if len(dims) > 4:
        return None
    pad = 4 - len(dims)
    return [1] * pad + dims, [[0] * pad + s for s in st]


def flat_default_config(n: int) -> dict:
    return {"BLOCK": 4096, "num_warps": 8} if n >= (1 << 20) else {"BLOCK": 1024, "num_warps": 4}


def flat_configs() -> list[dict]:
    return [{"BLOCK": blk, "num_warps": w} for blk in (1024, 2048, 4096, 8192) for w in (4, 8)
            if blk // (32 * w) >= 4]


def strided_configs() -> list[dict]:
    tiles = [(1, 1024, 4), (1, 2048, 8), (2, 1024, 8), (4, 512, 8), (4, 1024, 8), (8, 256, 4), (16, 128, 4),
             (32, 64, 4), (64, 32, 4), (64, 64, 8), (128, 32, 8)]
    return [{"BLOCK_R": r, "BLOCK_C": c, "num_warps": w} for r, c, w in tiles]


def launch_flat(c: Compiled, tensors, scalars, outs, config: dict) -> None:
    n = outs[0].numel()
    if n == 0:
        return
    block = config.get("BLOCK", 4096)
    c.module.fused_flat[(-(-n // block),)](
        *tensors, *c.scalar_args(scalars), *outs, n,
        BLOCK=block, INT64=n + block > _INT32_MAX, num_warps=config.get("num_warps", 8))


def launch_strided(c: Compiled, tensors, scalars, outs, config: dict, geo=None) -> None:
    if outs[0].numel() == 0:
        return
    dims, strides = geo or geometry(tensors, outs)
    br, bc = config.get("BLOCK_R", 1), config.get("BLOCK_C", 1024)
    reach = max(sum((d - 1) * abs(s) for d, s in zip(dims, st)) for st in strides)
    programs = dims[0] * dims[1] * (-(-dims[2] // br)) * (-(-dims[3] // bc))
    flat_strides = [s for st in strides for s in st]
    c.module.fused_strided[(programs,)](
        *tensors, *c.scalar_args(scalars), *outs, dims[1], dims[2], dims[3], *flat_strides,
        BLOCK_R=br, BLOCK_C=bc, INT64=reach + br * bc > _INT32_MAX, num_warps=config.get("num_warps", 4))


def strided_default_config(tensors) -> dict:
    from opforge.kernels.elementwise import strided_default_config as default

    geo = geometry(tensors, [])
    d = geo[0] if geo else [1, 1, 1, max(1, tensors[0].numel())]
    return default(d[0] * d[1] * d[2], d[3])


# ---------------------------------------------------------------------------
# Arguments: binding, specs
# ---------------------------------------------------------------------------
def _spec_entry(v, where: str, arg: str):
    if isinstance(v, torch.Tensor):
        if v.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{where}: {arg} has dtype {v.dtype}, which fused kernels do not support")
        return ("T", v.dtype, v.dim() == 0)
    if isinstance(v, (bool, int, float)):
        return ("S", bool if isinstance(v, bool) else int if isinstance(v, int) else float)
    try:
        hash(v)
    except TypeError:
        raise TypeError(f"{where}: {arg} of type {type(v).__name__} is neither a tensor, a number "
                        f"nor a hashable static value") from None
    return ("C", v)


class _Call:
    """One call's flattened arguments: ``values`` as the registry op takes them."""

    __slots__ = ("spec", "tensors", "scalars")

    def __init__(self, spec, tensors, scalars):
        self.spec, self.tensors, self.scalars = spec, tensors, scalars


def _split(values, where: str, names) -> _Call:
    spec, tensors, scalars = [], [], []
    for v, nm in zip(values, names):
        e = _spec_entry(v, where, nm)
        spec.append(e)
        if e[0] == "T":
            tensors.append(v)
        elif e[0] == "S":
            scalars.append(v)
    return _Call(tuple(spec), tensors, scalars)


def _validate_tensors(where: str, tensors) -> None:
    if not tensors:
        raise TypeError(f"{where}: the function needs at least one tensor argument")
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"{where}: tensors are on different devices ({dev} and {t.device})")
    try:
        torch.broadcast_shapes(*[t.shape for t in tensors])
    except RuntimeError:
        raise ValueError(f"{where}: tensor shapes {[tuple(t.shape) for t in tensors]} do not broadcast") from None


def _memo_key(values) -> tuple:
    return tuple((v.dtype, v.shape, v.stride(), v.device) if isinstance(v, torch.Tensor) else
                 (type(v), v if not isinstance(v, (int, float)) or isinstance(v, bool) else None)
                 for v in values)


# ---------------------------------------------------------------------------
# Registry ops for one kernel family (forward or backward of one function)
# ---------------------------------------------------------------------------
def _make_op(name: str, doc: str, resolve: Callable[[tuple], tuple[Compiled, list, list]],
             validate: Callable, samples: Callable, alloc: Callable | None = None) -> Op:
    """``resolve(values) -> (compiled, tensors, scalars)``; ``alloc(values, tensors, dtypes)``
    allocates outputs (default: ``allocate``)."""
    alloc = alloc or (lambda values, tensors, dtypes: allocate(tensors, dtypes))

    def tensors_of(*values):
        return tuple(v for v in values if isinstance(v, torch.Tensor))

    def prepared(values):
        c, tensors, scalars = resolve(values)
        return c, tensors, scalars, alloc(values, tensors, c.program.out_dtypes)

    def flat_run(cfg, *values):
        c, tensors, scalars, outs = prepared(values)
        launch_flat(c, tensors, scalars, outs, cfg)
        return tuple(outs)

    def strided_run(cfg, *values):
        c, tensors, scalars, outs = prepared(values)
        launch_strided(c, tensors, scalars, outs, cfg)
        return tuple(outs)

    def torch_run(cfg, *values):
        c, tensors, scalars, outs = prepared(values)
        for o, r in zip(outs, evaluate(c.program, tensors, scalars)):
            o.copy_(r)
        return tuple(outs)

    def flat_check(*values):
        ts = tensors_of(*values)
        return None if dense_alike(ts) else "tensors are not dense with one shared shape and layout"

    def strided_check(*values):
        ts = tensors_of(*values)
        if ts[0].numel() and geometry(ts, []) is None:
            return "more than 4 dims remain after collapsing the layout"
        return None

    def strided_bucket(*values):
        ts = tensors_of(*values)
        geo = geometry(ts, [])
        if geo is None:
            return "nd"
        dims, strides = geo
        layout = "".join("c" if st[3] == 1 else "r" if st[2] == 1 else "b" if 0 in st[2:] else "g"
                         for st in strides)
        return f"{bucket_size(dims[0] * dims[1] * dims[2])}x{bucket_size(dims[3])}:{layout}"

    def numel(*values):
        return max(t.numel() for t in tensors_of(*values))

    op = Op(
        name=name,
        reference=lambda *values: torch_run({}, *values),
        tensors=tensors_of,
        memo_key=lambda *values: _memo_key(values),
        dtype_key=lambda *values: ",".join(str(t.dtype).replace("torch.", "") for t in tensors_of(*values)),
        variants=[
            Variant("triton_flat", flat_run, version=FLAT_VERSION, dtypes=SUPPORTED_DTYPES, check=flat_check,
                    configs=lambda *v: flat_configs(), default_config=lambda *v: flat_default_config(numel(*v)),
                    bucket=lambda *v: bucket_size(numel(*v)),
                    description="generated kernel; dense tensors of one layout as a 1-D range"),
            Variant("triton_strided", strided_run, version=STRIDED_VERSION, dtypes=SUPPORTED_DTYPES,
                    check=strided_check, configs=lambda *v: strided_configs(),
                    default_config=lambda *v: strided_default_config(tensors_of(*v)), bucket=strided_bucket,
                    description="generated kernel; any strides and broadcasting, 2-D tiles over the "
                                "collapsed index space"),
            Variant("torch_eager", torch_run, kind="vendor", devices=("cuda",), dtypes=SUPPORTED_DTYPES,
                    bucket=lambda *v: bucket_size(numel(*v)),
                    description="the traced expression run by torch eager, one kernel per primitive"),
            Variant("reference", torch_run, kind="reference", devices=("cpu", "cuda"),
                    description="the traced expression run by torch (the oracle and the CPU fallback)"),
        ],
        validate=validate,
        samples=samples,
        doc=doc,
    )
    for k in range(2, 1000):
        try:
            return registry.register(op)
        except ValueError:
            op.name = f"{name}_{k}"
    raise ValueError(f"opforge.fuse: cannot find a free registry name for {name}")


# ---------------------------------------------------------------------------
# The public decorator
# ---------------------------------------------------------------------------
def _clean_name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "fn")
    name = name.replace("<locals>.", "").replace("<lambda>", "lambda")
    return re.sub(r"[^0-9A-Za-z_.]", "_", name)


class FusedFunction:
    """A fused function: call it like the original. ``op`` / ``backward_op``
    are its registry ops; ``source``, ``explain`` and ``program`` show what runs."""

    def __init__(self, fn: Callable, name: str | None = None, *, register: bool = True):
        if not callable(fn):
            raise TypeError(f"opforge.fuse: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or _clean_name(fn)
        self.where = f"opforge.fuse({self.name})"
        functools.update_wrapper(self, fn)
        self._sig = inspect.signature(fn)
        plain = [p for p in self._sig.parameters.values() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        simple = len(plain) == len(self._sig.parameters)
        self._n_plain = len(plain) if simple else -1
        self._plain_names = [p.name for p in plain]
        self._names: list[str] = []
        self._compiled: dict[tuple, Compiled] = {}
        self._backward: dict[tuple, Compiled] = {}
        self._lock = threading.RLock()  # compiled_backward traces the forward under it
        self.op = self.backward_op = None
        if register:  # ops.fused builds its own registry ops on unregistered FusedFunctions
            self.op = _make_op(f"fused.{self.name}", f"fused elementwise function {self.name}",
                               self._resolve, self._validate, self._samples)
            self.backward_op = _make_op(f"{self.op.name}_backward", f"gradient of {self.op.name}",
                                        self._resolve_backward, self._validate_backward, lambda device: [])

    # Binding ---------------------------------------------------------------
    def _values(self, args, kwargs) -> tuple:
        """The bound arguments, flattened in signature order (``*args`` expanded)."""
        if not kwargs and len(args) == self._n_plain:
            # The common case (every parameter passed positionally): no binding needed.
            for v in args:
                if type(v) is not torch.Tensor and not isinstance(v, (int, float, str, type(None), torch.dtype)):
                    _spec_entry(v, self.where, "an argument")
            self._names = self._plain_names
            return args
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.where}: {e}") from None
        bound.apply_defaults()
        values, names = [], []
        for pname, p in self._sig.parameters.items():
            v = bound.arguments.get(pname)
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                values += list(v or ())
                names += [f"{pname}[{i}]" for i in range(len(v or ()))]
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                if v:
                    raise TypeError(f"{self.where}: **{pname} arguments are not supported")
            else:
                values.append(v)
                names.append(pname)
        self._names = names
        for v, nm in zip(values, names):
            if not isinstance(v, (torch.Tensor, int, float, str, type(None), torch.dtype)):
                _spec_entry(v, self.where, nm)  # raises for what cannot be an argument
        return tuple(values)

    def _call_fn(self, values):
        """Call the original function with flattened values (the tracing call)."""
        pos, kw, i = [], {}, 0
        for pname, p in self._sig.parameters.items():
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                pos += list(values[i:len(values) - self._n_after(pname)])
                i = len(values) - self._n_after(pname)
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                kw[pname] = values[i]
                i += 1
            else:
                pos.append(values[i])
                i += 1
        return self.fn(*pos, **kw)

    def _n_after(self, var_name: str) -> int:
        params = list(self._sig.parameters.values())
        idx = [p.name for p in params].index(var_name)
        return sum(1 for p in params[idx + 1:] if p.kind is not inspect.Parameter.VAR_KEYWORD)

    def _names_for(self, values):
        return self._names if len(self._names) == len(values) else [f"argument {i}" for i in range(len(values))]

    # Tracing -------------------------------------------------------------
    def compiled(self, spec: tuple) -> Compiled:
        c = self._compiled.get(spec)
        if c is None:
            with self._lock:
                c = self._compiled.get(spec)
                if c is None:
                    program = trace(lambda *vals: self._call_fn(vals), self.name, spec)
                    c = self._compiled[spec] = Compiled(program, self.where)
        return c

    def compiled_backward(self, spec: tuple, needs: tuple) -> Compiled:
        key = (spec, needs)
        c = self._backward.get(key)
        if c is None:
            with self._lock:
                c = self._backward.get(key)
                if c is None:
                    fwd = self.compiled(spec).program
                    c = self._backward[key] = Compiled(autodiff.backward_program(fwd, needs), self.where)
        return c

    def _resolve(self, values):
        call = _split(values, self.where, self._names_for(values))
        return self.compiled(call.spec), call.tensors, call.scalars

    def _resolve_backward(self, values):
        # values: (*forward values, *output gradients, (needs, number of forward values))
        needs, n_fwd = values[-1]
        call = _split(values[:n_fwd], self.where, self._names_for(values[:n_fwd]))
        grads = list(values[n_fwd:-1])
        return self.compiled_backward(call.spec, needs), call.tensors + grads, call.scalars

    def _validate(self, *values):
        call = _split(values, self.where, self._names_for(values))
        _validate_tensors(self.where, call.tensors)

    def _validate_backward(self, *values):
        _validate_tensors(self.where, [v for v in values if isinstance(v, torch.Tensor)])

    def _samples(self, device) -> list[tuple]:
        """Random inputs for each traced spec: dense, broadcast/transposed, and a
        larger dense shape (selftest reaches both kernels and every traced dtype)."""
        gen = torch.Generator().manual_seed(len(self.name))
        out = []
        for spec in list(self._compiled):
            for shape, kind in (((67, 130), "dense"), ((130, 67), "t"), ((67, 130), "b"), ((515, 1031), "dense")):
                vals, k = [], 0
                for e in spec:
                    if e[0] == "T":
                        sh = () if e[2] else (shape[1],) if kind == "b" and k else shape
                        x = torch.rand(sh, generator=gen, dtype=torch.float64) * 2 + 0.25
                        if not e[1].is_floating_point:
                            x = (x * 10).round()
                        x = x.to(e[1]).to(device)
                        vals.append(x.t() if kind == "t" and x.dim() == 2 else x)
                        k += 1
                    elif e[0] == "S":
                        vals.append(e[1](0.75) if e[1] is float else e[1](1))
                    else:
                        vals.append(e[1])
                out.append(tuple(vals))
        return out

    # Calling -------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)
        values = self._values(args, kwargs)
        if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                           and v.dtype.is_floating_point for v in values):
            outs = _FusedGrad.apply(self, values, *[v for v in values if isinstance(v, torch.Tensor)])
        else:
            outs = dispatch.call(self.op, *values)
        return self._shape_result(values, outs)

    def _shape_result(self, values, outs):
        spec = tuple(_spec_entry(v, self.where, "") for v in values)
        return tuple(outs) if self._compiled[spec].program.multi else outs[0]

    def program(self, *args, **kwargs) -> Program:
        values = self._values(args, kwargs)
        return self._resolve(values)[0].program

    def source(self, *args, **kwargs) -> str:
        """The generated Triton source for these arguments."""
        values = self._values(args, kwargs)
        return self._resolve(values)[0].source

    def explain(self, *args, **kwargs) -> str:
        """Which variant dispatch runs for these arguments and why, then the kernel source."""
        values = self._values(args, kwargs)
        decision = dispatch.explain(self.op.name, *values)
        c = self._resolve(values)[0]
        return f"{decision}\n--- generated source ({compiler.digest(c.source)}) ---\n{c.source}"

    def __repr__(self) -> str:
        return f"<opforge.fuse {self.name} -> {self.op.qualname}>"


class _FusedGrad(torch.autograd.Function):
    """Autograd for a fused call: forward = the forward op, backward = the
    generated backward op (recomputing from the saved inputs)."""

    @staticmethod
    def forward(ctx, ff: FusedFunction, values, *tensors):
        outs = dispatch.call(ff.op, *values)
        ctx.ff, ctx.values = ff, tuple(None if isinstance(v, torch.Tensor) else v for v in values)
        ctx.save_for_backward(*tensors)
        ctx.float_outs = [o.dtype.is_floating_point for o in outs]
        ctx.mark_non_differentiable(*[o for o in outs if not o.dtype.is_floating_point])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        ff = ctx.ff
        tensors = ctx.saved_tensors
        it = iter(tensors)
        values = tuple(next(it) if v is None else v for v in ctx.values)
        shape = out_shape(tensors)
        needs = []
        for t, need in zip(tensors, ctx.needs_input_grad[2:]):
            if not need or not t.dtype.is_floating_point:
                needs.append(0)
            else:
                needs.append(1 if tuple(t.shape) == shape else 2)
        out_grads = []
        for g, is_float in zip(grads, ctx.float_outs):
            if is_float:
                out_grads.append(g.expand(shape) if tuple(g.shape) != shape else g)
        if not any(needs):
            return (None, None) + (None,) * len(tensors)
        result = dispatch.call(ff.backward_op, *values, *out_grads, (tuple(needs), len(values)))
        it = iter(result)
        grads_in = []
        for t, need in zip(tensors, needs):
            if not need:
                grads_in.append(None)
                continue
            g = next(it)
            if need == 2:
                g = sum_to(g, t.shape).to(t.dtype)
            grads_in.append(g)
        return (None, None, *grads_in)


def fuse(fn: Callable | None = None, *, name: str | None = None):
    """Turn ``fn`` -- elementwise torch expressions of its tensor and number
    arguments -- into one generated Triton kernel (see the module docstring).

    Usable as ``@fuse`` or ``@fuse(name="gelu_chain")``; the registry ops are
    ``fused.<name>`` and ``fused.<name>_backward``.
    """
    if fn is None:
        return lambda f: FusedFunction(f, name)
    return FusedFunction(fn, name)
