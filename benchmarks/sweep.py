"""Time every candidate config of the Triton variants of an op taking (input, dim).

A tool for choosing default configs: ``python3 benchmarks/sweep.py softmax
2048x65536:bf16 4096x4096:bf16:0`` (shape:dtype:dim) prints each config's time (the fastest
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
        parts = spec.split(":")
        shape_text, dtype_text, dim_text = parts[0], *(parts[1:] + ["fp32", "-1"][len(parts) - 1:])
        shape, dtype, dim = parse_shape(shape_text), DTYPES[dtype_text], int(dim_text)
        jobs.append(Job(op, spec, lambda dev, shape=shape, dtype=dtype, dim=dim:
                        (torch.randn(shape, device=dev).mul_(3).to(dtype), dim)))
    tune_jobs(jobs, exhaustive=True, show=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
