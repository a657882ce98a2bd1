"""Autotune: measure a variant's candidate configs and keep the fastest.

Nothing benchmarks inside a user's call or query unless asked: tuning is
``opforge tune`` (offline) or a background thread the user opts into.

Modes (``OPFORGE_AUTOTUNE``):
  cached      (default) the exact entry for the shape bucket (the user's
              cache, then the shipped table); else the nearest bucket's
              entry of the same op, variant, dtype and GPU model
              (:mod:`opforge.runtime.nearest`); else the variant's default
              config (the heuristic). Never benchmarks.
  background  as cached, and a bucket with no exact entry is tuned by a
              daemon thread (:mod:`opforge.runtime.background`); the result
              is used from the next call on.
  off         exact entries only, else the default config; never benchmarks.
  on          as off, but a shape bucket with no entry for the variant that
              dispatch prefers is tuned inside the call, once, then cached.
  exhaustive  tune every supported variant's every config for each new
              bucket inside the call, so dispatch compares variants by time.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch

from opforge.runtime import device as devmod
from opforge.runtime import timing
from opforge.runtime import nearest
from opforge.runtime.cache import AutotuneCache, TuneEntry, TuneKey, autotune_cache, shipped
from opforge.runtime.registry import Op, Variant

MODES = ("cached", "background", "off", "on", "exhaustive")
DEFAULT_MODE = "cached"
# Modes that stand in a neighbouring bucket's entry for a missing exact one.
NEAREST_MODES = ("cached", "background")


def mode() -> str:
    m = os.environ.get("OPFORGE_AUTOTUNE", DEFAULT_MODE).strip().lower()
    if m not in MODES:
        warnings.warn(f"opforge: OPFORGE_AUTOTUNE={m!r} is not one of {MODES}; using {DEFAULT_MODE!r}",
                      RuntimeWarning)
        return DEFAULT_MODE
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


def lookup(key: TuneKey, cache: AutotuneCache | None = None, *, variant: Variant | None = None,
           args: tuple | None = None) -> tuple[TuneEntry | None, str]:
    """The entry for ``key`` from the user's cache, else the shipped table.

    With ``variant`` and ``args``, an entry whose config does not look like the
    variant's candidates for ``args`` (:func:`config_problem`) is dropped with
    one warning, and the next source is consulted."""
    cache = cache or autotune_cache()
    for source, table in (("tuned", cache), ("shipped", shipped)):
        entry = table.get(key)
        if entry is None:
            continue
        why = config_problem(variant, entry.config, args) if variant is not None and args is not None else None
        if why is None:
            return entry, source
        table.drop(key, f"{why}; calls run with the default config")
    return None, ""


def nearest_entries(key: TuneKey, variant: Variant, args: tuple,
                    cache: AutotuneCache | None = None) -> list[nearest.Near]:
    """Entries of neighbouring buckets that may stand in for ``key``'s (same
    op, variant, kernel version, dtype, GPU model; comparable bucket), nearest
    first, leaving out any whose config does not fit ``variant``'s candidates
    for ``args`` (:func:`config_problem`; the entry stays: it fits its own bucket)."""
    cache = cache or autotune_cache()
    found = nearest.neighbours(key, (("tuned", cache.groups()), ("shipped", shipped.groups())))
    if not found:
        return []
    candidates = _candidates(variant, args)
    return [n for n in found if candidates is None or config_problem(variant, n.entry.config,
                                                                     candidates=candidates) is None]


def _candidates(variant: Variant, args: tuple | None) -> list[dict[str, Any]] | None:
    """``variant``'s configs for ``args`` plus its default, or None when they cannot be listed."""
    try:
        found = [dict(c) for c in variant.configs(*args)]
        return found + ([dict(variant.default_config(*args))] if any(found) else [])
    except Exception:  # candidates that cannot be listed for these args: nothing to compare with
        return None


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def config_problem(variant: Variant, config: dict[str, Any], args: tuple | None = None,
                   candidates: list[dict[str, Any]] | None = None) -> str | None:
    """Why ``config`` cannot be one of ``variant``'s configs, or None.

    The candidates are ``variant.configs(*args)`` and its default config. A
    config among them is fine; another must have the keys of one of them, each
    value of the type the candidates give that key, and, where every candidate
    value of a key is a power of two (block sizes, warps), a power of two. A
    variant that declares no configs (or none with keys) is not checked.
    """
    if candidates is None:
        candidates = _candidates(variant, args)
        if candidates is None:
            return None
    candidates = [c for c in candidates if isinstance(c, dict)]
    if not any(candidates) or config in candidates:
        return None
    key_sets = {frozenset(c) for c in candidates}
    if frozenset(config) not in key_sets:
        want = " or ".join(str(sorted(k)) for k in sorted(key_sets, key=sorted)[:3])
        return f"config {config} has keys {sorted(config)}, {variant.name}'s configs have {want}"
    for name, value in config.items():
        seen = [c[name] for c in candidates if name in c]
        types = {type(v) for v in seen}
        if type(value) not in types:
            return (f"config {config}: {name}={value!r} is a {type(value).__name__}, "
                    f"{variant.name}'s configs give {'/'.join(sorted(t.__name__ for t in types))}")
        ints = [v for v in seen if type(v) is int]
        if type(value) is int and ints and len(ints) == len(seen) and all(_is_pow2(v) for v in ints) \
                and not _is_pow2(value):
            return f"config {config}: {name}={value} is not a power of two (as every {variant.name} config's is)"
    return None


def rerun_with_default(decision, args: tuple, error: Exception, run: Callable):
    """``decision``'s cached config raised ``error`` at launch: run ``run(decision,
    args)`` with the variant's default config instead. When that works, the cached
    entry is dropped with one warning and the decision (memoized) keeps the
    default config; when it fails too (or there is no cached config to blame),
    ``error`` is raised and nothing is dropped."""
    variant = decision.variant
    try:
        default = variant.default_config(*args)
    except Exception:
        raise error from None
    if decision.source not in ("tuned", "shipped", "forced", "nearest") or decision.config == default:
        raise error
    cached = decision.config
    decision.config = default
    try:
        out = run(decision, args)
    except Exception:
        decision.config = cached
        raise error from None
    if decision.source == "nearest":  # the entry fits its own bucket: kept, this decision stops using it
        warnings.warn(f"opforge: {decision.op.qualname} {variant.name}: config {cached} of the nearest bucket "
                      f"{decision.near_bucket} failed at launch here ({type(error).__name__}: "
                      f"{str(error)[:200]}); calls run with the default config {default}", RuntimeWarning,
                      stacklevel=3)
        decision.source, decision.near_bucket = "heuristic", None
        return out
    key = tune_key(decision.op, variant, args)
    why = (f"config {cached} failed at launch ({type(error).__name__}: {str(error)[:200]}); "
           f"calls run with the default config {default}")
    cache = autotune_cache()
    if cache.get(key) is not None:
        cache.drop(key, why)
    else:
        shipped.drop(key, why)
    decision.source = "default"
    return out


def import_check(entry: TuneEntry) -> str | None:
    """Why ``opforge tune --import`` refuses ``entry``, or None: an op or variant
    this opforge does not have, or a config unlike the variant's candidates
    (compared with the candidates for the op's sample inputs)."""
    from opforge.runtime import registry

    try:
        op = registry.get(entry.key.op)
        variant = op.variant(entry.key.variant)
    except KeyError as e:
        return str(e.args[0] if e.args else e)
    candidates = _sample_candidates(op, variant)
    return config_problem(variant, entry.config, candidates=candidates) if candidates else None


_SAMPLE_CANDIDATES: dict[tuple[str, str], list[dict]] = {}


def _sample_candidates(op: Op, variant: Variant) -> list[dict]:
    k = (op.name, variant.name)
    if k not in _SAMPLE_CANDIDATES:
        found: list[dict] = []
        try:
            samples = list(op.samples(torch.device("cpu")))
        except Exception:
            samples = []
        for args in samples[:8]:
            try:
                declared = [dict(c) for c in variant.configs(*args)]
                found += declared + ([dict(variant.default_config(*args))] if any(declared) else [])
            except Exception:
                continue
        _SAMPLE_CANDIDATES[k] = found
    return _SAMPLE_CANDIDATES[k]


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
