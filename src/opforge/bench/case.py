"""A bench case: one op on one shape, its counted work, its reference and peers.

FLOPs and bytes are counted, not measured: bytes are the fewest an op must
move (each input read once, each output written once). With the measured
ceilings they give the floor time; achieved / attainable is the op's place
under the roofline.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from opforge.runtime import dispatch, registry, timing
from opforge.runtime.roofline import Ceilings

# ‖out − ref‖ / ‖ref‖ bounds against a float64 reference, per output dtype.
REL_ERR_BOUND = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@dataclass
class BenchCase:
    op: str  # registry name, e.g. "add"
    label: str  # shape as people read it, e.g. "32768x8192"
    dtype: torch.dtype
    make_args: Callable[[torch.device], tuple]  # random inputs, never zeros
    run: Callable[..., torch.Tensor]  # the opforge call
    reference: Callable[..., torch.Tensor]  # float64 oracle on upcast args
    flops: float
    nbytes: float
    peers: dict[str, Callable[..., torch.Tensor]] = field(default_factory=dict)
    variant: str | None = None  # force a variant (crossover sweeps)
    graph: bool = False  # launch-bound: time CUDA-graph replays on both sides
    # The registry op's arguments for the bench arguments, when the public call
    # takes them differently (e.g. layer_norm's shape and eps): used to ask
    # dispatch which variant ran, and to time a forced variant directly.
    op_args: Callable[..., tuple] | None = None
    # False: the reference takes the inputs as they are, not upcast to float64
    # (ops whose reference defines the arithmetic, e.g. quantize: bit-exact).
    upcast_reference: bool = True

    def registry_args(self, *args) -> tuple:
        """The bench inputs ``args`` as the registry op takes them."""
        return tuple(self.op_args(*args)) if self.op_args is not None else tuple(args)


def compiled_peer(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torch.compile of ``fn``, specialized to each shape like a user's model.

    Each bench shape is a recompile of the same function: lift dynamo's
    recompile limit, or later shapes would silently fall back to eager.
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 1024)
    return torch.compile(fn, dynamic=False)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ over finite values; inf when out is non-finite where the
    reference, rounded to out's dtype, is finite (or the other way round).

    Rounding first matters: exp(12) overflows fp16, and an inf there is right.
    """
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    expect = ref.detach().to(out.dtype).to(torch.float64) if out.dtype.is_floating_point else ref64
    finite = torch.isfinite(expect)
    if not bool(torch.equal(finite, torch.isfinite(out64))):
        return float("inf")
    if not bool(torch.equal(out64[~finite].nan_to_num(posinf=1, neginf=-1, nan=0),
                            expect[~finite].nan_to_num(posinf=1, neginf=-1, nan=0))):
        return float("inf")
    denom = torch.linalg.vector_norm(ref64[finite])
    num = torch.linalg.vector_norm((out64 - ref64)[finite])
    return float(num / denom) if float(denom) > 0 else float(num)


def _time(fn: Callable[[], Any], device: torch.device, *, quick: bool, graph: bool) -> float:
    if device.type == "cuda" and graph:
        return timing.bench_graph(fn)
    return timing.bench(fn, device, quick=quick)


def run_case(case: BenchCase, device: torch.device, ceilings: Ceilings, *, quick: bool) -> dict:
    """Check the op against its reference, then time it and its peers."""
    op = registry.get(case.op)
    args = case.make_args(device)
    ctx = dispatch.force_variant(case.op, case.variant) if case.variant else contextlib.nullcontext()
    with ctx:
        out = case.run(*args)
        dargs = case.registry_args(*args)
        decision = dispatch.decide(op, dargs, tune=False)
        ref = case.reference(*[a.to(torch.float64) if case.upcast_reference and isinstance(a, torch.Tensor)
                               and a.is_floating_point() else a for a in args])
        err = rel_err(out, ref)
        # A forced variant is timed directly: the sweep compares kernels, and
        # dispatch costs the same whichever variant it picks.
        timed = (lambda: decision.variant.run(decision.config, *dargs)) if case.variant else (lambda: case.run(*args))
        ms = _time(timed, device, quick=quick, graph=case.graph)
    peers = {}
    for name, fn in case.peers.items():
        try:
            fn(*args)
            pms = _time(lambda fn=fn: fn(*args), device, quick=quick, graph=case.graph)
            peers[name] = {"median_ms": pms, "ratio": pms / ms}
        except Exception as e:  # a peer that cannot run here (e.g. no compiler) is reported, not fatal
            peers[name] = {"median_ms": None, "ratio": None, "error": f"{type(e).__name__}: {e}"[:200]}
    floor = ceilings.floor_ms(case.flops, case.nbytes)
    bound = REL_ERR_BOUND.get(out.dtype, 0.0)
    return {
        "op": op.qualname,
        "variant": decision.variant.name,
        "config": decision.config,
        "shape": case.label,
        "dtype": str(case.dtype).replace("torch.", ""),
        "flops": case.flops,
        "bytes": case.nbytes,
        "median_ms": ms,
        "tbps": case.nbytes / (ms * 1e-3) / 1e12,
        "tflops": case.flops / (ms * 1e-3) / 1e12,
        "intensity": case.flops / case.nbytes if case.nbytes else None,
        "attainable_tflops": ceilings.attainable_tflops(case.flops / case.nbytes) if case.nbytes else None,
        "pct_roofline": 100.0 * floor / ms,
        "max_rel_err": err,
        "correct": err <= bound,
        "graph_timed": bool(case.graph and device.type == "cuda"),
        "peers": peers,
    }
