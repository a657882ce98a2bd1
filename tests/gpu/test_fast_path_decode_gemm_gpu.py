"""The fast path of decode attention and the Triton GEMMs on a real GPU: the
runners bound to a decision call the compiled kernels directly after their
first launch (``launch.Prepared``), give bit-identical results to the
validated path (every launch through ``JITFunction.run``), and keep working
on a side stream and inside CUDA-graph capture. Skipped without CUDA; run on
the lent H200 with
``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu/test_fast_path_decode_gemm_gpu.py``."""

import os

import pytest
import torch

import opforge
from opforge.kernels import attention_decode as DK
from opforge.kernels import gemm as GK
from opforge.ops import attention_decode as AD
from opforge.runtime import dispatch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


@pytest.fixture
def jit_runs(monkeypatch):
    """Counts ``JITFunction.run`` calls of the decode and GEMM kernels."""
    counts = {}
    for kernel in (DK.split_kv_kernel, DK.combine_kernel, GK.gemm_tiled_kernel, GK.splitk_reduce_kernel,
                   GK.gemm_tma_persistent_kernel):
        real = kernel.run

        def run(*args, _real=real, _name=kernel.fn.__name__, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kw)
        monkeypatch.setattr(kernel, "run", run, raising=False)
    return counts


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(x, y), (x.float() - y.float()).abs().max()


def _check(op, variant, fn, jit_runs, kernels):
    dispatch.reset()
    with dispatch.force_variant(op, variant):
        with dispatch.validated_path():
            want = fn()
        jit_runs.clear()
        got = [fn() for _ in range(4)]  # decide and bind, then memo hits: the direct launch
        torch.cuda.synchronize()
    for out in got:
        _same(out, want)
    # the first bound call launches each kernel through JITFunction.run, the rest call it directly
    assert {k: jit_runs.get(k, 0) for k in kernels} == {k: 1 for k in kernels}, jit_runs
    return want


DECODE = [  # (B, Sq, Hq, H_kv, D, cap, page, return_lse)
    (1, 1, 32, 8, 128, 8192, None, False),  # many splits: split + combine
    (2, 1, 32, 8, 128, 4096, 16, True),  # paged, lse
    (64, 1, 32, 8, 128, 512, None, True),  # one split: the split kernel alone
    (3, 4, 8, 2, 64, 1500, 256, False),  # speculative decode, big pages
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", DECODE)
def test_decode_bound_runner_is_bit_identical_and_launches_directly(case, dtype, jit_runs):
    B, Sq, Hq, H_kv, D, cap, page, return_lse = case
    q, k, v, sl, scale, _, table = AD.make_inputs(B, Sq, Hq, H_kv, D, cap, dtype, "cuda", page=page, seed=B)
    with dispatch.force_variant("attention_decode", "triton_split_kv"):
        d = dispatch.explain("attention_decode", q, k, v, sl, scale, return_lse, table)
    split = DK.decode_plan(q, k, v, sl, table, return_lse, scale, d.config).partials > 0
    kernels = ["split_kv_kernel"] + (["combine_kernel"] if split else [])
    _check("attention_decode", "triton_split_kv",
           lambda: opforge.attention_decode(q, k, v, sl, table, scale=scale, return_lse=return_lse), jit_runs, kernels)


def _linear(M, N, K, dtype=torch.bfloat16):
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype) * 0.05
    return a, w.t()


GEMM = [  # (variant, M, N, K, epilogue?)
    ("triton_splitk", 1, 4096, 4096, False),
    ("triton_splitk", 16, 1024, 8192, True),
    ("triton_tma_persistent", 256, 1024, 512, False),
    ("triton_tma_persistent", 300, 520, 768, True),
    ("triton_tiled", 64, 96, 80, True),
]


@pytest.mark.parametrize("case", GEMM)
def test_gemm_bound_runner_is_bit_identical_and_launches_directly(case, jit_runs):
    variant, M, N, K, epilogue = case
    a, b = _linear(M, N, K)
    bias = torch.randn(N, device="cuda", dtype=a.dtype)
    res = torch.randn(M, N, device="cuda", dtype=a.dtype)
    kw = dict(bias=bias, activation="gelu", residual=res) if epilogue else {}
    kernels = {"triton_splitk": ["gemm_tiled_kernel", "splitk_reduce_kernel"],
               "triton_tma_persistent": ["gemm_tma_persistent_kernel"],
               "triton_tiled": ["gemm_tiled_kernel"]}[variant]
    _check("matmul", variant, lambda: opforge.matmul(a, b, **kw), jit_runs, kernels)


def test_the_bound_cublas_product_is_bit_identical():
    a, b = _linear(64, 64, 64)
    dispatch.reset()
    with dispatch.force_variant("matmul", "torch_eager"):
        with dispatch.validated_path():
            want = opforge.matmul(a, b)
        for _ in range(3):
            _same(opforge.matmul(a, b), want)


@pytest.mark.parametrize("op", ["decode", "splitk", "tma"])
def test_bound_runners_on_a_side_stream_and_in_a_cuda_graph(op):
    if op == "decode":
        q, k, v, sl, scale, _, _ = AD.make_inputs(1, 1, 32, 8, 128, 8192, torch.bfloat16, "cuda", seed=5)
        variant, name = "triton_split_kv", "attention_decode"

        def fn():
            return opforge.attention_decode(q, k, v, sl, scale=scale)
    else:
        a, b = _linear(*((4, 2048, 4096) if op == "splitk" else (256, 512, 512)))
        variant, name = ("triton_splitk" if op == "splitk" else "triton_tma_persistent"), "matmul"

        def fn():
            return opforge.matmul(a, b)
    dispatch.reset()
    with dispatch.force_variant(name, variant):
        with dispatch.validated_path():
            want = fn()
        fn(), fn()  # bound, and the direct launch cached
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        graph.replay()
        torch.cuda.synchronize()
    _same(on_side, want)
    _same(captured, want)
