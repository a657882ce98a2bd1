"""``opforge bench``: measure every family's grid against the roofline and peers.

One run measures the ceilings, checks and times each case and its peers one
after the other on the same inputs, and writes the bench JSON (format in
DESIGN.md), a rich table and a roofline PNG.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from opforge.bench import families as families_registry
from opforge.bench import overhead, prewarm
from opforge.bench.case import run_case
from opforge.runtime import device as devmod
from opforge.runtime import roofline

SCHEMA_VERSION = 1


def run(*, quick: bool = False, families: list[str] | None = None, crossover: bool = True,
        host: bool = True, refresh_ceilings: bool = False, console: Console | None = None,
        checkpoint: str | None = None, prewarm_workers: int = 0, cases: list[str] | None = None) -> dict:
    """Bench the families; with ``checkpoint``, the JSON so far is rewritten there
    after every case, so a run cut short by a time limit keeps what it measured.
    With ``prewarm_workers``, worker processes compile every case first (see
    :mod:`opforge.bench.prewarm`). ``cases``: only the cases whose ``"op label
    dtype"`` (e.g. ``"amax 8x64x131072 dim=(0,2) bfloat16"``) contains one of
    these strings."""
    console = console or Console()
    dev = devmod.default_device()
    info = devmod.device_info(dev)
    vers = devmod.versions()
    if dev.type != "cuda":
        console.print("[yellow]No CUDA device: these are CPU figures (reference or Triton interpreter), "
                      "not GPU performance.[/yellow]")
    with console.status("measuring ceilings (device copy, bf16 matmul)"):
        ceil = roofline.ceilings(dev, quick=quick, refresh=refresh_ceilings)
    result = {
        "schema_version": SCHEMA_VERSION,
        "date": time.strftime("%Y-%m-%d"),
        "gpu": info.name,
        "sm_count": info.sm_count,
        "capability": info.arch,
        "driver": vers["driver"],
        "torch": vers["torch"],
        "triton": vers["triton"],
        "opforge": vers["opforge"],
        "quick": quick,
        "cpu_figures": dev.type != "cuda",
        "ceilings": {"copy_tbps": ceil.copy_tbps, "bf16_tflops": ceil.bf16_tflops, "method": ceil.method},
        "entries": [],
        "crossover": [],
    }
    selected = families or list(families_registry.names())
    jobs = [(fam, i, c, "entries") for fam in selected
            for i, c in enumerate(families_registry.family_cases(fam, "entries", dev, quick))]
    if crossover and (dev.type == "cuda" or devmod.interpret_mode()):
        jobs += [(fam, i, c, "crossover") for fam in selected
                 for i, c in enumerate(families_registry.family_cases(fam, "crossover", dev, quick))]
    if cases:
        jobs = [j for j in jobs if any(want in case_name(j[2]) for want in cases)]
    with Progress(console=console, transient=True) as progress:
        if prewarm_workers > 0 and jobs:
            warm = progress.add_task(f"compiling in {prewarm_workers} worker processes", total=len(jobs))
            t0 = time.perf_counter()
            prewarm.prewarm([(fam, where, i) for fam, i, _, where in jobs], prewarm_workers, quick=quick,
                            progress=progress, task=warm)
            result["prewarm_s"] = time.perf_counter() - t0
        task = progress.add_task("bench", total=len(jobs))
        for fam, _, case, where in jobs:
            progress.update(task, description=f"{case.op} {case.label} {case.variant or ''}")
            try:
                entry = run_case(case, dev, ceil, quick=quick)
            except torch.cuda.OutOfMemoryError as e:
                entry = {"op": f"opforge::{case.op}", "shape": case.label, "error": f"out of memory: {e}"[:200]}
            except Exception as e:  # one broken case is reported, the rest still run
                entry = {"op": f"opforge::{case.op}", "shape": case.label, "error": f"{type(e).__name__}: {e}"[:300]}
            result[where].append(entry)
            if checkpoint:
                write_json(result, checkpoint)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            progress.advance(task)
    if not refresh_ceilings:
        ceil = _recheck_ceilings(result, dev, ceil, quick, console)
    if host:
        with console.status("dispatch overhead and first-call latency"):
            result["dispatch_overhead"] = overhead.dispatch_overhead(dev)
            result["first_call"] = overhead.first_call_latency(dev)
    result["crossover_summary"] = crossover_summary(result["crossover"])
    return result


def _recheck_ceilings(result: dict, dev: torch.device, ceil, quick: bool, console: Console):
    """An op above 100 % of a cached ceiling means the ceiling is wrong (measured
    badly once, or on other software): measure it again and recompute every
    entry's place under the roof. A figure still above 100 % is kept as it is
    and named in ``ceilings.warning`` (small CPU cases can run from cache, above
    the DRAM copy rate)."""
    rows = [e for e in result["entries"] + result["crossover"] if "median_ms" in e]
    if not any(e["pct_roofline"] > 100 for e in rows):
        return ceil
    with console.status("an op is above 100 % of the cached ceilings: measuring them again"):
        ceil = roofline.ceilings(dev, quick=quick, refresh=True)
    result["ceilings"] = {"copy_tbps": ceil.copy_tbps, "bf16_tflops": ceil.bf16_tflops, "method": ceil.method,
                          "remeasured": True}
    for e in rows:
        e["pct_roofline"] = 100.0 * ceil.floor_ms(e["flops"], e["bytes"]) / e["median_ms"]
        if e["bytes"]:
            e["attainable_tflops"] = ceil.attainable_tflops(e["flops"] / e["bytes"])
    over = [e for e in rows if e["pct_roofline"] > 100]
    if over:
        worst = max(over, key=lambda e: e["pct_roofline"])
        result["ceilings"]["warning"] = (
            f"{len(over)} figure(s) above 100 % of the ceilings measured again (worst: {worst['op']} "
            f"{worst['shape']} at {worst['pct_roofline']:.0f} %): on a CPU small cases run from cache, above "
            f"the DRAM copy rate; on a GPU, rerun with --refresh-ceilings on an idle device")
        console.print(f"[yellow]{result['ceilings']['warning']}[/yellow]")
    return ceil


def find_case(text: str, device: torch.device, quick: bool = False):
    """The one bench case (any family) whose ``case_name`` contains ``text``."""
    found = [c for fam in families_registry.names() for c in families_registry.family_cases(fam, "entries", device, quick)
             if text in case_name(c)]
    exact = [c for c in found if case_name(c) == text]
    if len(exact) == 1 or len(found) == 1:
        return (exact or found)[0]
    names = sorted({case_name(c) for c in found})
    raise ValueError(f"{len(found)} bench cases match {text!r}" + (f": {', '.join(names[:12])}" if names else
                     " (the case names are 'op label dtype', see `opforge bench`)"))


def case_name(case) -> str:
    """What ``--case`` matches: op, label and dtype, e.g. ``"softmax 2048x65536 bfloat16"``."""
    return f"{case.op} {case.label} {str(case.dtype).replace('torch.', '')}"


def crossover_summary(entries: list[dict]) -> list[dict]:
    """The fastest variant at each size, per op and layout: where dispatch should switch."""
    best: dict[tuple[str, str, str], dict] = {}
    for e in entries:
        if "median_ms" not in e:
            continue
        layout = f"{e['op'].split('::')[1]} {e['dtype']}, {'transposed' if 'ᵀ' in e['shape'] else 'contiguous'}"
        k = (layout, e["shape"])
        if k not in best or e["median_ms"] < best[k]["median_ms"]:
            best[k] = {"layout": layout, "shape": e["shape"], "bytes": e["bytes"], "fastest": e["variant"],
                       "median_ms": e["median_ms"]}
    rows = sorted(best.values(), key=lambda r: (r["layout"], r["bytes"]))
    for r in rows:
        r["all_ms"] = {e["variant"]: e["median_ms"] for e in entries
                       if e.get("shape") == r["shape"] and "median_ms" in e
                       and r["layout"].startswith(e["op"].split("::")[1] + " ")}
    return rows


def table(result: dict) -> Table:
    t = Table(title=f"opforge bench — {result['gpu']} ({'CPU figures' if result['cpu_figures'] else 'GPU'}), "
                    f"roof {result['ceilings']['copy_tbps']:.3g} TB/s · {result['ceilings']['bf16_tflops']:.3g} "
                    f"TFLOP/s")
    for col in ("op", "variant", "dtype", "shape", "µs", "TB/s", "% roof", "rel err", "vs eager", "vs compile"):
        t.add_column(col, justify="right" if col not in ("op", "variant", "shape") else "left")
    for e in result["entries"]:
        if "error" in e:
            t.add_row(e["op"], "-", "-", e["shape"], "error", "", "", "", "", "")
            continue
        peers = e["peers"]

        def ratio(name):
            p = peers.get(name)
            return f"{p['ratio']:.2f}×" if p and p.get("ratio") else "-"

        ok = "" if e["correct"] else " [red]FAIL[/red]"
        t.add_row(e["op"].split("::")[1], e["variant"], e["dtype"], e["shape"] + (" (graph)" if e["graph_timed"] else ""),
                  f"{e['median_ms'] * 1e3:.1f}", f"{e['tbps']:.3g}", f"{e['pct_roofline']:.0f}",
                  f"{e['max_rel_err']:.1e}{ok}", ratio("torch eager"), ratio("torch.compile"))
    return t


def report(result: dict, console: Console) -> None:
    console.print(table(result))
    if result.get("crossover_summary"):
        ct = Table(title="crossover: fastest variant by size (µs per call, host overhead included)")
        for col in ("layout", "shape", "fastest", "times µs"):
            ct.add_column(col)
        for r in result["crossover_summary"]:
            ct.add_row(r["layout"], r["shape"], r["fastest"],
                       "  ".join(f"{k}={v * 1e3:.1f}" for k, v in sorted(r["all_ms"].items())))
        console.print(ct)
    d = result.get("dispatch_overhead")
    if d:
        console.print(f"dispatch overhead: {d['dispatch_overhead_us']:.2f} µs per call on top of "
                      f"{d['variant']} ({d['variant_direct_us']:.2f} µs direct; opforge call "
                      f"{d['opforge_call_us']:.2f} µs; torch.add {d['torch_eager_call_us']:.2f} µs); target < 10 µs")
    f = result.get("first_call")
    if f and "error" not in f:
        jit_part = (f"; gelu triton_flat (JIT compile) {f['triton_first_call_s'] * 1e3:.0f} ms then "
                    f"{f['triton_second_call_s'] * 1e3:.2f} ms" if f["triton_first_call_s"] == f["triton_first_call_s"]
                    else "")
        console.print(f"first call (fresh caches): import {f['import_s']:.2f} s; gelu ({f['first_call_variant']}) "
                      f"{f['first_call_s'] * 1e3:.0f} ms then {f['second_call_s'] * 1e3:.2f} ms{jit_part}; "
                      f"warm-up of {f['warmup_configs']} configs {f['warmup_wall_s']:.2f} s wall")
    elif f:
        console.print(f"[red]first-call measurement failed[/red]: {f['error'][-500:]}")


def write_json(result: dict, path: Path | str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1, default=str) + "\n")
