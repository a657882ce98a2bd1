"""JIT warm-up: compile the kernels an op will need before the first real call.

Triton compiles a kernel the first time it sees a new specialization (op,
dtype, constexpr config, pointer alignment) and keeps the binary in its own
on-disk cache (``TRITON_CACHE_DIR``), so a warm-up in one process also speeds
up the next. Compiling happens in worker threads: most of a compile is spent
in LLVM and ``ptxas`` (a subprocess), which run outside the GIL.

This compiles for one call's arguments by running it; ``opforge warmup``
(``opforge.warmup``) compiles, without launching, every specialization the
engines and ops were recorded to launch.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from opforge.runtime import dispatch, registry


@dataclass
class CompileReport:
    op: str
    variant: str
    config: dict
    seconds: float
    error: str = ""


def _compile_one(op, variant, cfg, args) -> CompileReport:
    t0 = time.perf_counter()
    try:
        variant.run(cfg, *args)
        tensors = op.tensors(*args)
        if tensors and tensors[0].device.type == "cuda":
            torch.cuda.synchronize(tensors[0].device)
        err = ""
    except Exception as e:  # a config that cannot compile here is reported, not fatal
        err = f"{type(e).__name__}: {e}"[:300]
    return CompileReport(op.qualname, variant.name, cfg, time.perf_counter() - t0, err)


def warmup(op_name: str, *args, all_configs: bool = False, parallel: bool = True) -> list[CompileReport]:
    """Compile what ``op_name`` needs for ``args``.

    By default: the config dispatch would use. ``all_configs``: every
    candidate config of every supported Triton variant (what tuning needs).
    Returns one report per config with its compile (first-run) time.
    """
    op = registry.get(op_name)
    if all_configs:
        jobs = []
        for v in op.variants:
            if v.kind == "triton" and dispatch.reject_reason(op, v, args) is None:
                jobs += [(v, cfg) for cfg in v.configs(*args)]
    else:
        d = dispatch.decide(op, args, tune=False)
        jobs = [(d.variant, d.config)]
    if not parallel or len(jobs) <= 1:
        return [_compile_one(op, v, cfg, args) for v, cfg in jobs]
    dev = op.tensors(*args)[0].device

    def work(job):
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        return _compile_one(op, job[0], job[1], args)

    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 4)) as pool:
        return list(pool.map(work, jobs))
