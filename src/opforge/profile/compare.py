"""Profile any Triton kernels side by side: the Python API for user kernels,
and the runner of the examples' ladders (transpose, reduction).

A step is built by a factory named ``"module:function"`` (importable in a
child process, as compiling and ncu need): ``factory(device=..., **kwargs)``
returns a ``Built``: ``run()`` launches the step's kernels once, ``launches``
lists each launch as ``(jit function, args, kwargs)`` for the compiled
resources, ``output()`` is the result after a run and ``expected`` its
float64 reference, ``nbytes``/``flops`` the work counted as the bench counts
it (each input read once, each output written once); a step whose kernel
declares its memory accesses (``accesses``: ``opforge.layout.analyze.Access``
per instruction of one program) gets the analyzer's prediction in its row.

``compare`` checks every step against its reference (on the CPU under the
Triton interpreter, small), compiles every launch for sm_90 in one child
(registers, spills, shared memory, occupancy), and on CUDA times each step
(bench timing: CUDA events, L2 flushed) and, with ``ncu=True``, runs Nsight
Compute on the step's kernels; the result is a ``kind: "ladder"`` report.
``run_ladder``, ``ladder_main`` and ``main_as_module`` are the examples'
report writer, command line and script entry, shared by every ladder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Built:
    run: Callable[[], Any]
    launches: list  # [(jit fn, args tuple, kwargs dict), ...] of one run
    output: Callable[[], Any]
    expected: Any  # torch.Tensor, float64
    nbytes: float
    flops: float = 0.0
    tolerance: float = 1e-5
    accesses: list | None = None  # opforge.layout.analyze.Access per memory instruction, when declared


@dataclass
class Step:
    name: str
    description: str
    factory: str  # "module:function" returning a Built
    kwargs: dict = field(default_factory=dict)


def rel_err(out, ref) -> float:
    import torch

    from opforge.bench.case import rel_err as bench_rel_err

    return bench_rel_err(out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu())


def build(step: Step, device) -> Built:
    from opforge.runtime.names import resolve

    return resolve(step.factory)(device=str(device), **step.kwargs)


def ncu_step(factory: str, kwargs: dict):
    """The ncu target's step for a factory (see ``opforge.profile._ncu_target``)."""
    from opforge.runtime.names import resolve

    return resolve(factory)(device="cuda", **kwargs).run


def compare(title: str, steps: list[Step], *, device=None, ncu: bool = False, resources: bool = True,
            sys_path: list[str] | None = None, ncu_timeout: float = 300, notes=()) -> dict:
    """The ladder report of ``steps`` on ``device`` (default: CUDA when present)."""
    import torch

    from opforge.profile import ncu as ncumod
    from opforge.profile import report as rep_mod
    from opforge.profile.resources import ProfileError, launches_resources
    from opforge.runtime import timing

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ceilings = _ceilings(dev)
    built = [build(s, dev) for s in steps]
    errors = []
    for b in built:
        b.run()
        errors.append(rel_err(b.output(), b.expected))
    per_step = [[] for _ in steps]
    res_error = None
    if resources:
        flat = [(i, launch) for i, b in enumerate(built) for launch in b.launches]
        try:
            compiled = launches_resources([launch for _, launch in flat])
        except ProfileError as e:
            compiled, res_error = [], f"compiled resources unavailable: {e}"
        for (i, _), r in zip(flat, compiled):
            per_step[i].append(r)
    ncu_error = None
    rows = []
    for s, b, err, res in zip(steps, built, errors, per_step):
        kernels = [r for r in res if not isinstance(r, str)]
        errs = [r for r in res if isinstance(r, str)]
        ms = timing.bench(b.run, dev) if dev.type == "cuda" else None
        metrics = None
        if ncu and dev.type == "cuda" and ncu_error is None:
            names = [_name(fn) for fn, _, _ in b.launches]
            job = {"callable": "opforge.profile.compare:ncu_step",
                   "kwargs": {"factory": s.factory, "kwargs": s.kwargs}, "sys_path": list(sys_path or [])}
            try:
                metrics = ncumod.run_job(job, names, launches_per_call=len(names), timeout=ncu_timeout)
            except ncumod.NcuError as e:  # the same for every step: say it once
                ncu_error = str(e)
        rows.append(rep_mod.make_row(s.name, description=s.description, kernels=kernels, median_ms=ms,
                                     nbytes=b.nbytes, flops=b.flops, ceilings=ceilings, ncu=metrics,
                                     error="; ".join(e[:200] for e in errs), correct=bool(err <= b.tolerance),
                                     layout=_layout_analysis(b.accesses)))
    notes = list(notes)
    if res_error:
        notes.append(res_error)
    if dev.type != "cuda":
        notes.append("no CUDA device: each step was checked under the Triton interpreter; no times")
    if ncu and dev.type != "cuda":
        ncu_error = "--ncu needs a CUDA device: ncu measures kernels running on a GPU"
    return rep_mod.new_report("ladder", title, rows, ceilings=ceilings, notes=notes, ncu_error=ncu_error,
                              max_rel_err={s.name: e for s, e in zip(steps, errors)})


def run_ladder(name: str, title: str, steps: list[Step], *, out: str | None = None, console=None,
               notes=(), **compare_kw) -> dict:
    """``compare``, printed to ``console`` and written to ``out`` as ``name.{json,html,png}`` when given."""
    from opforge.profile import report

    rep = compare(title, steps, notes=notes, **compare_kw)
    if console is not None:
        report.print_report(rep, console)
    if out:
        report.write_all(rep, out, name)
    return rep


def ladder_main(run: Callable[..., dict], name: str, description: str, size_help: str, argv=None) -> int:
    """An example ladder's command line: ``run(out, ncu, size, console=...)``; exit 1 when a step is wrong."""
    import argparse
    import sys

    from rich.console import Console

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", help=f"write {name}.{{json,html,png}} here")
    p.add_argument("--ncu", action="store_true", help="Nsight Compute figures (CUDA, ncu installed)")
    p.add_argument("--size", type=int, help=size_help)
    a = p.parse_args(argv)
    rep = run(a.out, a.ncu, a.size, console=Console(width=None if sys.stdout.isatty() else 150))
    bad = [r["label"] for r in rep["rows"] if not r["correct"]]
    if bad:
        print(f"WRONG results: {bad}", file=sys.stderr)
    return 1 if bad else 0


def main_as_module(path: str) -> None:
    """Exit with the ``main()`` of the script at ``path`` imported as a module by its name, so that a
    compile child (and ncu) can find its kernels by name."""
    import importlib
    import os
    import sys

    here, file = os.path.split(os.path.abspath(path))
    sys.path.insert(0, here)
    sys.exit(importlib.import_module(os.path.splitext(file)[0]).main())


def _layout_analysis(accesses) -> dict | None:
    """The analyzer's per-instruction costs and per-request totals (what ncu would count)."""
    if not accesses:
        return None
    from opforge.layout import analyze

    return {"accesses": analyze.to_json(accesses), "predicted": analyze.predict(accesses)}


def _name(fn) -> str:
    inner = getattr(fn, "fn", fn)
    return getattr(inner, "__name__", str(fn))


def _ceilings(dev) -> dict | None:
    if dev.type != "cuda":
        return None
    from opforge.runtime import roofline

    c = roofline.ceilings(dev)
    return {"copy_tbps": c.copy_tbps, "bf16_tflops": c.bf16_tflops, "method": c.method}


def profile_kernel(fn, grid, *args, nbytes: float | None = None, flops: float = 0.0, run: bool = True,
                   ncu: bool = False, **kwargs) -> dict:
    """Profile one launch ``fn[grid](*args, **kwargs)`` of any ``triton.jit`` kernel
    (defined at the top level of an importable module): compiled resources and
    occupancy; on CUDA tensors, the median time and, with ``nbytes`` (default:
    every tensor argument read once), the achieved bandwidth and its share of the
    copy ceiling. Returns a report row (``opforge.profile.report.make_row``).
    ``ncu=True`` is for steps built by a factory: use ``compare`` for that."""
    import torch

    from opforge.profile.report import make_row
    from opforge.profile.resources import kernel_resources
    from opforge.runtime import timing

    if ncu:
        raise ValueError("profile_kernel: ncu needs the launch rebuilt in a child process; "
                         "wrap it in a Step factory and call compare(..., ncu=True)")
    res = kernel_resources(fn, *args, **kwargs)
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    moved = nbytes if nbytes is not None else float(sum(t.numel() * t.element_size() for t in tensors))
    ms = None
    ceilings = None
    if run and tensors and tensors[0].is_cuda:
        ms = timing.bench(lambda: fn[grid](*args, **kwargs), tensors[0].device)
        ceilings = _ceilings(tensors[0].device)
    return make_row(_name(fn), kernels=[res], median_ms=ms, nbytes=moved, flops=flops, ceilings=ceilings)
