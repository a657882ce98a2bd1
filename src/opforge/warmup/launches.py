"""Record the kernel specializations a workload launches.

Triton compiles one binary per *specialization* of a kernel: the constexpr
values, the type of each runtime argument (a pointer's element dtype, an int's
width), the two facts it derives from argument values (a pointer 16-byte
aligned, an int divisible by 16, an int equal to 1 -- which becomes a
constant), and the launch options (``num_warps``, ``num_stages``...). That
tuple is what a warm-up must reproduce to leave the first real launch a cache
hit, so it is what is recorded here.

Every opforge kernel is launched as ``kernel[grid](...)``, which calls
``run`` on a ``triton.JITFunction`` (compiled) or an
``InterpretedFunction`` (``TRITON_INTERPRET=1``, the test suite): while a
:class:`LaunchRecorder` is active both ``run`` methods are wrapped, so one place
sees all launches and no kernel module changes. The specialization is computed
with Triton's own binder (``create_function_from_signature`` and
``native_specialize_impl``, the code ``JITFunction.run`` uses), so it is the
same under the interpreter, where nothing is compiled, as on a GPU.

Kernels generated from source (``opforge.fuse``: modules
``opforge_fused_<hash>``) are named by that module; the recorder keeps their
source text, from which :func:`opforge.fusion.compiler.load` rebuilds them.
"""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from opforge.runtime import launch

GENERATED_PREFIX = "opforge_fused_"


@dataclass(frozen=True)
class Specialization:
    """One compiled variant of one kernel.

    ``signature``: runtime parameter -> ``"*fp32:D"`` (pointer to fp32,
    16-byte aligned), ``"*fp32"`` (not aligned), ``"i32:D"`` / ``"i32"`` /
    ``"i64"`` (an int, ``:D`` when divisible by 16), ``"1"`` (an int equal to 1),
    ``"None"``, ``"fp32"`` (a Python float), ``"u1"`` (a bool).
    ``constexprs``: constexpr parameter -> value (``"tl.float32"`` for a Triton
    dtype). ``options``: the launch's keyword options, as given.
    """

    kernel: str  # "module:qualname"
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "signature": dict(self.signature), "constexprs": dict(self.constexprs),
                "options": dict(self.options)}

    @classmethod
    def from_json(cls, d: dict) -> "Specialization":
        return cls(d["kernel"], tuple(d["signature"].items()), tuple(d["constexprs"].items()),
                   tuple(sorted(d.get("options", {}).items())))

    def key(self) -> str:
        """A stable text key (sorting, set membership across processes)."""
        return json.dumps(self.to_json(), sort_keys=True)

    @property
    def module(self) -> str:
        return self.kernel.partition(":")[0]

    @property
    def generated(self) -> bool:
        return self.module.startswith(GENERATED_PREFIX)


# ---------------------------------------------------------------------------
# specialization of one launch, by Triton's own binder
# ---------------------------------------------------------------------------
_binders: dict[Any, tuple] = {}
_binders_lock = threading.Lock()


def kernel_name(kernel) -> str:
    fn = kernel.fn
    return f"{fn.__module__}:{fn.__qualname__}"


def _options_of(kernel) -> tuple[list, list]:
    """``do_not_specialize`` and ``do_not_specialize_on_alignment`` of a
    ``JITFunction`` or an ``InterpretedFunction`` (which keeps the decorator's kwargs)."""
    extra = getattr(kernel, "kwargs", {}) or {}
    dns = getattr(kernel, "do_not_specialize", None) or extra.get("do_not_specialize") or []
    dnsoa = getattr(kernel, "do_not_specialize_on_alignment", None) or \
        extra.get("do_not_specialize_on_alignment") or []
    return list(dns), list(dnsoa)


def binder_of(kernel):
    """(binder, params) for ``kernel``: Triton's argument binder built for the
    base backend (the CUDA backend specializes arguments the same way)."""
    fn = kernel.fn
    got = _binders.get(fn)
    if got is not None:
        return got
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    sig = inspect.signature(fn)
    dns, dnsoa = _options_of(kernel)
    params = [KernelParam(i, p, i in dns or p.name in dns, i in dnsoa or p.name in dnsoa)
              for i, p in enumerate(sig.parameters.values())]
    got = (create_function_from_signature(sig, params, BaseBackend), params)
    with _binders_lock:
        _binders[fn] = got
    return got


def encode_constexpr(value) -> Any:
    """A JSON value for a constexpr argument (a Triton dtype as ``"tl.<name>"``)."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tl.dtype):
        return f"tl.{value.name}"
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    raise TypeError(f"cannot record constexpr value {value!r} ({type(value).__name__})")


def decode_constexpr(value) -> Any:
    import triton.language as tl

    if isinstance(value, str) and value.startswith("tl."):
        return getattr(tl, value[3:])
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def _argument_class(name: str, spec: tuple) -> str:
    ty, attr = spec
    if ty == "constexpr":  # an int equal to 1, or None: Triton folds it into the kernel
        if attr is None or attr == 1:
            return str(attr)
        raise TypeError(f"argument {name}: unexpected constant specialization {attr!r}")
    if not isinstance(ty, str):
        raise TypeError(f"argument {name}: tuple arguments are not recorded ({ty!r})")
    return ty + (":D" if attr == "D" else "")


def specialize(kernel, args: tuple, kwargs: dict) -> Specialization:
    """The specialization ``kernel[grid](*args, **kwargs)`` compiles."""
    binder, params = binder_of(kernel)
    bound, spec, options = binder(*args, **kwargs)
    signature, constexprs = [], []
    for p, s in zip(params, spec):
        if p.is_constexpr:
            constexprs.append((p.name, encode_constexpr(bound[p.name])))
        else:
            signature.append((p.name, _argument_class(p.name, s)))
    opts = tuple(sorted((k, v) for k, v in options.items() if k not in ("debug", "instrumentation_mode")))
    return Specialization(kernel_name(kernel), tuple(signature), tuple(constexprs), opts)


def generated_source(kernel) -> str | None:
    """The source text of a generated (``opforge.fuse``) kernel's module, else None."""
    module = kernel.fn.__module__
    if not module.startswith(GENERATED_PREFIX):
        return None
    import sys

    with open(sys.modules[module].__file__) as f:
        return f.read()


# ---------------------------------------------------------------------------
# the recorder
# ---------------------------------------------------------------------------
@dataclass
class LaunchRecorder:
    """``with LaunchRecorder() as rec: ...`` records every kernel launch inside.

    ``specializations``: key -> :class:`Specialization`; ``sources``: module
    name -> source of generated kernels; ``failures``: launches whose
    specialization could not be derived (the launch itself still runs).
    Recorders nest and may be used from several threads.
    """

    specializations: dict[str, Specialization] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    launches: int = 0

    def add(self, kernel, args: tuple, kwargs: dict) -> None:
        try:
            s = specialize(kernel, args, kwargs)
            src = generated_source(kernel) if s.generated and s.module not in self.sources else None
        except Exception as e:  # recording never breaks the workload
            self.failures.append(f"{kernel_name(kernel)}: {type(e).__name__}: {e}")
            return
        with _lock:
            self.launches += 1
            self.specializations.setdefault(s.key(), s)
            if src is not None:
                self.sources[s.module] = src

    def __enter__(self) -> "LaunchRecorder":
        # every launch through JITFunction.run, where it is recorded: a pre-bound
        # launcher (runtime/launch.py) calls a compiled kernel it has seen directly
        self._jit_only = launch.jit_run_only()
        self._jit_only.__enter__()
        with _lock:
            if not _active:
                _install()
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)
            if not _active:
                _uninstall()
        self._jit_only.__exit__(None, None, None)


_lock = threading.RLock()
_active: list[LaunchRecorder] = []
_originals: dict[type, Any] = {}


def _kernel_classes() -> list[type]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return [JITFunction, InterpretedFunction]


def _wrap(original):
    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            for rec in list(_active):
                rec.add(self, args, kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__wrapped__ = original
    return run


def _install() -> None:
    for cls in _kernel_classes():
        _originals[cls] = cls.__dict__["run"]
        cls.run = _wrap(_originals[cls])


def _uninstall() -> None:
    for cls, original in _originals.items():
        cls.run = original
    _originals.clear()
