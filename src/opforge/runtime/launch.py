"""Pre-bound Triton launches: call the compiled kernel, not ``JITFunction.run``.

``kernel[grid](*args, **kw)`` costs several microseconds of Python per call
in Triton's ``JITFunction.run`` (binding, the specialization key built and
turned into a string, the device and stream looked up through the driver,
the globals check, the launch metadata). A ``Launcher`` holds one kernel with
its constexprs and options (``num_warps``...) fixed. Its first call of a
*signature* goes through ``JITFunction.run``, which compiles or finds the
kernel; the launcher keeps that ``CompiledKernel`` and later calls of the
same signature call its launcher directly.

The signature is everything Triton specializes on that can change between
calls: each tensor's dtype and whether its address is 16-byte aligned, each
int's value (Triton specializes ints equal to 1, divisible by 16, and on
their width), the type of each float, None, and the current device. A call
whose arguments are anything else (a bool, a tensor descriptor, ...), or
made while Triton has launch hooks, pre-run hooks, debug or instrumentation
on, takes ``JITFunction.run``; so does every call under the interpreter and
every call on a Triton whose objects do not look as this module expects
(checked on the first compiled call, not assumed).

The direct call goes one step further when it can: the compiled kernel's
launcher (triton 3.6's ``CudaLauncher.__call__``) only allocates the global
and profile scratch a kernel asks for, then calls its C ``launch``; for a
kernel that asks for none (every kernel but those building TMA descriptors
on the device, and all of them without instrumentation) the entry calls
``launch`` itself, with what ``__call__`` would pass.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_Tensor = torch.Tensor
_LIMIT = 256  # compiled signatures kept per launcher (ints are keyed by value)
_direct = True  # False inside jit_run_only()


@contextlib.contextmanager
def jit_run_only():
    """Every launch inside the block goes through ``JITFunction.run`` (tests, ``dispatch.validated_path``)."""
    global _direct
    old, _direct = _direct, False
    try:
        yield
    finally:
        _direct = old


def _current_device() -> int:
    return torch.cuda.current_device()


def _current_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


try:  # the C entry points torch.cuda.current_device / current_stream end in
    _current_device = torch._C._cuda_getDevice  # noqa: F811
    _current_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811
except AttributeError:  # a CPU build of torch: nothing launches anyway
    pass


def signature(args: tuple) -> tuple | None:
    """What Triton specializes ``args`` on, as a hashable key; None when unsure.

    A tensor gives two entries (its dtype, then whether its address is 16-byte
    aligned); its dtype is never equal to an int, a float type or None, so the
    key cannot confuse two argument lists of different types."""
    key: list[Any] = []
    for a in args:
        t = type(a)
        if t is _Tensor:
            key.append(a.dtype)
            key.append(a.data_ptr() & 15 == 0)
        elif t is int:
            key.append(a)
        elif t is float:
            key.append(float)
        elif a is None:
            key.append(None)
        elif isinstance(a, _Tensor):  # an nn.Parameter, a subclass
            key.append(a.dtype)
            key.append(a.data_ptr() & 15 == 0)
        else:
            return None
    return tuple(key)


def c_launch(launcher):
    """The C ``launch`` behind a compiled kernel's launcher when calling it
    directly is the same launch: the launcher is triton 3.6's
    ``CudaLauncher`` (its ``__call__`` allocates scratch, then calls
    ``launch(grid, stream, function, cooperative, pdl, global scratch,
    profile scratch, *args)``) and the kernel needs no scratch (both None
    then). None otherwise: the launcher itself is called."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except Exception:
        return None
    if type(launcher) is not CudaLauncher:
        return None
    launch_c = getattr(launcher, "launch", None)
    if (not callable(launch_c) or getattr(launcher, "global_scratch_size", 1) != 0
            or getattr(launcher, "profile_scratch_size", 1) != 0
            or not hasattr(launcher, "launch_cooperative_grid") or not hasattr(launcher, "launch_pdl")):
        return None
    return launch_c


class _Knobs:
    """Triton's global switches that change how a launch must be made."""

    def __init__(self) -> None:
        try:
            from triton import knobs

            self.runtime, self.compilation = knobs.runtime, knobs.compilation
            self.ok = hasattr(self.runtime.launch_enter_hook, "calls")
        except Exception:
            self.ok = False

    def quiet(self) -> bool:
        """No launch hooks, debug or instrumentation: the direct call is the same launch."""
        rt = self.runtime
        return not (rt.launch_enter_hook.calls or rt.launch_exit_hook.calls or rt.debug
                    or self.compilation.instrumentation_mode)


_knobs: _Knobs | None = None


def _triton_knobs() -> _Knobs:
    global _knobs
    if _knobs is None:
        _knobs = _Knobs()
    return _knobs


class Launcher:
    """``kernel[grid](*args, **kw)`` with ``kw`` (constexprs, ``num_warps``,
    ``num_stages``) fixed: ``launcher(grid, *args)``. ``args`` are the
    kernel's leading parameters, positionally; ``kw`` names the rest."""

    __slots__ = ("fn", "kw", "compiled", "direct", "knobs")

    def __init__(self, fn, **kw) -> None:
        self.fn = fn
        self.kw = kw
        self.compiled: dict[tuple, tuple] = {}
        # A JITFunction (the interpreter's InterpretedFunction has no device caches).
        self.direct = hasattr(fn, "device_caches") and hasattr(fn, "params") and hasattr(fn, "pre_run_hooks")
        self.knobs = None

    def __call__(self, grid, *args) -> None:
        if self.direct and _direct:
            sig = signature(args)
            if sig is not None:
                device = _current_device()
                hit = self.compiled.get((device, sig))
                if hit is not None and not self.fn.pre_run_hooks and self.knobs.quiet():
                    run, function, head, tail = hit
                    run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                        _current_stream(device), function, *head, *args, *tail)
                    return
                return self._compile_and_launch(grid, args, (device, sig))
        self.fn[grid](*args, **self.kw)

    def _compile_and_launch(self, grid, args: tuple, key: tuple) -> None:
        kernel = self.fn.run(*args, grid=grid, warmup=False, **self.kw)
        if key in self.compiled or kernel is None:
            return
        entry = self._entry(kernel, args, key[0])
        if entry is None:
            self.direct = False  # this Triton does not look as expected: JITFunction.run from now on
            return
        if len(self.compiled) >= _LIMIT:
            self.compiled.clear()
        self.compiled[key] = entry

    def _entry(self, kernel, args: tuple, device: int) -> tuple | None:
        """(launcher, function, head, trailing arguments) of ``kernel``: the
        direct call is ``launcher(grid x, y, z, stream, function, *head, *args,
        *trailing)``; None when any part is not what ``JITFunction.run`` itself passes."""
        try:
            if self.knobs is None:
                self.knobs = _triton_knobs()
            if not self.knobs.ok or hasattr(kernel, "result"):  # no hook chains, or an async compile
                return None
            binder = self.fn.device_caches[device][4]
            bound = list(binder(*args, **self.kw)[0].values())
            n = len(args)
            if len(bound) != len(self.fn.params) or any(bound[i] is not args[i] for i in range(n)):
                return None
            if not all(p.is_constexpr for p in self.fn.params[n:]):
                return None  # a runtime parameter passed by name: its specialization is not keyed
            run, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
            if function is None or not callable(run):
                return None
            head = (metadata, None, None, None)  # packed metadata, no launch metadata, no enter / exit hooks
            launch_c = c_launch(run)
            if launch_c is not None:
                run, head = launch_c, (run.launch_cooperative_grid, run.launch_pdl, None, None) + head
            return run, function, head, tuple(bound[n:])
        except Exception:
            return None


_launchers: dict[tuple, Launcher] = {}


def launch(fn, grid, *args, **kw) -> None:
    """``fn[grid](*args, **kw)`` through the ``Launcher`` of ``(fn, kw)``, for a
    call site whose options change from call to call (``kw``'s values must
    be hashable)."""
    key = (fn, *kw.items())
    try:
        launcher = _launchers.get(key)
    except TypeError:  # an unhashable option: no launcher to keep
        fn[grid](*args, **kw)
        return
    if launcher is None:
        if len(_launchers) >= 4 * _LIMIT:
            _launchers.clear()
        launcher = _launchers[key] = Launcher(fn, **kw)
    launcher(grid, *args)


class Prepared:
    """One launch site of a ``Launcher`` with its grid and trailing arguments
    (the scalars: sizes, strides) fixed, for a runner bound to one dispatch
    decision: ``prepared(*tensors)`` passes only the leading tensor arguments.

    A kernel of forty arguments pays for forty signature entries in
    ``Launcher``; here the fixed part's signature is computed once and a call
    keys on its tensors alone (dtype and 16-byte alignment, as ``signature``).
    The first call of a key goes through the ``Launcher`` (so through
    ``JITFunction.run``), and every case ``Launcher`` leaves to
    ``JITFunction.run`` (interpreter, hooks, ``jit_run_only``) is left to it here."""

    __slots__ = ("launcher", "grid", "fixed", "fixed_sig", "hits", "gx", "gy", "gz")

    def __init__(self, launcher: Launcher, grid: tuple, fixed: tuple) -> None:
        self.launcher, self.grid, self.fixed = launcher, tuple(grid), tuple(fixed)
        self.fixed_sig = signature(self.fixed)
        self.gx, self.gy, self.gz = (self.grid + (1, 1))[:3]
        self.hits: dict[tuple, tuple] = {}

    def __call__(self, *tensors) -> None:
        go = self.launcher
        if go.direct and _direct and self.fixed_sig is not None:
            sig = signature(tensors)
            if sig is not None:
                device = _current_device()
                hit = self.hits.get((device, sig))
                if hit is not None and not go.fn.pre_run_hooks and go.knobs.quiet():
                    run, function, head, rest = hit
                    run(self.gx, self.gy, self.gz, _current_stream(device), function, *head, *tensors, *rest)
                    return
                args = tensors + self.fixed
                go(self.grid, *args)
                entry = go.compiled.get((device, sig + self.fixed_sig))
                if entry is not None:
                    if len(self.hits) >= _LIMIT:
                        self.hits.clear()
                    run, function, head, tail = entry
                    self.hits[(device, sig)] = (run, function, head, self.fixed + tail)
                return
        go(self.grid, *tensors, *self.fixed)


def prepare(fn, grid, fixed: tuple, **kw) -> Prepared:
    """``fn[grid](*tensors, *fixed, **kw)`` as a ``Prepared`` launch (its own ``Launcher``)."""
    return Prepared(Launcher(fn, **kw), grid, fixed)
