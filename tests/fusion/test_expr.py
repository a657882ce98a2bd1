"""Tracing: the DAG a function becomes, torch's type rules, shared
subexpressions, the reference evaluation, and the errors for what cannot fuse.

Oracles: torch itself (dtypes of the eager result, values in float64).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opforge.fusion import expr as E

F16, BF16, F32, F64, I32, I64, BOOL = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                       torch.int32, torch.int64, torch.bool)


def T(dtype, dim0=False):
    return ("T", dtype, dim0)


def S(pytype):
    return ("S", pytype)


def make(entry, gen, shape=(3, 4)):
    if entry[0] == "S":
        return {float: 0.75, int: 3, bool: True}[entry[1]]
    x = torch.rand(() if entry[2] else shape, generator=gen, dtype=F64) * 3 + 0.5
    if entry[1] == BOOL:
        return x > 2
    return x.round().to(entry[1]) if not entry[1].is_floating_point else x.to(entry[1])


PROMOTION_CASES = [
    ("int + float scalar", lambda x, s: x + s, (T(I32), S(float))),
    ("bf16 + fp32 tensor", lambda x, y: x + y, (T(BF16), T(F32))),
    ("bf16 + fp32 0-dim", lambda x, y: x + y, (T(BF16), T(F32, True))),
    ("int true division", lambda x, y: x / y, (T(I32), T(I64))),
    ("comparison", lambda x, y: x < y, (T(F16), T(F32))),
    ("int exp", lambda x: torch.exp(x), (T(I64),)),
    ("bool + int scalar", lambda x, s: x + s, (T(BOOL), S(int))),
    ("where mixed", lambda c, a, b: torch.where(c, a, b), (T(BOOL), T(F16), T(BF16))),
    ("cast", lambda x: (x * 2).to(torch.bfloat16), (T(F32),)),
    ("int pow", lambda x: x ** 2, (T(I32),)),
    ("float scalar pow", lambda x, s: x ** s, (T(F16), S(float))),
    ("clamp mixed", lambda x, s: torch.clamp(x, min=s), (T(I32), S(float))),
]


@pytest.mark.parametrize("fn,spec", [c[1:] for c in PROMOTION_CASES], ids=[c[0] for c in PROMOTION_CASES])
def test_result_dtype_is_torchs(fn, spec, gen):
    program = E.trace(fn, "f", spec)
    args = [make(e, gen) for e in spec]
    expect = fn(*args)
    assert program.out_dtypes == [expect.dtype]
    (out,) = E.evaluate(program, [a for a in args if isinstance(a, torch.Tensor)],
                        [a for a in args if not isinstance(a, torch.Tensor)])
    assert out.dtype == expect.dtype and torch.equal(out, expect.expand(out.shape))


def test_common_subexpressions_are_one_node():
    def f(x, y):
        a = torch.exp(x * y)
        b = torch.exp(x * y)
        return a + b, F.silu(x * y)

    program = E.trace(f, "f", (T(F32), T(F32)))
    ops = [n.op for n in program.order()]
    assert ops.count("mul") == 1 and ops.count("exp") == 1


def test_scalar_arguments_are_parameters_and_literals_are_constants():
    program = E.trace(lambda x, s: x * s + 2.5, "f", (T(F32), S(float)))
    kinds = {n.op for n in program.order()}
    assert "scalar" in kinds and "const" in kinds
    const = next(n for n in program.order() if n.op == "const")
    assert const.value == 2.5


def test_constants_fold():
    program = E.trace(lambda x: x * (2.0 * 3.0 - 1.0), "f", (T(F32),))
    consts = [n.value for n in program.order() if n.op == "const"]
    assert consts == [5.0]


def test_methods_functions_and_operators_trace(gen):
    def f(x, y):
        a = x.exp().sigmoid() + torch.tanh(y) - F.gelu(x, approximate="tanh") * F.silu(y)
        b = torch.where(x > y, x.abs().sqrt(), y.rsqrt()) ** 2
        c = torch.clamp(-x, -1.0, 1.0) + torch.maximum(x, y) - torch.minimum(x, y) / x.float()
        d = torch.log1p(y) + torch.expm1(x) + torch.erf(x) + x.relu() + x.square() + y.reciprocal()
        m = ((x > 0) & (y < 2)) | ~(x == y)
        return a, b, c, d, m, x.to(torch.float16), x.half().double()

    spec = (T(F32), T(F32))
    program = E.trace(f, "f", spec)
    x, y = make(spec[0], gen), make(spec[1], gen)
    outs = E.evaluate(program, [x, y], [])
    for o, r in zip(outs, f(x, y)):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, equal_nan=True)


def test_upcast_evaluation_keeps_cast_rounding(gen):
    program = E.trace(lambda x: (x * 3).to(torch.bfloat16) * 1.0, "f", (T(F32),))
    x = make(T(F32), gen)
    (out,) = E.evaluate(program, [x], [], upcast=True)
    assert out.dtype == F64
    assert torch.equal(out, (x.double() * 3).to(torch.bfloat16).double())


def test_multiple_outputs_flag():
    assert E.trace(lambda x: (x, x + 1), "f", (T(F32),)).multi
    assert not E.trace(lambda x: x + 1, "f", (T(F32),)).multi


@pytest.mark.parametrize("fn,message", [
    (lambda x: x.sum(), "is not an elementwise operation"),
    (lambda x: torch.sum(x), "torch.sum is not an elementwise operation"),
    (lambda x: x[0], "indexing"),
    (lambda x: x if x > 0 else -x, "data-dependent Python control flow"),
    (lambda x: x.add_(1), "in-place"),
    (lambda x: torch.add(x, 1, out=x), "out="),
    (lambda x: x.to("cuda"), "only dtype casts"),
    (lambda x: x.shape, ".shape"),
    (lambda x: 3.0, "outputs must be tensor expressions"),
    (lambda x: torch.div(x, 2, rounding_mode="floor"), "rounding_mode"),
    (lambda x: x & 1.5, "does not accept"),
])
def test_unsupported_operations_raise_type_error_naming_them(fn, message):
    with pytest.raises(TypeError, match=message):
        E.trace(fn, "f", (T(F32),))


def test_inplace_operator_raises():
    def f(x):
        x += 1
        return x

    with pytest.raises(TypeError, match="in-place"):
        E.trace(f, "f", (T(F32),))


def test_closed_over_tensor_raises():
    w = torch.ones(3)
    with pytest.raises(TypeError, match="pass it as an argument"):
        E.trace(lambda x: x * w, "f", (T(F32),))


def test_output_of_only_numbers_raises():
    with pytest.raises(TypeError, match="only on Python numbers"):
        E.trace(lambda x, s: s * 2, "f", (T(F32), S(float)))
