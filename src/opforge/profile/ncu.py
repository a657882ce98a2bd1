"""Nsight Compute on one kernel: the command line, the run, and its CSV.

The profiled code runs in a child process under
``ncu --clock-control none --target-processes all --kernel-name regex:^(K)$
--launch-skip N --launch-count C --metrics ... --csv --page raw --print-units base
python -m opforge.profile._ncu_target JOB``. The target (``_ncu_target``)
builds the inputs once, calls the step ``warmup`` times (compiles, caches) and
once more; ``--launch-skip`` counts only launches that match the kernel name,
so ``N = warmup * launches_per_call`` skips the warm-up and ``C`` launches of
the last call are profiled. Clocks are never changed (``--clock-control
none``): the GPU runs at the clocks everyone else sees.

``--page raw --csv`` prints one header row (``"ID","Process ID",...,"Kernel
Name",...`` then one column per metric), one row of units and one row per
profiled kernel; ncu's own ``==PROF==``/``==WARNING==`` lines are interleaved
on stdout and skipped. ``fold`` turns the metrics into the report's key
figures: DRAM throughput, achieved occupancy, shared-memory bank conflicts,
global sectors per request (a coalesced warp access touches its bytes / 32
sectors: 4 for one fp32 per thread, 16 for Triton's usual 16-byte vectors;
each thread in its own sector gives 32), and warp stall
reasons (average stall cycles per warp for each reason, as shares).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from opforge.profile.resources import ProfileError


class NcuError(ProfileError):
    """ncu is missing, cannot read the GPU's counters, or failed."""


DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
ACHIEVED_OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCC = "sm__maximum_warps_per_active_cycle_pct"
BANK_LD = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
BANK_ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
SECTORS_LD = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
REQUESTS_LD = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
SECTORS_ST = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
REQUESTS_ST = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
REGISTERS = "launch__registers_per_thread"

STALL_PREFIX = "smsp__average_warp_latency_issue_stalled_"
STALL_SUFFIX = ".ratio"
# Hopper's warp stall reasons (Nsight Compute's metric reference); ncu does
# not expand wildcards in --metrics, so each is named.
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")

METRICS = (DRAM_PCT, ACHIEVED_OCC, THEORETICAL_OCC, BANK_LD, BANK_ST, SECTORS_LD, REQUESTS_LD, SECTORS_ST,
           REQUESTS_ST, DURATION, DRAM_READ, DRAM_WRITE, REGISTERS) + tuple(
    STALL_PREFIX + r + STALL_SUFFIX for r in STALL_REASONS)

_COMMON_PATHS = ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                 "/usr/local/NVIDIA-Nsight-Compute*/ncu", "/usr/bin/ncu")


def find_ncu() -> str:
    """The ncu executable: ``$OPFORGE_NCU``, then PATH, then the usual CUDA
    install folders; ``NcuError`` saying where it looked when none is found."""
    env = os.environ.get("OPFORGE_NCU")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise NcuError(f"OPFORGE_NCU={env} is not an executable file")
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in _COMMON_PATHS:
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    raise NcuError("Nsight Compute (ncu) was not found on PATH nor in " + ", ".join(_COMMON_PATHS)
                   + "; install Nsight Compute or set OPFORGE_NCU to the ncu executable")


def kernel_regex(names) -> str:
    """``regex:^(a|b)$`` for kernel function names (``module:function`` or bare)."""
    bare = sorted({n.rsplit(":", 1)[-1].rsplit(".", 1)[-1] for n in names})
    if not bare:
        raise ValueError("no kernel names to profile")
    return "regex:^(" + "|".join(re.escape(n) for n in bare) + ")$"


def command(ncu: str, job: dict, kernels, *, launch_skip: int, launch_count: int = 1,
            metrics=METRICS, python: str | None = None) -> list[str]:
    """The full ncu command line that profiles ``job`` (see ``_ncu_target``)."""
    if launch_skip < 0 or launch_count < 1:
        raise ValueError(f"launch_skip must be >= 0 and launch_count >= 1, got {launch_skip}, {launch_count}")
    return [ncu, "--clock-control", "none", "--target-processes", "all",
            "--kernel-name", kernel_regex(kernels), "--launch-skip", str(launch_skip),
            "--launch-count", str(launch_count), "--metrics", ",".join(metrics),
            "--csv", "--page", "raw", "--print-units", "base",
            python or sys.executable, "-m", "opforge.profile._ncu_target", json.dumps(job)]


# ---------------------------------------------------------------------------
# the CSV
# ---------------------------------------------------------------------------
# to base units (ns, bytes), should ncu print scaled ones despite --print-units base
_UNIT_SCALE = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
               "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}


def _number(text: str, unit: str = "") -> float | None:
    t = text.strip().replace(",", "")
    if t.lower() in ("", "n/a", "-"):
        return None
    try:
        v = float(t)
    except ValueError:
        return None
    return v * _UNIT_SCALE.get(unit.strip().lower(), 1.0)


@dataclass
class KernelMetrics:
    kernel: str
    raw: dict[str, float] = field(default_factory=dict)  # metric -> value (base units: ns, bytes)
    units: dict[str, str] = field(default_factory=dict)
    block: str = ""
    grid: str = ""


def parse_csv(text: str) -> list[KernelMetrics]:
    """Rows of ``ncu --csv --page raw`` output (ncu's log lines skipped).

    Also reads the long form of ``--page details`` (``Kernel Name``,
    ``Metric Name``, ``Metric Unit``, ``Metric Value``), one row per metric.
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r and ("ID" in r or "Metric Name" in r)), None)
    if start is None:
        raise NcuError("no ncu CSV table in the output (was any kernel profiled?):\n" + text[-1500:])
    header = rows[start]
    k = header.index("Kernel Name")
    if "Metric Name" in header:  # long form
        m, v = header.index("Metric Name"), header.index("Metric Value")
        u = header.index("Metric Unit") if "Metric Unit" in header else None
        ident = header.index("ID") if "ID" in header else None
        out: dict[tuple, KernelMetrics] = {}
        for r in rows[start + 1:]:
            if len(r) <= max(k, m, v):
                continue
            key = (r[ident] if ident is not None else "", r[k])
            km = out.setdefault(key, KernelMetrics(r[k]))
            unit = r[u] if u is not None else ""
            val = _number(r[v], unit)
            if val is not None:
                km.raw.setdefault(r[m], val)
                km.units[r[m]] = unit
        return list(out.values())
    body = rows[start + 1:]
    units = [""] * len(header)
    if body and (not body[0] or body[0][header.index("ID")].strip() == ""):
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    first_metric = next((i for i, h in enumerate(header) if "__" in h), len(header))
    out_rows = []
    for r in body:
        if len(r) <= k:
            continue
        km = KernelMetrics(r[k], block=_col(header, r, "Block Size"), grid=_col(header, r, "Grid Size"))
        for i in range(first_metric, min(len(header), len(r))):
            val = _number(r[i], units[i])
            if val is not None:
                km.raw[header[i]] = val
                km.units[header[i]] = units[i]
        out_rows.append(km)
    return out_rows


def _col(header, row, name) -> str:
    return row[header.index(name)] if name in header and header.index(name) < len(row) else ""


def _ratio(a, b):
    return a / b if a is not None and b else None


def fold(km: KernelMetrics) -> dict:
    """The report's key figures of one profiled kernel."""
    raw = km.raw
    stalls = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: v for name, v in raw.items()
              if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX) and v is not None}
    total = sum(v for v in stalls.values() if v > 0)
    shares = {r: v / total for r, v in sorted(stalls.items(), key=lambda kv: -kv[1]) if total and v > 0}
    dur = raw.get(DURATION)
    moved = (raw.get(DRAM_READ) or 0) + (raw.get(DRAM_WRITE) or 0)
    return {
        "kernel": km.kernel,
        "block": km.block,
        "grid": km.grid,
        "duration_ns": dur,
        "dram_throughput_pct": raw.get(DRAM_PCT),
        "dram_bytes": moved if (DRAM_READ in raw or DRAM_WRITE in raw) else None,
        "dram_tbps": moved / dur / 1e3 if dur and moved else None,  # bytes/ns = GB/s; /1e3 -> TB/s
        "achieved_occupancy_pct": raw.get(ACHIEVED_OCC),
        "theoretical_occupancy_pct": raw.get(THEORETICAL_OCC),
        "registers_per_thread": raw.get(REGISTERS),
        "shared_bank_conflicts_ld": raw.get(BANK_LD),
        "shared_bank_conflicts_st": raw.get(BANK_ST),
        "global_ld_sectors_per_request": _ratio(raw.get(SECTORS_LD), raw.get(REQUESTS_LD)),
        "global_st_sectors_per_request": _ratio(raw.get(SECTORS_ST), raw.get(REQUESTS_ST)),
        "stall_cycles": stalls,
        "stall_shares": shares,
        "top_stalls": list(shares)[:3],
    }


# ---------------------------------------------------------------------------
# running it
# ---------------------------------------------------------------------------
_PERMISSION = ("ERR_NVGPUCTRPERM", "permission to access NVIDIA GPU Performance Counters")
_MISSING_METRIC = re.compile(r"Failed to find metric\s+(?:regex:)?\^?['\"]?([\w.]+)")


def explain_failure(output: str, returncode: int) -> str:
    """A person's sentence for what went wrong in an ncu run."""
    if any(p in output for p in _PERMISSION):
        return ("ncu cannot read the GPU's performance counters on this machine (ERR_NVGPUCTRPERM): the "
                "driver restricts them to admin users; run as root or with the NVreg_RestrictProfilingToAdminUsers=0 "
                "driver option. Everything else in the report stands without the ncu figures.")
    if "No kernels were profiled" in output:
        return ("ncu profiled no kernel: the kernel-name filter or launch-skip did not match any launch "
                "(see the command above)")
    tail = "\n".join(ln for ln in output.splitlines() if "==ERROR==" in ln or "rror" in ln)[-1500:]
    return f"ncu failed with exit code {returncode}:\n{tail or output[-1500:]}"


def missing_metrics(output: str) -> set[str]:
    return set(_MISSING_METRIC.findall(output))


def run_job(job: dict, kernels, *, launches_per_call: int = 1, warmup: int = 3, timeout: float = 300,
            metrics=METRICS, ncu: str | None = None, raw: bool = False) -> list[dict]:
    """Profile the last call of ``job`` under ncu; one folded dict per kernel launch
    (``raw=True``: the metrics as ncu printed them, plus ``kernel``).

    Metrics the installed ncu does not know are dropped and the run retried
    (twice at most; an unknown stall reason drops the stall family).
    """
    exe = ncu or find_ncu()
    job = dict(job, warmup=warmup)
    env = dict(os.environ, OPFORGE_AUTOTUNE="off", OPFORGE_INTERPRET="0", TRITON_INTERPRET="0")
    metrics = tuple(metrics)
    for attempt in range(3):
        cmd = command(exe, job, kernels, launch_skip=warmup * launches_per_call, launch_count=launches_per_call,
                      metrics=metrics)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            raise NcuError(f"ncu did not finish in {timeout:.0f} s: {' '.join(cmd[:12])} ...") from e
        output = r.stdout + "\n" + r.stderr
        gone = missing_metrics(output) & set(metrics)
        if gone and attempt < 2:
            if any(g.startswith(STALL_PREFIX) for g in gone):  # one unknown stall reason: drop the family
                gone |= {m for m in metrics if m.startswith(STALL_PREFIX)}
            metrics = tuple(m for m in metrics if m not in gone)
            continue
        if r.returncode != 0 or "==ERROR==" in output and "Kernel Name" not in r.stdout:
            raise NcuError(explain_failure(output, r.returncode))
        try:
            rows = parse_csv(r.stdout)
        except NcuError:
            raise NcuError(explain_failure(output, r.returncode)) from None
        return [dict(km.raw, kernel=km.kernel) if raw else fold(km) for km in rows]
    raise NcuError("ncu rejected the metric list three times: " + explain_failure(output, r.returncode))
