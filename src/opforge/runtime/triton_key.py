"""Triton's installation hash, remembered across processes.

Why: every Triton cache key starts with ``triton.runtime.cache.triton_key()``, the SHA-256 of
Triton's compiler, backend and language sources and of ``libtriton.so`` (415 MB in triton 3.6).
Each process computes it once, at its first compile or cache lookup: 0.3 s of hashing inside a
user's first query on the H200 (q01 at SF1), and again in every ``opforge warmup`` worker.

Here the result is kept in a small JSON index (``$OPFORGE_CACHE_DIR/triton_key.json``) under a
fingerprint of the same files -- path, size and modification time of each, which any reinstall
or edit changes -- so a later process reads the 1.9 kB key instead of hashing 415 MB. A
process whose fingerprint has no entry computes the key as Triton does and records it.
``install()`` puts the memoized function in place of Triton's module attribute (the one
``get_cache_key`` calls); the key it returns is Triton's own, byte for byte.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
import tempfile
from pathlib import Path

INDEX_NAME = "triton_key.json"
MAX_ENTRIES = 8  # fingerprints kept (several Triton installs may share one cache folder)
_SOURCE_DIRS = ("compiler", "backends", "language")


def _triton_root() -> str:
    import triton.runtime.cache as cache

    return os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__)))


def fingerprint() -> str:
    """SHA-256 over (path, size, mtime) of every file ``triton_key()`` reads, and the version."""
    import triton

    root = _triton_root()
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files = [os.path.join(root, "runtime", "cache.py"), os.path.join(root, "_C", f"libtriton.{ext}")]
    for sub in _SOURCE_DIRS:
        for folder, _, names in os.walk(os.path.join(root, sub)):
            files += [os.path.join(folder, n) for n in names if n.endswith((".py", ".so"))]
    h = hashlib.sha256(triton.__version__.encode())
    for f in sorted(files):
        st = os.stat(f)
        h.update(f"\n{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()


def index_path() -> Path:
    from opforge.runtime.cache import default_cache_dir

    return default_cache_dir() / INDEX_NAME


def _read_index() -> dict:
    try:
        doc = json.loads(index_path().read_text())
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return {k: v for k, v in entries.items() if isinstance(v, str)} if isinstance(entries, dict) else {}


def _write_index(entries: dict) -> None:
    path = index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".triton_key-")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": 1, "entries": entries}, f)
        os.replace(tmp, path)  # readers see the old index or the new one, never half of one
    except OSError:
        pass  # a read-only cache folder: the key is computed per process, as Triton does


def _store(fp: str, key: str) -> None:
    entries = _read_index()
    if entries.get(fp) != key:
        entries.pop(fp, None)
        entries = dict(list(entries.items())[-(MAX_ENTRIES - 1):])
        entries[fp] = key
        _write_index(entries)


def install() -> None:
    """Make ``triton.runtime.cache.triton_key`` read the index (or compute and record the key
    on its first call in this process). Idempotent; costs one ``stat`` per Triton source file.
    A Triton without this function, or files that cannot be read, leave Triton's own in place."""
    try:
        import triton.runtime.cache as cache
    except ImportError:
        return
    original = getattr(cache, "triton_key", None)
    if original is None or hasattr(original, "__wrapped_triton_key__"):
        return

    @functools.lru_cache(maxsize=None)
    def triton_key() -> str:
        try:
            fp = fingerprint()
        except OSError:
            return original()
        key = _read_index().get(fp)
        if key is None:
            key = original()
            _store(fp, key)
        return key

    triton_key.__wrapped_triton_key__ = original
    cache.triton_key = triton_key


def ensure() -> str:
    """``install()``, then the key: read from the index, or computed and recorded now."""
    import triton.runtime.cache as cache

    install()
    return cache.triton_key()
