"""Overlapped tensor-parallel GEMMs vs compute alone, comm alone and sequential (issue 7).

    torchrun --nproc-per-node 2 benchmarks/dist_overlap.py [--quick] [--json PATH] [--op NAME] ...

Runs :mod:`opforge.distributed.bench` on every rank (NCCL on GPUs, Gloo on CPUs); rank 0
prints one line per shape and writes the JSON (default
``benchmarks/results/<gpu|cpu>x<ranks>-<date>-dist-overlap.json``). Method and
fields: the module docstring of ``opforge.distributed.bench``.
"""
from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402

from opforge.distributed import bench  # noqa: E402


def default_path() -> str:
    kind = "h200" if torch.cuda.is_available() and "H200" in torch.cuda.get_device_name() else (
        "gpu" if torch.cuda.is_available() else "cpu")
    ranks = os.environ.get("WORLD_SIZE", "1")
    return str(HERE / "results" / f"{kind}x{ranks}-{dt.date.today():%Y-%m-%d}-dist-overlap.json")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--json" not in argv:
        argv += ["--json", default_path()]
    sys.exit(bench.main(argv))
