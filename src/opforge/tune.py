"""``opforge tune``: tune shapes offline, and share results as JSON lines.

Tuning offline means a user's first call finds its config in the cache (or in
the tuned table shipped for the H200): by default (``OPFORGE_AUTOTUNE=cached``)
nothing benchmarks mid-job, and a shape with no entry runs the nearest tuned
bucket's config. ``--preset sql`` / ``--preset stream`` run the engines' own
workloads so the buckets they launch are tuned too (:mod:`opforge.tune_engines`).
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.bench import elementwise as elementwise_bench
from opforge.bench import families as bench_families
from opforge.runtime import autotune, dispatch, jit, registry
from opforge.runtime import device as devmod
from opforge.runtime.cache import autotune_cache

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64, "float64": torch.float64}


class Job(NamedTuple):
    """One op on one input: ``make(device)`` returns the registry op's arguments."""

    op: str
    label: str
    make: Callable[[torch.device], tuple]


def elementwise_jobs(quick: bool, families=None) -> list[Job]:
    return [Job(name, f"{'x'.join(map(str, shape))} {str(dtype)[6:]}",
                lambda dev, shape=shape, other=other, dtype=dtype: _args(shape, other, dtype, dev))
            for name, shape, other, dtype in elementwise_bench.tune_shapes(quick)]


def bench_jobs(quick: bool, families=None) -> list[Job]:
    """Every shape of the bench grid (cases and crossover sweeps) of ``families``
    (default: all), once per op, shape and dtype."""
    dev = devmod.default_device()
    jobs, seen = [], set()
    for fam in families or bench_families.names():
        cases = bench_families.family_cases(fam, "entries", dev, quick) + bench_families.family_cases(fam, "crossover", dev, quick)
        for case in cases:
            key = (case.op, case.label, case.dtype)
            if key in seen:
                continue
            seen.add(key)

            def make(device, case=case):
                args = case.make_args(device)
                return case.op_args(*args) if case.op_args is not None else args

            jobs.append(Job(case.op, f"{case.label} {str(case.dtype)[6:]}", make))
    return jobs


PRESETS = {"elementwise": elementwise_jobs, "bench": bench_jobs}
ENGINE_PRESETS = ("sql", "stream")


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r} is not like 4096x1024") from None


def _args(shape, other, dtype, device):
    a = torch.randn(shape, device=device).to(dtype)
    if other is None:
        return (a, None)
    if other == "scalar":
        return (a, 1.5)
    return (a, torch.randn(other, device=device).to(dtype))


def tune_jobs(jobs: list[Job], *, exhaustive: bool = True, budget_s: float | None = None,
              show: bool = False, console: Console | None = None) -> list:
    """Tune each job's supported variants; returns the stored entries.

    A job's candidate configs are compiled first, in parallel threads (most of
    a compile runs outside the GIL), then each config is timed for about 30 ms
    (median of CUDA-event repeats), which separates configs that differ by
    more than a few percent. ``budget_s`` stops before a job that would start
    past it (the rest are reported as skipped). ``show`` prints every config's time."""
    console = console or Console()
    device = devmod.default_device()
    cache = autotune_cache()
    stored = []
    start = time.monotonic()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("tuning", total=len(jobs))
        for i, job in enumerate(jobs):
            if budget_s is not None and time.monotonic() - start > budget_s:
                console.print(f"[yellow]time budget of {budget_s:.0f} s spent: {len(jobs) - i} jobs not tuned[/yellow]")
                break
            op = registry.get(job.op)
            args = job.make(device)
            progress.update(task, description=f"{job.op} {job.label}")
            supported = [v for v in op.variants
                         if v.kind != "reference" and dispatch.reject_reason(op, v, args) is None]
            chosen = supported if exhaustive else supported[:1]
            if device.type == "cuda" and any(v.kind == "triton" for v in chosen):
                jit.warmup(job.op, *args, all_configs=True)
            for v in chosen:
                report = None
                if show:
                    def report(cfg, ms, v=v):
                        shown = "failed" if ms is None else f"{ms * 1e3:9.1f} µs"
                        progress.console.print(f"  {job.op} {job.label} {v.name} {cfg}: {shown}")
                entry = autotune.tune(op, v, args, cache, quick=True, on_config=report)
                if entry is not None:
                    stored.append(entry)
            progress.advance(task)
    dispatch.reset()
    return stored


def run(args, console: Console | None = None) -> int:
    console = console or Console()
    cache = autotune_cache()
    if args.clear:
        cache.clear()
        console.print(f"cleared {cache.path}")
    refused: list[str] = []
    if args.import_path:
        n = cache.import_jsonl(args.import_path, check=autotune.import_check, refused=refused)
        for why in refused:
            console.print(f"refused {args.import_path}:{why}", style="red", markup=False, highlight=False)
        console.print(f"imported {n} entries from {args.import_path} into {cache.path}"
                      + (f"; {len(refused)} refused (lines above)" if refused else ""), markup=False)
    jobs = []
    if args.preset in ENGINE_PRESETS:
        _tune_engine(args, console)
    elif args.preset:
        jobs += PRESETS[args.preset](args.quick, args.family)
    if args.op:
        dtype = DTYPES[args.dtype]
        for text in args.shape:
            shape = parse_shape(text)
            other = parse_shape(args.other) if args.other not in ("none", "scalar", "same") else \
                {"none": None, "scalar": "scalar", "same": shape}[args.other]
            jobs.append(Job(args.op, f"{text} {args.dtype}",
                            lambda dev, shape=shape, other=other: _args(shape, other, dtype, dev)))
    if jobs:
        entries = tune_jobs(jobs, exhaustive=(args.mode or "exhaustive") == "exhaustive", budget_s=args.budget,
                            show=args.show, console=console)
        console.print(f"tuned {len(jobs)} shapes: {len(entries)} entries stored in {cache.path}")
    if args.export_path:
        n = cache.export_jsonl(args.export_path)
        console.print(f"exported {n} entries to {args.export_path}")
    return 1 if refused else 0


def _tune_engine(args, console: Console) -> None:
    """``--preset sql`` / ``--preset stream``: run the engine's workload in mode ``on`` (or ``--mode``)."""
    from opforge import tune_engines

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = [q.strip() for q in args.queries.split(",") if q.strip()] if args.queries else None
    if args.preset == "sql":
        numbers = [int(q.lower().lstrip("q")) for q in names] if names else None
        steps = tune_engines.sql_steps(args.sf, device, numbers, console=console)
    else:
        steps = tune_engines.stream_steps(args.events, args.batch_size, device, names)
    outcome = tune_engines.tune_workload(steps, args.mode or "on", console)
    tune_engines.report(outcome, args.preset, console)
