"""Memory sizes as users write them ("24GiB", "512MB", 1 << 30) and where the device limit comes from.

Units follow DuckDB's ``SET memory_limit``: KB / MB / GB / TB are powers of 1000, KiB / MiB / GiB /
TiB powers of 1024, a bare number is bytes."""
from __future__ import annotations

import os
import re

_UNITS = {"": 1, "b": 1, "bytes": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")
LIMIT_ENV = "OPFORGE_SQL_MEMORY_LIMIT"
HOST_LIMIT_ENV = "OPFORGE_SQL_SPILL_HOST_LIMIT"


def parse_size(value, what: str = "memory_limit") -> int | None:
    """Bytes from an int or a size string; None stays None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"opforge.sql: {what} must be a size such as '24GiB' or a number of bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"opforge.sql: {what}: cannot read {value!r} as a size (e.g. '24GiB', '512MB')")
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"opforge.sql: {what} must be a size such as '24GiB' or a number of bytes, "
                        f"got {type(value).__name__}")
    if n <= 0:
        raise ValueError(f"opforge.sql: {what} must be > 0 bytes, got {value!r}")
    return n


def env_limit() -> int | None:
    """The device memory limit from ``$OPFORGE_SQL_MEMORY_LIMIT`` (None when unset)."""
    return parse_size(os.environ.get(LIMIT_ENV) or None, LIMIT_ENV)


def default_host_limit() -> int:
    """Pinned host memory the spill may take before it writes to disk: ``$OPFORGE_SQL_SPILL_HOST_LIMIT``,
    else a quarter of the machine's memory (pinned pages cannot be swapped out)."""
    env = parse_size(os.environ.get(HOST_LIMIT_ENV) or None, HOST_LIMIT_ENV)
    if env is not None:
        return env
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
