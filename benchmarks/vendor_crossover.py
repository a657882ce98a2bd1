"""Where the vendor kernel beats ours: GEMM over 40 realistic shapes and decode
attention over batch x context, each timed for every variant, on one GPU.

Issue 23 asks dispatch to pick cuBLAS / SDPA where they are faster, with the
crossover measured rather than guessed. This script measures, per shape: the
peer (``torch.matmul``, or ``F.scaled_dot_product_attention`` over a
head-major cache), each of our variants forced with its shipped-or-default
config, our Triton variants tuned (while the time budget lasts), and what
plain dispatch runs. It writes the results (JSON) and, for each shape bucket,
tuned-table entries of every variant measured on that shape, so dispatch
chooses between them by time (``--entries``; merge them into
``src/opforge/runtime/tuned/``).

    python benchmarks/vendor_crossover.py --out results.json --entries tuned.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

import opforge
from opforge.ops import attention_decode as AD
from opforge.ops import matmul as MM
from opforge.runtime import autotune, dispatch, registry, timing
from opforge.runtime.cache import TuneEntry

# C[M, N] = A[M, K] @ W[N, K].t(): M tokens 1-8192, N and K from LLM projections and
# vocabularies, with awkward sizes (1000, 2049, 5001, 50257) on purpose. Drawn once
# with a fixed seed and kept here so every run times the same set.
GEMM_SHAPES = [
    (1, 1000, 1024), (1, 3072, 14336), (1, 14336, 768), (1, 128256, 768), (2, 4096, 11008),
    (3, 4096, 14336), (3, 32000, 768), (4, 11008, 14336), (4, 128256, 14336), (16, 6144, 11008),
    (32, 50257, 8192), (64, 1024, 11008), (77, 5001, 4096), (77, 6144, 512), (77, 11008, 4096),
    (128, 14336, 5120), (128, 28672, 5120), (256, 1000, 4096), (256, 11008, 1024), (256, 28672, 768),
    (256, 28672, 3072), (256, 128256, 8192), (333, 4096, 11008), (333, 11008, 768), (333, 14336, 3072),
    (333, 28672, 8192), (1000, 11008, 14336), (1000, 32000, 1024), (1024, 6144, 5120), (1024, 11008, 5120),
    (2048, 4096, 2048), (2500, 2049, 768), (4096, 11008, 1024), (4096, 14336, 512), (6000, 1024, 8192),
    (6000, 3072, 8192), (6000, 3072, 11008), (8192, 1000, 8192), (8192, 2049, 11008), (8192, 32000, 512),
]
DECODE_GRID = [(B, ctx) for B in (1, 2, 4) for ctx in (1024, 8192, 32768)]


def _bench(fn, dev) -> float:
    return timing.bench(fn, dev)


def _variants(op, args):
    return [v for v in op.variants if v.kind != "reference" and dispatch.reject_reason(op, v, args) is None]


def _measure(op_name: str, public, op_args, peer, dev, deadline: float, tune: bool) -> dict:
    """Time the peer, each supported variant forced, the tuned Triton variants
    (while before ``deadline``), and plain dispatch, for one shape."""
    op = registry.get(op_name)
    row = {"peer_ms": _bench(peer, dev), "variants": {}, "tuned": {}}
    for v in _variants(op, op_args):
        try:
            with dispatch.force_variant(op_name, v.name):
                dispatch.reset()
                cfg = dispatch.decide(op, op_args, tune=False).config
                row["variants"][v.name] = {"ms": _bench(public, dev), "config": cfg}
        except Exception as e:  # a variant that fails here is reported, not fatal
            row["variants"][v.name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if tune and v.kind == "triton" and time.monotonic() < deadline:
            t0 = time.monotonic()
            entry = autotune.tune(op, v, op_args)
            if entry is not None:
                with dispatch.force_variant(op_name, v.name):
                    dispatch.reset()
                    row["tuned"][v.name] = {"ms": _bench(public, dev), "config": entry.config,
                                            "tune_s": round(time.monotonic() - t0, 2)}
    dispatch.reset()
    row["dispatch_ms"] = _bench(public, dev)
    row["dispatch_variant"] = dispatch.decide(op, op_args, tune=False).variant.name
    best = {n: r["ms"] for n, r in row["variants"].items() if "ms" in r}
    best.update({n: min(r["ms"], best.get(n, math.inf)) for n, r in row["tuned"].items()})
    row["best_variant"] = min(best, key=best.get) if best else None
    row["best_ms"] = best.get(row["best_variant"]) if best else None
    return row


def _entries(op_name: str, op_args, row) -> list[TuneEntry]:
    """One entry per variant measured on this shape: its best time and config."""
    op = registry.get(op_name)
    out = []
    for name, r in row["variants"].items():
        if "ms" not in r:
            continue
        ms, cfg = r["ms"], r["config"]
        t = row["tuned"].get(name)
        if t is not None and t["ms"] < ms:
            ms, cfg = t["ms"], t["config"]
        out.append(TuneEntry(autotune.tune_key(op, op.variant(name), op_args), cfg, ms))
    return out


def gemm(dev, deadline, tune, dtype=torch.bfloat16):
    rows, entries = [], []
    for M, N, K in GEMM_SHAPES:
        a = torch.randn(M, K, device=dev, dtype=dtype)
        w = (torch.randn(N, K, device=dev, dtype=dtype) * K ** -0.5)
        b = w.t()
        op_args = (a, b, None, None, MM.make_epilogue(a, None, None, None, None))
        row = _measure("matmul", lambda: opforge.matmul(a, b), op_args, lambda: torch.matmul(a, b), dev,
                       deadline, tune)
        row.update(M=M, N=N, K=K, bucket=MM.bucket(MM.geometry(a, b)), tflops_peer=2 * M * N * K / row["peer_ms"] / 1e9)
        row["ratio_dispatch"] = row["peer_ms"] / row["dispatch_ms"]
        row["ratio_best"] = row["peer_ms"] / row["best_ms"]
        rows.append(row)
        entries += _entries("matmul", op_args, row)
        print(f"gemm {M}x{N}x{K}: cuBLAS {row['peer_ms']*1e3:.1f} us, dispatch {row['dispatch_ms']*1e3:.1f} us "
              f"({row['dispatch_variant']}, {row['ratio_dispatch']:.2f}x), best {row['best_variant']} "
              f"{row['ratio_best']:.2f}x", flush=True)
        del a, w, b
    return rows, entries


def decode(dev, deadline, tune, dtype=torch.bfloat16, Hq=32, H_kv=8, D=128):
    rows, entries = [], []
    for B, ctx in DECODE_GRID:
        q = torch.randn(B, 1, Hq, D, device=dev, dtype=dtype)
        k_ref = torch.randn(B, H_kv, ctx, D, device=dev, dtype=dtype)
        v_ref = torch.randn(B, H_kv, ctx, D, device=dev, dtype=dtype)
        k, v = k_ref.transpose(1, 2), v_ref.transpose(1, 2)  # [B, ctx, H_kv, D] views of the same bytes
        seqlens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
        scale = D ** -0.5
        q_hm = q.transpose(1, 2)

        def peer():
            return F.scaled_dot_product_attention(q_hm, k_ref, v_ref, enable_gqa=True)

        op_args = (q, k, v, seqlens, scale, False, None)
        row = _measure("attention_decode", lambda: opforge.attention_decode(q, k, v, seqlens), op_args, peer,
                       dev, deadline, tune)
        got = opforge.attention_decode(q, k, v, seqlens).float()
        want = peer().transpose(1, 2).float()
        row.update(B=B, ctx=ctx, Hq=Hq, H_kv=H_kv, D=D, max_abs_err=float((got - want).abs().max()),
                   gbps_peer=2 * B * ctx * H_kv * D * q.element_size() / row["peer_ms"] / 1e6)
        row["ratio_dispatch"] = row["peer_ms"] / row["dispatch_ms"]
        row["ratio_best"] = row["peer_ms"] / row["best_ms"]
        rows.append(row)
        entries += _entries("attention_decode", op_args, row)
        print(f"decode B={B} ctx={ctx}: SDPA {row['peer_ms']*1e3:.1f} us, dispatch {row['dispatch_ms']*1e3:.1f} us "
              f"({row['dispatch_variant']}, {row['ratio_dispatch']:.2f}x), best {row['best_variant']} "
              f"{row['ratio_best']:.2f}x, err {row['max_abs_err']:.2e}", flush=True)
    return rows, entries


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--entries", help="write tuned-table entries (JSON lines) here")
    p.add_argument("--family", choices=("gemm", "decode", "all"), default="all")
    p.add_argument("--tune-budget-s", type=float, default=240.0,
                   help="stop tuning Triton variants after this many seconds (timing goes on)")
    args = p.parse_args()
    dev = torch.device("cuda")
    os.environ.setdefault("OPFORGE_AUTOTUNE", "off")  # nothing is tuned behind our back; --tune-budget-s tunes
    deadline = time.monotonic() + args.tune_budget_s
    result = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    entries = []
    for fam, fn in (("gemm", gemm), ("decode", decode)):
        if args.family in (fam, "all"):
            rows, ents = fn(dev, deadline, args.tune_budget_s > 0)
            entries += ents
            result[fam] = {
                "rows": rows,
                "geomean_dispatch_vs_peer": _geomean([r["ratio_dispatch"] for r in rows]),
                "geomean_best_vs_peer": _geomean([r["ratio_best"] for r in rows]),
                "below_0.95_dispatch": sum(r["ratio_dispatch"] < 0.95 for r in rows),
                "below_0.95_best": sum(r["ratio_best"] < 0.95 for r in rows),
                "worst_dispatch": min(r["ratio_dispatch"] for r in rows),
            }
            print(fam, {k: v for k, v in result[fam].items() if k != "rows"}, flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    if args.entries:
        with open(args.entries, "w") as f:
            f.writelines(e.to_json() + "\n" for e in entries)


if __name__ == "__main__":
    main()
