"""Device check of the Gluon FP8 GEMM (``opforge.kernels.gemm_fp8_gluon``) on an H200.

1. Correctness of every kernel form ("ws": warp-specialized persistent, "simple": one warpgroup) against a
   float32 torch reference of the scaled product, per-tensor / row-wise / 128-block scales, fast
   accumulation, bias and out dtypes; PASS/FAIL per case (a failure is printed, never fatal).
2. Timing (triton.testing.do_bench) at 4096^3, 8192^3, 16384^3 and LLM shapes against
   torch._scaled_mm (per-tensor, row-wise; use_fast_accum as the row says) and, for block scales, against
   the best torch path: torch._scaled_mm's blockwise scaling where this torch/cuBLAS has it, our Triton
   kernel (opforge.scaled_matmul forced to triton_tma_persistent) and dequantize + bf16 matmul.
A watchdog ends the run at ~170 s (a hung kernel prints what it had). Usage, from the repo root::

    PYTHONPATH=src python3 benchmarks/gluon_fp8_gemm.py [--quick] [--kernels ws,simple]
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time

import torch

E4M3, BF16, F16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32
T0 = time.time()


def log(*a):
    print(*a, flush=True)


def quant(x, dtype=E4M3):
    return x.clamp(-448, 448).to(dtype)


def make(M, N, K, modes, seed=0):
    """A [M, K], W [N, K] (fp8), their scales in the op's layout, and the float32 reference of the product."""
    from opforge.kernels.gemm_fp8_gluon import ROW, SCALE_BLOCK, TENSOR

    g = torch.Generator(device="cuda").manual_seed(seed)
    A = quant(torch.randn(M, K, device="cuda", generator=g) * 2)
    W = quant(torch.randn(N, K, device="cuda", generator=g) * 2)
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)

    def pos(*shape):
        return torch.rand(*shape, device="cuda", generator=g) * 0.02 + 0.005

    ma, mb = modes
    SA = pos(1, 1) if ma == TENSOR else pos(M, 1) if ma == ROW else pos(M, kb)
    SB = pos(1, 1) if mb == TENSOR else pos(1, N) if mb == ROW else pos(kb, nb)
    return A, W, SA, SB


def expand(SA, SB, modes, M, N, K):
    from opforge.kernels.gemm_fp8_gluon import BLOCK, SCALE_BLOCK

    ea = SA.repeat_interleave(SCALE_BLOCK, 1)[:, :K] if modes[0] == BLOCK else SA
    eb = SB.repeat_interleave(SCALE_BLOCK, 0)[:K].repeat_interleave(SCALE_BLOCK, 1)[:, :N] if modes[1] == BLOCK \
        else SB
    return ea, eb  # broadcastable against [M, K] and [K, N]


def reference(A, W, SA, SB, modes, bias=None):
    M, K = A.shape
    N = W.shape[0]
    ea, eb = expand(SA, SB, modes, M, N, K)
    z = (A.float() * ea) @ (W.float().t() * eb)
    return z + bias.float() if bias is not None else z


def run_gluon(A, W, SA, SB, modes, out_dtype=BF16, bias=None, fast=False, kernel="ws", config=None):
    from opforge.kernels import gemm_fp8_gluon as G

    C = torch.empty(A.shape[0], W.shape[0], dtype=out_dtype, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    G.launch(A, W, C, SA, SB, *modes, bias, fast, config, sms, kernel)
    return C


def cfg(bn=128, stages=None, group_m=8, out_bytes=2, pipe=1):
    from opforge.kernels import gemm_fp8_gluon as G

    st = stages or min(5, G.max_stages(bn, out_bytes))
    return {"BLOCK_M": 128, "BLOCK_N": bn, "STAGES": st, "GROUP_M": group_m, "CONSUMER_REGS": 232,
            "PRODUCER_REGS": 40, "PIPE": pipe}


def correctness(kernels):
    from opforge.kernels.gemm_fp8_gluon import BLOCK, ROW, TENSOR

    log("== correctness (rel = max|out - ref| / max|ref|, ref = float32 torch of the scaled product)")
    T, R, B = TENSOR, ROW, BLOCK
    small, ragged, longk = (512, 768, 1024), (1000, 1000, 1024), (256, 384, 4096)
    # (kernel, shape, modes, out dtype, fast, bias, config)
    cases = [("simple", small, (T, T), BF16, False, False, None), ("simple", ragged, (B, B), BF16, False, True, None),
             ("ws", small, (T, T), BF16, False, False, None), ("ws", small, (R, R), BF16, False, False, None),
             ("ws", small, (B, B), BF16, False, False, None), ("ws", ragged, (T, T), BF16, False, False, None),
             ("ws", ragged, (R, B), BF16, False, False, None), ("ws", ragged, (B, T), BF16, False, False, None),
             ("ws", ragged, (B, B), BF16, False, False, None), ("ws", longk, (B, B), BF16, False, False, None),
             ("ws", ragged, (T, T), BF16, True, False, None), ("ws", small, (R, R), F16, False, True, None),
             ("ws", small, (B, B), F32, False, True, None), ("ws", ragged, (R, R), BF16, True, True, None),
             ("ws", ragged, (B, B), BF16, False, False, cfg(256)), ("ws", small, (T, T), BF16, True, False, cfg(256)),
             ("ws", ragged, (R, R), F32, False, True, cfg(256, out_bytes=4)),
             ("ws", (384, 512, 1152), (B, B), BF16, False, False, None),  # odd number of K chunks
             ("ws", (256, 256, 128), (T, T), BF16, False, False, None),  # one chunk
             ("ws", (300, 296, 208), (R, R), BF16, False, True, None),  # two chunks, the second ragged
             ("ws", ragged, (B, B), BF16, False, False, cfg(pipe=0)), ("ws", ragged, (T, T), BF16, False, False,
                                                                      cfg(256, pipe=0)),
             ("ws-e5m2", small, (R, R), BF16, False, False, None),  # b in float8_e5m2
             ("ws-e5m2a", ragged, (B, B), BF16, False, False, None)]  # a in float8_e5m2
    fails = 0
    for kernel, (M, N, K), modes, od, fast, with_bias, config in cases:
        w_dtype = torch.float8_e5m2 if kernel.endswith("-e5m2") else E4M3
        a_dtype = torch.float8_e5m2 if kernel.endswith("-e5m2a") else E4M3
        kernel = kernel.split("-")[0]
        if kernel not in kernels:
            continue
        bn = config["BLOCK_N"] if config else "dflt"
        name = (f"{kernel:6s} {M}x{N}x{K} a={str(a_dtype)[6:]} b={str(w_dtype)[6:]} modes={modes} out={str(od)[6:]} fast={int(fast)} bias={int(with_bias)} "
                f"BN={bn}")
        try:
            A, W, SA, SB = make(M, N, K, modes)
            W = W.float().to(w_dtype)
            A = A.float().to(a_dtype)
            bias = torch.randn(N, device="cuda") if with_bias else None
            ref = reference(A, W, SA, SB, modes, bias)
            out = run_gluon(A, W, SA, SB, modes, od, bias, fast, kernel, config)
            torch.cuda.synchronize()
            err = (out.float() - ref).abs().max().item()
            rel = err / ref.abs().max().item()
            tol = 2e-2 if fast else 1e-2
            ok = rel < tol and torch.isfinite(out.float()).all().item()
            fails += not ok
            log(f"  {'PASS' if ok else 'FAIL'} {name}  abs {err:.3e} rel {rel:.2e}  [{time.time() - T0:.0f} s]")
        except Exception as e:  # noqa: BLE001 - one case must not end the run
            fails += 1
            log(f"  FAIL {name}  {type(e).__name__}: {str(e)[:300]}")
    fails += through_dispatch()
    fails += selftest_samples()
    return fails


def selftest_samples():
    """opforge selftest's check of gluon_ws: every scaled_matmul sample it accepts, against the reference."""
    from opforge import selftest
    from opforge.ops.scaled_matmul import OP

    try:
        r = selftest.check_variant(OP, OP.variant("gluon_ws"), torch.device("cuda"))
        log(f"  {'PASS' if not r.failed else 'FAIL'} selftest samples: {r.passed} passed, {r.failed} failed, "
            f"{r.skipped} refused, worst rel {r.worst_err:.1e} {r.failures[:2]}")
        return r.failed
    except Exception as e:  # noqa: BLE001
        log(f"  FAIL selftest samples  {type(e).__name__}: {str(e)[:300]}")
        return 1


def through_dispatch():
    """opforge.scaled_matmul with gluon_ws forced: the op's run path (3-D a, bias, activation)."""
    import opforge
    from opforge.kernels.gemm_fp8_gluon import BLOCK, ROW
    from opforge.runtime import dispatch

    fails = 0
    try:  # N = 300: bf16 rows of 600 bytes, no TMA store; dispatch must pick another variant
        A, W, SA, SB = make(512, 300, 1024, (BLOCK, BLOCK), seed=4)
        d = dispatch.explain("scaled_matmul", A, W.t(), SA, SB, None, __import__(
            "opforge.ops.scaled_matmul", fromlist=["x"]).ScaledEpilogue())
        out = opforge.scaled_matmul(A, W.t(), SA, SB)
        ref = reference(A, W, SA, SB, (BLOCK, BLOCK))
        rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        ok = rel < 1e-2 and d.variant.name != "gluon_ws"
        fails += not ok
        log(f"  {'PASS' if ok else 'FAIL'} op     512x300x1024 block scales: dispatch ran {d.variant.name} "
            f"(gluon_ws: {d.rejected.get('gluon_ws')})  rel {rel:.2e}")
    except Exception as e:  # noqa: BLE001
        fails += 1
        log(f"  FAIL op     512x300x1024 fallback  {type(e).__name__}: {str(e)[:300]}")
    for modes, act in (((ROW, ROW), "gelu"), ((BLOCK, BLOCK), None)):
        name = f"op     scaled_matmul 2x300x1024 @ 1024x640 modes={modes} act={act} bias=1 (forced gluon_ws)"
        try:
            A, W, SA, SB = make(600, 640, 1024, modes, seed=3)
            bias = torch.randn(640, device="cuda")
            ref = reference(A, W, SA, SB, modes, bias)
            ref = torch.nn.functional.gelu(ref) if act else ref
            with dispatch.force_variant("scaled_matmul", "gluon_ws"):
                out = opforge.scaled_matmul(A.view(2, 300, 1024), W.t(), SA.view(2, 300, -1), SB, bias=bias,
                                            activation=act)
            rel = ((out.float().reshape(600, 640) - ref).abs().max() / ref.abs().max()).item()
            ok = rel < 1e-2
            fails += not ok
            log(f"  {'PASS' if ok else 'FAIL'} {name}  rel {rel:.2e}")
        except Exception as e:  # noqa: BLE001
            fails += 1
            log(f"  FAIL {name}  {type(e).__name__}: {str(e)[:300]}")
    return fails


def bench(fn, ms_budget=120):
    import triton

    return triton.testing.do_bench(fn, warmup=20, rep=ms_budget)


def tflops(M, N, K, ms):
    return 2 * M * N * K / ms / 1e9


def scaled_mm_fn(A, W, SA, SB, modes, fast):
    from opforge.kernels.gemm_fp8_gluon import TENSOR

    sa = SA.reshape(()) if modes[0] == TENSOR else SA
    sb = SB.reshape(()) if modes[1] == TENSOR else SB
    return lambda: torch._scaled_mm(A, W.t(), scale_a=sa, scale_b=sb, out_dtype=BF16, use_fast_accum=fast)


def blockwise_scaled_mm_fn(A, W, SA, SB, ref):
    """torch._scaled_mm with 1x128 / 128x128 scales, if this torch + cuBLAS takes them (checked against ref)."""
    tries = [(SA.t().contiguous().t(), SB.t().contiguous()), (SA, SB.t().contiguous()), (SA.t().contiguous().t(), SB)]
    why = ""
    for sa, sb in tries:
        try:
            fn = lambda sa=sa, sb=sb: torch._scaled_mm(A, W.t(), scale_a=sa, scale_b=sb, out_dtype=BF16)
            out = fn()
            rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if rel < 1e-2:
                return fn
            why = f"wrong result (rel {rel:.1e})"
        except Exception as e:  # noqa: BLE001 - a layout this build rejects
            why = f"{type(e).__name__}: {str(e)[:160]}"
    if not getattr(blockwise_scaled_mm_fn, "said", False):
        blockwise_scaled_mm_fn.said = True
        log(f"  (torch._scaled_mm blockwise 1x128/128x128 unavailable: {why})")
    return None


def peers_for(A, W, SA, SB, modes, fast):
    """name -> callable: the torch paths this row is measured against (the fastest is the peer)."""
    from opforge.kernels.gemm_fp8_gluon import BLOCK

    M, K = A.shape
    N = W.shape[0]
    if BLOCK not in modes:
        return {"_scaled_mm" + (" fast" if fast else ""): scaled_mm_fn(A, W, SA, SB, modes, fast)}
    import opforge
    from opforge.runtime import dispatch

    peers = {}
    if M * N <= 8192 ** 2:
        fn = blockwise_scaled_mm_fn(A, W, SA, SB, reference(A, W, SA, SB, modes))
        if fn is not None:
            peers["_scaled_mm blockwise"] = fn

    def triton_tma():
        with dispatch.force_variant("scaled_matmul", "triton_tma_persistent"):
            return opforge.scaled_matmul(A, W.t(), SA, SB)

    peers["opforge triton_tma"] = triton_tma
    ea, eb = expand(SA, SB, modes, M, N, K)
    peers["dequant+bf16 mm"] = lambda: (A.float() * ea).to(BF16) @ (W.float().t() * eb).to(BF16)
    return peers


COLUMNS = {"dflt": ("ws", None, 1), "ws128": ("ws", 128, 1), "ws128np": ("ws", 128, 0), "ws256": ("ws", 256, 1),
           "simple": ("simple", None, 0)}


def timing(columns, shapes, budget_s):
    from opforge.kernels.gemm_fp8_gluon import BLOCK, ROW, TENSOR

    log("== timing (TFLOP/s; x = gluon / fastest peer; dflt: the warp-specialized kernel at its default config "
        "(what dispatch runs), ws128 / ws256: 128x128 / 128x256 tiles (block scales: never pipelined))")
    log(f"  {'shape MxNxK':18s} {'sc':3s} {'acc':4s} {'peer':21s} {'peer TF':>7s} "
        + " ".join(f"{c + ' TF':>10s} {'x':>5s}" for c in columns))
    tag = {TENSOR: "t", ROW: "r", BLOCK: "b"}
    for M, N, K in shapes:
        for modes, fast in (((TENSOR, TENSOR), False), ((TENSOR, TENSOR), True), ((ROW, ROW), False),
                            ((BLOCK, BLOCK), False)):
            if time.time() - T0 > budget_s:
                log(f"  (time budget reached at {M}x{N}x{K})")
                return
            label = tag[modes[0]] + tag[modes[1]]
            try:
                A, W, SA, SB = make(M, N, K, modes)
                best_name, best_ms = None, float("inf")
                for name, fn in peers_for(A, W, SA, SB, modes, fast).items():
                    try:
                        ms = bench(fn)
                        if ms < best_ms:
                            best_name, best_ms = name, ms
                    except Exception as e:  # noqa: BLE001
                        log(f"  peer {name} failed: {type(e).__name__}: {str(e)[:200]}")
                cells = []
                for c in columns:
                    kernel, bn, pipe = COLUMNS[c]
                    config = cfg(bn, pipe=pipe) if bn else None  # None: default_config, what dispatch runs
                    try:
                        ms = bench(lambda: run_gluon(A, W, SA, SB, modes, BF16, None, fast, kernel, config))
                        cells.append(f"{tflops(M, N, K, ms):10.1f} {best_ms / ms:5.2f}")
                    except Exception as e:  # noqa: BLE001
                        cells.append(f"{'ERR':>10s} {'-':>5s}")
                        log(f"  {c} failed: {type(e).__name__}: {str(e)[:200]}")
                log(f"  {f'{M}x{N}x{K}':18s} {label:3s} {'fast' if fast else 'prec':4s} {str(best_name):21s} "
                    f"{tflops(M, N, K, best_ms):7.1f} " + " ".join(cells))
                A = W = SA = SB = None
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                log(f"  {M}x{N}x{K} {label}: {type(e).__name__}: {str(e)[:300]}")


def sweep(budget_s, M=8192, N=8192, K=8192):
    """Ring depth and group size of the ws kernel at one shape."""
    from opforge.kernels.gemm_fp8_gluon import BLOCK, TENSOR

    log(f"== sweep {M}x{N}x{K} (TFLOP/s)")
    for modes, fast, grid in (((TENSOR, TENSOR), False, ((256, 3, 8), (256, 4, 8), (256, 4, 16), (128, 6, 8))),
                              ((TENSOR, TENSOR), True, ((256, 3, 16), (256, 4, 8), (256, 4, 16))),
                              ((BLOCK, BLOCK), False, ((128, 4, 8), (128, 6, 8), (128, 5, 16), (128, 6, 16)))):
        A, W, SA, SB = make(M, N, K, modes)
        for bn, st, gm in grid:
            if time.time() - T0 > budget_s:
                log("  (time budget reached)")
                return
            name = f"{'bb' if BLOCK in modes else 'tt'} {'fast' if fast else 'prec'} BN={bn} STAGES={st} GROUP_M={gm}"
            try:
                ms = bench(lambda: run_gluon(A, W, SA, SB, modes, BF16, None, fast, "ws", cfg(bn, st, gm)))
                log(f"  {name}: {tflops(M, N, K, ms):7.1f}")
            except Exception as e:  # noqa: BLE001
                log(f"  {name}: {type(e).__name__}: {str(e)[:200]}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="correctness and 4096^3 only")
    p.add_argument("--kernels", default="ws,simple", help="correctness: kernel forms")
    p.add_argument("--columns", default="dflt,ws128,ws256", help="timing: " + ",".join(COLUMNS))
    p.add_argument("--watchdog", type=float, default=170.0)
    args = p.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    kernels = args.kernels.split(",")
    log(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"triton {__import__('triton').__version__}")
    fails = correctness(kernels)
    log(f"correctness: {fails} failing case(s)  [{time.time() - T0:.0f} s]")
    shapes = [(4096, 4096, 4096)] if args.quick else [
        (8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 16384), (4096, 14336, 4096), (8192, 4096, 14336),
        (4096, 4096, 4096)]  # 4096^3 again: run 1 had row-wise there at 0.7x
    timing(args.columns.split(","), shapes, budget_s=args.watchdog - 40)
    if not args.quick:
        sweep(budget_s=args.watchdog - 8)
    log(f"done [{time.time() - T0:.0f} s]")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPFORGE_GLUON", "1")
    sys.exit(main())
