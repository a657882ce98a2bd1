"""Compile manifest entries into Triton's on-disk cache, in parallel, launching nothing.

Each entry becomes stand-in arguments that Triton specializes exactly as the
recorded launch (a pointer stand-in with the element dtype and an aligned or
unaligned address, ints 16 / 17 / 2**32 / 1 ... for the int classes), checked
against the entry with Triton's binder before compiling, and then:

* on a GPU: ``kernel.warmup(*stand_ins, grid=(1,), **options)``, the public
  path, which computes the cache key and writes ``TRITON_CACHE_DIR`` exactly as
  the first real launch would (so that launch becomes a cache hit);
* with ``arch`` (no GPU needed): ``triton.compile`` for ``GPUTarget("cuda",
  arch, 32)`` -- the same LLVM and ``ptxas`` work, which checks that every
  entry compiles and lets CPU-only machines measure compile time.

Workers are processes (``spawn``): a compile spends a good part of its time in
Python (the AST walk, MLIR pass set-up), so threads in one process serialize on
the GIL (see ``benchmarks/warmup_first_run.py``, which measures both).
Entries are handed out one at a time, so a slow kernel (GEMM, attention) does
not leave the other workers idle.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from opforge.warmup.launches import Specialization, binder_of, decode_constexpr, specialize


@dataclass
class CompileResult:
    key: str
    kernel: str
    seconds: float
    error: str = ""


# ---------------------------------------------------------------------------
# stand-in arguments
# ---------------------------------------------------------------------------
class PointerStandIn:
    """What Triton reads of a tensor argument: its dtype and whether its address is 16-byte aligned."""

    def __init__(self, dtype, aligned: bool):
        self.dtype = dtype
        self._ptr = 0 if aligned else 8
        self.shape = [1]

    def data_ptr(self) -> int:
        return self._ptr

    def stride(self):
        return (1,)

    @staticmethod
    def ptr_range() -> int:
        return 0


_INTS = {"i32": (16, 17), "i64": (2**32, 2**32 + 1), "u64": (2**63, 2**64 - 1)}
_pointer_dtypes: dict[str, object] = {}


def _pointer_dtype(name: str):
    """torch dtype for a Triton pointer element type (``fp32``, ``bf16``, ``u1``, ``fp8e4nv``...)."""
    if not _pointer_dtypes:
        import torch
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        for dt in vars(torch).values():
            if isinstance(dt, torch.dtype):
                try:
                    ty, _ = native_specialize_impl(BaseBackend, PointerStandIn(dt, True), False, True, True)
                except Exception:  # noqa: S112 - dtypes Triton has no type for
                    continue
                _pointer_dtypes.setdefault(ty[1:], dt)
    try:
        return _pointer_dtypes[name]
    except KeyError:
        raise ValueError(f"no torch dtype for Triton pointer type *{name}") from None


def stand_in(cls: str):
    """A value Triton specializes to the argument class ``cls`` (see ``Specialization``)."""
    ty, _, attr = cls.partition(":")
    aligned = attr == "D"
    if ty.startswith("*"):
        return PointerStandIn(_pointer_dtype(ty[1:]), aligned)
    if ty == "1":
        return 1
    if ty == "None":
        return None
    if ty in _INTS:
        return _INTS[ty][0 if aligned else 1]
    if ty in ("u1", "i1"):
        return True
    if ty.startswith(("fp", "bf")):
        return 1.5
    raise ValueError(f"no stand-in for argument class {cls!r}")


def resolve_kernel(spec: Specialization, sources: dict[str, str]):
    """The ``triton.jit`` object an entry names (a generated one rebuilt from its source)."""
    module, _, qual = spec.kernel.partition(":")
    if spec.generated:
        from opforge.fusion import compiler

        if module not in sources:
            raise ValueError(f"{spec.kernel}: the manifest lacks the source of this generated kernel")
        mod = compiler.load(sources[module])
        if mod.__name__ != module:
            raise ValueError(f"{spec.kernel}: its recorded source hashes to {mod.__name__}")
        return getattr(mod, qual)
    from opforge.runtime.names import resolve

    return resolve(spec.kernel)


def stand_ins(kernel, spec: Specialization) -> tuple[list, dict]:
    """(positional arguments in parameter order, launch options) reproducing ``spec``;
    raises ``ValueError`` when the kernel's parameters no longer match the entry."""
    _, params = binder_of(kernel)
    sig, const = dict(spec.signature), dict(spec.constexprs)
    names = [p.name for p in params]
    if sorted(names) != sorted(list(sig) + list(const)):
        raise ValueError(f"{spec.kernel}: the kernel's parameters {names} differ from the entry's "
                         f"{sorted(list(sig) + list(const))} (re-record the manifest)")
    args = [decode_constexpr(const[p.name]) if p.is_constexpr else stand_in(sig[p.name]) for p in params]
    options = dict(spec.options)
    got = specialize(kernel, tuple(args), options)
    if got.key() != spec.key():
        raise ValueError(f"{spec.kernel}: stand-ins specialize to {got.to_json()} instead of {spec.to_json()}")
    return args, options


# ---------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------
def compile_entry(spec: Specialization, sources: dict[str, str], arch: int | None = None) -> None:
    kernel = resolve_kernel(spec, sources)
    if not hasattr(kernel, "warmup") or type(kernel).__name__ == "InterpretedFunction":
        raise RuntimeError("kernels are interpreted here (TRITON_INTERPRET=1): nothing to compile")
    args, options = stand_ins(kernel, spec)
    if arch is None:
        kernel.warmup(*args, grid=(1,), **options)
        return
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kw = dict(options, debug=kernel.debug or knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, specialization, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args,
                                                                                                          **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, opts)
    triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _timed(entry: dict, source: dict[str, str], arch: int | None) -> CompileResult:
    spec = Specialization.from_json(entry)
    t0 = time.perf_counter()
    try:
        compile_entry(spec, source, arch)
        err = ""
    except Exception as e:  # reported by the caller, never fatal
        err = f"{type(e).__name__}: {e}".strip()[:500]
    return CompileResult(spec.key(), spec.kernel, time.perf_counter() - t0, err)


def _worker_init() -> None:
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["OPFORGE_INTERPRET"] = "0"


def compile_all(specs: list[Specialization], sources: dict[str, str], *, jobs: int, arch: int | None = None,
                pool: str = "process", on_done: Callable[[CompileResult], None] | None = None) -> list[CompileResult]:
    """Compile ``specs`` with ``jobs`` workers (``pool``: "process" or "thread"; jobs <= 1: here, serially)."""
    tasks = [(s.to_json(), {s.module: sources[s.module]} if s.module in sources else {}, arch) for s in specs]
    results: list[CompileResult] = []

    def done(r: CompileResult) -> None:
        results.append(r)
        if on_done:
            on_done(r)

    if jobs <= 1:
        for t in tasks:
            done(_timed(*t))
        return results
    if pool == "thread":
        executor = ThreadPoolExecutor(max_workers=jobs)
    elif pool == "process":
        import multiprocessing

        executor = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_worker_init)
    else:
        raise ValueError(f"opforge warmup: pool must be 'process' or 'thread', got {pool!r}")
    with executor:
        futures: list[Future] = [executor.submit(_timed, *t) for t in tasks]
        for f in as_completed(futures):
            done(f.result())
    return results
