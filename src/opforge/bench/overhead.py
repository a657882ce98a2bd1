"""Host-side costs: dispatch overhead per call, and first-call latency.

Dispatch overhead is the CPU time of ``opforge.add(x, y)`` minus the CPU time
of running the very variant and config that dispatch chose, called directly
(output allocation and kernel launch included on both sides). What is left is
the price of the torch.library op and the memoized decision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

import opforge
from opforge.runtime import dispatch, registry, timing


def dispatch_overhead(device: torch.device) -> dict:
    x = torch.randn(1024, device=device)
    y = torch.randn(1024, device=device)
    op = registry.get("add")
    opforge.add(x, y)
    d = dispatch.decide(op, (x, y), tune=False)
    with torch.no_grad():
        t_ours = timing.host_overhead_us(lambda: opforge.add(x, y))
        t_raw = timing.host_overhead_us(lambda: d.variant.run(d.config, x, y))
        t_eager = timing.host_overhead_us(lambda: torch.add(x, y))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {
        "op": "opforge::add",
        "variant": d.variant.name,
        "shape": "1024",
        "opforge_call_us": t_ours,
        "variant_direct_us": t_raw,
        "dispatch_overhead_us": t_ours - t_raw,
        "torch_eager_call_us": t_eager,
        "target_us": 10.0,
    }


_FIRST_CALL = r"""
import json, time, sys
t0 = time.perf_counter()
import torch
import opforge
from opforge.runtime import dispatch, jit, registry
t_import = time.perf_counter() - t0
dev = torch.device(sys.argv[1])
x = torch.randn(3000, 1000, device=dev, dtype=torch.bfloat16)
sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter(); opforge.gelu(x); sync(); first = time.perf_counter() - t0
t0 = time.perf_counter(); opforge.gelu(x); sync(); second = time.perf_counter() - t0
chosen = dispatch.decide(registry.get("gelu"), (x, None), tune=False).variant.name
compile_first = compile_second = float("nan")
if dev.type == "cuda":  # the JIT path: a Triton variant compiled on first use
    with dispatch.force_variant("gelu", "triton_flat"):
        t0 = time.perf_counter(); opforge.gelu(x); sync(); compile_first = time.perf_counter() - t0
        t0 = time.perf_counter(); opforge.gelu(x); sync(); compile_second = time.perf_counter() - t0
t0 = time.perf_counter(); reports = jit.warmup("silu", x, all_configs=True); wall = time.perf_counter() - t0
print(json.dumps({"import_s": t_import, "warmup_wall_s": wall, "first_call_s": first, "second_call_s": second,
                  "first_call_variant": chosen, "triton_first_call_s": compile_first,
                  "triton_second_call_s": compile_second,
                  "warmup_all_configs": [{"variant": r.variant, "config": r.config, "seconds": r.seconds,
                                          "error": r.error} for r in reports]}))
"""


def first_call_latency(device: torch.device) -> dict:
    """A fresh process with empty Triton and opforge caches: import, first call, second call."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                   OPFORGE_CACHE_DIR=os.path.join(tmp, "opforge"), OPFORGE_AUTOTUNE="off")
        proc = subprocess.run([sys.executable, "-c", _FIRST_CALL, str(device)], env=env,
                              capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ws = out.pop("warmup_all_configs")
    out["warmup_configs"] = len(ws)
    out["warmup_failed"] = sum(1 for w in ws if w["error"])
    out["warmup_compile_s"] = {f"{w['variant']} {w['config']}": round(w["seconds"], 3) for w in ws}
    return out
