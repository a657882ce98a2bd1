"""Symbolic differentiation of a traced program: the backward program.

Reverse mode over the DAG: each primitive states the derivative of its
output in each operand as more DAG nodes (``_RULES``), built in a copy of
the forward graph, so the backward program reads the forward's inputs and
the output gradients and *recomputes* every forward intermediate it needs
in registers -- one kernel, nothing saved but the inputs. Hash-consing
shares what forward and backward have in common (e.g. ``sigmoid(x)`` in
silu's derivative).

Formulas follow torch's autograd (``derivatives.yaml``): ``maximum`` splits
the gradient at ties, ``clamp`` passes it where ``min <= x <= max``,
``relu`` where the output is positive, ``pow`` gives 0 for a zero exponent.
Gradients accumulate without intermediate casts (computed in fp32 or fp64
and rounded once, at the store). Python-number arguments, integer and bool
values get no gradient.

``needs[i]`` for tensor input ``i``: 0 no gradient; 1 a gradient of the
input's shape and dtype; 2 a broadcast input: the full-shape gradient is
written in fp32 (fp64 for fp64) and summed to the input's shape afterwards.
"""

from __future__ import annotations

import math

import torch

from opforge.fusion.expr import Graph, Program

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_INV_SQRT_PI = 2.0 / math.sqrt(math.pi)
_GELU_BETA = math.sqrt(2.0) * 2.0 / math.sqrt(math.pi) * 0.5
_GELU_KAPPA = 0.044715


class _B:
    """Node-building shorthand over one graph."""

    def __init__(self, g: Graph):
        self.g = g

    def __call__(self, op, *xs, **attrs) -> int:
        return self.g.apply(op, tuple(self._id(x) for x in xs), "opforge.fuse (backward)", **attrs)

    def _id(self, x) -> int:
        return x if isinstance(x, _Id) else self.g.const(x)


class _Id(int):
    """A node id (plain ints passed to the builder are constants)."""


def _rules(b: _B, n, out: _Id, g: _Id):
    """[(operand id, gradient id)] for node ``n`` with output ``out`` and upstream ``g``."""
    def B(op, *xs, **kw):
        return _Id(b(op, *xs, **kw))

    a = [_Id(i) for i in n.args]
    op = n.op
    if op == "add":
        return [(a[0], g), (a[1], g)]
    if op == "sub":
        return [(a[0], g), (a[1], B("neg", g))]
    if op == "mul":
        return [(a[0], B("mul", g, a[1])), (a[1], B("mul", g, a[0]))]
    if op == "div":
        return [(a[0], B("div", g, a[1])), (a[1], B("neg", B("div", B("mul", g, a[0]), B("mul", a[1], a[1]))))]
    if op == "pow":
        base, expo = a
        e = b.g.nodes[expo]
        pairs = []
        if not (e.op == "const" and e.value == 0):
            d = B("mul", B("mul", g, expo), B("pow", base, B("sub", expo, 1)))
            if e.op != "const":
                d = B("where", B("eq", expo, 0), 0.0, d)
            pairs.append((base, d))
        if not e.weak:
            d = B("mul", B("mul", g, out), B("log", base))
            pairs.append((expo, B("where", B("and", B("eq", base, 0.0), B("ge", expo, 0.0)), 0.0, d)))
        return pairs
    if op == "neg":
        return [(a[0], B("neg", g))]
    if op == "abs":
        return [(a[0], B("mul", g, B("sign", a[0])))]
    if op == "relu":
        return [(a[0], B("where", B("gt", out, 0), g, 0))]
    if op == "exp":
        return [(a[0], B("mul", g, out))]
    if op == "log":
        return [(a[0], B("div", g, a[0]))]
    if op == "log1p":
        return [(a[0], B("div", g, B("add", a[0], 1.0)))]
    if op == "expm1":
        return [(a[0], B("mul", g, B("add", out, 1.0)))]
    if op == "sqrt":
        return [(a[0], B("div", g, B("mul", out, 2.0)))]
    if op == "rsqrt":
        return [(a[0], B("mul", B("mul", g, -0.5), B("mul", B("mul", out, out), out)))]
    if op == "sigmoid":
        return [(a[0], B("mul", g, B("mul", out, B("sub", 1.0, out))))]
    if op == "tanh":
        return [(a[0], B("mul", g, B("sub", 1.0, B("mul", out, out))))]
    if op == "erf":
        return [(a[0], B("mul", B("mul", g, _TWO_INV_SQRT_PI), B("exp", B("neg", B("mul", a[0], a[0])))))]
    if op == "silu":
        s = B("sigmoid", a[0])
        return [(a[0], B("mul", g, B("mul", s, B("add", 1.0, B("mul", a[0], B("sub", 1.0, s))))))]
    if op == "gelu":
        x = a[0]
        if n.attr("approximate") == "tanh":
            x2 = B("mul", x, x)
            inner = B("mul", _GELU_BETA, B("add", x, B("mul", _GELU_KAPPA, B("mul", x2, x))))
            t = B("tanh", inner)
            left_d = B("mul", 0.5, B("add", 1.0, t))
            right_d = B("mul", B("mul", B("mul", 0.5, x), B("sub", 1.0, B("mul", t, t))),
                        B("mul", _GELU_BETA, B("add", 1.0, B("mul", 3.0 * _GELU_KAPPA, x2))))
            return [(x, B("mul", g, B("add", left_d, right_d)))]
        cdf = B("mul", 0.5, B("add", 1.0, B("erf", B("mul", x, _SQRT1_2))))
        pdf = B("mul", B("exp", B("mul", -0.5, B("mul", x, x))), _INV_SQRT_2PI)
        return [(x, B("mul", g, B("add", cdf, B("mul", x, pdf))))]
    if op == "where":
        return [(a[1], B("where", a[0], g, 0)), (a[2], B("where", a[0], 0, g))]
    if op in ("maximum", "minimum"):
        lose_a, lose_b = ("lt", "gt") if op == "maximum" else ("gt", "lt")
        half = B("div", g, 2)
        tie = B("eq", a[0], a[1])
        return [(a[0], B("where", tie, half, B("where", B(lose_a, a[0], a[1]), 0, g))),
                (a[1], B("where", tie, half, B("where", B(lose_b, a[0], a[1]), 0, g)))]
    if op == "clamp":
        x, rest = a[0], list(a[1:])
        lo = rest.pop(0) if n.attr("has_lo") else None
        hi = rest.pop(0) if n.attr("has_hi") else None
        keep = None
        pairs = []
        if lo is not None:
            keep = B("ge", x, lo)
            pairs.append((lo, B("where", B("lt", x, lo), g, 0)))
        if hi is not None:
            below = B("le", x, hi)
            keep = below if keep is None else B("and", keep, below)
            pairs.append((hi, B("where", B("gt", x, hi), g, 0)))
        return [(x, B("where", keep, g, 0))] + pairs
    if op == "cast":
        return [(a[0], g)]
    return []  # comparisons, bitwise ops, sign: no gradient


def backward_program(fwd: Program, needs: tuple[int, ...]) -> Program:
    """The program computing the gradients of ``fwd``'s inputs marked in ``needs``
    from its inputs (kernel inputs 0..k-1) and the gradients of its floating
    outputs (kernel inputs k..)."""
    graph = fwd.graph.copy()
    b = _B(graph)
    nodes = graph.nodes
    wanted = {fwd.inputs[i] for i, need in enumerate(needs) if need}
    # Nodes whose value depends on an input that wants a gradient.
    live: set[int] = set()
    for n in fwd.order():
        if n.id in wanted or any(x in live for x in n.args):
            live.add(n.id)

    adj: dict[int, int] = {}

    def accumulate(target: int, grad: int) -> None:
        t = nodes[target]
        if target not in live or t.weak or not t.dtype.is_floating_point:
            return
        adj[target] = grad if target not in adj else b.g.apply("add", (adj[target], grad))

    grad_inputs = []
    for k, o in enumerate(fwd.outputs):
        node = nodes[o]
        if node.dtype.is_floating_point:
            gi = graph.input(len(fwd.inputs) + len(grad_inputs), fwd.out_dtypes[k], node.dim0)
            grad_inputs.append(gi)
            accumulate(o, gi)

    for n in reversed(fwd.order()):
        if n.id not in adj or n.op in ("input", "scalar", "const"):
            continue
        for operand, grad in _rules(b, n, _Id(n.id), _Id(adj[n.id])):
            accumulate(operand, grad)

    outputs, out_dtypes = [], []
    for i, need in enumerate(needs):
        if not need:
            continue
        nid = fwd.inputs[i]
        dt = nodes[nid].dtype
        if need == 2 and dt in (torch.float16, torch.bfloat16):
            dt = torch.float32
        grad = adj.get(nid)
        if grad is None:  # the output does not depend on this input (differentiably)
            grad = graph.apply("cast", (graph.const(0),), dtype=dt)
        outputs.append(grad)
        out_dtypes.append(dt)
    return Program(f"{fwd.name}_backward", graph, list(fwd.inputs) + grad_inputs, list(fwd.scalars),
                   outputs, out_dtypes)
