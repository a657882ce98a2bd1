"""The gate of kernel variants not yet measured on the device.

A new variant passes the interpreter tests long before it has run on a GPU.
Until a device run shows it correct and faster, dispatch must not pick it by
default: its check calls ``unmeasured(...)``, which rejects it unless
``OPFORGE_ROWS=1`` is set (bench scripts, the device loop) or its entry in
``MEASURED`` is True (one line per path, flipped once the device numbers were in).
"""

from __future__ import annotations

import os

ENV = "OPFORGE_ROWS"
MEASURED = {
    # softmax / layer_norm / rms_norm forward, long rows (kernels.waves): 1.5-1.8x torch eager at
    # 1024x65536 and 1024x262144 bf16, 10-88x at 8x2^20 (H200, 2026-12-02, benchmarks/rows_scan.py).
    "triton_wave": True,
    # scan and compaction (kernels.scan, the LATE kernels): cumsum fp32 2^28 1.30x eager (77 % of copy,
    # from 1.02x); the compaction kernel 1.36x eager (from 0.86x) (same run).
    "LATE": True,
}


def unmeasured(what: str) -> str | None:
    """None when the gated variant may run, else the reason it may not."""
    if MEASURED[what] or os.environ.get(ENV) == "1":
        return None
    return f"{what}: not yet measured on the device (set {ENV}=1 to allow it)"
