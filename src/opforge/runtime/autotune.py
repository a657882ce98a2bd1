"""Autotune: measure a variant's candidate configs and keep the fastest.

Modes (``OPFORGE_AUTOTUNE``):
  off         use a cached or shipped entry when there is one, else the
              variant's default config; never benchmark.
  on          (default) as off, but a shape bucket with no entry for the
              variant that dispatch prefers is tuned once, then cached.
  exhaustive  tune every supported variant's every config for each new
              bucket, so dispatch chooses between variants by measured time.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch

from opforge.runtime import device as devmod
from opforge.runtime import timing
from opforge.runtime.cache import AutotuneCache, TuneEntry, TuneKey, autotune_cache, shipped
from opforge.runtime.registry import Op, Variant

MODES = ("off", "on", "exhaustive")


def mode() -> str:
    m = os.environ.get("OPFORGE_AUTOTUNE", "on").strip().lower()
    if m not in MODES:
        warnings.warn(f"opforge: OPFORGE_AUTOTUNE={m!r} is not one of {MODES}; using 'on'", RuntimeWarning)
        return "on"
    return m


def tune_key(op: Op, variant: Variant, args: tuple, geom: Any = None) -> TuneKey:
    """``geom``: the op's geometry when the caller has it (dispatch), else computed here."""
    tensors = op.tensors(*args)
    info = devmod.device_info(tensors[0].device if tensors else None)
    vers = _versions()
    gpu = info.name if info.type == "cuda" else ("cpu-interpreter" if devmod.interpret_mode() else "cpu")
    return TuneKey(
        op=op.qualname,
        variant=variant.name,
        kernel_version=variant.version,
        triton=vers[0],
        torch=vers[1],
        gpu=gpu,
        sm_count=info.sm_count,
        dtype=op.dtype_key(*args),
        shape_bucket=variant.spec.bucket(geom) if variant.spec is not None and geom is not None
        else variant.bucket(*args),
    )


_VERSIONS: tuple[str, str] | None = None


def _versions() -> tuple[str, str]:
    global _VERSIONS
    if _VERSIONS is None:
        try:
            import triton

            tv = triton.__version__
        except Exception:
            tv = ""
        _VERSIONS = (tv, torch.__version__.split("+")[0])
    return _VERSIONS


def lookup(key: TuneKey, cache: AutotuneCache | None = None) -> tuple[TuneEntry | None, str]:
    """The entry for ``key`` from the user's cache, else the shipped table."""
    entry = (cache or autotune_cache()).get(key)
    if entry is not None:
        return entry, "tuned"
    entry = shipped.get(key)
    if entry is not None:
        return entry, "shipped"
    return None, ""


def measure_configs(
    variant: Variant,
    args: tuple,
    configs: list[dict[str, Any]],
    device: torch.device,
    *,
    quick: bool = False,
    on_config: Callable[[dict, float | None], None] | None = None,
) -> list[tuple[dict[str, Any], float]]:
    """Median time of each config that compiles and runs; failures are skipped."""
    results = []
    for cfg in configs:
        try:
            ms = timing.bench(lambda: variant.run(cfg, *args), device, quick=quick)
        except Exception as e:  # a config that does not compile or exceeds resources
            if os.environ.get("OPFORGE_DEBUG"):
                warnings.warn(f"opforge: config {cfg} of {variant.name} failed: {e!r}")
            ms = None
        if on_config is not None:
            on_config(cfg, ms)
        if ms is not None:
            results.append((cfg, ms))
    return results


def tune(op: Op, variant: Variant, args: tuple, cache: AutotuneCache | None = None, **kw) -> TuneEntry | None:
    """Measure ``variant``'s candidate configs on ``args``; store and return the winner."""
    cache = cache or autotune_cache()
    tensors = op.tensors(*args)
    device = tensors[0].device if tensors else devmod.default_device()
    configs = list(variant.configs(*args))
    results = measure_configs(variant, args, configs, device, **kw)
    if not results:
        return None
    cfg, ms = min(results, key=lambda r: r[1])
    entry = TuneEntry(tune_key(op, variant, args), cfg, ms)
    cache.put(entry)
    return entry


def can_benchmark(tensors) -> bool:
    """Tuning runs kernels many times: never while a CUDA graph is being captured."""
    if tensors and tensors[0].device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing()
    return True
