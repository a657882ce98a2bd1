"""The program ncu runs: ``python -m opforge.profile._ncu_target JOB``.

``JOB`` is JSON: ``{"callable": "module:function", "kwargs": {...},
"warmup": N, "sys_path": [...]}``. ``function(**kwargs)`` builds its inputs
on the GPU and returns a step (a function of no arguments that launches the
kernels once). The step runs ``warmup`` times (JIT compile, caches), then
once more: the launch ncu measures. Nothing is printed on stdout, which
carries ncu's CSV.
"""

from __future__ import annotations

import json
import sys


def op_step(op: str, shape: list, dtype: str, args: list, variant: str, config: dict, seed: int = 0):
    """A step that runs one opforge variant with one config on a random input."""
    import torch

    from opforge.runtime.registry import get

    v = get(op).variant(variant)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", dtype=torch.float32, generator=g).to(getattr(torch, dtype))
    extra = tuple(args)
    return lambda: v.run(config, x, *extra)


def case_step(case: str, variant: str, config: dict):
    """A step that runs one opforge variant with one config on a bench case's inputs
    (``opforge.bench.harness.find_case``: the case whose name contains ``case``)."""
    import torch

    from opforge.bench.harness import find_case
    from opforge.runtime.registry import get

    found = find_case(case, torch.device("cuda"))
    args = found.registry_args(*found.make_args(torch.device("cuda")))
    v = get(found.op).variant(variant)
    return lambda: v.run(config, *args)


def main(argv: list[str]) -> int:
    import torch

    from opforge.runtime.names import resolve

    job = json.loads(argv[1])
    for p in job.get("sys_path", []):
        if p not in sys.path:
            sys.path.append(p)
    step = resolve(job["callable"])(**job.get("kwargs", {}))
    for _ in range(int(job.get("warmup", 3))):
        step()
    torch.cuda.synchronize()
    step()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
