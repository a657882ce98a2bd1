"""Host cost of tiny-tensor calls, and where the vendor kernel wins (issue 23, item 3).

Two parts, each its own run on the GPU:

``host``: per-call microseconds of ``add``, ``softmax``, ``layer_norm``,
``rms_norm`` and ``matmul`` at 64x64 (fp32 and bf16): a loop of 2000 calls,
CUDA synced once at the end, the median of 7 loops; opforge as dispatch
decides, the same with the Triton variant forced, and torch's own op; the
ratio opforge / torch against the goal (add <= 1.2, softmax and the norms <=
1.5, matmul <= 1.3).

``crossover``: the same per-call time over sizes 2**10..2**26 elements (add,
softmax, layer_norm, rms_norm; a near-square ``[rows, cols]``) and M=N=K
16..2048 (matmul), for every Triton variant that takes the shape and for the
vendor variant (``dispatch.force_variant``). It prints, per op and dtype,
the smallest size from which Triton is faster (the crossover), and writes
tuned-table entries (``runtime/tuned`` format, keys from
``autotune.tune_key``) for every size where the vendor variant wins: one
entry per supported variant, all timed the same way, so dispatch picks the
vendor there whatever else the tables hold. Commit that file as
``src/opforge/runtime/tuned/h200.small-shapes.jsonl``: the shipped tables load
in name order, later files win, and this name sorts after ``h200.jsonl``.

Run (H200)::

    OPFORGE_INTERPRET=0 python3 benchmarks/host_overhead.py host --out host.json
    OPFORGE_INTERPRET=0 python3 benchmarks/host_overhead.py crossover --out crossover.json \\
        --tuned-out h200.small-shapes.jsonl [--ops add,softmax] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import autotune, dispatch, registry
from opforge.runtime.cache import TuneEntry

GOALS = {"add": 1.2, "softmax": 1.5, "layer_norm": 1.5, "rms_norm": 1.5, "matmul": 1.3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CALLS = 2000
DEVICE = "cuda"  # --device cpu: a smoke run of the script itself (OPFORGE_INTERPRET=1), not a measurement


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], object], calls: int = CALLS, loops: int = 7) -> float:
    """Median over ``loops`` of (wall time of ``calls`` calls, synced once at the end) / calls."""
    for _ in range(20):
        fn()
    _sync()
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def _calls_for(fn: Callable[[], object], budget_s: float = 0.05) -> int:
    """Calls per loop so one loop takes about ``budget_s`` (big shapes are GPU-bound)."""
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    _sync()
    each = (time.perf_counter() - t0) / 5
    return max(10, min(CALLS, int(budget_s / max(each, 1e-9))))


# ---------------------------------------------------------------------------
# The ops: (opforge call, torch call, dispatch args) for a size
# ---------------------------------------------------------------------------
def _square(n: int) -> tuple[int, int]:
    cols = 1 << math.ceil(math.log2(n) / 2)
    return n // cols, cols


def make(op: str, n: int, dtype: torch.dtype):
    """``n``: elements (the ops over rows) or M=N=K (matmul)."""
    dev = DEVICE
    if op == "matmul":
        a, b = torch.randn(n, n, device=dev).to(dtype), torch.randn(n, n, device=dev).to(dtype)
        return (lambda: opforge.matmul(a, b)), (lambda: torch.matmul(a, b)), f"{n}x{n}x{n}"
    rows, cols = _square(n)
    x = torch.randn(rows, cols, device=dev).to(dtype)
    shape = f"{rows}x{cols}"
    if op == "add":
        y = torch.randn(rows, cols, device=dev).to(dtype)
        return (lambda: opforge.add(x, y)), (lambda: torch.add(x, y)), shape
    if op == "softmax":
        return (lambda: opforge.softmax(x, -1)), (lambda: torch.softmax(x, -1)), shape
    w = torch.randn(cols, device=dev).to(dtype)
    if op == "layer_norm":
        b = torch.randn(cols, device=dev).to(dtype)
        return (lambda: opforge.layer_norm(x, (cols,), w, b)), (lambda: F.layer_norm(x, (cols,), w, b)), shape
    if op == "rms_norm":
        return (lambda: opforge.rms_norm(x, (cols,), w)), (lambda: F.rms_norm(x, (cols,), w)), shape
    raise ValueError(op)


def _dispatch_args(op_name: str, fn: Callable[[], object]) -> tuple:
    """The arguments the public call hands to ``dispatch.call`` (for tune keys and explain)."""
    op = registry.get(op_name)
    seen: list[tuple] = []
    real = dispatch.decide

    def spy(o, args, **kw):
        if o is op and not seen:
            seen.append(args)
        return real(o, args, **kw)

    dispatch.decide = spy
    try:
        with dispatch.validated_path():
            fn()
    finally:
        dispatch.decide = real
    return seen[0]


def _variants(op_name: str, args: tuple) -> tuple[list[str], str]:
    """The Triton variants that take ``args``, and the name of the vendor variant."""
    op = registry.get(op_name)
    triton = [v.name for v in op.variants if v.kind == "triton" and dispatch.reject_reason(op, v, args) is None]
    vendor = next(v.name for v in op.variants if v.kind == "vendor")
    return triton, vendor


def _chosen(op_name: str, args: tuple) -> str:
    return dispatch.explain(op_name, *args).variant.name


# ---------------------------------------------------------------------------
# Part 1: host cost at 64x64
# ---------------------------------------------------------------------------
def host(ops: list[str], dtypes: list[str]) -> list[dict]:
    out = []
    for op in ops:
        for dname in dtypes:
            n = 64 if op == "matmul" else 64 * 64
            ours, theirs, shape = make(op, n, DTYPES[dname])
            args = _dispatch_args(op, ours)
            triton, vendor = _variants(op, args)
            dispatch.reset()
            row = {"op": op, "dtype": dname, "shape": shape, "chosen": _chosen(op, args),
                   "opforge_us": per_call_us(ours), "torch_us": per_call_us(theirs)}
            with torch.no_grad():
                row["opforge_no_grad_us"] = per_call_us(ours)
            with dispatch.validated_path():
                row["validated_path_us"] = per_call_us(ours, calls=200)
            for name in triton + [vendor]:
                with dispatch.force_variant(op, name):
                    row[f"forced_{name}_us"] = per_call_us(ours)
            row["ratio"] = row["opforge_us"] / row["torch_us"]
            row["goal"] = GOALS[op]
            row["meets_goal"] = row["ratio"] <= GOALS[op]
            out.append(row)
            print(f"{op:11s} {dname} {shape:9s} runs {row['chosen']:22s} opforge {row['opforge_us']:6.2f} us  "
                  f"torch {row['torch_us']:6.2f} us  ratio {row['ratio']:.2f} (goal {GOALS[op]}) "
                  f"{'ok' if row['meets_goal'] else 'MISSED'}  validated path {row['validated_path_us']:.1f} us  "
                  + "  ".join(f"{k[7:-3]} {v:.2f}" for k, v in row.items() if k.startswith("forced_")), flush=True)
    return out


# ---------------------------------------------------------------------------
# Part 2: the crossover sweep and the tuned entries it implies
# ---------------------------------------------------------------------------
def _sizes(op: str, quick: bool, only: list[int] | None = None) -> list[int]:
    if only:
        return only
    if op == "matmul":
        sizes = [1 << k for k in range(4, 12)]  # M=N=K 16..2048
    else:
        sizes = [1 << k for k in range(10, 27)]  # 2**10..2**26 elements
    return sizes[::2] if quick else sizes


def crossover(ops: list[str], dtypes: list[str], quick: bool, only: list[int] | None = None
              ) -> tuple[list[dict], list[TuneEntry]]:
    rows: list[dict] = []
    entries: list[TuneEntry] = []
    for op_name in ops:
        op = registry.get(op_name)
        for dname in dtypes:
            first_triton_win = None
            for n in _sizes(op_name, quick, only):
                ours, _, shape = make(op_name, n, DTYPES[dname])
                args = _dispatch_args(op_name, ours)
                triton, vendor = _variants(op_name, args)
                times: dict[str, float] = {}
                configs: dict[str, dict] = {}
                for name in triton + [vendor]:
                    dispatch.reset()
                    with dispatch.force_variant(op_name, name):
                        try:
                            times[name] = per_call_us(ours, calls=_calls_for(ours), loops=5)
                        except Exception as e:  # a variant that fails here is reported, not timed
                            print(f"  {op_name} {name} {shape}: {type(e).__name__}: {str(e)[:200]}")
                            continue
                        configs[name] = dispatch.explain(op_name, *args).config
                best_triton = min((t for v, t in times.items() if v != vendor), default=float("inf"))
                vendor_us = times.get(vendor, float("inf"))
                vendor_wins = vendor_us * (1 + dispatch.TIE_MARGIN) < best_triton
                if not vendor_wins and first_triton_win is None:
                    first_triton_win = n
                rows.append({"op": op_name, "dtype": dname, "size": n, "shape": shape,
                             "times_us": times, "vendor_wins": vendor_wins})
                print(f"{op_name:11s} {dname} {shape:12s} " + "  ".join(f"{k} {v:8.2f}" for k, v in times.items())
                      + f"   -> {'vendor' if vendor_wins else 'triton'}", flush=True)
                if vendor_wins:
                    for name, us in times.items():
                        key = autotune.tune_key(op, op.variant(name), args)
                        entries.append(TuneEntry(key, configs[name], us / 1000.0))
            rows.append({"op": op_name, "dtype": dname, "crossover_size": first_triton_win})
            print(f"== {op_name} {dname}: " + ("the vendor variant wins at every size" if first_triton_win is None
                                               else f"Triton is faster from size {first_triton_win}"), flush=True)
    return rows, entries


def _meta() -> dict:
    import triton

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "triton": triton.__version__,
            "method": f"wall time of a loop of calls (up to {CALLS}), CUDA synced at the end, median of loops"}


def write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["host", "crossover"])
    p.add_argument("--ops", default="add,softmax,layer_norm,rms_norm,matmul")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--quick", action="store_true", help="crossover: every other size")
    p.add_argument("--out", help="JSON results here")
    p.add_argument("--tuned-out", help="crossover: the tuned entries (JSON lines) here")
    p.add_argument("--sizes", help="crossover: these sizes only (comma-separated)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args(argv)
    global DEVICE
    DEVICE = a.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (and OPFORGE_INTERPRET=0)", file=sys.stderr)
        return 2
    ops, dtypes = a.ops.split(","), a.dtypes.split(",")
    result = {"part": a.part, **_meta(), "autotune_mode": autotune.mode()}
    if a.part == "host":
        result["entries"] = host(ops, dtypes)
        missed = [f"{e['op']} {e['dtype']}" for e in result["entries"] if not e["meets_goal"]]
        print("all goals met" if not missed else f"goals missed: {', '.join(missed)}")
    else:
        only = [int(n) for n in a.sizes.split(",")] if a.sizes else None
        result["entries"], entries = crossover(ops, dtypes, a.quick, only)
        if a.tuned_out:
            with open(a.tuned_out, "w") as f:
                for e in sorted(entries, key=lambda e: e.key.text()):
                    f.write(e.to_json() + "\n")
            print(f"wrote {len(entries)} tuned entries to {a.tuned_out}")
    write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
