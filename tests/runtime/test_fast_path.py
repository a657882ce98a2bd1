"""The fast call path (issue 23): a memo hit runs the decision's pre-bound
runner, which must give bit-identical results to the validated path (every
call validated and decided afresh, the variant's plain ``run``), raise the
same errors for bad input on a new signature, and still record autograd.

CPU: Triton variants run under the interpreter; the vendor variants are
allowed on the CPU here (their ``devices`` patched) so their pre-bound forms
run too. ``tests/gpu/test_fast_path_gpu.py`` checks the same on CUDA."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import dispatch, registry


def _rand(*shape, gen, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _cases(gen):
    """(op name, public call, args) for every op with a pre-bound runner."""
    x, y = _rand(8, 32, gen=gen), _rand(8, 32, gen=gen)
    xi, yi = torch.randint(-50, 50, (8, 32), generator=gen), torch.randint(1, 50, (8, 32), generator=gen)
    w, b = _rand(32, gen=gen), _rand(32, gen=gen)
    x3 = _rand(2, 3, 32, gen=gen, dtype=torch.bfloat16)
    return [
        ("add", lambda: opforge.add(x, y)),
        ("add", lambda: opforge.add(x, 2.5)),
        ("add", lambda: opforge.add(xi, 3)),
        ("mul", lambda: opforge.mul(xi, yi)),
        ("div", lambda: opforge.div(xi, yi)),
        ("exp", lambda: opforge.exp(x)),
        ("gelu", lambda: opforge.gelu(x)),
        ("softmax", lambda: opforge.softmax(x, -1)),
        ("softmax", lambda: opforge.softmax(x3, -1)),
        ("log_softmax", lambda: opforge.log_softmax(x, 1)),
        ("softmax", lambda: opforge.softmax(x, 0)),
        ("layer_norm", lambda: opforge.layer_norm(x, (32,), w, b)),
        ("layer_norm", lambda: opforge.layer_norm(x3, [32])),
        ("rms_norm", lambda: opforge.rms_norm(x, 32, w)),
        ("rms_norm", lambda: opforge.rms_norm(x3, (32,))),
        ("matmul", lambda: opforge.matmul(x, y.t())),
    ]


VARIANTS = {
    "add": ["triton_flat", "triton_strided", "torch_eager"],
    "mul": ["triton_flat", "torch_eager"],
    "div": ["triton_flat", "torch_eager"],
    "exp": ["triton_flat", "torch_eager"],
    "gelu": ["triton_flat", "torch_eager"],
    "softmax": ["triton_row", "triton_online", "torch_eager"],
    "log_softmax": ["triton_row", "torch_eager"],
    "layer_norm": ["triton_row", "triton_looped", "torch_eager"],
    "rms_norm": ["triton_row", "torch_eager"],
    "matmul": ["triton_tiled", "torch_eager"],
}


@pytest.fixture
def vendor_on_cpu(monkeypatch):
    """Let the vendor variants (CUDA-only by declaration) run on CPU tensors."""
    for name in VARIANTS:
        monkeypatch.setattr(registry.get(name).variant("torch_eager"), "devices", ("cpu", "cuda"))


def _case_variants():
    return [(i, v) for i, (name, _) in enumerate(_cases(torch.Generator().manual_seed(0)))
            for v in VARIANTS[name]]


@pytest.mark.parametrize("case,variant", _case_variants())
def test_fast_path_is_bit_identical_to_the_validated_path(case, variant, gen, vendor_on_cpu):
    name, fn = _cases(gen)[case]
    with dispatch.force_variant(name, variant):
        try:
            with dispatch.validated_path():
                want = fn()
        except ValueError as e:
            if "forced variant" not in str(e):
                raise
            pytest.skip(f"{variant} does not take this case")
        first = fn()  # decides, binds
        again = fn()  # the memo hit: the pre-bound runner
    assert first.dtype == want.dtype and first.shape == want.shape and first.stride() == want.stride()
    assert torch.equal(first, want) and torch.equal(again, want)


def _error(fn):
    with pytest.raises((TypeError, ValueError)) as info:
        fn()
    return type(info.value), str(info.value)


def test_bad_input_on_a_new_signature_raises_as_the_validated_path(gen):
    x, y = _rand(4, 8, gen=gen), _rand(4, 8, gen=gen)
    w = _rand(8, gen=gen)
    meta = torch.empty(4, 8, device="meta")
    good_then_bad = [
        (lambda: opforge.add(x, y), lambda: opforge.add(x, _rand(3, 8, gen=gen))),  # shape
        (lambda: opforge.add(x, y), lambda: opforge.add(x, meta)),  # device
        (lambda: opforge.add(x, y), lambda: opforge.add(x, y.to(torch.complex64))),  # dtype
        (lambda: opforge.exp(x), lambda: opforge.exp(torch.ones(4, 8, dtype=torch.int32))),  # dtype
        (lambda: opforge.softmax(x, -1), lambda: opforge.softmax(x, 2)),  # dim
        (lambda: opforge.softmax(x, -1), lambda: opforge.softmax(x.to(torch.int64), -1)),  # dtype
        (lambda: opforge.layer_norm(x, (8,), w), lambda: opforge.layer_norm(x, (8,), _rand(7, gen=gen))),
        (lambda: opforge.layer_norm(x, (8,), w), lambda: opforge.layer_norm(x, (8,), w.double())),
        (lambda: opforge.layer_norm(x, (8,), w), lambda: opforge.layer_norm(x, (4,), None)),  # shape
        (lambda: opforge.rms_norm(x, (8,), w), lambda: opforge.rms_norm(x, (8,), w.to(device="meta"))),
        (lambda: opforge.rms_norm(x, (8,), w), lambda: opforge.rms_norm(x, (8.0,), w)),  # not an int
        (lambda: opforge.matmul(x, y.t()), lambda: opforge.matmul(x, y)),  # inner dims
    ]
    for good, bad in good_then_bad:
        with dispatch.validated_path():
            expected = _error(bad)
        dispatch.reset()
        good()
        good()  # memoized and bound
        assert _error(bad) == expected


def test_a_memo_hit_with_requires_grad_records_autograd(gen):
    x, w = _rand(4, 16, gen=gen), _rand(16, gen=gen)
    for op, ref in ((lambda t: opforge.softmax(t, -1), lambda t: torch.softmax(t, -1)),
                    (lambda t: opforge.layer_norm(t, (16,), w), lambda t: F.layer_norm(t, (16,), w)),
                    (lambda t: opforge.mul(t, t), lambda t: t * t)):
        op(x)  # memoized without grad
        xg, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = op(xg)
        assert out.grad_fn is not None
        g = _rand(*out.shape, gen=gen)
        out.backward(g)
        ref(xr).backward(g)
        torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-5, atol=1e-5)


def test_a_new_config_rebinds_the_runner(gen):
    x, y = _rand(4, 8, gen=gen), _rand(4, 8, gen=gen)
    with dispatch.force_variant("add", "triton_flat"):
        opforge.add(x, y)
        (d,) = [d for d in dispatch._memo.values() if d.op.name == "add"]
        bound = d.fast
        d.config = {"BLOCK": 2048, "num_warps": 8}  # what a failed launch's fallback or a profile run does
        assert d.fast is not bound
        torch.testing.assert_close(opforge.add(x, y), x + y, rtol=0, atol=0)
        assert d.fast is not bound and d.fast != d._bind_and_run


def test_a_bound_runner_that_fails_falls_back_like_the_plain_path(gen, monkeypatch):
    """A decision whose runner raises goes to ``rerun_with_default`` as before."""
    x, y = _rand(4, 8, gen=gen), _rand(4, 8, gen=gen)
    seen = []

    def rerun(d, args, e, run):
        seen.append(type(e))
        return run(d, args)

    monkeypatch.setattr(dispatch.autotune, "rerun_with_default", rerun)
    with dispatch.force_variant("add", "triton_flat"):
        opforge.add(x, y)
        (d,) = [d for d in dispatch._memo.values() if d.op.name == "add"]
        d.fast = lambda *a: (_ for _ in ()).throw(RuntimeError("launch failed"))
        torch.testing.assert_close(opforge.add(x, y), x + y, rtol=0, atol=0)
    assert seen == [RuntimeError]


def test_validated_path_decides_every_call(gen, monkeypatch):
    x = _rand(4, 8, gen=gen)
    calls = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda op, args, **kw: calls.append(op.name) or real(op, args, **kw))
    with dispatch.validated_path():
        opforge.exp(x)
        opforge.exp(x)
    assert calls == ["exp", "exp"] and not dispatch._memo
    opforge.exp(x)
    opforge.exp(x)
    assert calls == ["exp", "exp", "exp"]


@pytest.mark.parametrize("name,variant,call", [
    ("add", "triton_flat", lambda x, w: opforge.add(x, x)),
    ("add", "triton_flat", lambda x, w: opforge.add(x, 2.0)),
    ("add", "torch_eager", lambda x, w: opforge.add(x, x)),
    ("exp", "torch_eager", lambda x, w: opforge.exp(x)),
    ("softmax", "triton_row", lambda x, w: opforge.softmax(x, -1)),
    ("softmax", "torch_eager", lambda x, w: opforge.softmax(x, -1)),
    ("layer_norm", "triton_row", lambda x, w: opforge.layer_norm(x, (8,), w, w)),
    ("layer_norm", "torch_eager", lambda x, w: opforge.layer_norm(x, (8,), w, w)),
    ("rms_norm", "triton_row", lambda x, w: opforge.rms_norm(x, (8,), w)),
    ("rms_norm", "torch_eager", lambda x, w: opforge.rms_norm(x, (8,))),
])
def test_the_hot_variants_run_a_pre_bound_runner(name, variant, call, gen, vendor_on_cpu):
    """Not the generic ``partial(spec.run, geom, config)``: the variant's ``bind`` form."""
    x, w = _rand(4, 8, gen=gen), _rand(8, gen=gen)
    with dispatch.force_variant(name, variant):
        call(x, w)
        call(x, w)
    (d,) = [d for d in dispatch._memo.values() if d.op.name == name]
    assert d.variant.name == variant and not isinstance(d.fast, functools.partial)


def test_a_plain_product_on_the_vendor_takes_the_shortcut(gen, vendor_on_cpu, monkeypatch):
    """matmul's shortcut (``ops/matmul.py``): a memo hit whose decision is ``torch.matmul`` skips the
    dispatcher, with the validated path's result; a forced variant, a hook or a reset goes back to it."""
    from opforge.ops import matmul as mm
    from opforge.runtime import hooks

    # the vendor's decision, as for a small GEMM on a GPU: no Triton variant takes CPU tensors
    monkeypatch.setattr(dispatch.devmod, "interpret_mode", lambda: False)
    dispatch.reset()
    x, y = _rand(64, 64, gen=gen), _rand(64, 64, gen=gen)
    with dispatch.validated_path():
        want = opforge.matmul(x, y)
    assert dispatch.explain("matmul", x, y, None, None, mm.make_epilogue(x)).variant.name == "torch_eager"
    calls = []
    real = mm._call
    monkeypatch.setattr(mm, "_call", lambda *a: calls.append(a[0].name) or real(*a))
    first = opforge.matmul(x, y)  # decides, memoizes, learns the shortcut
    again = opforge.matmul(x, y)
    assert calls == ["matmul"] and list(mm._products.values()) == [mm._VENDOR]
    assert torch.equal(first, want) and torch.equal(again, want) and again.stride() == want.stride()
    hooks.HOOKS.append(lambda event, d: calls.append(event))
    try:
        assert torch.equal(opforge.matmul(x, y), want)
    finally:
        hooks.HOOKS.pop()
    assert calls == ["matmul", "matmul", "enter", "exit"]
    with dispatch.force_variant("matmul", "reference"):
        assert not mm._products
        with dispatch.validated_path():
            forced = opforge.matmul(x, y)
        assert torch.equal(opforge.matmul(x, y), forced) and torch.equal(opforge.matmul(x, y), forced)
    assert not mm._products  # nothing learned while forced
    opforge.matmul(x, y)
    assert mm._products
    dispatch.reset()
    assert not mm._products
