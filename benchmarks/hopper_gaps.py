"""Issue 27's open gaps on the H200: memcheck of the new kernels, and Nsight Compute beside the peer.

    PYTHONPATH=src python3 benchmarks/hopper_gaps.py [--parts memcheck,ncu] [--cases a,b] [--out PATH]

* ``memcheck``: ``opforge selftest``'s check of each new variant (the family's samples the variant
  takes, against the float64 reference) plus one call through dispatch at a bench-like shape (so the
  shipped tuned config runs too), all in one child process under ``compute-sanitizer --tool memcheck``.
  Variants: the Gluon FP8 GEMM (``scaled_matmul`` ``gluon_ws``, its gate opened with
  ``OPFORGE_GLUON=1``), the long-row wave kernels (``softmax`` / ``layer_norm`` / ``rms_norm``
  ``triton_wave``) and the single-pass look-back scan and compaction (``cumsum`` / ``compact``
  ``triton_lookback``).
* ``ncu``: each case's kernels, ours and the peer's, each in its own child process under ncu (an
  NVTX range around the measured call: the peer's kernel names need not be known), with the figures
  that say where the time goes: duration, SM and DRAM throughput (% of peak), the tensor pipe's
  activity (GMMA), issue activity, achieved occupancy, registers, shared memory per block, L2 hit rate
  and the top warp-stall reasons. Cases: attention forward (S 4096 causal, S 8192 full) and backward
  (S 4096 causal) against cuDNN; FP8 per-tensor 8192^3 against ``torch._scaled_mm``; long-row
  layer_norm / softmax and the 2^28 cumsum against a copy of the same bytes.

Prints one table per part and writes everything as JSON to ``--out``. A case that fails is reported
and the others still run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

NCU_METRICS = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
    "launch__shared_mem_per_block_dynamic",
    "lts__t_sector_hit_rate.pct",
)
STALLS = ("barrier", "long_scoreboard", "math_pipe_throttle", "mio_throttle", "short_scoreboard",
          "wait", "lg_throttle", "no_instruction", "dispatch_stall", "sleeping", "membar", "selected",
          "not_selected", "branch_resolving", "misc", "drain", "imc_miss", "tex_throttle")
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warp_latency_issue_stalled_", ".ratio"

MEMCHECK_VARIANTS = (("scaled_matmul", "gluon_ws"), ("softmax", "triton_wave"), ("layer_norm", "triton_wave"),
                     ("rms_norm", "triton_wave"), ("cumsum", "triton_lookback"), ("compact", "triton_lookback"))


def say(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------
# the cases: name -> builder returning {label: step}; each step launches once
# ---------------------------------------------------------------------------

def _attention_inputs(S, causal, grad=False):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 16, S, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
               for _ in range(3))
    return q, k, v


def _sdpa_cudnn(q, k, v, causal):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _ours_forced(op, variant, fn):
    from opforge.runtime.dispatch import force_variant

    def step():
        with force_variant(op, variant):
            return fn()
    return step


def case_attn_fwd(S, causal):
    import opforge

    q, k, v = _attention_inputs(S, causal)
    return {"gluon_ws": _ours_forced("attention", "gluon_ws", lambda: opforge.attention(q, k, v, causal=causal)),
            "cudnn": lambda: _sdpa_cudnn(q, k, v, causal)}


def case_attn_bwd(S, causal):
    import torch

    import opforge

    q, k, v = _attention_inputs(S, causal, grad=True)
    do = torch.randn_like(q)

    def ours():
        from opforge.runtime.dispatch import force_variant

        with force_variant("attention", "gluon_ws"), force_variant("attention_backward", "gluon_ws"):
            opforge.attention(q, k, v, causal=causal).backward(do)

    def peer():
        _sdpa_cudnn(q, k, v, causal).backward(do)
    return {"gluon_ws (fwd+bwd)": ours, "cudnn (fwd+bwd)": peer}


def case_fp8(n):
    import torch

    import opforge

    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(n, n, device="cuda", generator=g)).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, n, device="cuda", generator=g)).clamp(-448, 448).to(torch.float8_e4m3fn)
    sa = torch.tensor([[0.01]], device="cuda")
    sb = torch.tensor([[0.02]], device="cuda")
    return {"gluon_ws": _ours_forced("scaled_matmul", "gluon_ws", lambda: opforge.scaled_matmul(a, w.t(), sa, sb)),
            "_scaled_mm": lambda: torch._scaled_mm(a, w.t(), scale_a=sa.reshape(()), scale_b=sb.reshape(()),
                                                   out_dtype=torch.bfloat16)}


def copy_kernel(x):
    """A kernel that reads and writes the bytes ``x`` holds (``clone`` is a driver memcpy that ncu does not
    profile): the bandwidth a plain elementwise kernel reaches, the ceiling of a one-pass row kernel."""
    import torch

    y = torch.empty_like(x)
    return lambda: torch.neg(x, out=y)


def case_rows(op, cols):
    import torch

    import opforge

    x = torch.randn(1024, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    fn = {"softmax": lambda: opforge.softmax(x, dim=-1),
          "layer_norm": lambda: opforge.layer_norm(x, (cols,), w, b)}[op]
    return {"triton_wave": _ours_forced(op, "triton_wave", fn), "copy": copy_kernel(x)}


def case_cumsum(n):
    import torch

    import opforge

    x = torch.randn(n, device="cuda", dtype=torch.float32)
    return {"triton_lookback": _ours_forced("cumsum", "triton_lookback", lambda: opforge.cumsum(x, dim=0)),
            "copy": copy_kernel(x)}


CASES = {
    "attn_fwd_s4096_causal": lambda: case_attn_fwd(4096, True),
    "attn_fwd_s8192_full": lambda: case_attn_fwd(8192, False),
    "attn_bwd_s4096_causal": lambda: case_attn_bwd(4096, True),
    "fp8_tensor_8192": lambda: case_fp8(8192),
    "layer_norm_1024x65536": lambda: case_rows("layer_norm", 65536),
    "softmax_1024x262144": lambda: case_rows("softmax", 262144),
    "cumsum_2^28": lambda: case_cumsum(1 << 28),
}


def child_step(case: str, label: str) -> None:
    """Run one case's step: warm it, then once inside the NVTX range ``gap`` that ncu profiles."""
    import torch

    step = CASES[case]()[label]
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    # a start/end range, not push/pop: it is process-wide, so it also holds the kernels that autograd's
    # device thread launches for a backward
    rid = torch.cuda.nvtx.range_start("gap")
    step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_end(rid)


# ---------------------------------------------------------------------------
# ncu
# ---------------------------------------------------------------------------

def ncu_case(ncu: str, case: str, label: str, timeout: float) -> list[dict]:
    from opforge.profile.ncu import NcuError, explain_failure, missing_metrics, parse_csv

    metrics = NCU_METRICS + tuple(STALL_PREFIX + s + STALL_SUFFIX for s in STALLS)
    env = dict(os.environ, OPFORGE_GLUON="1", OPFORGE_AUTOTUNE="off")
    for _ in range(3):
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", "gap",
               "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
               sys.executable, __file__, "--child-case", case, "--child-label", label]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out = r.stdout + "\n" + r.stderr
        gone = missing_metrics(out) & set(metrics)
        if gone:
            metrics = tuple(m for m in metrics if m not in gone)
            continue
        if "Kernel Name" not in r.stdout:
            raise NcuError(explain_failure(out, r.returncode))
        return [dict(km.raw, kernel=km.kernel) for km in parse_csv(r.stdout)]
    raise NcuError("ncu kept rejecting metrics")


def summarize(raw: dict) -> dict:
    def f(name):
        v = raw.get(name)
        return v if isinstance(v, (int, float)) else None

    stalls = {s: f(STALL_PREFIX + s + STALL_SUFFIX) for s in STALLS}
    total = sum(v for v in stalls.values() if v) or None
    top = sorted(((s, v / total) for s, v in stalls.items() if v and total), key=lambda t: -t[1])[:4]
    return {"kernel": raw["kernel"][:60], "us": (f("gpu__time_duration.sum") or 0) / 1e3,
            "sm_pct": f("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            "dram_pct": f("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "gmma_pct": f("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
            "issue_pct": f("smsp__issue_active.avg.pct_of_peak_sustained_active"),
            "occ_pct": f("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "regs": f("launch__registers_per_thread"), "grid": f("launch__grid_size"),
            "block": f("launch__block_size"), "smem": f("launch__shared_mem_per_block_dynamic"),
            "l2_hit_pct": f("lts__t_sector_hit_rate.pct"),
            "dram_gb": ((f("dram__bytes_read.sum") or 0) + (f("dram__bytes_write.sum") or 0)) / 1e9,
            "top_stalls": [(s, round(share, 3)) for s, share in top]}


def part_ncu(cases, timeout) -> dict:
    from opforge.profile.ncu import NcuError, find_ncu

    try:
        ncu = find_ncu()
    except NcuError as e:
        say(f"ncu: {e}")
        return {}
    results = {}
    say(f"{'case':<24} {'kernel':<44} {'us':>9} {'SM%':>5} {'DRAM%':>6} {'GMMA%':>6} {'issue%':>6} "
        f"{'occ%':>5} {'regs':>4} {'L2hit%':>6}  top stalls")
    for spec in cases:
        case, _, only = spec.partition("/")
        for label in [lb for lb in _labels(case) if not only or lb.startswith(only)]:
            t0 = time.time()
            try:
                rows = [summarize(r) for r in ncu_case(ncu, case, label, timeout)]
            except Exception as e:  # one case's failure is reported, the others still run
                say(f"{case:<24} {label}: FAILED {type(e).__name__}: {str(e)[-600:]}")
                results[f"{case}/{label}"] = {"error": f"{type(e).__name__}: {e}"[-1500:]}
                continue
            results[f"{case}/{label}"] = rows
            say(f"{case:<24} [{label}] {len(rows)} kernel(s), total {sum(r['us'] for r in rows):.1f} us "
                f"({time.time() - t0:.0f} s)")
            for r in sorted(rows, key=lambda r: -r["us"])[:4]:
                def p(x, w=5):
                    return f"{x:>{w}.1f}" if x is not None else " " * (w - 1) + "-"
                stalls = ", ".join(f"{s} {v:.0%}" for s, v in r["top_stalls"])
                say(f"{'':<24} {r['kernel'][:44]:<44} {r['us']:>9.1f} {p(r['sm_pct'])} {p(r['dram_pct'], 6)} "
                    f"{p(r['gmma_pct'], 6)} {p(r['issue_pct'], 6)} {p(r['occ_pct'])} "
                    f"{int(r['regs'] or 0):>4} {p(r['l2_hit_pct'], 6)}  {stalls}")
    return results


def _labels(case):
    """The labels of a case without building its inputs on the GPU (the parent holds no tensors)."""
    return {"attn_fwd": ("gluon_ws", "cudnn"), "attn_bwd": ("gluon_ws (fwd+bwd)", "cudnn (fwd+bwd)"),
            "fp8_tens": ("gluon_ws", "_scaled_mm"), "layer_no": ("triton_wave", "copy"),
            "softmax_": ("triton_wave", "copy"), "cumsum_2": ("triton_lookback", "copy")}[case[:8]]


def warm_compile(cases) -> None:
    """Compile every case's kernels once in this process, so each ncu child loads them from the cache."""
    import torch

    for case in sorted({c.partition("/")[0] for c in cases}):
        try:
            for label, step in CASES[case]().items():
                step()
            torch.cuda.synchronize()
        except Exception as e:
            say(f"warm {case}: {type(e).__name__}: {e}"[:400])
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# memcheck
# ---------------------------------------------------------------------------

def child_memcheck() -> None:
    """Selftest checks of the new variants plus one dispatch call each at a bench-like shape."""
    import torch

    import opforge
    from opforge.runtime import device as devmod
    from opforge.runtime import registry
    from opforge.selftest import check_variant

    for op_name, variant in MEMCHECK_VARIANTS:
        op = registry.get(op_name)
        r = check_variant(op, op.variant(variant), devmod.default_device())
        say(f"selftest {op_name} [{variant}]: passed {r.passed} failed {r.failed} skipped {r.skipped} "
            f"{'PASS' if r.passed and not r.failed else 'FAIL'} {r.failures[:2]}")
    x = torch.randn(64, 65536, device="cuda", dtype=torch.bfloat16)
    for name, fn in (("softmax", lambda: opforge.softmax(x, dim=-1)),
                     ("layer_norm", lambda: opforge.layer_norm(x, (65536,))),
                     ("rms_norm", lambda: opforge.rms_norm(x, (65536,)))):
        out = fn()
        say(f"dispatch {name} 64x65536 bf16: finite={bool(torch.isfinite(out.float()).all())}")
    y = torch.randn(1 << 22, device="cuda")
    err = (opforge.cumsum(y, dim=0).double() - y.double().cumsum(0)).abs().max().item()
    say(f"dispatch cumsum 2^22 fp32: max abs err vs fp64 {err:.3e}")
    a = torch.randn(1024, 2048, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(1536, 2048, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.rand(1024, 16, device="cuda") + 0.5, torch.rand(16, 12, device="cuda") + 0.5
    out = opforge.scaled_matmul(a, w.t(), sa, sb)
    ref = (a.float() * sa.repeat_interleave(128, 1)) @ (w.float().t() * sb.repeat_interleave(128, 0)
                                                          .repeat_interleave(128, 1))
    say(f"dispatch scaled_matmul 1024x1536x2048 block scales: rel err "
        f"{((out.float() - ref).abs().max() / ref.abs().max()).item():.2e}")
    torch.cuda.synchronize()


def part_memcheck(timeout) -> dict:
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        say("compute-sanitizer not found: memcheck skipped")
        return {"skipped": "compute-sanitizer not found"}
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, __file__, "--child-memcheck"]
    env = dict(os.environ, OPFORGE_GLUON="1", OPFORGE_AUTOTUNE="off", PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        say(f"memcheck: did not finish in {timeout:.0f} s")
        return {"error": "timeout"}
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    say("\n".join(lines[-30:]))
    verdict = "CLEAN" if r.returncode == 0 else f"exit {r.returncode} (3: errors found)"
    say(f"memcheck: {verdict} ({time.time() - t0:.0f} s)")
    return {"verdict": verdict, "returncode": r.returncode, "tail": lines[-30:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="memcheck,ncu")
    ap.add_argument("--cases", default=",".join(CASES), help="case or case/label-prefix, comma-separated")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per ncu child")
    ap.add_argument("--memcheck-timeout", type=float, default=200)
    ap.add_argument("--out")
    ap.add_argument("--child-case")
    ap.add_argument("--child-label")
    ap.add_argument("--child-memcheck", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
    if a.child_memcheck:
        child_memcheck()
        return 0
    if a.child_case:
        child_step(a.child_case, a.child_label)
        return 0
    os.environ.setdefault("OPFORGE_GLUON", "1")
    report = {"date": time.strftime("%Y-%m-%d"), "parts": {}}
    cases = [c for c in a.cases.split(",") if c]
    if "memcheck" in a.parts:
        say("== memcheck ==")
        report["parts"]["memcheck"] = part_memcheck(a.memcheck_timeout)
    if "ncu" in a.parts:
        say("== ncu ==")
        t0 = time.time()
        warm_compile(cases)
        say(f"(kernels compiled in {time.time() - t0:.0f} s)")
        report["parts"]["ncu"] = part_ncu(cases, a.timeout)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
