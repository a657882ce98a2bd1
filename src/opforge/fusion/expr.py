"""The traced expression DAG, and the proxy objects that build it.

Tracing calls the user's function once with ``Proxy`` objects in place of
its tensor and number arguments. A proxy implements ``__torch_function__``,
the Python operators and the common tensor methods; each call appends a node
to a ``Graph`` instead of computing anything. Nodes are hash-consed on
``(op, operands, attributes)``, so a subexpression written twice is one node
(common subexpressions are shared).

Types follow torch exactly because torch computes them: each node's dtype is
the dtype torch gives when the primitive runs on ``meta`` tensors of the
operands' dtypes (shape ``()`` for 0-dim tensors, ``(1,)`` otherwise, since
a 0-dim tensor ranks below a dimensioned one in torch's promotion), with
Python numbers passed as Python numbers (torch's weak scalars). So int + float
scalar is float, bf16 + fp32 tensor is fp32, comparisons are bool and true
division of ints is the default float dtype, as in eager.

Shapes are not traced: every primitive is elementwise, so one trace serves
every shape and broadcast pattern; the launch handles broadcasting by strides.
What a trace depends on is the dtype of each tensor argument, whether it is
0-dim, and the Python type of each number argument (``spec``).

Python numbers written in the function body are constants of the
expression; numbers passed as arguments are scalar parameters (kernel
arguments, so a new value does not recompile).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

WEAK_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64}
_WEAK_SAMPLE = {torch.bool: True, torch.int64: 3, torch.float64: 1.5}
SUPPORTED_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
                              torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


# ---------------------------------------------------------------------------
# Primitives: the torch function that states each one's semantics. It runs on
# meta tensors (type inference) and on real tensors (the reference path).
# ---------------------------------------------------------------------------
def _clamp(a, *bounds, has_lo, has_hi):
    it = iter(bounds)
    lo = next(it) if has_lo else None
    hi = next(it) if has_hi else None
    return torch.clamp(a, lo, hi)


PRIMS: dict[str, Callable[..., Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": operator.pow,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor, "invert": operator.invert,
    "where": torch.where, "maximum": torch.maximum, "minimum": torch.minimum, "clamp": _clamp,
    "neg": operator.neg, "abs": torch.abs, "sign": torch.sign,
    "exp": torch.exp, "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "erf": torch.erf, "relu": torch.relu, "silu": F.silu,
    "gelu": lambda a, approximate="none": F.gelu(a, approximate=approximate),
    "cast": lambda a, dtype: a.to(dtype),
}
FLOAT_ONLY = frozenset({"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid", "tanh", "erf",
                        "silu", "gelu"})


@dataclass(frozen=True)
class Node:
    """One value of the expression. ``dtype`` is torch's dtype for it; a weak
    node is a Python number (a constant or a scalar parameter; its dtype is
    float64/int64/bool for float/int/bool); ``dim0`` marks a 0-dim tensor."""

    id: int
    op: str  # "input" | "scalar" | "const" | a key of PRIMS
    args: tuple[int, ...]
    attrs: tuple
    dtype: torch.dtype
    weak: bool = False
    dim0: bool = False
    value: Any = None  # the constant's value (op "const") or the argument index (input, scalar)

    def attr(self, key, default=None):
        return dict(self.attrs).get(key, default)


class Graph:
    """An append-only, hash-consed list of nodes (ids are a topological order)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._index: dict[tuple, int] = {}

    def copy(self) -> "Graph":
        g = Graph()
        g.nodes = list(self.nodes)
        g._index = dict(self._index)
        return g

    def _add(self, op, args, attrs, dtype, weak=False, dim0=False, value=None, key=None) -> int:
        key = key if key is not None else (op, args, attrs)
        found = self._index.get(key)
        if found is not None:
            return found
        node = Node(len(self.nodes), op, args, attrs, dtype, weak, dim0, value)
        self.nodes.append(node)
        self._index[key] = node.id
        return node.id

    def input(self, index: int, dtype: torch.dtype, dim0: bool) -> int:
        return self._add("input", (), (("index", index),), dtype, dim0=dim0, value=index)

    def scalar(self, index: int, pytype: type) -> int:
        return self._add("scalar", (), (("index", index),), WEAK_DTYPE[pytype], weak=True, value=index)

    def const(self, value) -> int:
        kind = bool if isinstance(value, bool) else int if isinstance(value, int) else float
        value = kind(value)
        return self._add("const", (), (("repr", kind.__name__, repr(value)),), WEAK_DTYPE[kind],
                         weak=True, value=value)

    def apply(self, op: str, operands: tuple[int, ...], where: str = "opforge.fuse", **attrs) -> int:
        """The node for ``op(*operands, **attrs)``, its dtype as torch gives it."""
        attrs_t = tuple(sorted(attrs.items(), key=lambda kv: kv[0]))
        found = self._index.get((op, operands, attrs_t))
        if found is not None:
            return found
        nodes = [self.nodes[i] for i in operands]
        if op != "cast" and nodes and all(n.op == "const" for n in nodes):
            # Constant folding (Python semantics on float64/int64/bool, like the reference path).
            r = PRIMS[op](*[torch.tensor(n.value, dtype=torch.float64 if isinstance(n.value, float) else None)
                            for n in nodes], **attrs)
            return self.const(r.item())
        dtype, weak, dim0 = _infer(op, nodes, attrs, where)
        return self._add(op, operands, attrs_t, dtype, weak, dim0)


def _display(op: str) -> str:
    return {"cast": "a cast", "and": "&", "or": "|", "xor": "^", "invert": "~"}.get(op, f"torch.{op}")


def _infer(op: str, nodes: list[Node], attrs: dict, where: str) -> tuple[torch.dtype, bool, bool]:
    fn = PRIMS[op]
    if op in ("and", "or", "xor", "invert") and any(n.dtype.is_floating_point for n in nodes):
        raise TypeError(f"{where}: {_display(op)} does not accept floating-point operands "
                        f"(torch's bitwise ops take bool and integer tensors)")
    all_weak = all(n.weak for n in nodes)
    try:
        if all_weak:
            r = fn(*[torch.tensor(_WEAK_SAMPLE[n.dtype]) for n in nodes], **attrs)
        else:
            r = fn(*[_WEAK_SAMPLE[n.dtype] if n.weak else
                     torch.empty(() if n.dim0 else (1,), dtype=n.dtype, device="meta") for n in nodes], **attrs)
    except (RuntimeError, TypeError, ValueError) as e:
        kinds = ", ".join(("python " + {torch.float64: "float", torch.int64: "int", torch.bool: "bool"}[n.dtype])
                          if n.weak else str(n.dtype).replace("torch.", "") for n in nodes)
        raise TypeError(f"{where}: {_display(op)} does not accept ({kinds}): {str(e).splitlines()[0]}") from None
    if all_weak and op != "cast":
        dt = torch.float64 if r.dtype.is_floating_point else (torch.bool if r.dtype == torch.bool else torch.int64)
        return dt, True, False
    if r.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{where}: {_display(op)} gives {r.dtype}, which fused kernels do not support")
    return r.dtype, False, r.dim() == 0


# ---------------------------------------------------------------------------
# Programs: a graph with its argument and output lists
# ---------------------------------------------------------------------------
@dataclass
class Program:
    """What one kernel computes: ``outputs`` from tensor ``inputs`` and scalar
    parameters ``scalars`` (node ids, in kernel-argument order)."""

    name: str
    graph: Graph
    inputs: list[int]
    scalars: list[int]
    outputs: list[int]
    out_dtypes: list[torch.dtype] = field(default_factory=list)
    multi: bool = False  # the function returned a tuple

    def __post_init__(self):
        if not self.out_dtypes:
            self.out_dtypes = [self.graph.nodes[i].dtype for i in self.outputs]

    def order(self) -> list[Node]:
        """The nodes the outputs need, operands first."""
        need: set[int] = set()
        stack = list(self.outputs)
        while stack:
            i = stack.pop()
            if i not in need:
                need.add(i)
                stack.extend(self.graph.nodes[i].args)
        return [self.graph.nodes[i] for i in sorted(need)]

    def signature(self) -> str:
        """A text that identifies the computation (the kernel cache key)."""
        lines = []
        for n in self.order():
            lines.append(f"{n.id}={n.op}{n.args}{n.attrs}:{n.dtype}:{int(n.weak)}{int(n.dim0)}")
        lines.append(f"in={[self.graph.nodes[i].dtype for i in self.inputs]}")
        lines.append(f"sc={[self.graph.nodes[i].dtype for i in self.scalars]}")
        lines.append(f"out={self.outputs}:{self.out_dtypes}")
        return "\n".join(lines)


def evaluate(program: Program, tensors, scalars, *, upcast: bool = False) -> list[torch.Tensor]:
    """The reference path: the DAG evaluated node by node with torch eager.

    With ``upcast`` floating tensors are computed in float64 (the test oracle).
    Results have the broadcast shape and the program's output dtypes.
    """
    g = program.graph
    vals: dict[int, Any] = {}
    for n in program.order():
        if n.op == "input":
            t = tensors[n.value]
            vals[n.id] = t.double() if upcast and t.is_floating_point() else t
        elif n.op == "scalar":
            vals[n.id] = scalars[n.value]
        elif n.op == "const":
            vals[n.id] = n.value
        else:
            args = [vals[i] for i in n.args]
            attrs = dict(n.attrs)
            if not any(isinstance(a, torch.Tensor) for a in args):
                # Only Python numbers: compute on 0-dim tensors (float64 for floats).
                args = [torch.tensor(a, dtype=torch.float64 if isinstance(a, float) else None) for a in args]
                r = PRIMS[n.op](*args, **attrs)
                vals[n.id] = r.item() if n.weak else r
                continue
            if n.op == "cast" and upcast and attrs["dtype"].is_floating_point:
                # The rounding a cast does is part of the semantics; keep it, then go on in float64.
                vals[n.id] = args[0].to(attrs["dtype"]).double()
                continue
            vals[n.id] = PRIMS[n.op](*args, **attrs)
    shape = torch.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()
    device = tensors[0].device if tensors else torch.device("cpu")
    outs = []
    for i, dt in zip(program.outputs, program.out_dtypes):
        v = vals[i]
        dt = torch.float64 if upcast and dt.is_floating_point else dt
        out = torch.empty(shape, dtype=dt, device=device)
        out.copy_(v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=dt, device=device))
        outs.append(out)
    return outs


# ---------------------------------------------------------------------------
# Tracing
# ---------------------------------------------------------------------------
class Tracer:
    """Builds one graph from one call of the user's function."""

    def __init__(self, name: str, graph: Graph | None = None):
        self.name = name
        self.where = f"opforge.fuse({name})"
        self.graph = graph or Graph()

    def proxy(self, node_id: int) -> "Proxy":
        return Proxy(self, node_id)

    def operand(self, x) -> int:
        if isinstance(x, Proxy):
            if x._tracer is not self:
                raise TypeError(f"{self.where}: a traced value from another fused function was used")
            return x._node
        if isinstance(x, (bool, int, float)):
            if isinstance(x, float) or isinstance(x, bool) or -(2**63) <= x < 2**63:
                return self.graph.const(x)
            raise TypeError(f"{self.where}: the integer constant {x} does not fit in int64")
        if isinstance(x, torch.Tensor):
            raise TypeError(f"{self.where}: a tensor that is not an argument of the function was used "
                            f"(e.g. a global or closed-over tensor); pass it as an argument")
        raise TypeError(f"{self.where}: cannot use a {type(x).__name__} in a fused expression")

    def apply(self, op: str, *operands, **attrs) -> "Proxy":
        ids = tuple(self.operand(o) for o in operands)
        return self.proxy(self.graph.apply(op, ids, self.where, **attrs))

    def call(self, func, args, kwargs) -> Any:
        handler = HANDLERS.get(func)
        if handler is None:
            raise TypeError(f"{self.where}: {_func_name(func)} is not an elementwise operation that fuse "
                            f"supports (reductions, indexing, shape and in-place operations are not)")
        return handler(self, *args, **(kwargs or {}))


def _func_name(func) -> str:
    mod = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if name.startswith("_VariableFunctionsClass."):
        return "torch." + name.split(".", 1)[1]
    if mod.startswith("torch._C._nn") or mod == "torch.nn.functional":
        return f"torch.nn.functional.{getattr(func, '__name__', name)}"
    if mod.startswith("torch._C") or not mod:
        return f"torch.{name}" if not name.startswith(("Tensor", "_TensorBase", "TensorBase")) else name
    return f"{mod}.{name}"


class Proxy:
    """A traced value. Supports ``__torch_function__``, Python operators and
    the common tensor methods; anything that needs a concrete value (``bool``,
    indexing, shapes) raises ``TypeError``."""

    __slots__ = ("_tracer", "_node")

    def __init__(self, tracer: Tracer, node: int):
        self._tracer = tracer
        self._node = node

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = next(a._tracer for a in _flat(args, kwargs) if isinstance(a, Proxy))
        return tracer.call(func, args, kwargs)

    @property
    def dtype(self) -> torch.dtype:
        n = self._tracer.graph.nodes[self._node]
        if n.weak:
            raise TypeError(f"{self._tracer.where}: a Python number argument has no dtype")
        return n.dtype

    def __repr__(self) -> str:
        n = self._tracer.graph.nodes[self._node]
        return f"Proxy(%{n.id} = {n.op}, {n.dtype})"

    # Operators ------------------------------------------------------------
    def __add__(self, o): return self._tracer.apply("add", self, o)
    def __radd__(self, o): return self._tracer.apply("add", o, self)
    def __sub__(self, o): return self._tracer.apply("sub", self, o)
    def __rsub__(self, o): return self._tracer.apply("sub", o, self)
    def __mul__(self, o): return self._tracer.apply("mul", self, o)
    def __rmul__(self, o): return self._tracer.apply("mul", o, self)
    def __truediv__(self, o): return self._tracer.apply("div", self, o)
    def __rtruediv__(self, o): return self._tracer.apply("div", o, self)
    def __pow__(self, o): return _pow(self._tracer, self, o)
    def __rpow__(self, o): return _pow(self._tracer, o, self)
    def __neg__(self): return self._tracer.apply("neg", self)
    def __pos__(self): return self
    def __abs__(self): return self._tracer.apply("abs", self)
    def __invert__(self): return self._tracer.apply("invert", self)
    def __and__(self, o): return self._tracer.apply("and", self, o)
    def __rand__(self, o): return self._tracer.apply("and", o, self)
    def __or__(self, o): return self._tracer.apply("or", self, o)
    def __ror__(self, o): return self._tracer.apply("or", o, self)
    def __xor__(self, o): return self._tracer.apply("xor", self, o)
    def __rxor__(self, o): return self._tracer.apply("xor", o, self)
    def __eq__(self, o): return self._tracer.apply("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return self._tracer.apply("ne", self, o)  # type: ignore[override]
    def __lt__(self, o): return self._tracer.apply("lt", self, o)
    def __le__(self, o): return self._tracer.apply("le", self, o)
    def __gt__(self, o): return self._tracer.apply("gt", self, o)
    def __ge__(self, o): return self._tracer.apply("ge", self, o)
    __hash__ = object.__hash__

    def _refuse(self, what: str):
        raise TypeError(f"{self._tracer.where}: {what} on a traced tensor is not supported")

    def __bool__(self): self._refuse("data-dependent Python control flow (bool())")
    def __int__(self): self._refuse("int()")
    def __float__(self): self._refuse("float()")
    def __index__(self): self._refuse("use as an index")
    def __len__(self): self._refuse("len()")
    def __iter__(self): self._refuse("iteration")
    def __getitem__(self, k): self._refuse("indexing")
    def __setitem__(self, k, v): self._refuse("indexed assignment (an in-place operation)")

    def _inplace(self, *a):
        self._refuse("an in-place operator")

    __iadd__ = __isub__ = __imul__ = __itruediv__ = __ipow__ = __iand__ = __ior__ = __ixor__ = _inplace

    def __getattr__(self, name: str):
        method = METHODS.get(name)
        if method is not None:
            return lambda *a, **k: method(self._tracer, self, *a, **k)
        if name.endswith("_") and not name.startswith("_"):
            self._refuse(f"the in-place method .{name}()")
        if name.startswith("__"):
            raise AttributeError(name)
        if callable(getattr(torch.Tensor, name, None)):
            raise TypeError(f"{self._tracer.where}: Tensor.{name} is not an elementwise operation that fuse "
                            f"supports (reductions, indexing, shape and in-place operations are not)")
        self._refuse(f".{name}")


def _flat(args, kwargs):
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


# ---------------------------------------------------------------------------
# Handlers: torch callables and tensor methods -> primitives
# ---------------------------------------------------------------------------
def _pow(t: Tracer, a, b):
    return t.apply("pow", a, b)


def _add(t, a, b, *, alpha=1, out=None):
    _no_out(t, out)
    return t.apply("add", a, b if alpha == 1 else t.apply("mul", b, alpha))


def _sub(t, a, b, *, alpha=1, out=None):
    _no_out(t, out)
    return t.apply("sub", a, b if alpha == 1 else t.apply("mul", b, alpha))


def _div(t, a, b, *, rounding_mode=None, out=None):
    _no_out(t, out)
    if rounding_mode is not None:
        raise TypeError(f"{t.where}: torch.div with rounding_mode={rounding_mode!r} is not supported")
    return t.apply("div", a, b)


def _no_out(t, out):
    if out is not None:
        raise TypeError(f"{t.where}: out= (an in-place write) is not supported")


def _binary(op):
    def h(t, a, b, *, out=None):
        _no_out(t, out)
        return t.apply(op, a, b)
    return h


def _reversed(op):
    return lambda t, a, b: t.apply(op, b, a)


def _unary(op):
    def h(t, a, *, out=None, inplace=False):
        _no_out(t, out)
        if inplace:
            raise TypeError(f"{t.where}: inplace=True is not supported")
        return t.apply(op, a)
    return h


def _gelu(t, a, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise TypeError(f"{t.where}: gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return t.apply("gelu", a, approximate=approximate)


def _where(t, cond, a=None, b=None):
    if a is None or b is None:
        raise TypeError(f"{t.where}: torch.where(cond) (nonzero indices) is not elementwise")
    return t.apply("where", cond, a, b)


def _clamp(t, a, min=None, max=None, *, out=None):
    _no_out(t, out)
    if min is None and max is None:
        raise TypeError(f"{t.where}: torch.clamp needs min or max")
    bounds = [x for x in (min, max) if x is not None]
    return t.apply("clamp", a, *bounds, has_lo=min is not None, has_hi=max is not None)


def _cast_to(t, a, dtype):
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{t.where}: only .to(dtype) is supported while tracing, got {dtype!r}")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{t.where}: dtype {dtype} is not supported by fused kernels")
    return t.apply("cast", a, dtype=dtype)


def _to(t, a, *args, **kwargs):
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("copy", None)
    for x in args:
        if isinstance(x, torch.dtype):
            dtype = x
        elif isinstance(x, Proxy):
            dtype = x.dtype
        else:
            raise TypeError(f"{t.where}: .to({x!r}) is not supported while tracing; only dtype casts are")
    if kwargs or dtype is None:
        raise TypeError(f"{t.where}: only .to(dtype) is supported while tracing")
    return _cast_to(t, a, dtype)


def _type(t, a, dtype=None, **kwargs):
    if dtype is None:
        raise TypeError(f"{t.where}: .type() without a dtype returns a string; not supported")
    return _cast_to(t, a, dtype)


def _caster(dtype):
    return lambda t, a, **kw: _cast_to(t, a, dtype)


def _logical_not(t, a, *, out=None):
    _no_out(t, out)
    return t.apply("eq", a, False if t.graph.nodes[t.operand(a)].dtype == torch.bool else 0)


def _logical(op):
    def h(t, a, b, *, out=None):
        _no_out(t, out)
        return t.apply(op, t.apply("ne", a, 0), t.apply("ne", b, 0))
    return h


T = torch.Tensor
HANDLERS: dict[Any, Callable] = {}


def _register(handler, *funcs):
    for f in funcs:
        HANDLERS[f] = handler


_register(_add, torch.add, T.add, T.__add__)
_register(_reversed("add"), T.__radd__)
_register(_sub, torch.sub, torch.subtract, T.sub, T.__sub__)
_register(_reversed("sub"), T.__rsub__)
_register(_binary("mul"), torch.mul, torch.multiply, T.mul, T.__mul__)
_register(_reversed("mul"), T.__rmul__)
_register(_div, torch.div, torch.divide, T.div, T.__truediv__)
_register(_binary("div"), torch.true_divide)
_register(_reversed("div"), T.__rtruediv__)
_register(_binary("pow"), torch.pow, T.pow, T.__pow__)
_register(_reversed("pow"), T.__rpow__)
for _op, _fns in {
    "eq": (torch.eq, T.eq, T.__eq__), "ne": (torch.ne, torch.not_equal, T.ne, T.__ne__),
    "lt": (torch.lt, torch.less, T.lt, T.__lt__), "le": (torch.le, torch.less_equal, T.le, T.__le__),
    "gt": (torch.gt, torch.greater, T.gt, T.__gt__), "ge": (torch.ge, torch.greater_equal, T.ge, T.__ge__),
    "and": (torch.bitwise_and, T.__and__, T.bitwise_and), "or": (torch.bitwise_or, T.__or__, T.bitwise_or),
    "xor": (torch.bitwise_xor, T.__xor__, T.bitwise_xor),
    "maximum": (torch.maximum, T.maximum), "minimum": (torch.minimum, T.minimum),
}.items():
    _register(_binary(_op), *_fns)
_register(_reversed("and"), T.__rand__)
_register(_reversed("or"), T.__ror__)
_register(_reversed("xor"), T.__rxor__)
_register(_logical("and"), torch.logical_and, T.logical_and)
_register(_logical("or"), torch.logical_or, T.logical_or)
_register(_logical("xor"), torch.logical_xor, T.logical_xor)
_register(_logical_not, torch.logical_not, T.logical_not)
for _op, _fns in {
    "neg": (torch.neg, torch.negative, T.neg, T.__neg__), "abs": (torch.abs, torch.absolute, T.abs, T.__abs__),
    "invert": (torch.bitwise_not, T.bitwise_not, T.__invert__), "sign": (torch.sign, T.sign),
    "exp": (torch.exp, T.exp), "log": (torch.log, T.log), "log1p": (torch.log1p, T.log1p),
    "expm1": (torch.expm1, torch.special.expm1, T.expm1), "sqrt": (torch.sqrt, T.sqrt),
    "rsqrt": (torch.rsqrt, T.rsqrt), "sigmoid": (torch.sigmoid, torch.special.expit, F.sigmoid, T.sigmoid),
    "tanh": (torch.tanh, F.tanh, T.tanh), "erf": (torch.erf, torch.special.erf, T.erf),
    "relu": (torch.relu, F.relu, T.relu), "silu": (F.silu,),
}.items():
    _register(_unary(_op), *_fns)
_register(lambda t, a, *, out=None: t.apply("mul", a, a), torch.square, T.square)
_register(lambda t, a, *, out=None: t.apply("div", 1, a) if not t.graph.nodes[t.operand(a)].dtype.is_floating_point
          else t.apply("div", 1.0, a), torch.reciprocal, T.reciprocal)
_register(_gelu, F.gelu)
_register(_where, torch.where, T.where)
_register(_clamp, torch.clamp, torch.clip, T.clamp, T.clip)
_register(lambda t, a, min, **kw: _clamp(t, a, min=min, **kw), torch.clamp_min, T.clamp_min)
_register(lambda t, a, max, **kw: _clamp(t, a, max=max, **kw), torch.clamp_max, T.clamp_max)
_register(_to, T.to)
_register(_type, T.type)
_register(lambda t, a, other: _cast_to(t, a, other.dtype), T.type_as)

# Tensor methods reached through attribute access on a proxy.
METHODS: dict[str, Callable] = {
    "add": _add, "sub": _sub, "mul": _binary("mul"), "div": _div, "true_divide": _binary("div"),
    "pow": _binary("pow"), "eq": _binary("eq"), "ne": _binary("ne"), "lt": _binary("lt"), "le": _binary("le"),
    "gt": _binary("gt"), "ge": _binary("ge"), "maximum": _binary("maximum"), "minimum": _binary("minimum"),
    "bitwise_and": _binary("and"), "bitwise_or": _binary("or"), "bitwise_xor": _binary("xor"),
    "logical_and": _logical("and"), "logical_or": _logical("or"), "logical_xor": _logical("xor"),
    "logical_not": _logical_not, "bitwise_not": _unary("invert"),
    "neg": _unary("neg"), "abs": _unary("abs"), "sign": _unary("sign"), "exp": _unary("exp"),
    "log": _unary("log"), "log1p": _unary("log1p"), "expm1": _unary("expm1"), "sqrt": _unary("sqrt"),
    "rsqrt": _unary("rsqrt"), "sigmoid": _unary("sigmoid"), "tanh": _unary("tanh"), "erf": _unary("erf"),
    "relu": _unary("relu"), "square": HANDLERS[torch.square], "reciprocal": HANDLERS[torch.reciprocal],
    "where": lambda t, a, cond, other: t.apply("where", cond, a, other),
    "clamp": _clamp, "clip": _clamp, "clamp_min": HANDLERS[torch.clamp_min], "clamp_max": HANDLERS[torch.clamp_max],
    "to": _to, "type": _type, "type_as": HANDLERS[T.type_as],
    "float": _caster(torch.float32), "double": _caster(torch.float64), "half": _caster(torch.float16),
    "bfloat16": _caster(torch.bfloat16), "int": _caster(torch.int32), "long": _caster(torch.int64),
    "short": _caster(torch.int16), "char": _caster(torch.int8), "byte": _caster(torch.uint8),
    "bool": _caster(torch.bool),
}

ARG_SCALAR_TYPES = (bool, int, float)


def trace(fn: Callable, name: str, spec: tuple) -> Program:
    """Trace ``fn`` for ``spec``: one entry per argument, ``("T", dtype, dim0)``
    for a tensor, ``("S", type)`` for a number, ``("C", value)`` for anything
    else (passed through unchanged: a static argument such as a string)."""
    tracer = Tracer(name)
    g = tracer.graph
    args, inputs, scalars = [], [], []
    for entry in spec:
        if entry[0] == "T":
            nid = g.input(len(inputs), entry[1], entry[2])
            inputs.append(nid)
            args.append(tracer.proxy(nid))
        elif entry[0] == "S":
            nid = g.scalar(len(scalars), entry[1])
            scalars.append(nid)
            args.append(tracer.proxy(nid))
        else:
            args.append(entry[1])
    result = fn(*args)
    many = isinstance(result, (tuple, list))
    results = list(result) if many else [result]
    if not results:
        raise TypeError(f"{tracer.where}: the function returned no outputs")
    outputs = []
    for r in results:
        if isinstance(r, Proxy) and r._tracer is tracer:
            node = g.nodes[r._node]
            if node.weak:
                raise TypeError(f"{tracer.where}: an output depends only on Python numbers; "
                                f"outputs must be tensor expressions")
            outputs.append(r._node)
        else:
            raise TypeError(f"{tracer.where}: outputs must be tensor expressions of the arguments, "
                            f"got {type(r).__name__}")
    if not inputs:
        raise TypeError(f"{tracer.where}: the function has no tensor arguments")
    return Program(name, g, inputs, scalars, outputs, multi=many)
