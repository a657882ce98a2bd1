"""Dispatch: pick the variant and config that run for these arguments.

The rule: among the variants that support the arguments, prefer the one
with the fastest tuned entry for this shape bucket (the user's cache, then the
shipped table; within ``TIE_MARGIN`` the earlier variant wins); with no
entries, the first supported variant in the op's order.

In the default mode (``OPFORGE_AUTOTUNE=cached``, and ``background``) a bucket
with no exact entry for any variant uses the nearest bucket's entries
(:mod:`opforge.runtime.nearest`): each variant's nearest entry whose config
fits these arguments; of those at the smallest distance, the fastest wins by
the same rule (entries equally far are equally good evidence; a farther one
is passed over). An exact entry outranks every nearest one: it was measured
on this bucket, a neighbour's time was not, so their times are not compared
and a variant with only a nearest entry is passed over. With neither, the
first supported variant runs its default config ("heuristic"). Nothing is
benchmarked in these modes; ``background`` queues the bucket for a worker
thread (:mod:`opforge.runtime.background`).

Decisions are memoized on the op's cheap key, so a repeated call costs
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
    # "tuned" | "shipped" | "nearest" | "heuristic" | "default" | "forced" | "reference"
    source: str
    rejected: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    cuda_index: int | None = None
    geom: Any = None  # the op's geometry, for a family's variant
    near_bucket: str | None = None  # the bucket whose entry a "nearest" decision uses
    passed: dict[str, str] = field(default_factory=dict)  # why a supported variant was passed over
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
        source = f"nearest bucket {self.near_bucket}" if self.source == "nearest" else self.source
        lines = [f"{self.op.qualname}: runs {self.variant.name} (v{self.variant.version}) "
                 f"config={self.config or '{}'} [{source}]"]
        for v in self.op.variants:
            if v is self.variant:
                continue
            if v.name in self.rejected:
                lines.append(f"  rejected {v.name}: {self.rejected[v.name]}")
            elif v.name in self.passed:
                lines.append(f"  passed over {v.name}: {self.passed[v.name]}")
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
# Shortcuts an op keeps in front of ``call`` for its commonest memo hits (matmul's plain product
# routed to the vendor: ``ops/matmul.py``), learned from memoized decisions: emptied whenever the
# memo forgets one and while a variant is forced or the validated path runs.
shortcuts: list[dict] = []


def forget_shortcuts() -> None:
    for s in shortcuts:
        s.clear()


def shortcuts_allowed() -> bool:
    """Whether ``call`` would run a memoized decision unhooked: no variant forced, no validated path,
    no hooks listening (an op learns a shortcut only then, and takes one only while no hook listens)."""
    return not (_forced or _validated_only or _hooks.HOOKS)


def reset() -> None:
    """Forget memoized decisions (after changing OPFORGE_* settings or the cache)."""
    _memo.clear()
    forget_shortcuts()


@contextlib.contextmanager
def validated_path():
    """Inside the block every call validates and decides afresh and runs its
    variant's plain ``run`` (no memo, no pre-bound runner) and every kernel
    launch goes through ``JITFunction.run``: the reference the fast path is
    tested against."""
    global _validated_only
    old, _validated_only = _validated_only, True
    forget_shortcuts()
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
    forget_shortcuts()
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
    if mode in autotune.NEAREST_MODES:
        d = _decide_cached(op, args, geom, supported, tunable, rejected, cuda_index)
        if tune and mode == "background" and d.source in ("nearest", "heuristic"):
            _tune_in_background(d, args)
        return d
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
        best = _fastest(timings)
        v = op.variant(best)
        return Decision(op, v, entries[best].config, sources[best], rejected, timings, cuda_index, geom)
    v = supported[0]
    source = "reference" if v.kind == "reference" else "default"
    return Decision(op, v, _default_config(v, args, geom), source, rejected, timings, cuda_index, geom)


def _fastest(timings: dict[str, float]) -> str:
    """The fastest name; within ``TIE_MARGIN`` of it, the first in ``timings``' (the op's) order."""
    fastest = min(timings.values())
    return next(n for n, ms in timings.items() if ms <= fastest * (1 + TIE_MARGIN))


def _decide_cached(op: Op, args: tuple, geom, supported: list[Variant], tunable: list[Variant],
                   rejected: dict[str, str], cuda_index) -> Decision:
    """The default modes' rule (module docstring): exact entries, else the
    nearest buckets' entries, else the heuristic. Never benchmarks."""
    keys = {v.name: autotune.tune_key(op, v, args, geom) for v in tunable}
    exact: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for v in tunable:
        entry, source = autotune.lookup(keys[v.name], variant=v, args=args)
        if entry is not None:
            exact[v.name], sources[v.name] = entry, source
    if exact:
        timings = {name: e.median_ms for name, e in exact.items()}
        best = _fastest(timings)
        why = "no entry for this bucket; another variant has one (an exact entry outranks any nearest one)"
        passed = {v.name: why for v in tunable if v.name not in exact}
        return Decision(op, op.variant(best), exact[best].config, sources[best], rejected, timings, cuda_index,
                        geom, passed=passed)
    near = {}
    for v in tunable:
        found = autotune.nearest_entries(keys[v.name], v, args)
        if found:
            near[v.name] = found[0]
    if near:
        closest = min(round(n.distance, 9) for n in near.values())
        level = {name: n.entry.median_ms for name, n in near.items() if round(n.distance, 9) == closest}
        best = _fastest(level)
        chosen = near[best]
        passed = {}
        for v in tunable:
            n = near.get(v.name)
            if v.name == best:
                continue
            if n is None:
                passed[v.name] = "no entry for this or a comparable bucket"
            elif v.name not in level:
                passed[v.name] = f"its nearest entry (bucket {n.bucket}, distance {n.distance:.3g}) is farther"
            else:
                passed[v.name] = (f"tuned at {n.entry.median_ms:.4g} ms on bucket {n.bucket}, chosen one "
                                  f"{chosen.entry.median_ms:.4g} ms on bucket {chosen.bucket}")
        return Decision(op, op.variant(best), chosen.entry.config, "nearest", rejected, level, cuda_index, geom,
                        near_bucket=chosen.bucket, passed=passed)
    v = supported[0]
    source = "reference" if v.kind == "reference" else "heuristic"
    return Decision(op, v, _default_config(v, args, geom), source, rejected, {}, cuda_index, geom)


def _tune_in_background(d: Decision, args: tuple) -> None:
    """Queue ``d``'s bucket for the background worker; when it is tuned, ``d``
    (already memoized by ``call``, maybe) switches to the tuned config and the
    memo forgets it, so the next call runs the tuned config."""
    from opforge.runtime import background

    op, v = d.op, d.variant
    key = autotune.tune_key(op, v, args, d.geom)
    memo_key = (op.name, op.memo_key(*args), None)  # as ``call`` builds it, with no variant forced

    def done(entry) -> None:
        d.config, d.source, d.near_bucket = entry.config, "tuned", None
        d.timings, d.passed = {v.name: entry.median_ms}, {}
        with _lock:
            _memo.pop(memo_key, None)
            forget_shortcuts()

    background.submit(op, v, args, key.text(), done)


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
        # A decision made during CUDA-graph capture skipped the tuning that mode "on" would do later:
        # kept only in the modes that never tune inside a call.
        if autotune.mode() not in ("on", "exhaustive") or autotune.can_benchmark(op.tensors(*args)):
            with _lock:
                if len(_memo) >= _MEMO_LIMIT:
                    _memo.clear()
                    forget_shortcuts()
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
