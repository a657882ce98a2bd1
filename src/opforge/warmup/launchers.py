"""Triton's C launcher modules, built into its cache by ``opforge warmup``.

Why: a compiled kernel is not yet launchable. The first launch of each kernel in a process
makes Triton's ``CudaLauncher`` generate C glue for the kernel's argument signature
(``make_launcher``) and build it with the C compiler into a ``__triton_launcher`` module,
cached in ``TRITON_CACHE_DIR`` under the SHA-256 of the source and the platform
(``compile_module_from_src``). A warmup that compiles kernels but leaves these to the first
launch leaves 0.1-0.3 s of gcc per distinct signature in the user's first query (q01 at SF1 on
the H200: 0.48 s of its 2.28 s).

The source depends only on the kernel's signature (argument types, constexpr slots) and its
tensor-descriptor metadata, not on the GPU, so it is generated here from the compiled kernel
exactly as ``CudaLauncher.__init__`` does (``launcher_source``), with or without a GPU;
many kernels share one. Building it needs the C compiler and ``libcuda.so.1`` to link
against: on a machine without the CUDA driver (``--arch`` on a CPU host) the sources are
counted and nothing is written (a module built without the driver would not load where it
is used). Building calls Triton's own ``compile_module_from_src``: the same key, file name
and cache entry the launch path looks up.
"""
from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

LAUNCHER_NAME = "__triton_launcher"  # the module name CudaLauncher builds


def launcher_source(compiled) -> str:
    """The C source of the launcher a compiled kernel's first launch builds ("" for a kernel
    not compiled for CUDA). Mirrors ``triton.backends.nvidia.driver.CudaLauncher.__init__``."""
    target = getattr(compiled.metadata, "target", None)
    if target is None or target.backend != "cuda":
        return ""
    from triton.backends.nvidia.driver import make_launcher

    src = compiled.src
    constants = src.constants if hasattr(src, "constants") else {}
    arg_idx = lambda x: (src.fn.arg_names.index(x), ) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(idx): value for idx, value in constants.items()}
    signature = dict(src.signature)
    return make_launcher(constants, signature, getattr(compiled.metadata, "tensordesc_meta", None))


def launcher_key(source: str) -> str:
    """The cache key ``compile_module_from_src`` files the module under."""
    from triton.runtime.build import platform_key

    return hashlib.sha256((source + platform_key()).encode("utf-8")).hexdigest()


def cached_launcher(source: str) -> str | None:
    """Path of the built module for ``source`` in Triton's cache, or None: the lookup the launch
    path makes before it would run the C compiler."""
    import sysconfig

    from triton.runtime.cache import get_cache_manager

    return get_cache_manager(launcher_key(source)).get_file(LAUNCHER_NAME + sysconfig.get_config_var("EXT_SUFFIX"))


def driver_missing() -> str:
    """Why launchers cannot be built here ("" when they can)."""
    try:
        from triton.backends.nvidia.driver import library_dirs

        library_dirs()
    except (AssertionError, OSError, FileNotFoundError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"no CUDA driver to link against ({first})"
    return ""


def build_launcher(source: str) -> None:
    """Build (or find) ``source``'s module in Triton's cache, as the launch path would."""
    from triton.backends.nvidia.driver import include_dirs, libraries, library_dirs
    from triton.runtime.build import compile_module_from_src

    compile_module_from_src(src=source, name=LAUNCHER_NAME, library_dirs=library_dirs(),
                            include_dirs=include_dirs, libraries=libraries)


@dataclass
class LauncherReport:
    distinct: int = 0  # distinct launcher sources among the compiled kernels
    cached: int = 0  # already in the cache
    built: int = 0
    seconds: float = 0.0  # wall time from the first build to the last
    skipped: str = ""  # why none were built
    errors: list[str] = field(default_factory=list)


class LauncherBuilder:
    """Builds each distinct launcher source once, on ``jobs`` threads (the C compiler is a
    subprocess, so threads overlap), while kernels are still compiling."""

    def __init__(self, jobs: int):
        self.report = LauncherReport(skipped=driver_missing())
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._futures: list[Future] = []
        self._pool = None if self.report.skipped else ThreadPoolExecutor(max_workers=max(1, jobs))
        self._t0: float | None = None

    def add(self, source: str) -> None:
        if not source:
            return
        key = launcher_key(source)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self.report.distinct += 1
            if self._pool is None:
                return
            if self._t0 is None:
                self._t0 = time.perf_counter()
        self._futures.append(self._pool.submit(self._build, source))

    def _build(self, source: str) -> None:
        if cached_launcher(source) is not None:
            with self._lock:
                self.report.cached += 1
            return
        try:
            build_launcher(source)
            with self._lock:
                self.report.built += 1
        except Exception as e:  # reported, never fatal: the launch path would build it
            with self._lock:
                self.report.errors.append(f"{type(e).__name__}: {e}"[:300])

    def finish(self) -> LauncherReport:
        if self._pool is not None:
            for f in self._futures:
                f.result()
            self._pool.shutdown()
            if self._t0 is not None:
                self.report.seconds = time.perf_counter() - self._t0
        return self.report
