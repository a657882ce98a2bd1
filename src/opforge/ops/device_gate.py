"""The gate of kernel variants not yet measured on the device.

A new variant passes the interpreter tests long before it has run on a GPU.
Until a device run shows it correct and faster, dispatch must not pick it by
default: its check calls ``unmeasured(...)``, which rejects it unless
``OPFORGE_ROWS=1`` is set (bench scripts, the device loop) or its entry in
``MEASURED`` is True (one line to flip per path once the device numbers are in).
"""

from __future__ import annotations

import os

ENV = "OPFORGE_ROWS"
MEASURED = {
    "triton_wave": False,  # softmax / layer_norm / rms_norm forward, long rows (kernels.waves)
    "LATE": False,  # scan and compaction: loads first, scan after the look-back (kernels.scan)
}


def unmeasured(what: str) -> str | None:
    """None when the gated variant may run, else the reason it may not."""
    if MEASURED[what] or os.environ.get(ENV) == "1":
        return None
    return f"{what}: not yet measured on the device (set {ENV}=1 to allow it)"
