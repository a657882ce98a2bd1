"""``opforge warmup``: compile the manifests into Triton's cache, or record them (``--record``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

RECORD_HINT = "opforge warmup --record {engine}"


def add_arguments(p) -> None:
    p.add_argument("--engine", default="all", choices=["sql", "stream", "ops", "all"],
                   help="whose kernels to compile (default: all)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile workers (default: the CPU count)")
    p.add_argument("--pool", default="process", choices=["process", "thread"], help="worker kind (default: process)")
    p.add_argument("--arch", type=int, default=None,
                   help="compile for sm_ARCH without a GPU (checks the manifests, measures compile time)")
    p.add_argument("--json", dest="json_path", help="write the compile times and failures as JSON here")
    p.add_argument("--record", choices=["sql", "stream", "ops", "all"],
                   help="run the engine's workload and merge the kernels it launches into its manifest")
    p.add_argument("--scale", type=float, action="append",
                   help="with --record sql: TPC-H scale factor (repeatable; default: SF1 on a GPU, SF0.001 "
                        "on the CPU)")
    p.add_argument("--events", type=int, help="with --record stream: Nexmark events (default: 1M on a GPU, 10k on the CPU)")
    p.add_argument("--batch-size", type=int, help="with --record stream: events per micro-batch")
    p.add_argument("--fresh", action="store_true", help="with --record: replace the manifest instead of merging")
    p.add_argument("--manifests", type=Path, default=None, help="manifest folder (default: the package's)")


def run(args, console: Console) -> int:
    if args.record:
        return record(args, console)
    return warm(args, console)


# ---------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------
def warm(args, console: Console) -> int:
    import torch

    if args.arch is None and not torch.cuda.is_available():
        raise RuntimeError("opforge warmup compiles kernels for this machine's GPU, and there is no CUDA GPU "
                           "here (torch.cuda.is_available() is False); --arch 90 compiles for sm_90 without "
                           "one, --record records manifests")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opforge.runtime import triton_key
    from opforge.warmup import manifest
    from opforge.warmup.compile import compile_all
    from opforge.warmup.launchers import LauncherBuilder

    engines = manifest.ENGINES if args.engine == "all" else (args.engine,)
    specs, sources = {}, {}
    for engine in engines:
        m = manifest.load(engine, args.manifests)
        specs.update(m.entries)
        sources.update(m.sources)
    jobs = args.jobs or os.cpu_count() or 1
    triton_key.ensure()  # hashed at most once here, then read by every worker and later process
    todo = [specs[k] for k in sorted(specs)]
    failed = []
    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    t0 = time.perf_counter()
    launchers = LauncherBuilder(jobs)
    with Progress(*columns, console=console, transient=not console.is_terminal) as progress:
        task = progress.add_task("", total=len(todo))

        def done(r):
            progress.update(task, advance=1, description=r.kernel.rpartition(":")[2])
            if r.error:
                failed.append(r)
            launchers.add(r.launcher)

        results = compile_all(todo, sources, jobs=jobs, arch=args.arch, pool=args.pool, on_done=done)
        progress.update(task, description="launchers")
        built = launchers.finish()
    wall = time.perf_counter() - t0
    from triton import knobs

    target = f"sm_{args.arch}" if args.arch else torch.cuda.get_device_name()
    console.print(f"opforge warmup: {len(results) - len(failed)}/{len(results)} kernel specializations "
                  f"({', '.join(engines)}) compiled for {target} in {wall:.1f} s with {jobs} {args.pool} "
                  f"worker(s) into {knobs.cache.dir}", markup=False, highlight=False)
    if built.skipped:
        console.print(f"launchers: {built.distinct} distinct, not built: {built.skipped}", markup=False,
                      highlight=False)
    else:
        console.print(f"launchers: {built.distinct} distinct, {built.built} built, {built.cached} already "
                      f"cached ({built.seconds:.1f} s)", markup=False, highlight=False)
    for r in failed:
        console.print(f"  failed {r.kernel}: {r.error}", markup=False, highlight=False)
    for e in built.errors:
        console.print(f"  launcher failed: {e}", markup=False, highlight=False)
    if args.json_path:
        doc = {"engines": list(engines), "target": target, "jobs": jobs, "pool": args.pool, "wall_s": wall,
               "compiled": len(results) - len(failed), "failed": len(failed),
               "launchers": {"distinct": built.distinct, "built": built.built, "cached": built.cached,
                             "seconds": built.seconds, "skipped": built.skipped, "errors": built.errors},
               "entries": [{"kernel": r.kernel, "seconds": r.seconds, "error": r.error}
                           for r in sorted(results, key=lambda r: -r.seconds)]}
        Path(args.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


# ---------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------
def _as_tests_run() -> str:
    """Without a GPU, record as the tests run (tests/conftest.py), so that the
    coverage test sees the same launches: kernels under the Triton interpreter,
    no tuning, an empty autotune cache. The kernels must be decorated after
    this, so no kernel module may be loaded yet."""
    loaded = [m for m in sys.modules if m.startswith("opforge.kernels.")]
    if loaded and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("opforge warmup --record on the CPU runs kernels under the Triton interpreter; "
                           f"set OPFORGE_INTERPRET=1 TRITON_INTERPRET=1 ({loaded[0]} is already loaded)")
    cache = tempfile.mkdtemp(prefix="opforge-record-")
    os.environ.update(OPFORGE_INTERPRET="1", TRITON_INTERPRET="1", OPFORGE_AUTOTUNE="off", OPFORGE_CACHE_DIR=cache)
    return cache


def record_engine(engine: str, device: str, *, scales=None, events=None, batch_size=None, on_step=None):
    """Run ``engine``'s workload under a recorder; returns (recorder, recipes)."""
    from opforge.warmup import workloads
    from opforge.warmup.launches import LaunchRecorder

    gpu = device.startswith("cuda")
    with LaunchRecorder() as rec:
        if engine == "sql":
            recipes = workloads.sql(device, scales or (workloads.GPU_SQL_SCALES if gpu else workloads.CI_SQL_SCALES),
                                    on_step=on_step)
        elif engine == "stream":
            recipes = workloads.stream(
                device, events or (workloads.GPU_STREAM_EVENTS if gpu else workloads.CI_STREAM_EVENTS),
                batch_size or (workloads.GPU_STREAM_BATCH if gpu else workloads.CI_STREAM_BATCH), on_step=on_step)
        else:
            recipes = workloads.ops(device, on_step=on_step)
    return rec, recipes


def record(args, console: Console) -> int:
    import torch

    if torch.cuda.is_available():
        return _record(args, console)
    cache = _as_tests_run()
    try:
        return _record(args, console)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _record(args, console: Console) -> int:
    import torch

    from opforge.runtime import device as devmod
    from opforge.warmup import manifest

    dev = devmod.default_device()
    device = str(dev)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)"
    engines = manifest.ENGINES if args.record == "all" else (args.record,)
    for engine in engines:
        t0 = time.perf_counter()
        with console.status(f"recording {engine} on {where}") as status:
            rec, recipes = record_engine(engine, device, scales=args.scale, events=args.events,
                                         batch_size=args.batch_size,
                                         on_step=lambda s: status.update(f"recording {engine} on {where}: {s}"))
        m = manifest.Manifest(engine) if args.fresh else manifest.load(engine, args.manifests)
        new = 0
        for recipe in recipes:
            new += m.add(rec.specializations.values(), rec.sources, f"{recipe} on {where}")
        path = m.save(args.manifests)
        console.print(f"{engine}: {rec.launches} launches, {len(rec.specializations)} specializations "
                      f"({new} new) in {time.perf_counter() - t0:.0f} s -> {path} ({len(m.entries)} entries)",
                      markup=False, highlight=False)
        for f in rec.failures:
            console.print(f"  not recorded: {f}", markup=False, highlight=False)
        if rec.failures:
            return 1
    return 0
