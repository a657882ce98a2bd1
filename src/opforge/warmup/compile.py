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

Each result carries the C source of the kernel's Triton launcher (``launchers``), which the
caller builds once per distinct source.

Workers are processes (``python -m opforge.warmup.compile``) by default: part
of a compile is Python holding the GIL (the AST walk to TTIR, pass set-up), so
threads in one process can overlap only the LLVM and ``ptxas`` parts; a process
costs its imports once (a few seconds). ``pool="thread"`` is there to measure
the difference on a many-core host (``benchmarks/warmup_first_run.py --pools
process,thread``); on the 2-core CI machine, under load, neither could be
measured cleanly.
Entries are handed out one at a time, so a slow kernel (GEMM, attention) does
not leave the other workers idle.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from opforge.warmup.launches import Specialization, binder_of, decode_constexpr, specialize


@dataclass
class CompileResult:
    key: str
    kernel: str
    seconds: float
    error: str = ""
    launcher: str = ""  # the C source of its Triton launcher (``launchers.launcher_source``)


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
def compile_entry(spec: Specialization, sources: dict[str, str], arch: int | None = None):
    """Compile ``spec`` into Triton's cache; returns the ``CompiledKernel``."""
    kernel = resolve_kernel(spec, sources)
    if type(kernel).__name__ == "InterpretedFunction":
        raise RuntimeError("kernels are interpreted here (TRITON_INTERPRET=1): nothing to compile")
    args, options = stand_ins(kernel, spec)
    if arch is None:
        compiled = kernel.warmup(*args, grid=(1,), **options)
        return compiled.result() if hasattr(compiled, "result") else compiled
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kw = dict(options, debug=kernel.debug or knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, opts)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _timed(entry: dict, source: dict[str, str], arch: int | None) -> CompileResult:
    spec = Specialization.from_json(entry)
    from opforge.warmup.launchers import launcher_source

    t0 = time.perf_counter()
    compiled = None
    try:
        compiled = compile_entry(spec, source, arch)
        err = ""
    except Exception as e:  # reported by the caller, never fatal
        err = f"{type(e).__name__}: {e}".strip()[:500]
    seconds = time.perf_counter() - t0
    try:
        launcher = launcher_source(compiled) if compiled is not None else ""
    except Exception:  # noqa: BLE001 - a Triton whose launcher glue differs: its first launch builds it
        launcher = ""
    return CompileResult(spec.key(), spec.kernel, seconds, err, launcher)


RESULT_MARK = "@@opforge-warmup@@ "


def _worker_main() -> None:
    """``python -m opforge.warmup.compile``: compile the tasks read from stdin, one JSON line each,
    answering each with one marked line on stdout (other output of a compile is ignored)."""
    from opforge.runtime import triton_key

    triton_key.install()  # the parent recorded the key: no worker hashes libtriton.so again
    for line in sys.stdin:
        r = _timed(*json.loads(line))
        sys.stdout.write(RESULT_MARK + json.dumps(asdict(r)) + "\n")
        sys.stdout.flush()


def _worker_env() -> dict:
    import opforge

    src = str(Path(opforge.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, TRITON_INTERPRET="0", OPFORGE_INTERPRET="0", PYTHONPATH=path)


def _in_processes(tasks: list[tuple], jobs: int, done: Callable[[CompileResult], None]) -> None:
    """``jobs`` worker processes, each fed one task at a time from a shared queue. A plain
    subprocess, not multiprocessing: nothing depends on the caller's ``__main__``, and a
    worker that dies (a compiler crash) fails its task only; a new worker takes over."""
    todo: queue.Queue = queue.Queue()
    for t in tasks:
        todo.put(t)
    env = _worker_env()

    def start():
        return subprocess.Popen([sys.executable, "-m", "opforge.warmup.compile"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)

    def drive() -> None:
        proc = start()
        try:
            while True:
                try:
                    task = todo.get_nowait()
                except queue.Empty:
                    return
                proc.stdin.write(json.dumps(task) + "\n")
                proc.stdin.flush()
                for line in proc.stdout:
                    if line.startswith(RESULT_MARK):
                        done(CompileResult(**json.loads(line[len(RESULT_MARK):])))
                        break
                else:
                    spec = Specialization.from_json(task[0])
                    done(CompileResult(spec.key(), spec.kernel, 0.0, f"worker exited ({proc.wait()})"))
                    proc = start()
        finally:
            proc.stdin.close()
            proc.wait()

    workers = [threading.Thread(target=drive, daemon=True) for _ in range(min(jobs, len(tasks)))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def compile_all(specs: list[Specialization], sources: dict[str, str], *, jobs: int, arch: int | None = None,
                pool: str = "process", on_done: Callable[[CompileResult], None] | None = None) -> list[CompileResult]:
    """Compile ``specs`` with ``jobs`` workers (``pool``: "process" or "thread"; jobs <= 1: here, serially).
    ``on_done`` is called once per entry as it finishes (from one thread at a time)."""
    if pool not in ("process", "thread"):
        raise ValueError(f"opforge warmup: pool must be 'process' or 'thread', got {pool!r}")
    tasks = [(s.to_json(), {s.module: sources[s.module]} if s.module in sources else {}, arch) for s in specs]
    results: list[CompileResult] = []
    lock = threading.Lock()

    def done(r: CompileResult) -> None:
        with lock:
            results.append(r)
            if on_done:
                on_done(r)

    if jobs <= 1:
        for t in tasks:
            done(_timed(*t))
    elif pool == "thread":
        with ThreadPoolExecutor(max_workers=jobs) as executor:
            for f in as_completed([executor.submit(_timed, *t) for t in tasks]):
                done(f.result())
    else:
        _in_processes(tasks, jobs, done)
    return results


if __name__ == "__main__":
    _worker_main()
