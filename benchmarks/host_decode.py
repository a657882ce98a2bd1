"""Host time per call of decode attention and the GEMMs, against their torch peers (issue 23).

For each case two figures, in microseconds a call:

* ``host``: the CPU time of the call alone: the device synced, then a batch
  of 20 calls timed without a sync (the launch queue never fills), the
  median of 15 batches;
* ``eager``: a loop of calls synced once at the end (what an eager loop
  sees: the larger of host and GPU time), as ``host_overhead.py`` measures.

Decode (``attention_decode``, bf16, Hq 32 / H_kv 8 / D 128, B 1/2/4 x ctx
256/1k/8k/32k, all lengths full; 256 is one split, a single launch) runs as dispatch decides; beside it the same
with every launch through ``JITFunction.run`` (``launch.jit_run_only``, the
launch cost before the pre-bound launcher) and SDPA on the dense cache
(``enable_gqa``). ``ratio`` is SDPA eager / ours eager (goal >= 1.0).

GEMM: the Triton variants forced (``triton_splitk`` at decode shapes,
``triton_tma_persistent`` and ``triton_tiled`` at mid shapes) and the
cuBLAS variant (``torch_eager``) forced at small shapes, each against
``torch.matmul``; ``ratio`` is ours / torch (host time; goal for matmul
<= 1.3). Tiny: ``add`` and ``matmul`` at 64x64 fp32 and bf16 as dispatch
decides, against torch (goals 1.2 and 1.3, on the eager figure).

Run (H200, one call, a few minutes with cold compiles)::

    OPFORGE_INTERPRET=0 python3 benchmarks/host_decode.py --out host-decode.json

``--device cpu`` (with ``OPFORGE_INTERPRET=1``) is a smoke run of the script
on tiny shapes, not a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import autotune, dispatch, launch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import host_overhead as HO  # noqa: E402  (per_call_us, make, _meta)

DEVICE = "cuda"
BATCH, BATCHES = 20, 15


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def host_us(fn) -> float:
    """Median CPU microseconds a call over batches of ``BATCH`` calls, each batch started on an idle device."""
    for _ in range(3 if DEVICE == "cuda" else 1):
        fn()
    times = []
    for _ in range(BATCHES):
        _sync()
        t0 = time.perf_counter()
        for _ in range(BATCH):
            fn()
        times.append((time.perf_counter() - t0) / BATCH * 1e6)
    _sync()
    return statistics.median(times)


def eager_us(fn) -> float:
    if DEVICE != "cuda":
        return host_us(fn)
    return HO.per_call_us(fn, calls=HO._calls_for(fn), loops=5)


def _both(fn) -> dict:
    return {"host_us": host_us(fn), "eager_us": eager_us(fn)}


def _via_jit_run(fn) -> dict:
    """``_both(fn)`` with every launch through ``JITFunction.run`` (the launch cost before the pre-bound launcher)."""
    with launch.jit_run_only():
        return _both(fn)


def decode(quick: bool) -> list[dict]:
    rows = []
    if DEVICE == "cuda":
        # ctx 256: a short context, one split (``SINGLE_SPLIT_TILES``): a single launch
        Hq, H_kv, D, grid = 32, 8, 128, [(B, ctx) for B in (1, 2, 4) for ctx in (256, 1024, 8192, 32768)]
    else:
        Hq, H_kv, D, grid = 2, 1, 16, [(1, 64)]
    if quick:
        grid = grid[::4]
    for B, ctx in grid:
        dt = torch.bfloat16 if DEVICE == "cuda" else torch.float32
        q = torch.randn(B, 1, Hq, D, device=DEVICE, dtype=dt)
        kr = torch.randn(B, H_kv, ctx, D, device=DEVICE, dtype=dt)
        vr = torch.randn(B, H_kv, ctx, D, device=DEVICE, dtype=dt)
        k, v = kr.transpose(1, 2), vr.transpose(1, 2)  # [B, ctx, H_kv, D] views, SDPA's dense cache beneath
        sl = torch.full((B,), ctx, dtype=torch.int32, device=DEVICE)

        def ours():
            return opforge.attention_decode(q, k, v, sl)

        def sdpa():
            return F.scaled_dot_product_attention(q.transpose(1, 2), kr, vr, enable_gqa=True)

        torch.testing.assert_close(ours().float(), sdpa().transpose(1, 2).float(), rtol=2e-2, atol=2e-2)
        d = dispatch.explain("attention_decode", q, k, v, sl, D ** -0.5, False, None)
        row = {"B": B, "ctx": ctx, "variant": d.variant.name, "config": d.config, "source": d.source,
               "ours": _both(ours), "ours_jit_run": _via_jit_run(ours), "sdpa": _both(sdpa)}
        row["ratio_eager"] = row["sdpa"]["eager_us"] / row["ours"]["eager_us"]
        rows.append(row)
        print(f"decode B={B} ctx={ctx:6d} {d.variant.name:16s} ours host {row['ours']['host_us']:7.1f} eager "
              f"{row['ours']['eager_us']:7.1f} | via JITFunction.run host {row['ours_jit_run']['host_us']:7.1f} "
              f"eager {row['ours_jit_run']['eager_us']:7.1f} | sdpa host {row['sdpa']['host_us']:6.1f} eager "
              f"{row['sdpa']['eager_us']:6.1f} | sdpa/ours eager {row['ratio_eager']:.2f} (goal >= 1.0)", flush=True)
    return rows


GEMM_CUDA = [  # (variant forced, M, N, K): Linear-shaped bf16, W [N, K] seen as W^T
    ("triton_splitk", 1, 14336, 768), ("triton_splitk", 16, 4096, 4096), ("triton_splitk", 64, 1024, 11008),
    ("triton_tma_persistent", 256, 11008, 1024), ("triton_tma_persistent", 2048, 4096, 2048),
    ("triton_tiled", 256, 4096, 1024),
    ("torch_eager", 64, 64, 64), ("torch_eager", 128, 128, 128), ("torch_eager", 256, 1024, 1024),
    ("torch_eager", 1, 4096, 4096),
]
GEMM_CPU = [("triton_splitk", 3, 24, 512), ("triton_tma_persistent", 32, 32, 32), ("triton_tiled", 20, 18, 24)]


def gemm(quick: bool) -> list[dict]:
    rows = []
    cases = GEMM_CUDA if DEVICE == "cuda" else GEMM_CPU
    for variant, M, N, K in (cases[::2] if quick else cases):
        dt = torch.bfloat16 if DEVICE == "cuda" else torch.float32
        a = torch.randn(M, K, device=DEVICE, dtype=dt)
        b = torch.randn(N, K, device=DEVICE, dtype=dt).t()
        def fn():
            return opforge.matmul(a, b)
        with dispatch.force_variant("matmul", variant):  # once around the loops: its cost is not a call's
            try:
                fn()
            except ValueError as e:  # the variant rejects the shape on this device
                print(f"gemm {variant} {M}x{N}x{K}: {e}", flush=True)
                continue
            row = {"variant": variant, "M": M, "N": N, "K": K, "ours": _both(fn),
                   "torch": _both(lambda: torch.matmul(a, b))}
            if variant != "torch_eager":
                row["ours_jit_run"] = _via_jit_run(fn)
        row["ratio_host"] = row["ours"]["host_us"] / row["torch"]["host_us"]
        rows.append(row)
        jit = row.get("ours_jit_run")
        print(f"gemm {variant:22s} {M:5d}x{N:5d}x{K:5d} ours host {row['ours']['host_us']:7.1f} eager "
              f"{row['ours']['eager_us']:7.1f}"
              + (f" | via JITFunction.run host {jit['host_us']:7.1f}" if jit else "")
              + f" | torch.matmul host {row['torch']['host_us']:6.1f} eager {row['torch']['eager_us']:6.1f}"
              f" | ours/torch host {row['ratio_host']:.2f}", flush=True)
    return rows


def tiny() -> list[dict]:
    rows = []
    for op in ("add", "matmul"):
        for dname, dt in HO.DTYPES.items():
            n = 64 if op == "matmul" else 64 * 64
            ours, theirs, shape = HO.make(op, n, dt)
            dispatch.reset()
            row = {"op": op, "dtype": dname, "shape": shape, "ours": _both(ours), "torch": _both(theirs)}
            row["ratio_eager"] = row["ours"]["eager_us"] / row["torch"]["eager_us"]
            row["goal"] = HO.GOALS[op]
            rows.append(row)
            print(f"tiny {op:6s} {dname} {shape:6s} ours host {row['ours']['host_us']:6.2f} eager "
                  f"{row['ours']['eager_us']:6.2f} | torch host {row['torch']['host_us']:6.2f} eager "
                  f"{row['torch']['eager_us']:6.2f} | ratio {row['ratio_eager']:.2f} (goal {row['goal']})",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="decode,gemm,tiny")
    p.add_argument("--quick", action="store_true", help="every other (decode: every fourth) case")
    p.add_argument("--out", help="JSON results here")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args(argv)
    global DEVICE, BATCH, BATCHES
    DEVICE = HO.DEVICE = a.device
    if DEVICE == "cpu":  # the interpreter: a few calls show the script works
        BATCH, BATCHES = 1, 2
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (and OPFORGE_INTERPRET=0)", file=sys.stderr)
        return 2
    result = {"bench": "host_decode", **HO._meta(), "autotune_mode": autotune.mode(),
              "method": f"host: median of {BATCHES} batches of {BATCH} calls, each batch started on an idle "
                        f"device, not synced; eager: a loop of calls synced at the end, median of 5 loops"}
    with torch.no_grad():
        parts = a.parts.split(",")
        if "decode" in parts:
            result["decode"] = decode(a.quick)
        if "gemm" in parts:
            result["gemm"] = gemm(a.quick)
        if "tiny" in parts and DEVICE == "cuda":
            result["tiny"] = tiny()
    HO.write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
