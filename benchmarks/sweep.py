"""Time every candidate config of the Triton variants of an op taking (input, dim).

A tool for choosing default configs: ``python3 benchmarks/sweep.py softmax
2048x65536:bf16 512x262144:bf16`` prints each config's time (the fastest
is also stored in the autotune cache, as ``opforge tune`` does).
"""

from __future__ import annotations

import sys

import torch

from opforge.tune import DTYPES, Job, parse_shape, tune_jobs


def main(argv: list[str]) -> int:
    op, specs = argv[0], argv[1:]
    jobs = []
    for spec in specs:
        shape_text, _, dtype_text = spec.partition(":")
        shape, dtype = parse_shape(shape_text), DTYPES[dtype_text or "fp32"]
        jobs.append(Job(op, spec, lambda dev, shape=shape, dtype=dtype:
                        (torch.randn(shape, device=dev).mul_(3).to(dtype), -1)))
    tune_jobs(jobs, exhaustive=True, show=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
