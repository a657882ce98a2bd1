"""The fast call path of decode attention and the GEMMs (issue 23): the
runner bound to a decision (``K.decode_plan`` / ``K.tiled_plan`` /
``K.tma_plan`` and ``launch.Prepared``) gives bit-identical results to the
validated path, and bad input on a new signature raises the same errors.

CPU: the Triton kernels run under the interpreter at tiny sizes, so the
bound runners launch through ``JITFunction.run`` here; what this checks is
that they pass the same tensors, scalars and constexprs as the plain path.
The direct call of the compiled kernels is checked on CUDA in
``tests/gpu/test_fast_path_decode_gemm_gpu.py``."""

from __future__ import annotations

import functools

import pytest
import torch

import opforge
from opforge.ops import attention_decode as AD
from opforge.runtime import dispatch, registry


def _fast_and_validated(op: str, variant: str, fn):
    with dispatch.force_variant(op, variant):
        with dispatch.validated_path():
            want = fn()
        got = [fn(), fn()]  # decide and bind, then the memo hit
    (d,) = [d for d in dispatch._memo.values() if d.op.name == op]
    assert d.variant.name == variant and not isinstance(d.fast, functools.partial), "the plain run, not a bind"
    return want, got


def _same(a, b) -> None:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(x, y)


# B=1, Sq=1, Hq=2, H_kv=1, D=16, fp32 (32-token tiles): capacity 64 is one split, 128 two.
DECODE = [
    # fp32: 32-token tiles; 6 tiles are 3 splits, up to SINGLE_SPLIT_TILES = 4 one
    ("contiguous, several splits, lse", dict(cap=192), True),
    ("contiguous, one split", dict(cap=64), False),
    ("paged by 16, several splits, lse", dict(cap=192, page=16), True),
]


@pytest.mark.parametrize("name,shape,return_lse", DECODE, ids=[c[0] for c in DECODE])
def test_decode_fast_path_is_bit_identical(name, shape, return_lse):
    q, k, v, seqlens, scale, _, table = AD.make_inputs(1, 1, 2, 1, 16, shape["cap"], torch.float32, "cpu",
                                                      page=shape.get("page"), lengths=[shape["cap"] - 5], seed=3)
    want, got = _fast_and_validated("attention_decode", "triton_split_kv", lambda: opforge.attention_decode(
        q, k, v, seqlens, table, scale=scale, return_lse=return_lse))
    for out in got:
        _same(out, want)


def test_decode_fast_path_checks_values_and_new_signatures():
    q, k, v, seqlens, scale, _, _ = AD.make_inputs(1, 1, 2, 1, 16, 64, torch.float32, "cpu", lengths=[60], seed=4)
    call = functools.partial(opforge.attention_decode, q, k, v, scale=scale)
    bad = [
        lambda: call(torch.tensor([65], dtype=torch.int32)),  # same signature, a length past the cache (CPU check)
        lambda: call(torch.tensor([60])),  # int64 lengths: a new signature
        lambda: opforge.attention_decode(q, k[..., :8], v[..., :8], seqlens, scale=scale),  # head dims differ
    ]
    expected = []
    for fn in bad:
        with dispatch.validated_path(), pytest.raises((TypeError, ValueError)) as info:
            fn()
        expected.append((type(info.value), str(info.value)))
    call(seqlens)
    call(seqlens)  # memoized and bound
    for fn, (kind, message) in zip(bad, expected):
        with pytest.raises(kind) as info:
            fn()
        assert str(info.value) == message


def _rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _gemm_cases(gen):
    """(variant, call) for each Triton GEMM launch form and the bound cuBLAS product."""
    r = functools.partial(_rand, gen)
    a3, w, bias, res = r(2, 5, 16), r(16, 12), r(12), r(2, 5, 12)
    x, wk = r(3, 512), r(24, 512).t()  # a Linear weight seen as W^T: split-K over K = 512
    xb, wb, bb, rb = r(2, 1024, dtype=torch.bfloat16), r(1024, 24, dtype=torch.bfloat16), \
        r(24, dtype=torch.bfloat16), r(24, dtype=torch.bfloat16)
    s, t, sb, sr = r(32, 32), r(32, 32), r(32), r(32, 32)
    return [
        ("triton_tiled", lambda: opforge.matmul(a3, w, bias=bias, activation="relu", residual=res)),
        ("triton_splitk", lambda: opforge.matmul(x, wk)),
        ("triton_splitk", lambda: opforge.matmul(xb, wb, bias=bb, activation="silu", residual=rb)),
        ("triton_tma_persistent", lambda: opforge.matmul(s, t)),
        ("triton_tma_persistent", lambda: opforge.matmul(s, t.t(), bias=sb, activation="relu", residual=sr)),
        ("torch_eager", lambda: opforge.matmul(s, t.t())),
    ]


@pytest.mark.parametrize("case", range(6))
def test_gemm_fast_path_is_bit_identical(case, gen, monkeypatch):
    monkeypatch.setattr(registry.get("matmul").variant("torch_eager"), "devices", ("cpu", "cuda"))
    variant, fn = _gemm_cases(gen)[case]
    want, got = _fast_and_validated("matmul", variant, fn)
    for out in got:
        _same(out, want)


def test_gemm_bad_input_on_a_new_signature_raises_as_the_validated_path(gen):
    x, w = _rand(gen, 3, 512), _rand(gen, 512, 24)
    bad = [
        lambda: opforge.matmul(x, _rand(gen, 500, 24)),  # inner dims
        lambda: opforge.matmul(x, w, bias=_rand(gen, 23)),  # bias shape
        lambda: opforge.matmul(x, w.double()),  # dtypes differ
        lambda: opforge.matmul(x, w, activation="tanh"),
        lambda: opforge.matmul(x, w, bias=torch.empty(24, device="meta")),  # a memo hit's key holds the device
    ]
    expected = []
    for fn in bad:
        with dispatch.validated_path(), pytest.raises((TypeError, ValueError)) as info:
            fn()
        expected.append((type(info.value), str(info.value)))
    bias = _rand(gen, 24)
    with dispatch.force_variant("matmul", "triton_splitk"):
        for _ in range(2):  # memoized and bound, with and without a bias
            opforge.matmul(x, w)
            opforge.matmul(x, w, bias=bias)
        for fn, (kind, message) in zip(bad, expected):
            with pytest.raises(kind) as info:
                fn()
            assert str(info.value) == message


def test_decode_cases_reach_one_split_and_several():
    splits = {c[0]: AD.K.default_config(1, 2, 1, 1, 16, c[1]["cap"], 4)["SPLITS"] for c in DECODE}
    assert [s > 1 for s in splits.values()] == ["several" in name for name in splits]
