"""Achieved bandwidth and FLOP rate of one op at several configs, beside each
config's compiled resources and theoretical occupancy.

The question it answers is the occupancy article's: does more occupancy pay?
For each candidate config of the variant dispatch picks (the variant's own
``configs``, default first, capped at ``max_configs``) the sweep compiles the
config's kernels for sm_90 (registers, spills, shared memory, occupancy and
its limiter, no GPU needed) and, on CUDA tensors, times the config with the
bench timing (median of CUDA-event repeats, L2 flushed). Bytes are the
fewest the op must move (each input read once, each output written once,
the bench rule); FLOPs are the caller's (``flops=``) or, when not given, one
per output element, flagged ``flops_assumed``. With the measured ceilings
(``runtime.roofline``) each row gets its % of copy bandwidth and its place
under the roofline. Without CUDA the rows carry resources only (times None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable


@dataclass
class SweepRow:
    config: dict
    chosen: bool  # the config dispatch runs
    kernels: list = field(default_factory=list)  # Resources.to_dict() per launched kernel
    error: str = ""  # the config does not compile / run
    median_ms: float | None = None
    tbps: float | None = None
    tflops: float | None = None
    pct_copy_bw: float | None = None
    pct_roofline: float | None = None

    @property
    def occupancy(self) -> float | None:
        """The lowest theoretical occupancy among the config's kernels."""
        occ = [k["occupancy"]["occupancy"] for k in self.kernels]
        return min(occ) if occ else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                       for k, v in self.config.items()}
        d["occupancy"] = self.occupancy
        return d


@dataclass
class Sweep:
    op: str
    variant: str
    source: str  # dispatch's decision source
    nbytes: float
    flops: float
    flops_assumed: bool
    rows: list[SweepRow]
    timed: bool
    ceilings: dict | None  # {"copy_tbps", "bf16_tflops", "method"} when timed

    def to_dict(self) -> dict:
        return {"op": self.op, "variant": self.variant, "source": self.source, "nbytes": self.nbytes,
                "flops": self.flops, "flops_assumed": self.flops_assumed, "timed": self.timed,
                "ceilings": self.ceilings, "rows": [r.to_dict() for r in self.rows]}


def _tensors(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    return []


def count_bytes(op, args: tuple) -> tuple[float, float]:
    """(bytes the op must move, output elements): inputs read once, outputs
    written once; outputs' shapes from the reference on ``meta`` tensors."""
    import torch

    ins = [t for t in op.tensors(*args)]
    nbytes = float(sum(t.numel() * t.element_size() for t in ins))
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    try:
        outs = _tensors(op.reference(*meta))
    except Exception:  # a reference meta cannot run: fall back to a real small run is not possible; assume x-shaped
        outs = [ins[0]] if ins else []
    nbytes += sum(t.numel() * t.element_size() for t in outs)
    return nbytes, float(sum(t.numel() for t in outs))


def pick_configs(default: dict, candidates: list[dict], max_configs: int) -> list[dict]:
    """The default first, then candidates spread evenly over the list, no duplicates."""
    out = [dict(default)]
    rest = [dict(c) for c in candidates if dict(c) != dict(default)]
    room = max(0, max_configs - 1)
    if len(rest) > room:
        step = len(rest) / room if room else 0
        rest = [rest[int(i * step)] for i in range(room)]
    for c in rest:
        if c not in out:
            out.append(c)
    return out


def sweep(op_name: str, *args, variant: str | None = None, configs: list[dict] | None = None,
          max_configs: int = 8, flops: float | None = None, nbytes: float | None = None,
          timer: Callable[[Callable[[], Any]], float] | None = None, arch: int = 90, limits=None,
          resources: list | None = None) -> Sweep:
    """Compile (and on CUDA, time) ``op_name(*args)`` at several configs.

    ``timer(fn) -> median ms`` replaces the bench timing (tests, other clocks);
    ``configs`` replaces the variant's candidate list; ``resources`` (with
    ``configs``: ``op_config_resources`` of them) skips the compiles.
    """
    import torch

    from opforge.profile.resources import decide_for_profile, op_config_resources

    decision = decide_for_profile(op_name, args, variant)
    op, v = decision.op, decision.variant
    cpu_args = tuple(torch.zeros_like(a, device="cpu") if isinstance(a, torch.Tensor) and a.device.type == "meta"
                     else a for a in args)
    cands = list(configs) if configs is not None else list(v.configs(*cpu_args))
    chosen = dict(decision.config)
    cfgs = pick_configs(chosen, cands, max_configs) if configs is None else [dict(c) for c in cands]
    if resources is not None and len(resources) != len(cfgs):
        raise ValueError(f"sweep: {len(resources)} resources for {len(cfgs)} configs")
    res = resources if resources is not None else op_config_resources(decision, args, cfgs, arch=arch,
                                                                       limits=limits)

    moved, out_elems = count_bytes(op, args)
    moved = float(nbytes) if nbytes is not None else moved
    assumed = flops is None
    work = float(flops) if flops is not None else out_elems
    on_cuda = _cuda_device(args) is not None
    ceil = None
    if on_cuda or timer is not None:
        ceil = _ceilings(args) if on_cuda else None
    rows = []
    for cfg, r in zip(cfgs, res):
        row = SweepRow(cfg, cfg == chosen)
        if isinstance(r, str):
            row.error = r[:300]
        else:
            row.kernels = [k.to_dict() for k in r]
        if not row.error and (on_cuda or timer is not None):
            try:
                ms = _time(v, cfg, args, timer)
            except Exception as e:  # a config that compiles but cannot launch here
                row.error = f"{type(e).__name__}: {e}"[:300]
                ms = None
            if ms:
                row.median_ms = ms
                row.tbps = moved / (ms * 1e-3) / 1e12
                row.tflops = work / (ms * 1e-3) / 1e12
                if ceil:
                    row.pct_copy_bw = 100.0 * row.tbps / ceil["copy_tbps"]
                    t_floor = max(moved / (ceil["copy_tbps"] * 1e12), work / (ceil["bf16_tflops"] * 1e12))
                    row.pct_roofline = 100.0 * t_floor * 1e3 / ms
        rows.append(row)
    return Sweep(op.qualname, v.name, decision.source, moved, work, assumed, rows,
                 any(r.median_ms is not None for r in rows), ceil)


def _cuda_device(args):
    """The device of the first CUDA tensor in ``args``, looking inside lists and tuples (grouped
    GEMM takes tuples of tensors); None when there is none."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device
        if isinstance(a, (list, tuple)):
            dev = _cuda_device(a)
            if dev is not None:
                return dev
    return None


def _time(v, cfg, args, timer) -> float:
    fn = lambda: v.run(cfg, *args)  # noqa: E731
    if timer is not None:
        return float(timer(fn))
    from opforge.runtime import timing

    return timing.bench(fn, _cuda_device(args))


def _ceilings(args) -> dict:
    from opforge.runtime import roofline

    c = roofline.ceilings(_cuda_device(args))
    return {"copy_tbps": c.copy_tbps, "bf16_tflops": c.bf16_tflops, "method": c.method}


def occupancy_pays(sweep_result: Sweep, tolerance: float = 0.05) -> dict | None:
    """The lowest occupancy whose time is within ``tolerance`` of the fastest
    config's: above it, more occupancy stopped paying. None without timings."""
    timed = [r for r in sweep_result.rows if r.median_ms and r.occupancy is not None]
    if not timed:
        return None
    fastest = min(r.median_ms for r in timed)
    enough = [r for r in timed if r.median_ms <= fastest * (1 + tolerance)]
    low = min(enough, key=lambda r: (r.occupancy, r.median_ms))
    rate = sweep_result.nbytes / 1e9  # GB -> TB/s when divided by ms
    return {"occupancy": low.occupancy, "config": low.config, "tbps": rate / low.median_ms,
            "best_tbps": rate / fastest, "tolerance": tolerance}
