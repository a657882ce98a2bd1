"""Top-k: ``opforge.topk(input, k, dim=-1, largest=True, sorted=True)`` ->
``(values, indices)`` as ``torch.topk``.

Results are always sorted (best first); among equal values the lower index
comes first (torch leaves tie order unspecified). Any float dtype; ``dim``
moved last (a copy only when that view has no unit stride). The gradient
of ``values`` scatters back to the chosen positions (plain torch).

Registry op ``topk`` args ``(input, k, dim, largest)``; variants
``triton_row`` (rows of up to 4096 held in registers, ``k <= 64``: MoE
gating and sampling), ``torch_eager`` (CUDA) and ``reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opforge.kernels import topk as K
from opforge.ops.checks import check_dim, check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, norm_dim, rows_view

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
WHERE = "opforge.topk"


def reference(x, k, dim=-1, largest=True):
    return torch.topk(x, k, dim, largest, True)


def validate(x, k, dim=-1, largest=True) -> None:
    check_tensor(WHERE, "input", x)
    check_dim(WHERE, x, dim)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{WHERE}: k must be an int, got {type(k).__name__}")
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise ValueError(f"{WHERE}: k must be in [0, {size}] (the size of dim {dim}), got {k}")


@dataclass(frozen=True, slots=True)
class Geometry:
    """The input as ``[rows, cols]`` with ``dim`` last, and the static arguments."""

    rows: int
    cols: int
    k: int
    dim: int
    largest: bool


def geometry(x, k, dim=-1, largest=True) -> Geometry:
    d = norm_dim(x, dim) if x.dim() else 0
    cols = x.shape[d] if x.dim() else 1
    return Geometry(x.numel() // cols if cols else 0, cols, k, dim, largest)


def row_run(g: Geometry, cfg, x, k, dim=-1, largest=True):
    xm = x.movedim(dim, -1) if x.dim() else x.reshape(1)
    lead = xm.shape[:-1]
    values = torch.empty((*lead, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((*lead, k), dtype=torch.int64, device=x.device)
    K.launch_topk(rows_view(xm, -1), values.view(-1, k), indices.view(-1, k), k, largest, cfg)
    if x.dim() == 0:
        return values.reshape(()), indices.reshape(())
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def row_check(g: Geometry) -> str | None:
    if g.cols > K.ROW_LIMIT:
        return f"rows of {g.cols} exceed the register row limit {K.ROW_LIMIT}"
    if g.k > K.MAX_K:
        return f"k = {g.k} exceeds {K.MAX_K} (one register pass per pick)"
    return None


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.cols)}:k{g.k}"


SPECS = [
    Spec("triton_row", row_run, version=K.VERSION, dtypes=FLOATS, check=row_check,
         configs=lambda g: K.configs(g.rows, g.cols), default_config=lambda g: K.default_config(g.rows, g.cols),
         bucket=bucket, description="whole rows in registers, k max-and-mask passes; ties to the lower index"),
    Spec("torch_eager", lambda g, cfg, *a: reference(*a), kind="vendor", devices=("cuda",), dtypes=FLOATS,
         bucket=bucket, description="torch.topk"),
    Spec("reference", lambda g, cfg, *a: reference(*a), kind="reference", devices=("cpu", "cuda"),
         description="torch.topk (the oracle and the CPU fallback)"),
]


def sample_inputs(device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(8)
    # distinct values: tie order is where torch and the kernel may differ
    return [(torch.randperm(37 * 8, generator=g).reshape(37, 8).to(dt).to(device), 2, -1, True)
            for dt in (torch.float32, torch.float64)] + \
        [(torch.randperm(6 * 300, generator=g).reshape(6, 300).float().to(device), 5, 1, False)]


OP = registry.register_op(
    "topk", SPECS, geometry=geometry, reference=reference, tensors=lambda x, *rest: (x,),
    memo_key=lambda x, *rest: (x.dtype, x.shape, x.stride(), x.device, *rest),
    dtype_key=lambda x, *rest: f"{x.dtype}".replace("torch.", ""), validate=validate, samples=sample_inputs,
    doc="the k largest (or smallest) values along a dim, with their indices")


def _setup(ctx, inputs, output):
    x, k, dim, largest = inputs
    ctx.save_for_backward(output[1])
    ctx.shape, ctx.dim = x.shape, dim


def _backward(ctx, gv, gi):
    (indices,) = ctx.saved_tensors
    gx = gv.new_zeros(ctx.shape)
    return (gx.scatter_(ctx.dim, indices, gv) if gx.dim() else gv.clone()), None, None, None


define("topk(Tensor input, int k, int dim, bool largest) -> (Tensor, Tensor)",
       lambda *a: dispatch.call(OP, *a),
       lambda x, k, dim, largest: (validate(x, k, dim, largest),
                                   *(t.new_empty(t.shape) for t in _fake_shapes(x, k, dim)))[1:],
       _backward, _setup)


def _fake_shapes(x, k, dim):
    shape = list(x.shape)
    if shape:
        shape[norm_dim(x, dim)] = k
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


_packet = torch.ops.opforge.topk.default


def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """``torch.topk`` (always sorted, ties to the lower index); differentiable in the values."""
    if direct_ok(input) and type(k) is int and type(dim) is int:
        return dispatch.call(OP, input, k, dim, bool(largest))
    validate(input, k, dim, largest)
    return _packet(input, k, dim, bool(largest))


__all__ = ["topk"]
