"""``opforge tune``: tune shapes offline, and share results as JSON lines.

Tuning offline means a user's first call finds its config in the cache (or in
the tuned table shipped for the H200) instead of benchmarking mid-job.
"""

from __future__ import annotations

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opforge.bench import elementwise as elementwise_bench
from opforge.runtime import autotune, dispatch, registry
from opforge.runtime import device as devmod
from opforge.runtime.cache import autotune_cache

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64, "float64": torch.float64}
PRESETS = {"elementwise": elementwise_bench.tune_shapes}


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


def tune_shapes(jobs, *, exhaustive: bool = True, console: Console | None = None) -> list:
    """Tune each (op, shape, other, dtype) job; returns the stored entries.

    Each config is timed for about 30 ms (median of CUDA-event repeats), which
    separates configs that differ by more than a few percent."""
    console = console or Console()
    device = devmod.default_device()
    cache = autotune_cache()
    stored = []
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("tuning", total=len(jobs))
        for name, shape, other, dtype in jobs:
            op = registry.get(name)
            args = _args(shape, other, dtype, device)
            progress.update(task, description=f"{name} {'x'.join(map(str, shape))} {str(dtype)[6:]}")
            supported = [v for v in op.variants
                         if v.kind != "reference" and dispatch.reject_reason(op, v, args) is None]
            for v in supported if exhaustive else supported[:1]:
                entry = autotune.tune(op, v, args, cache, quick=True)
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
    if args.import_path:
        n = cache.import_jsonl(args.import_path)
        console.print(f"imported {n} entries from {args.import_path} into {cache.path}")
    jobs = []
    if args.preset:
        jobs += PRESETS[args.preset](args.quick)
    if args.op:
        dtype = DTYPES[args.dtype]
        for text in args.shape:
            shape = parse_shape(text)
            other = {"none": None, "scalar": "scalar", "same": shape}.get(args.other)
            jobs.append((args.op, shape, other if args.other in ("none", "scalar", "same")
                         else parse_shape(args.other), dtype))
    if jobs:
        entries = tune_shapes(jobs, exhaustive=args.mode == "exhaustive", console=console)
        console.print(f"tuned {len(jobs)} shapes: {len(entries)} entries stored in {cache.path}")
    if args.export_path:
        n = cache.export_jsonl(args.export_path)
        console.print(f"exported {n} entries to {args.export_path}")
    return 0
