"""The operator registry: every op, its reference, and its variants.

An op is a name (``opforge::<name>``), a reference implementation in plain
torch (the CPU fallback, the test oracle and the statement of semantics), and
an ordered list of variants. A variant declares what it supports; dispatch
(``runtime.dispatch``) picks among the supported ones.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

Config = dict[str, Any]

NAMESPACE = "opforge"


@dataclass
class Variant:
    """One way to compute an op: a Triton kernel, a vendor call, or the reference.

    ``run(config, *args)`` computes the op. ``check(*args)`` returns ``None``
    when the variant can take these arguments, else a short reason. The
    declarative fields (devices, dtypes, min_capability) are checked by
    dispatch before ``check`` so that every rejection reads the same way.
    Tuning calls ``run`` many times on the caller's own arguments, so a
    variant must not modify its inputs.
    """

    name: str
    run: Callable[..., Any]
    kind: str = "triton"  # "triton" | "vendor" | "reference"
    version: str = "1"
    devices: tuple[str, ...] = ("cuda",)
    dtypes: frozenset[torch.dtype] | None = None  # None: any dtype
    min_capability: tuple[int, int] = (0, 0)
    check: Callable[..., str | None] = lambda *args: None
    configs: Callable[..., Sequence[Config]] = lambda *args: ({},)
    default_config: Callable[..., Config] = lambda *args: {}
    bucket: Callable[..., str] = lambda *args: ""
    description: str = ""

    # Set for a family's variant (``register_family``): its ``Spec``, whose
    # callables take the op's geometry, so dispatch computes it once a call.
    spec: "Spec | None" = None

    @property
    def interpretable(self) -> bool:
        return self.kind == "triton"


def _no_reason(g) -> None:
    return None


def _no_configs(g) -> tuple[Config, ...]:
    return ({},)


def _empty_config(g) -> Config:
    return {}


def _no_bucket(g) -> str:
    return ""


@dataclass(frozen=True)
class Spec:
    """A variant of a family, declared once at module level.

    ``run(g, cfg, *args)`` computes the op; ``check(g)``, ``configs(g)``,
    ``default_config(g)`` and ``bucket(g)`` see only the geometry ``g`` (the
    op's ``geometry(*args)``): a decision that depends on nothing else is one
    the memo key (which determines the geometry) may stand for. The other
    fields are ``Variant``'s.
    """

    name: str
    run: Callable[..., Any]
    kind: str = "triton"
    version: str = "1"
    devices: tuple[str, ...] = ("cuda",)
    dtypes: frozenset[torch.dtype] | None = None
    min_capability: tuple[int, int] = (0, 0)
    check: Callable[[Any], str | None] = _no_reason
    configs: Callable[[Any], Sequence[Config]] = _no_configs
    default_config: Callable[[Any], Config] = _empty_config
    bucket: Callable[[Any], str] = _no_bucket
    description: str = ""

    def bind(self, geometry: Callable[..., Any]) -> Variant:
        """The ``Variant`` whose callables take ``*args`` (tuning, warmup,
        tests): each computes the geometry itself; dispatch uses ``spec``."""
        spec = self
        return Variant(
            self.name, lambda cfg, *a: spec.run(geometry(*a), cfg, *a), self.kind, self.version, self.devices,
            self.dtypes, self.min_capability, check=lambda *a: spec.check(geometry(*a)),
            configs=lambda *a: spec.configs(geometry(*a)),
            default_config=lambda *a: spec.default_config(geometry(*a)),
            bucket=lambda *a: spec.bucket(geometry(*a)), description=self.description, spec=self)


@dataclass
class Op:
    """A registered operator.

    ``tensors(*args)`` lists the tensor arguments (for device and dtype
    checks); ``memo_key(*args)`` is the cheap key that dispatch memoizes on;
    ``dtype_key(*args)`` names the dtypes in the tuning key; ``validate(*args)``
    raises a clear error for bad input (dispatch calls it once per memo key);
    ``samples(device)`` gives random inputs that reach every variant (selftest).
    ``geometry(*args)``, for a family (``register_family``), is the shape facts
    its variants decide and run on, computed once a call by dispatch.
    """

    name: str
    reference: Callable[..., Any]
    tensors: Callable[..., Sequence[torch.Tensor]]
    memo_key: Callable[..., tuple]
    dtype_key: Callable[..., str]
    variants: list[Variant] = field(default_factory=list)
    validate: Callable[..., None] = lambda *args: None  # raises TypeError/ValueError
    samples: Callable[[torch.device], list[tuple]] = lambda device: []  # selftest inputs
    doc: str = ""
    geometry: Callable[..., Any] | None = None

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"{self.qualname} has no variant {name!r}; it has {[v.name for v in self.variants]}")


_OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    if op.name in _OPS:
        raise ValueError(f"op {op.qualname} is already registered")
    names = [v.name for v in op.variants]
    if len(set(names)) != len(names):
        raise ValueError(f"op {op.qualname} has duplicate variant names: {names}")
    _OPS[op.name] = op
    return op


def register_family(
    names: Sequence[str],
    specs: Callable[[str], Sequence[Spec]],
    *,
    geometry: Callable[[str], Callable[..., Any]],
    **fields: Callable[[str], Any],
) -> dict[str, Op]:
    """Register one op per name of a family whose variants are ``Spec``s.

    Every argument is a function of the op's name: ``specs(name)`` lists its
    variants in dispatch order, ``geometry(name)`` its geometry function, and
    each keyword gives that ``Op`` field (``reference``, ``tensors``,
    ``memo_key``, ``dtype_key``, ``validate``, ``samples``, ``doc``).
    """
    ops = {}
    for name in names:
        geom = geometry(name)
        ops[name] = register(Op(name=name, variants=[s.bind(geom) for s in specs(name)], geometry=geom,
                                **{k: f(name) for k, f in fields.items()}))
    return ops


def register_op(name: str, specs: Sequence[Spec], *, geometry: Callable[..., Any], **fields: Any) -> Op:
    """Register a family of one op: ``register_family`` with the variants and
    the ``Op`` fields given as values rather than as functions of the name."""
    return register_family((name,), lambda n: specs, geometry=lambda n: geometry,
                           **{k: (lambda n, v=v: v) for k, v in fields.items()})[name]


def get(name: str) -> Op:
    key = name.split("::", 1)[1] if name.startswith(NAMESPACE + "::") else name
    _load_ops()
    try:
        return _OPS[key]
    except KeyError:
        raise KeyError(f"no op named {name!r}; registered: {sorted(_OPS)}") from None


def all_ops() -> list[Op]:
    _load_ops()
    return [_OPS[k] for k in sorted(_OPS)]


# Importing this package registers the ops. Named, not imported: the ops
# import the registry, and the runtime must not import the API built on it.
OPS_PACKAGE = "opforge.ops"


def _load_ops() -> None:
    if OPS_PACKAGE not in sys.modules:
        importlib.import_module(OPS_PACKAGE)
