"""``opforge warmup`` leaves a first launch nothing to build: after the warmup's compile and
launcher build into a fresh ``TRITON_CACHE_DIR``, a new process launches the kernel with
Triton's C compiler step refused for launcher modules, and gets the right answer. Skipped
without CUDA; run on the lent H200 with
``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu/test_warmup_launchers_cuda.py``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)

FIRST_LAUNCH = r"""
import torch, triton.runtime.build as build
real = build._build
def refuse(name, *a, **k):
    if name == "__triton_launcher":
        raise AssertionError("the first launch built a launcher module")
    return real(name, *a, **k)  # Triton's own driver utilities, once per cache folder
build._build = refuse
from warmup_kernels import scale_kernel
x = torch.arange(1000, dtype=torch.float32, device="cuda")
out = torch.empty_like(x)
scale_kernel[(8,)](x, out, 1000, 2.5, BLOCK=128, COMPUTE=None, num_warps=4)
assert torch.equal(out, x * 2.5)
print("ok")
"""


def test_first_launch_after_warmup_builds_no_launcher(tmp_path):
    from opforge.warmup.compile import _worker_env, compile_all
    from opforge.warmup.launches import Specialization
    from opforge.warmup.launchers import LauncherBuilder, cached_launcher

    kernels = str(Path(__file__).parents[1] / "warmup")
    env = dict(_worker_env(), TRITON_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([kernels, env["PYTHONPATH"]])
    old = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "PYTHONPATH")}
    os.environ.update(TRITON_CACHE_DIR=env["TRITON_CACHE_DIR"], PYTHONPATH=env["PYTHONPATH"])
    try:
        sig = (("x_ptr", "*fp32:D"), ("out_ptr", "*fp32:D"), ("n", "i32"), ("alpha", "fp32"))
        spec = Specialization("warmup_kernels:scale_kernel", sig, (("BLOCK", 128), ("COMPUTE", None)),
                              (("num_warps", 4),))
        [r] = compile_all([spec], {}, jobs=2)
        assert r.error == "" and r.launcher
        builder = LauncherBuilder(jobs=1)
        builder.add(r.launcher)
        report = builder.finish()
        assert report.built == 1 and not report.errors and cached_launcher(r.launcher) is not None
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    run = subprocess.run([sys.executable, "-c", FIRST_LAUNCH], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
