"""The roofline: measured ceilings and where an op's time sits under them.

Ceilings are measured, not read off a datasheet: a large device-to-device
copy (bytes read + written) for bandwidth and a large cuBLAS bf16 matmul on
random data for the tensor rate. They are cached per device and software
versions (torch, triton, driver, opforge) in the autotune database, so
``opforge bench`` measures them once per set-up; a cached value that is not a
positive number is measured again, and the bench measures again when an op
lands above 100 % of a cached ceiling (:func:`ceilings` with ``refresh``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from opforge.runtime import device as devmod
from opforge.runtime import timing
from opforge.runtime.cache import autotune_cache


@dataclass(frozen=True)
class Ceilings:
    copy_tbps: float  # bytes/s of a device copy, read + write, in TB/s
    bf16_tflops: float  # dense bf16 matmul rate, TFLOP/s
    measured_on: str
    method: str

    def floor_ms(self, flops: float, nbytes: float) -> float:
        """The least time the op can take: the larger of its compute and memory times."""
        t_mem = nbytes / (self.copy_tbps * 1e12) if nbytes else 0.0
        t_math = flops / (self.bf16_tflops * 1e12) if flops else 0.0
        return max(t_mem, t_math) * 1e3

    def attainable_tflops(self, intensity: float) -> float:
        """min(peak, intensity * bandwidth): the roof over an arithmetic intensity."""
        return min(self.bf16_tflops, intensity * self.copy_tbps)

    @property
    def ridge(self) -> float:
        """FLOP/byte where an op turns from memory-bound to compute-bound."""
        return self.bf16_tflops / self.copy_tbps


def _device_key(dev: torch.device) -> str:
    info = devmod.device_info(dev)
    v = devmod.versions()
    return (f"{info.name}|{info.sm_count}|torch {v['torch']}|triton {v['triton']}|driver {v['driver']}"
            f"|opforge {v['opforge']}")


def measure_ceilings(dev: torch.device, *, quick: bool = False) -> Ceilings:
    """Copy bandwidth and bf16 matmul rate on ``dev``, measured now."""
    if dev.type != "cuda":
        return _cpu_ceilings(quick)
    with torch.cuda.device(dev):
        n = (1 << 28) if not quick else (1 << 26)  # 1 GiB / 256 MiB of fp32
        src = torch.rand(n, device=dev)
        dst = torch.empty_like(src)
        ms = timing.bench_gpu(lambda: dst.copy_(src))
        copy_tbps = 2 * src.numel() * 4 / (ms * 1e-3) / 1e12
        del src, dst
        m = 8192 if not quick else 4096
        a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
        b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
        ms = timing.bench_gpu(lambda: a @ b)
        tflops = 2 * m**3 / (ms * 1e-3) / 1e12
    return Ceilings(copy_tbps, tflops, time.strftime("%Y-%m-%d"),
                    f"copy_ of {n * 4 >> 20} MiB fp32; cuBLAS bf16 {m}^3 on random data")


def _cpu_ceilings(quick: bool) -> Ceilings:
    n = (1 << 24) if not quick else (1 << 22)
    src = torch.rand(n)
    dst = torch.empty_like(src)
    ms = timing.bench_cpu(lambda: dst.copy_(src), repeats=5)
    m = 1024 if not quick else 512
    a, b = torch.randn(m, m), torch.randn(m, m)
    ms_mm = timing.bench_cpu(lambda: a @ b, repeats=5)
    return Ceilings(2 * n * 4 / (ms * 1e-3) / 1e12, 2 * m**3 / (ms_mm * 1e-3) / 1e12,
                    time.strftime("%Y-%m-%d"), f"CPU: copy_ of {n * 4 >> 20} MiB; fp32 matmul {m}^3 (CPU figures)")


def ceilings(dev: torch.device, *, quick: bool = False, refresh: bool = False) -> Ceilings:
    """The ceilings of ``dev``: cached per device and versions, measured when missing."""
    key = _device_key(dev) + ("|quick" if quick else "")
    cache = autotune_cache()
    if not refresh:
        cached = _sane(cache.get_ceilings(key))
        if cached is not None:
            return cached
    c = measure_ceilings(dev, quick=quick)
    cache.put_ceilings(key, asdict(c))
    return c


def _sane(value) -> Ceilings | None:
    """A cached value as ``Ceilings`` when both rates are finite positive numbers."""
    try:
        c = Ceilings(**value)
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (c.copy_tbps, c.bf16_tflops))
    except TypeError:
        return None
    return c if ok else None
