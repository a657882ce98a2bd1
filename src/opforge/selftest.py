"""``opforge selftest``: compile every variant on this device and check it.

The Triton interpreter compiles nothing, so CPU tests cannot prove that a
kernel compiles for sm_90 or runs without faults. This command does, on the
GPU: every variant of every op, on random inputs that reach it, against the
float64 reference. ``--sanitize`` reruns the whole check under
compute-sanitizer's memcheck. ``--jobs N`` splits the variants into N shards
checked by N processes at once: a cold run is bound by Triton's compiles on
the host's CPUs, which one process uses one at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from opforge.bench.case import REL_ERR_BOUND, rel_err
from opforge.runtime import device as devmod
from opforge.runtime import dispatch, registry


@dataclass
class VariantResult:
    op: str
    variant: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    worst_err: float = 0.0
    failures: list[str] = field(default_factory=list)


def _upcast(args):
    return [a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


# Inputs whose products the tensor cores compute below fp32 precision, whatever the
# output dtype: TF32 rounds fp32 inputs to 10 mantissa bits; Hopper's fp8 MMA
# accumulates about 14 mantissa bits within a K block (as torch._scaled_mm does
# without fast accumulation). Measured worst on the H200: 7.7e-4 and 1.3e-4.
TF32_REL_ERR_BOUND = 2e-3
FP8_REL_ERR_BOUND = 1e-3
FP8_DTYPES = {torch.float8_e4m3fn, torch.float8_e5m2}


def bound(out_dtype: torch.dtype, args) -> float:
    """The relative error allowed for an output of ``out_dtype`` from ``args``."""
    b = REL_ERR_BOUND.get(out_dtype, 0.0)
    if any(isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES for a in args):
        b = max(b, FP8_REL_ERR_BOUND)
    if any(getattr(a, "tf32", False) is True for a in args):
        b = max(b, TF32_REL_ERR_BOUND)
    return b


def _compare(out, ref64, args=()) -> tuple[bool, float]:
    """``out`` against the float64 reference: relative error within the bound for
    its dtype and inputs (see ``bound``), equality for integers; tuples (values,
    indices) element-wise."""
    if isinstance(out, (tuple, list)):
        if not isinstance(ref64, (tuple, list)) or len(ref64) != len(out):
            return False, float("inf")
        results = [_compare(o, r, args) for o, r in zip(out, ref64)]
        return all(ok for ok, _ in results), max(err for _, err in results)
    if out.dtype.is_floating_point:
        err = rel_err(out, ref64)
        ok = err <= bound(out.dtype, args)
    else:
        err = 0.0 if torch.equal(out.cpu(), ref64.to(out.dtype).cpu()) else float("inf")
        ok = err == 0.0
    return ok and tuple(out.shape) == tuple(ref64.shape), err


def check_variant(op, variant, device) -> VariantResult:
    res = VariantResult(op.qualname, variant.name)
    for args in op.samples(device):
        if dispatch.reject_reason(op, variant, args) is not None:
            res.skipped += 1
            continue
        try:
            out = variant.run(variant.default_config(*args), *args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ok, err = _compare(out, op.reference(*_upcast([a for a in args if a is not None])), args)
        except Exception as e:
            ok, err = False, float("inf")
            res.failures.append(f"{_describe(args)}: {type(e).__name__}: {e}"[:400])
        res.worst_err = max(res.worst_err, err)
        if ok:
            res.passed += 1
        else:
            res.failed += 1
            if len(res.failures) < 3:
                res.failures.append(f"{_describe(args)}: rel err {err:.2e}")
    return res


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).replace('torch.', '')}{tuple(a.shape)}{'' if a.is_contiguous() else '*'}")
        elif a is not None:
            parts.append(repr(a))
    return ", ".join(parts)


def run(device: torch.device | None = None, console: Console | None = None,
        ops: list[str] | None = None, shard: tuple[int, int] = (0, 1), jobs: int = 1,
        json_path: str | None = None) -> list[VariantResult]:
    """Check every non-reference variant of ``ops`` (default: all registered ops;
    a name ending in ``*`` selects every op with that prefix). ``shard=(k, n)``
    checks every n-th variant from the k-th; ``jobs`` > 1 runs that many shards
    in subprocesses and merges their results."""
    console = console or Console()
    if jobs > 1:
        select(ops)  # a name matching no op is refused here, once, not by every shard
        results = _run_shards(console, ops, jobs)
    else:
        device = device or devmod.default_device()
        results = [_checked(check_variant(op, v, device), console) for op, v in variants(ops, shard)]
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in results], f)
    if shard[1] == 1:  # a shard's lines stream to its parent, which prints the one table
        _report(results, console, device or devmod.default_device())
    return results


def variants(ops: list[str] | None, shard: tuple[int, int] = (0, 1)) -> list:
    """The (op, variant) pairs to check, every ``n``-th from the ``k``-th."""
    k, n = shard
    if not 0 <= k < n:
        raise ValueError(f"opforge selftest: shard {k}/{n} is outside 0..{n - 1}")
    pairs = [(op, v) for op in select(ops) for v in op.variants if v.kind != "reference"]
    return pairs[k::n]


def _checked(r: VariantResult, console: Console) -> VariantResult:
    # a line as each variant finishes: a run cut short by a time limit still says what it checked
    console.print(f"{r.op} {r.variant}: {r.passed} passed, {r.failed} failed, {r.skipped} skipped, "
                  f"worst rel err {r.worst_err:.1e}", markup=False, highlight=False)
    return r


def _run_shards(console: Console, ops: list[str] | None, jobs: int) -> list[VariantResult]:
    """Each shard in its own ``opforge selftest --shard k/jobs`` process; their
    per-variant lines stream through as they come, the results come back as JSON."""
    with tempfile.TemporaryDirectory(prefix="opforge-selftest-") as tmp:
        procs = []
        for k in range(jobs):
            cmd = [sys.executable, "-m", "opforge", "selftest", "--shard", f"{k}/{jobs}",
                   "--json", os.path.join(tmp, f"{k}.json")]
            cmd += [arg for name in ops or [] for arg in ("--op", name)]
            procs.append(subprocess.Popen(cmd))
        codes = [p.wait() for p in procs]
        results = []
        for k, code in enumerate(codes):
            path = os.path.join(tmp, f"{k}.json")
            if not os.path.exists(path):
                raise RuntimeError(f"opforge selftest: shard {k}/{jobs} exited with code {code} "
                                   f"and wrote no results")
            with open(path) as f:
                results += [VariantResult(**r) for r in json.load(f)]
    return results


def _report(results: list[VariantResult], console: Console, device: torch.device) -> None:
    table = Table(title=f"opforge selftest on {devmod.device_info(device).name} ({devmod.device_info(device).arch})")
    for col in ("op", "variant", "passed", "failed", "skipped", "worst rel err", "status"):
        table.add_column(col)
    for r in results:
        status = "[green]PASS[/green]" if r.failed == 0 and r.passed else (
            "[yellow]n/a[/yellow]" if r.failed == 0 else "[red]FAIL[/red]")
        table.add_row(r.op, r.variant, str(r.passed), str(r.failed), str(r.skipped), f"{r.worst_err:.1e}", status)
    console.print(table)
    for r in results:
        for f in r.failures:
            console.print(f"[red]{r.op} {r.variant}[/red]: {f}")
    total_fail = sum(r.failed for r in results)
    ran = sum(r.passed + r.failed for r in results)
    console.print(f"{ran - total_fail} passed, {total_fail} failed")


def select(names: list[str] | None) -> list:
    """The registered ops named (``softmax``, ``opforge::softmax``, ``cross_entropy*``)."""
    every = registry.all_ops()
    if not names:
        return every
    chosen = []
    for name in names:
        key = name.split("::", 1)[-1]
        hits = [op for op in every if (op.name.startswith(key[:-1]) if key.endswith("*") else op.name == key)]
        if not hits:
            raise ValueError(f"opforge selftest: no op matches {name!r}; registered: {[o.name for o in every]}")
        chosen += [op for op in hits if op not in chosen]
    return chosen


def run_sanitized(console: Console | None = None, ops: list[str] | None = None) -> int:
    """Rerun the selftest under compute-sanitizer memcheck; returns its exit code."""
    console = console or Console()
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        console.print("[yellow]compute-sanitizer not found: --sanitize skipped[/yellow]")
        return 0
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-m", "opforge", "selftest"]
    cmd += [arg for name in ops or [] for arg in ("--op", name)]
    console.print("running: " + " ".join(cmd))
    proc = subprocess.run(cmd, env=dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1"))
    verdict = "clean" if proc.returncode == 0 else f"exit code {proc.returncode}"
    console.print(f"compute-sanitizer memcheck: {verdict}")
    return proc.returncode
