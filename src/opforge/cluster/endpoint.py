"""Where a running cluster's placement driver answers: ``$OPFORGE_CACHE_DIR/cluster/endpoint.json``
(URL, the table ids its region keys start with) and ``token`` beside it (mode 0600), written by the
coordinator at start and removed at stop, so ``opforge cluster status`` on the same host finds it.
Standard library only: the CLI reads it without importing torch or Ray."""
from __future__ import annotations

import json
import os
from pathlib import Path


def directory() -> Path:
    base = os.environ.get("OPFORGE_CACHE_DIR")
    if base:
        return Path(base) / "cluster"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("opforge")) / "cluster"


def write(url: str, token: str, tables: dict[str, int]) -> Path:
    d = directory()
    d.mkdir(parents=True, exist_ok=True)
    tok = d / "token"
    fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    path = d / "endpoint.json"
    path.write_text(json.dumps({"url": url, "pid": os.getpid(), "tables": tables}))
    return path


def read() -> tuple[dict, str] | None:
    d = directory()
    try:
        info = json.loads((d / "endpoint.json").read_text())
        token = (d / "token").read_text().strip()
    except (OSError, ValueError):
        return None
    return info, token


def remove(url: str) -> None:
    """Remove the files if they still name ``url`` (a later cluster may have replaced them)."""
    found = read()
    if found is not None and found[0].get("url") == url:
        for name in ("endpoint.json", "token"):
            (directory() / name).unlink(missing_ok=True)
