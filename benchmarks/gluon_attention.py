"""The Gluon warp-specialized attention forward on the H200: correctness, then speed.

Usage (repo root, on the GPU)::

    PYTHONPATH=src python3 benchmarks/gluon_attention.py [--quick] [--parts warm,check,time,dispatch]

Each part runs in a child process with a time limit, so a hang (an mbarrier
waited on forever) or a crash costs that part only. Prints:

* ``check``: max abs error of O (and of the log-sum-exp) against SDPA's math in
  fp32, PASS/FAIL per case: B 2, H 8, S 1024 and 1000 (ragged), D 64/128,
  causal/full, GQA 8/2, bf16 (and one fp16 case);
* ``time``: bf16, B 4, H 16, D 128, S 2048..16384, causal/full, TFLOP/s
  (causal counts half) of gluon_ws (default config and best config), cuDNN
  SDPA, flash SDPA and our Triton forward (opforge.attention), and the
  ratios; GQA 32/8 S 4096 against SDPA with enable_gqa; D 64 S 4096;
  and every config of the kernel at each shape (the best one is named);
* ``dispatch``: what ``opforge.attention`` picks with OPFORGE_GLUON=1,
  ``gluon_ws`` forced through the op's API against the reference, and the
  selftest's check of the variant (``selftest`` part);
* ``backward``: the Gluon backward (kernels/attention_gluon_backward.py)
  against autograd in fp32, and its TFLOP/s against our Triton backward and
  cuDNN's (forward+backward less forward);
* ``memcheck``: that selftest check under compute-sanitizer memcheck.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

PARTS = ("warm", "check", "time", "dispatch", "backward", "memcheck")
LIMITS = {"warm": 30, "check": 15, "time": 40, "dispatch": 25, "backward": 90, "memcheck": 20,
          "selftest": 30}  # 150 s at most


def _say(*a):
    print(*a, flush=True)


def _setup():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def _reference(q, k, v, causal):
    """SDPA's math in fp32 with k/v heads expanded (GQA); lse from the same scores."""
    import torch

    torch_ = torch
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    qf = q.float()
    with torch_.nn.attention.sdpa_kernel(torch_.nn.attention.SDPBackend.MATH):
        out = torch_.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    s = (qf @ kf.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        Sq, Sk = q.shape[2], k.shape[2]
        mask = torch_.ones(Sq, Sk, dtype=torch_.bool, device=q.device).tril(Sk - Sq)
        s = s.masked_fill(~mask, float("-inf"))
    return out, torch_.logsumexp(s, -1)


def _gluon(q, k, v, causal, cfg=None):
    import torch

    from opforge.kernels import attention_gluon as KG

    cfg = cfg or KG.forward_default_config(q.shape[-1], q.shape[2], k.shape[2], causal, q.shape[1] // k.shape[1])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    KG.launch_forward(q, k, v, out, lse, q.shape[-1] ** -0.5, causal, cfg)
    return out, lse


def _compile_gluon(D, causal, dtype_name, i):
    import torch

    from opforge.kernels import attention_gluon as KG

    cfg = KG.forward_configs(D, 4096, 4096)[i]
    t0 = time.time()
    KG.compile_sm90(D, causal, getattr(torch, dtype_name), cfg)
    return f"gluon D{D} {'causal' if causal else 'full'} {dtype_name} config {i}: {time.time() - t0:.1f} s"


def _warm_triton():
    """Our Triton forward at the timing shapes' specializations (small S, same divisibility)."""
    import torch

    import opforge

    t0 = time.time()
    for H, Hk, D in ((16, 16, 128), (32, 8, 128), (16, 16, 64)):
        q = torch.randn(1, H, 256, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, Hk, 256, D, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            opforge.attention(q, k, k, causal=causal)
            if H == Hk and D == 128:  # the backward part's Triton peer
                out, lse = torch.ops.opforge.attention(q, q, q, D ** -0.5, -1, 0 if causal else -1,
                                                       None, None, -1, -1)
                torch.ops.opforge.attention_backward(out, q, q, q, out, lse, D ** -0.5, -1, 0 if causal else -1,
                                                     None, None, -1, -1)
    torch.cuda.synchronize()
    return f"triton forward: {time.time() - t0:.1f} s"


def part_warm(quick: bool):
    """Compile every specialization the other parts launch, in parallel, into Triton's cache."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from opforge.kernels import attention_gluon as KG

    jobs = []
    for D in (128, 64):
        seen = []  # a persistent grid runs the same compiled kernel: one compile per config without that key
        for i, cfg in enumerate(KG.forward_configs(D, 4096, 4096)):
            key = dict(cfg, PERSISTENT=False)
            if key not in seen:
                seen.append(key)
                jobs += [(_compile_gluon, (D, c, "bfloat16", i)) for c in (True, False)]
    # fp16: the check part's case and the selftest samples' (D 64 full / causal, D 128 full)
    jobs += [(_compile_gluon, (64, c, "float16", 0)) for c in (True, False)]
    jobs += [(_compile_gluon, (128, False, "float16", 0)), (_warm_triton, ())]
    jobs += [(_compile_gluon_backward, (D, c)) for D in (128, 64) for c in (True, False)]
    jobs += [(_compile_gluon_backward, (D, c, "float16")) for D, c in ((64, True), (64, False), (128, False))]
    with ProcessPoolExecutor(min(len(jobs), max(2, (os.cpu_count() or 4) - 1)),
                             mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(fn, *args) for fn, args in jobs]
        for f in as_completed(futures):
            try:
                _say("  " + f.result())
            except Exception as e:
                _say(f"  compile ERROR {type(e).__name__}: {str(e)[:400]}")


def part_check(quick: bool):
    torch = _setup()
    torch.manual_seed(0)
    cases = []
    for S in (1024, 1000):
        for D in (64, 128):
            for causal in (False, True):
                cases.append((2, 8, 8, S, D, causal, torch.bfloat16))
    cases += [(2, 8, 2, 1024, 128, False, torch.bfloat16), (2, 8, 2, 1000, 128, True, torch.bfloat16),
              (2, 8, 2, 1024, 64, True, torch.float16), (1, 2, 2, 64, 128, True, torch.bfloat16),
              (1, 2, 1, 300, 64, False, torch.bfloat16)]
    from opforge.kernels import attention_gluon as KG

    cases = [c + (0,) for c in cases]
    for D, causal in ((128, True), (128, False), (64, False)):  # the other configs
        # S 3000: 384 tiles of 128 queries, several per CTA on a persistent grid
        cases += [(2, 8, 2, 3000, D, causal, torch.bfloat16, i) for i in range(1, len(KG.forward_configs(D, 1, 1)))]
    _say(f"{'case':54s} {'max|dO|':>9s} {'max|dLSE|':>9s} result")
    for B, H, Hk, S, D, causal, dt, i in cases:
        cfg = KG.forward_configs(D, 1, 1)[i] if i else None  # None: the shape's default
        name = f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} {str(dt)[6:]} cfg{i}"
        try:
            q = torch.randn(B, H, S, D, device="cuda", dtype=dt)
            k = torch.randn(B, Hk, S, D, device="cuda", dtype=dt)
            v = torch.randn(B, Hk, S, D, device="cuda", dtype=dt)
            t0 = time.time()
            out, lse = _gluon(q, k, v, causal, cfg)
            torch.cuda.synchronize()
            first = time.time() - t0  # seconds: a compile (cache miss) or not
            ref, ref_lse = _reference(q, k, v, causal)
            eo = (out.float() - ref).abs().max().item()
            el = (lse - ref_lse).abs().max().item()
            ok = eo <= 2e-2 and el <= 1e-2 and math.isfinite(eo) and math.isfinite(el)
            _say(f"{name:54s} {eo:9.2e} {el:9.2e} {'PASS' if ok else 'FAIL'}  ({first:.1f} s)")
        except Exception as e:  # one failure must not hide the others
            _say(f"{name:54s} ERROR {type(e).__name__}: {str(e)[:300]}")


def _bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40)


def _peers(q, k, v, causal):
    """name -> callable, for SDPA backends and our Triton forward."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import opforge

    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = q.shape[1] != k.shape[1]

    def with_backend(backend):
        def run():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
        return run

    peers = {"triton": lambda: opforge.attention(q, k, v, causal=causal)}
    if gqa:
        peers["sdpa_gqa"] = lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    else:
        peers["cudnn"] = with_backend(SDPBackend.CUDNN_ATTENTION)
        peers["flash"] = with_backend(SDPBackend.FLASH_ATTENTION)
    return peers


def _tag(i: int, cfg: dict) -> str:
    return (f"cfg{i} N{cfg['BLOCK_N']} st{cfg['STAGES']} c{cfg['CONSUMERS']}{' pp' if cfg['PINGPONG'] else ''}"
            f"{' pers' if cfg['PERSISTENT'] else ''}{' o-in-q' if cfg.get('O_IN_Q') else ''}")


def part_time(quick: bool):
    """The peers, gluon_ws's default config and its best config per shape, then every config's TFLOP/s."""
    torch = _setup()
    from opforge.kernels import attention_gluon as KG

    shapes = [(4, 16, 16, S, 128, c) for S in ((2048, 8192) if quick else (2048, 4096, 8192, 16384))
              for c in (False, True)]
    shapes += [(4, 32, 8, 4096, 128, c) for c in (False, True)]
    shapes += [(4, 16, 16, 4096, 64, c) for c in (False, True)]
    cols = ["default", "best", "triton", "cudnn", "flash", "sdpa_gqa"]
    _say(f"{'shape (bf16)':32s} " + " ".join(f"{c:>8s}" for c in cols)
         + "  best/cudnn best/flash best/triton best/sdpa  best config   (TFLOP/s; causal counts half)")
    sweep = []
    for B, H, Hk, S, D, causal in shapes:
        name = f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'}"
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        tf = {}
        for cname, fn in _peers(q, k, v, causal).items():
            try:
                tf[cname] = flops / _bench(fn) / 1e9
            except Exception as e:
                _say(f"  {name} {cname}: {type(e).__name__}: {str(e)[:200]}")
        per_cfg = {}
        tf["default"] = flops / _bench(lambda: _gluon(q, k, v, causal)) / 1e9
        for i, cfg in enumerate(KG.forward_configs(D, 1, 1)):
            try:
                per_cfg[i] = flops / _bench(lambda: _gluon(q, k, v, causal, cfg)) / 1e9
            except Exception as e:
                _say(f"  {name} {_tag(i, cfg)}: {type(e).__name__}: {str(e)[:200]}")
        if per_cfg:
            best = max(per_cfg, key=per_cfg.get)
            tf["best"] = per_cfg[best]
            best_tag = _tag(best, KG.forward_configs(D, 1, 1)[best])
        else:
            best_tag = "-"
        sweep.append((name, per_cfg))
        cells = " ".join(f"{tf[c]:8.1f}" if c in tf else f"{'-':>8s}" for c in cols)
        ratios = " ".join(f"{tf['best'] / tf[p]:10.2f}" if "best" in tf and p in tf else f"{'-':>10s}"
                          for p in ("cudnn", "flash", "triton", "sdpa_gqa"))
        _say(f"{name:32s} {cells}  {ratios}  {best_tag}")
    _say("every config (TFLOP/s):")
    for D in (128, 64):
        _say("  D" + str(D) + ": " + "; ".join(_tag(i, c) for i, c in enumerate(KG.forward_configs(D, 1, 1))))
    for name, per_cfg in sweep:
        _say(f"  {name:32s} " + " ".join(f"{i}:{t:.0f}" for i, t in per_cfg.items()))


def part_dispatch(quick: bool):
    """``opforge.attention`` with the guard open: what dispatch picks unforced (shipped tuned
    entries outrank a variant that has none), then the variant forced through the op's API."""
    os.environ["OPFORGE_GLUON"] = "1"
    torch = _setup()
    import opforge
    from opforge.ops.attention import attention_reference
    from opforge.runtime.dispatch import force_variant

    q = torch.randn(2, 8, 777, 128, device="cuda", dtype=torch.bfloat16)
    qs = torch.randn(2, 777, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # (B, S, H, D) storage
    d = opforge.explain("attention", q, q, q, 128 ** -0.5, -1, 0, None, None, -1, -1)
    _say(f"unforced: dispatch picks {d.variant.name} ({d.source}); gluon_ws: "
         f"{d.passed.get('gluon_ws') or d.rejected.get('gluon_ws') or 'chosen'}")
    with force_variant("attention", "gluon_ws"):
        for x, causal, what in ((q, True, "causal S777 D128"), (qs, False, "full BSHD-strided S777 D64")):
            d = opforge.explain("attention", x, x, x, x.shape[-1] ** -0.5, -1, 0 if causal else -1,
                                None, None, -1, -1)
            out = opforge.attention(x, x, x, causal=causal)
            ref, _ = attention_reference(x, x, x, x.shape[-1] ** -0.5, -1, 0 if causal else -1)
            err = (out.float() - ref.float()).abs().max().item()
            _say(f"opforge.attention [{d.variant.name}] {what} vs reference: max abs {err:.2e} "
                 f"{'PASS' if err <= 2e-2 else 'FAIL'}")
    part_selftest(quick)


def _compile_gluon_backward(D, causal, dtype_name="bfloat16"):
    import torch

    from opforge.kernels import attention_gluon_backward as KB

    t0 = time.time()
    KB.compile_sm90(D, causal, getattr(torch, dtype_name))
    return f"gluon backward D{D} {'causal' if causal else 'full'} {dtype_name}: {time.time() - t0:.1f} s"


def _gluon_backward(do, q, k, v, out, lse, causal):
    import torch

    from opforge.kernels import attention_gluon_backward as KB

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    KB.launch_backward(do, q, k, v, out, lse, dq, dk, dv, q.shape[-1] ** -0.5, causal)
    return dq, dk, dv


def part_backward(quick: bool):
    """The Gluon backward (not dispatched yet): dq/dk/dv against autograd through SDPA's math
    in fp32, then TFLOP/s (2.5x the forward's FLOPs) against our Triton backward and cuDNN."""
    torch = _setup()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    __import__("opforge.ops.attention")  # defines torch.ops.opforge.attention_backward

    _say(f"{'case':40s} {'max|dQ|':>9s} {'max|dK|':>9s} {'max|dV|':>9s} result")
    for B, H, Hk, S, D, causal in ((2, 8, 8, 1000, 128, True), (2, 8, 2, 1024, 64, False),
                                   (1, 4, 1, 777, 128, False), (2, 4, 4, 1536, 128, True)):
        name = f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'}"
        try:
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
            do = torch.randn_like(q)
            out, lse = _gluon(q, k, v, causal)
            dq, dk, dv = _gluon_backward(do, q, k, v, out, lse, causal)
            torch.cuda.synchronize()
            qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal,
                                                                       enable_gqa=H != Hk)
            gq, gk, gv = torch.autograd.grad(ref, (qf, kf, vf), do.float())
            errs = [(a.float() - r).abs().max().item() for a, r in ((dq, gq), (dk, gk), (dv, gv))]
            scales = [r.abs().max().item() for r in (gq, gk, gv)]
            ok = all(e <= 2e-2 * max(1.0, sc) and math.isfinite(e) for e, sc in zip(errs, scales))
            _say(f"{name:40s} " + " ".join(f"{e:9.2e}" for e in errs) + f" {'PASS' if ok else 'FAIL'}")
        except Exception as e:
            _say(f"{name:40s} ERROR {type(e).__name__}: {str(e)[:300]}")
    _say(f"{'backward (bf16)':32s} {'gluon':>8s} {'triton':>8s} {'cudnn':>8s}  gl/triton gl/cudnn  (TFLOP/s)")
    for S, causal in ((4096, False), (4096, True), (8192, True)):
        try:
            _time_backward(torch, 4, 16, S, 128, causal)
        except Exception as e:
            _say(f"  S{S} {'causal' if causal else 'full'}: {type(e).__name__}: {str(e)[:200]}")


def _time_backward(torch, B, H, S, D, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name = f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = _gluon(q, k, v, causal)
    flops = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    tf = {}
    scale = D ** -0.5
    runs = {"gluon": lambda: _gluon_backward(do, q, k, v, out, lse, causal),
            "triton": lambda: torch.ops.opforge.attention_backward(do, q, k, v, out, lse, scale, -1,
                                                                   0 if causal else -1, None, None, -1, -1)}
    for cname, fn in runs.items():
        try:
            tf[cname] = flops / _bench(fn) / 1e9
        except Exception as e:
            _say(f"  {name} {cname}: {type(e).__name__}: {str(e)[:200]}")
    try:  # cuDNN: forward+backward through autograd, less its forward
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            fwd = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal))
            both = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                qg, kg, vg, is_causal=causal).backward(do))
        tf["cudnn"] = flops / (both - fwd) / 1e9
    except Exception as e:
        _say(f"  {name} cudnn: {type(e).__name__}: {str(e)[:200]}")
    cells = " ".join(f"{tf[c]:8.1f}" if c in tf else f"{'-':>8s}" for c in ("gluon", "triton", "cudnn"))
    ratios = " ".join(f"{tf['gluon'] / tf[p]:9.2f}" if "gluon" in tf and p in tf else f"{'-':>9s}"
                      for p in ("triton", "cudnn"))
    _say(f"{name:32s} {cells}  {ratios}")


def part_selftest(quick: bool):
    """``opforge selftest``'s check of the one variant: the family's samples (GQA, Sq != Sk, strided
    views, fp16/bf16...) that gluon_ws takes, against the float64 reference."""
    os.environ["OPFORGE_GLUON"] = "1"
    _setup()
    from opforge.runtime import device as devmod
    from opforge.runtime import registry
    from opforge.selftest import check_variant

    for name in ("attention", "attention_backward"):
        op = registry.get(name)
        r = check_variant(op, op.variant("gluon_ws"), devmod.default_device())
        _say(f"selftest {name} [gluon_ws]: passed {r.passed} failed {r.failed} skipped {r.skipped} "
             f"worst rel err {r.worst_err:.2e} {'PASS' if r.passed and not r.failed else 'FAIL'} {r.failures}")


def part_memcheck(quick: bool):
    """The selftest part under compute-sanitizer memcheck (out-of-bounds TMA, bad shared memory use)."""
    import shutil

    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        _say("compute-sanitizer not found: memcheck skipped")
        return
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, __file__, "--child", "selftest"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMITS["memcheck"] - 4)
    except subprocess.TimeoutExpired:
        _say("memcheck: did not finish in time")
        return
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    _say("\n".join(lines[-8:]))
    _say(f"memcheck: {'CLEAN' if done.returncode == 0 else f'exit {done.returncode} (3: errors found)'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        globals()[f"part_{a.child}"](a.quick)
        return 0
    t_all = time.time()
    for part in a.parts.split(","):
        _say(f"== {part} ==")
        t0 = time.time()
        cmd = [sys.executable, __file__, "--child", part] + (["--quick"] if a.quick else [])
        try:
            done = subprocess.run(cmd, timeout=LIMITS[part], stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                _say(f"{part}: exit {done.returncode}\n{done.stderr[-2500:]}")
        except subprocess.TimeoutExpired:
            _say(f"{part}: TIMEOUT after {LIMITS[part]} s (a hang: what printed above is all it did)")
        _say(f"({part}: {time.time() - t0:.0f} s)")
    _say(f"total {time.time() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
