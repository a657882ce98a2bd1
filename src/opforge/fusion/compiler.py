"""Generated source -> ``triton.jit`` kernels, cached.

Triton's ``@jit`` reads a kernel's source with ``inspect.getsource`` (to
hash it for its own disk cache, and the interpreter rewrites it), so the
generated module is written to a file -- ``<opforge cache dir>/fusion/
fused_<hash>.py``, the hash being of the source text -- and imported from
there. The same expression with the same dtypes gives the same text, hence
the same file and the same Triton cache entry in every process; in one
process the module is kept in memory. Writes are atomic (a temporary file,
then ``os.replace``), so processes sharing the cache dir never read half a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import types
from pathlib import Path

_modules: dict[str, types.ModuleType] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where generated modules are written (``$OPFORGE_CACHE_DIR/fusion``)."""
    from opforge.runtime.cache import default_cache_dir

    for base in (default_cache_dir(), Path(tempfile.gettempdir()) / "opforge"):
        path = Path(base) / "fusion"
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            continue
    raise OSError("opforge.fuse: no writable directory for generated kernels")


def digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def load(source: str) -> types.ModuleType:
    """The imported module for ``source`` (written to disk on first use)."""
    key = digest(source)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        path = cache_dir() / f"fused_{key}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        name = f"opforge_fused_{key}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[key] = mod
        return mod
