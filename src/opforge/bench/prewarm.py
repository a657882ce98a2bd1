"""Compile a bench run's kernels in parallel worker processes before timing.

Most of a GPU bench run is compilation, not measurement: every shape is a
fresh ``torch.compile`` of its peer (inductor specializes per shape) and a
JIT of our Triton configs, each a few seconds of one CPU core, while the
timing of a case takes a fraction of a second. Compilation results are
cached on disk (inductor's FX graph cache, Triton's kernel cache), so worker
processes that run every case once, untimed and
concurrently, leave the timed run in the parent only cache hits. Timing stays
serial: only compilation runs in parallel.

A worker is ``python -m opforge.bench.prewarm JOBS_JSON``; a job names a case
by family, list (``entries`` or ``crossover``) and index, so the worker
rebuilds the exact case the parent will time.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import torch

from opforge.bench import families

Job = tuple[str, str, int]  # family, "entries" | "crossover", index in that family's list


def _warm(case, dev: torch.device) -> None:
    from opforge.runtime import dispatch

    args = case.make_args(dev)
    ctx = dispatch.force_variant(case.op, case.variant) if case.variant else contextlib.nullcontext()
    with ctx:
        case.run(*args)
    for fn in case.peers.values():
        with contextlib.suppress(Exception):  # the timed run reports a peer's failure
            fn(*args)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def worker(jobs: list[Job], quick: bool) -> None:
    """Run each job's case and peers once; a failing case is left for the timed run to report."""
    from opforge.runtime import device as devmod

    dev = devmod.default_device()
    built: dict[tuple[str, str], list] = {}
    for family, where, index in jobs:
        try:
            cases = built.setdefault((family, where), families.family_cases(family, where, dev, quick))
            _warm(cases[index], dev)
        except Exception:  # noqa: S112 - the timed run reports it
            pass
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def prewarm(jobs: list[Job], workers: int, *, quick: bool = False, progress=None, task=None) -> int:
    """Run ``jobs`` in ``workers`` processes (round-robin split); returns how many workers failed.

    Jobs are dealt round-robin so that each worker gets a mix of families and
    sizes (neighbouring cases of a family share compiled kernels, which the
    disk caches then share across workers anyway).
    """
    workers = max(1, min(workers, len(jobs)))
    chunks = [jobs[i::workers] for i in range(workers)]
    bad = 0
    # Workers autotune as a first call would, which compiles every config into
    # the shared Triton cache; but they time configs side by side on a busy
    # GPU, so their choices go to a private autotune cache that is thrown away
    # and the parent tunes again, alone on the GPU, from compiled kernels.
    with tempfile.TemporaryDirectory(prefix="opforge-prewarm-") as private:
        env = dict(os.environ, OPFORGE_PREWARM_QUICK="1" if quick else "0", OPFORGE_CACHE_DIR=private)
        procs = [subprocess.Popen([sys.executable, "-m", "opforge.bench.prewarm", json.dumps(c)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in chunks]
        for p, chunk in zip(procs, chunks):
            bad += p.wait() != 0
            if progress is not None:
                progress.advance(task, len(chunk))
    return bad


def main(argv: list[str]) -> int:
    jobs = [tuple(j) for j in json.loads(argv[0])]
    worker(jobs, quick=os.environ.get("OPFORGE_PREWARM_QUICK") == "1")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
