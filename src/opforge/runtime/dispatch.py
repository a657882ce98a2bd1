"""Dispatch: pick the variant and config that run for these arguments.

The rule: among the variants that support the arguments, prefer the one
with the fastest tuned entry for this shape bucket (the user's cache, then the
shipped table; within ``TIE_MARGIN`` the earlier variant wins); with no
entries, the first supported variant in the op's order. Decisions are memoized on the op's cheap key, so a repeated call costs
one dict lookup before the kernel launch. A family's geometry (``Op.geometry``)
depends only on what that key holds, so it is computed with the decision and
kept in it: a memoized call passes it to the variant without recomputing it. On its first call a decision
binds its runner (``_bind``): config bound, and for the hot variants (``bind`` on their runner) grid,
constexprs and a pre-bound Triton launcher (``runtime.launch``) fixed, so a memo hit is the key, one lookup
and that runner. ``validated_path()`` turns all of it off (the fast path's test reference). ``explain`` says
what would run and why each other variant was rejected.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from opforge.runtime import autotune
from opforge.runtime import hooks as _hooks
from opforge.runtime import device as devmod
from opforge.runtime import launch
from opforge.runtime.registry import Op, Variant, get

_MEMO_LIMIT = 8192
# Tuned times within this fraction of the fastest count as a tie, and a tie
# goes to the variant earlier in the op's order (our kernels before vendor
# calls): run-to-run noise must not flip decisions.
TIE_MARGIN = 0.015


@dataclass
class Decision:
    op: Op
    variant: Variant
    config: dict[str, Any]
    source: str  # "tuned" | "shipped" | "default" | "forced" | "reference"
    rejected: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    cuda_index: int | None = None
    geom: Any = None  # the op's geometry, for a family's variant
    run: Any = field(init=False, repr=False, compare=False)  # run(config, *args)
    # fast(*args): the hot path's runner, config bound (see ``_bind``); bound on the first call
    fast: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = self.variant.spec
        self.run = functools.partial(spec.run, self.geom) if spec is not None and self.geom is not None \
            else self.variant.run
        self.fast = self._bind_and_run

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        if name == "config" and "fast" in self.__dict__:  # a new config (a failed launch's default): rebind
            object.__setattr__(self, "fast", self._bind_and_run)

    def _bind_and_run(self, *args):
        self.fast = _bind(self, args)
        return self.fast(*args)

    def __str__(self) -> str:
        lines = [f"{self.op.qualname}: runs {self.variant.name} (v{self.variant.version}) "
                 f"config={self.config or '{}'} [{self.source}]"]
        for v in self.op.variants:
            if v is self.variant:
                continue
            if v.name in self.rejected:
                lines.append(f"  rejected {v.name}: {self.rejected[v.name]}")
            elif v.name in self.timings:
                lines.append(f"  passed over {v.name}: tuned at {self.timings[v.name]:.4g} ms, "
                             f"chosen one {self.timings.get(self.variant.name, float('nan')):.4g} ms")
            else:
                lines.append(f"  passed over {v.name}: supported, later in the op's order")
        return "\n".join(lines)


def _bind(d: Decision, args: tuple):
    """The runner of ``d`` with its config bound. A family's variant whose
    runner has ``bind(geom, config, args)`` pre-computes, from the first
    call's arguments, what depends only on the memo key (shapes, strides,
    dtypes, device): launch grids, constexprs, kernel launchers. ``bind``
    returns None when it has no fast form for these arguments."""
    spec = d.variant.spec
    fast = None
    if spec is not None and d.geom is not None:
        bind = getattr(spec.run, "bind", None)
        if bind is not None:
            fast = bind(d.geom, d.config, args)
        if fast is None:
            fast = functools.partial(spec.run, d.geom, d.config)
    else:
        fast = functools.partial(d.variant.run, d.config)
    if _MULTI_GPU and d.cuda_index is not None:
        return functools.partial(_on_device, d.cuda_index, fast)
    return fast


def _on_device(index: int, fn, *args):
    if index != torch.cuda.current_device():
        with torch.cuda.device(index):
            return fn(*args)
    return fn(*args)


_memo: dict[tuple, Decision] = {}
_forced: dict[str, str] = {}
_lock = threading.Lock()
_MULTI_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 1
_validated_only = False  # validated_path(): decide and validate every call, no pre-bound runners


def reset() -> None:
    """Forget memoized decisions (after changing OPFORGE_* settings or the cache)."""
    _memo.clear()


@contextlib.contextmanager
def validated_path():
    """Inside the block every call validates and decides afresh and runs its
    variant's plain ``run`` (no memo, no pre-bound runner) and every kernel
    launch goes through ``JITFunction.run``: the reference the fast path is
    tested against."""
    global _validated_only
    old, _validated_only = _validated_only, True
    try:
        with launch.jit_run_only():
            yield
    finally:
        _validated_only = old


@contextlib.contextmanager
def force_variant(op_name: str, variant: str):
    """Run ``op_name`` with ``variant`` inside the block (bench, selftest, tests)."""
    op = get(op_name)
    op.variant(variant)  # raises for a wrong name
    old = _forced.get(op.name)
    _forced[op.name] = variant
    try:
        yield
    finally:
        if old is None:
            _forced.pop(op.name, None)
        else:
            _forced[op.name] = old


_UNSET = object()


def geometry(op: Op, args: tuple):
    """The op's geometry for ``args`` (None for an op outside a family)."""
    return op.geometry(*args) if op.geometry is not None else None


def reject_reason(op: Op, v: Variant, args: tuple, geom=_UNSET) -> str | None:
    """Why ``v`` cannot take ``args``, or None when it can."""
    tensors = op.tensors(*args)
    dev = tensors[0].device if tensors else torch.device("cpu")
    if v.kind == "triton":
        if not devmod.triton_available():
            return "triton is not installed"
        if dev.type == "cpu" and not devmod.interpret_mode():
            return "tensors are on the CPU (Triton kernels need CUDA, or OPFORGE_INTERPRET=1)"
        if dev.type == "cuda" and devmod.interpret_mode():
            return "OPFORGE_INTERPRET=1 runs Triton kernels on CPU tensors only"
        if dev.type not in ("cpu", "cuda"):
            return f"device {dev.type} is not supported"
    elif dev.type not in v.devices:
        return f"device {dev.type} not in {v.devices}"
    if v.dtypes is not None:
        bad = [t.dtype for t in tensors if t.dtype not in v.dtypes]
        if bad:
            return f"dtype {bad[0]} not in {sorted(str(d).replace('torch.', '') for d in v.dtypes)}"
    if dev.type == "cuda" and v.min_capability > (0, 0):
        cap = devmod.capability(dev)
        if cap < v.min_capability:
            return f"needs sm_{v.min_capability[0]}{v.min_capability[1]}, device is sm_{cap[0]}{cap[1]}"
    if v.spec is None:
        return v.check(*args)
    return v.spec.check(geometry(op, args) if geom is _UNSET else geom)


def _default_config(v: Variant, args: tuple, geom) -> dict[str, Any]:
    return v.spec.default_config(geom) if v.spec is not None else v.default_config(*args)


def decide(op: Op, args: tuple, *, tune: bool = True) -> Decision:
    """The full decision (slow path): filter, consult the cache, maybe tune."""
    op.validate(*args)
    tensors = op.tensors(*args)
    geom = geometry(op, args)
    rejected: dict[str, str] = {}
    supported: list[Variant] = []
    for v in op.variants:
        reason = reject_reason(op, v, args, geom)
        if reason is None:
            supported.append(v)
        else:
            rejected[v.name] = reason
    if not supported:
        raise RuntimeError(f"{op.qualname}: no variant supports these arguments: {rejected}")
    cuda_index = tensors[0].device.index if tensors and tensors[0].device.type == "cuda" else None

    forced = _forced.get(op.name)
    if forced is not None:
        v = op.variant(forced)
        if v not in supported:
            raise ValueError(f"{op.qualname}: forced variant {forced} rejects these arguments: {rejected[forced]}")
        entry, _ = autotune.lookup(autotune.tune_key(op, v, args, geom), variant=v, args=args) \
            if v.kind != "reference" else (None, "")
        cfg = entry.config if entry else _default_config(v, args, geom)
        return Decision(op, v, cfg, "forced", rejected, {}, cuda_index, geom)

    tunable = [v for v in supported if v.kind != "reference"]
    mode = autotune.mode()
    may_bench = tune and mode != "off" and autotune.can_benchmark(tensors)
    entries: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for i, v in enumerate(tunable):
        entry, source = autotune.lookup(autotune.tune_key(op, v, args, geom), variant=v, args=args)
        wants_tuning = entry is None and may_bench and (mode == "exhaustive" or (i == 0 and not entries))
        if wants_tuning:
            entry, source = autotune.tune(op, v, args), "tuned"
        if entry is not None:
            entries[v.name], sources[v.name] = entry, source
        if mode == "on" and i == 0 and entry is None and may_bench:
            break  # the preferred variant failed to tune; fall through to the rule
    timings = {name: e.median_ms for name, e in entries.items()}
    if entries:
        fastest = min(e.median_ms for e in entries.values())
        best = next(n for n in entries if entries[n].median_ms <= fastest * (1 + TIE_MARGIN))
        v = op.variant(best)
        return Decision(op, v, entries[best].config, sources[best], rejected, timings, cuda_index, geom)
    v = supported[0]
    source = "reference" if v.kind == "reference" else "default"
    return Decision(op, v, _default_config(v, args, geom), source, rejected, timings, cuda_index, geom)


def call(op: Op, *args):
    """Run ``op`` on ``args`` through its memoized decision (the hot path):
    the memo key, one dict lookup, the decision's pre-bound runner. Validation
    and the decision happen once per memo key."""
    key = (op.name, op.memo_key(*args), _forced.get(op.name) if _forced else None)
    d = _memo.get(key)
    if d is None or _validated_only:
        d = decide(op, args)
        if _validated_only:
            return _run(d, args)
        if autotune.can_benchmark(op.tensors(*args)) or autotune.mode() == "off":
            with _lock:
                if len(_memo) >= _MEMO_LIMIT:
                    _memo.clear()
                _memo[key] = d
    if _hooks.HOOKS:  # NVTX ranges, timeline(): only while someone listens
        return _hooks.run_hooked(d, _run, d, args)
    try:
        return d.fast(*args)
    except Exception as e:  # a cached config that fails at launch: dropped, and d runs the default from now on
        return autotune.rerun_with_default(d, args, e, _run)


def _run(d: Decision, args: tuple):
    """The plain path: the variant's ``run`` with the decision's config."""
    try:
        if _MULTI_GPU and d.cuda_index is not None and d.cuda_index != torch.cuda.current_device():
            with torch.cuda.device(d.cuda_index):
                return d.run(d.config, *args)
        return d.run(d.config, *args)
    except Exception as e:  # a cached config that fails at launch: dropped, and d runs the default from now on
        return autotune.rerun_with_default(d, args, e, _run)


def explain(op_name: str, *args) -> Decision:
    """What would run for ``args`` and why; never benchmarks. ``print()`` it."""
    return decide(get(op_name), args, tune=False)
