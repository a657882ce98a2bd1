"""The fast call path on a real GPU: pre-bound runners and the pre-bound
Triton launcher give bit-identical results to the validated path, keep
working on a new signature (a misaligned view, another dtype), on a side
stream and inside CUDA-graph capture. Skipped without CUDA; run on the lent
H200 with ``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu/test_fast_path_gpu.py``."""

import os

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.kernels import elementwise as EK
from opforge.runtime import dispatch, launch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda").to(dtype)


def _cases(dtype, n):
    x, y = _rand(n, n, dtype=dtype), _rand(n, n, dtype=dtype)
    w, b = _rand(n, dtype=dtype), _rand(n, dtype=dtype)
    return {
        "add": (lambda: opforge.add(x, y), ["triton_flat", "triton_strided", "torch_eager"]),
        "add_scalar": (lambda: opforge.add(x, 3), ["triton_flat", "torch_eager"]),
        "exp": (lambda: opforge.exp(x), ["triton_flat", "torch_eager"]),
        "softmax": (lambda: opforge.softmax(x, -1), ["triton_row", "triton_online", "torch_eager"]),
        "log_softmax": (lambda: opforge.log_softmax(x, -1), ["triton_row", "torch_eager"]),
        "layer_norm": (lambda: opforge.layer_norm(x, (n,), w, b), ["triton_row", "triton_looped", "torch_eager"]),
        "rms_norm": (lambda: opforge.rms_norm(x, (n,), w), ["triton_row", "torch_eager"]),
        "matmul": (lambda: opforge.matmul(x, y), ["triton_tiled", "torch_eager"]),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 37])
@pytest.mark.parametrize("case", ["add", "add_scalar", "exp", "softmax", "log_softmax", "layer_norm", "rms_norm",
                                  "matmul"])
def test_fast_path_is_bit_identical_to_the_validated_path(case, n, dtype):
    fn, variants = _cases(dtype, n)[case]
    op = case.split("_scalar")[0]
    for variant in variants:
        dispatch.reset()
        with dispatch.force_variant(op, variant):
            with dispatch.validated_path():
                want = fn()
            got = [fn() for _ in range(3)]  # decide + bind, then memo hits (the direct launch)
        for out in got:
            assert out.dtype == want.dtype and out.shape == want.shape and out.stride() == want.stride()
            assert torch.equal(out, want), (variant, (out.float() - want.float()).abs().max())


def _flat_add(a, b, out, go, grid):
    go(grid, a, b, 0, out, out.numel())
    return out


def test_the_launcher_calls_the_compiled_kernel_after_the_first_call():
    n = 4096
    grid, kw = EK.flat_options("add", 1, torch.float32, n, {"BLOCK": 1024, "num_warps": 4})
    go = launch.Launcher(EK.flat_kernel, **kw)
    a, b = _rand(n), _rand(n)
    for _ in range(3):
        out = _flat_add(a, b, torch.empty_like(a), go, grid)
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    assert go.direct and len(go.compiled) == 1
    # a misaligned view is another signature: compiled (or found) again, still right
    a2, b2 = _rand(n + 1)[1:], _rand(n + 1)[1:]
    for _ in range(2):
        out = _flat_add(a2, b2, torch.empty_like(a), go, grid)
        torch.testing.assert_close(out, a2 + b2, rtol=0, atol=0)
    assert len(go.compiled) == 2


def test_the_direct_launch_uses_the_current_stream():
    n = 1 << 20
    grid, kw = EK.flat_options("add", 1, torch.float32, n, {"BLOCK": 1024, "num_warps": 4})
    go = launch.Launcher(EK.flat_kernel, **kw)
    a, b = _rand(n), _rand(n)
    _flat_add(a, b, torch.empty_like(a), go, grid)  # compile on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [_flat_add(a, b, torch.empty_like(a), go, grid) for _ in range(5)]
    side.synchronize()
    for out in outs:
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)


@pytest.mark.parametrize("case,variant", [("softmax", "triton_row"), ("layer_norm", "triton_row"),
                                          ("rms_norm", "triton_row"), ("add", "triton_flat")])
def test_cuda_graph_capture_replays_the_pre_bound_runner(case, variant):
    x, w = _rand(64, 64), _rand(64)
    fns = {"softmax": lambda: opforge.softmax(x, -1), "layer_norm": lambda: opforge.layer_norm(x, (64,), w),
           "rms_norm": lambda: opforge.rms_norm(x, (64,), w), "add": lambda: opforge.add(x, x)}
    refs = {"softmax": lambda: torch.softmax(x, -1), "layer_norm": lambda: F.layer_norm(x, (64,), w),
            "rms_norm": lambda: F.rms_norm(x, (64,), w), "add": lambda: x + x}
    with dispatch.force_variant(case, variant):
        fns[case]()
        fns[case]()  # bound and compiled outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fns[case]()
    for _ in range(3):
        x.copy_(_rand(64, 64))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, refs[case](), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_decisions_on_two_devices_run_on_their_own_device():
    for dev in ("cuda:0", "cuda:1"):
        x = torch.randn(64, 64, device=dev)
        with dispatch.force_variant("softmax", "triton_row"):
            for _ in range(2):
                torch.testing.assert_close(opforge.softmax(x, -1), torch.softmax(x, -1))
