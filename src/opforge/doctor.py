"""``opforge doctor``: what opforge sees on this machine."""

from __future__ import annotations

import os

import torch
from rich.console import Console
from rich.table import Table

from opforge.runtime import autotune, cache
from opforge.runtime import device as devmod


def facts() -> dict:
    v = devmod.versions()
    out = {f"{k} version": val or "-" for k, val in v.items()}
    out["CUDA available"] = str(torch.cuda.is_available())
    for i in range(torch.cuda.device_count()):
        info = devmod.device_info(torch.device("cuda", i))
        out[f"cuda:{i}"] = (f"{info.name}, {info.sm_count} SMs, {info.arch}, "
                            f"{info.memory_bytes / 2**30:.0f} GiB, L2 {info.l2_bytes / 2**20:.0f} MiB")
    out["triton kernels"] = (
        "compiled for CUDA" if torch.cuda.is_available() and devmod.triton_available()
        else "interpreter (OPFORGE_INTERPRET=1)" if devmod.interpret_mode() and devmod.triton_available()
        else "unavailable: ops run their torch reference"
    )
    out["autotune mode"] = autotune.mode()
    c = cache.autotune_cache()
    out["autotune cache"] = f"{c.path} ({'ok' if c.usable else 'unusable: in memory'}, {len(c.entries())} entries)"
    out["shipped tuned entries"] = str(len(cache.shipped))
    out["triton cache"] = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    return out


def run(console: Console | None = None) -> dict:
    console = console or Console()
    f = facts()
    t = Table(title="opforge doctor", show_header=False)
    t.add_column("what")
    t.add_column("value")
    for k, val in f.items():
        t.add_row(k, val)
    console.print(t)
    return f
