"""Host time or GPU time? For decode attention and small GEMMs, time each
variant three ways: a stream of eager calls (what a loop sees), the host's
CPU time per call, and CUDA-graph replays (the GPU's own time). A call is
host-bound where the first is near the second and far above the third.

    python benchmarks/host_vs_gpu.py --out host_vs_gpu.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import opforge
from opforge.ops import attention_decode as AD
from opforge.ops import matmul as MM
from opforge.runtime import autotune, dispatch, registry, timing


def _three(fn) -> dict:
    fn()
    torch.cuda.synchronize()
    return {"stream_us": timing.bench_gpu(fn, warmup_ms=10, rep_ms=50) * 1e3,
            "host_us": timing.host_overhead_us(fn, calls=400),
            "graph_us": timing.bench_graph(fn) * 1e3}


def _forced(op_name, vname, fn):
    def run():
        with dispatch.force_variant(op_name, vname):
            return fn()
    return run


def decode(dev, out):
    Hq, H_kv, D = 32, 8, 128
    for B in (1, 2, 4):
        for ctx in (1024, 8192, 32768):
            q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
            kr = torch.randn(B, H_kv, ctx, D, device=dev, dtype=torch.bfloat16)
            vr = torch.randn(B, H_kv, ctx, D, device=dev, dtype=torch.bfloat16)
            k, v = kr.transpose(1, 2), vr.transpose(1, 2)
            sl = torch.full((B,), ctx, dtype=torch.int32, device=dev)
            row = {"B": B, "ctx": ctx, "sdpa": _three(lambda: F.scaled_dot_product_attention(
                q.transpose(1, 2), kr, vr, enable_gqa=True))}
            op = registry.get("attention_decode")
            args = (q, k, v, sl, D ** -0.5, False, None)
            v_ = op.variant("triton_split_kv")
            row["default_config"] = v_.default_config(*args)
            row["triton_default"] = _three(_forced("attention_decode", "triton_split_kv",
                                                   lambda: opforge.attention_decode(q, k, v, sl)))
            best = None
            for cfg in v_.configs(*args) + [dict(row["default_config"], SPLITS=s) for s in (4, 8, 16, 32, 64)]:
                try:
                    ms = timing.bench_graph(lambda: v_.run(cfg, *args))
                except Exception as e:
                    continue
                if best is None or ms < best[1]:
                    best = (cfg, ms)
            row["triton_best_graph"] = {"config": best[0], "graph_us": best[1] * 1e3}
            out.append(row)
            print("decode", B, ctx, {k: v for k, v in row.items() if k not in ("B", "ctx")}, flush=True)


def gemm(dev, out):
    for M, N, K in ((1, 14336, 768), (64, 1024, 11008), (256, 11008, 1024), (333, 11008, 768),
                    (2048, 4096, 2048), (4096, 14336, 512), (6000, 3072, 8192)):
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(N, K, device=dev, dtype=torch.bfloat16).t()
        row = {"M": M, "N": N, "K": K, "cublas": _three(lambda: torch.matmul(a, b))}
        op = registry.get("matmul")
        args = (a, b, None, None, MM.make_epilogue(a, None, None, None, None))
        for v in op.variants:
            if v.kind == "reference" or dispatch.reject_reason(op, v, args) is not None:
                continue
            row[v.name] = _three(_forced("matmul", v.name, lambda: opforge.matmul(a, b)))
        out.append(row)
        print("gemm", M, N, K, {k: {kk: round(vv, 1) for kk, vv in v.items()} for k, v in row.items()
                                 if isinstance(v, dict)}, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dev = torch.device("cuda")
    out = {"decode": [], "gemm": []}
    decode(dev, out["decode"])
    gemm(dev, out["gemm"])
    json.dump(out, open(a.out, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
