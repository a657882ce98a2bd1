"""Embedding: ``opforge.embedding(input, weight, padding_idx=None)`` as
``torch.nn.functional.embedding`` (no ``max_norm``, dense gradient).

``input`` holds int32 / int64 ids of any shape; ``weight`` is ``[V, H]``;
the output is ``[*input.shape, H]`` in the weight's dtype. The gradient of
``weight`` sums the rows of the tokens that used each id, deterministically
(the ids sorted, each run of equal ids summed in order in fp32 by one
program, written once: ``kernels/embedding.py``); the ``padding_idx`` row
gets none. Out-of-range ids raise for CPU tensors; on CUDA they are not
checked (a check would synchronise every call).

Registry ops: ``embedding`` args ``(input, weight, padding_idx)`` and
``embedding_backward`` args ``(grad, input, num_weights, padding_idx)``
(``padding_idx`` -1 for none); variants ``triton_gather`` /
``triton_sorted``, ``torch_eager`` (CUDA) and ``reference``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from opforge.kernels import embedding as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
IDS = frozenset({torch.int32, torch.int64})
WHERE = "opforge.embedding"


# ---------------------------------------------------------------------------
# Reference semantics (plain torch)
# ---------------------------------------------------------------------------
def embedding_ref(ids, weight, padding_idx=-1):
    return F.embedding(ids.long(), weight)


def embedding_backward_ref(grad, ids, num_weights, padding_idx=-1):
    flat = ids.reshape(-1).long()
    g = grad.reshape(flat.numel(), -1)
    acc = torch.zeros((num_weights, g.shape[1]), dtype=torch.promote_types(g.dtype, torch.float32), device=g.device)
    acc.index_add_(0, flat, g.to(acc.dtype))
    if padding_idx >= 0:
        acc[padding_idx] = 0
    return acc.to(grad.dtype)


REFERENCE = {"embedding": embedding_ref, "embedding_backward": embedding_backward_ref}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _check_ids(where, ids):
    if not isinstance(ids, torch.Tensor) or ids.dtype not in IDS:
        raise TypeError(f"{where}: input must be an int32 or int64 tensor of ids, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")


def validate(ids, weight, padding_idx=-1) -> None:
    _check_ids(WHERE, ids)
    check_tensor(WHERE, "weight", weight)
    if weight.dtype not in FLOATS:
        raise TypeError(f"{WHERE}: weight must be fp16, bf16, fp32 or fp64, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"{WHERE}: weight must be 2-D [num_embeddings, dim], got shape {tuple(weight.shape)}")
    if ids.device != weight.device:
        raise ValueError(f"{WHERE}: input is on {ids.device} but weight is on {weight.device}")
    if not -1 <= padding_idx < weight.shape[0]:
        raise ValueError(f"{WHERE}: padding_idx must be within num_embeddings {weight.shape[0]}, got {padding_idx}")


def validate_backward(grad, ids, num_weights, padding_idx=-1) -> None:
    where = "opforge.embedding_backward"
    _check_ids(where, ids)
    check_tensor(where, "grad", grad)
    if tuple(grad.shape[:-1]) != tuple(ids.shape):
        raise ValueError(f"{where}: grad has shape {tuple(grad.shape)}; expected {tuple(ids.shape)} + [dim]")


def check_ids(ids, num_weights: int) -> None:
    if ids.is_cuda or ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_weights:
        raise ValueError(f"{WHERE}: ids must lie in [0, {num_weights}), got [{lo}, {hi}]")


# ---------------------------------------------------------------------------
# Geometry and variants
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """Tokens (ids), the row width and the table's rows: all the kernels' grids need."""

    tokens: int
    hidden: int
    rows: int


def _forward_geometry(ids, weight, padding_idx=-1) -> Geometry:
    return Geometry(ids.numel(), weight.shape[1], weight.shape[0])


def _backward_geometry(grad, ids, num_weights, padding_idx=-1) -> Geometry:
    return Geometry(ids.numel(), grad.shape[-1], num_weights)


def gather_run(g: Geometry, cfg, ids, weight, padding_idx=-1):
    out = torch.empty((*ids.shape, g.hidden), dtype=weight.dtype, device=weight.device)
    K.launch_gather(ids.reshape(-1), weight if weight.stride(1) == 1 else weight.contiguous(),
                    out.view(-1, g.hidden), cfg)
    return out


def sorted_run(g: Geometry, cfg, grad, ids, num_weights, padding_idx=-1):
    dw = torch.zeros((num_weights, g.hidden), dtype=grad.dtype, device=grad.device)
    sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
    K.launch_scatter_sorted(sorted_ids, perm, grad.reshape(g.tokens, g.hidden).contiguous(), dw, padding_idx, cfg)
    return dw


def _eager(name):
    def run(g: Geometry, cfg, *args):
        if name == "embedding":
            return F.embedding(args[0], args[1])
        grad, ids, num_weights, padding_idx = args
        return torch.ops.aten.embedding_dense_backward(grad, ids, num_weights, padding_idx, False)
    return run


def _reference(name):
    return lambda g, cfg, *args: REFERENCE[name](*args)


def _default(g: Geometry):
    return K.default_config(g.hidden)


def _configs(g: Geometry):
    return K.configs(g.hidden)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.tokens)}x{bucket_size(g.hidden)}"


def specs(name: str) -> list[Spec]:
    first = (Spec("triton_gather", gather_run, version=K.VERSION, dtypes=FLOATS | IDS, configs=_configs,
                  default_config=_default, bucket=bucket, description="one program per token and column block")
             if name == "embedding" else
             Spec("triton_sorted", sorted_run, version=K.VERSION, dtypes=FLOATS | IDS, configs=_configs,
                  default_config=_default, bucket=bucket,
                  description="ids sorted; each run of equal ids summed in order by one program (deterministic)"))
    return [first,
            Spec("torch_eager", _eager(name), kind="vendor", devices=("cuda",), dtypes=FLOATS | IDS, bucket=bucket,
                 description="torch's embedding kernels"),
            Spec("reference", _reference(name), kind="reference", devices=("cpu", "cuda"),
                 description="plain torch (the oracle and the CPU fallback)")]


def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(17)
    out = []
    for dt in (torch.float32, torch.bfloat16):
        ids = torch.randint(0, 50, (3, 40), generator=g).to(device)
        if name == "embedding":
            out.append((ids, torch.randn((50, 96), generator=g).to(dt).to(device), -1))
        else:
            out.append((torch.randn((3, 40, 96), generator=g).to(dt).to(device), ids, 50, 7))
    return out


def _key(t):
    return (t.dtype, t.shape, t.stride(), t.device) if isinstance(t, torch.Tensor) else t


OPS = registry.register_family(
    ("embedding", "embedding_backward"), specs,
    geometry=lambda name: _forward_geometry if name == "embedding" else _backward_geometry,
    reference=REFERENCE.__getitem__,
    tensors=lambda name: lambda *a: tuple(t for t in a if isinstance(t, torch.Tensor)),
    memo_key=lambda name: lambda *a: tuple(map(_key, a)),
    dtype_key=lambda name: lambda *a: ",".join(str(t.dtype).replace("torch.", "") for t in a
                                               if isinstance(t, torch.Tensor)),
    validate=lambda name: validate if name == "embedding" else validate_backward,
    samples=lambda name: functools.partial(sample_inputs, name),
    doc=lambda name: "rows of a table by id" if name == "embedding" else "gradient of embedding in its table")


def _setup(ctx, inputs, output):
    ids, weight, padding_idx = inputs
    ctx.save_for_backward(ids)
    ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx


def _backward(ctx, grad):
    (ids,) = ctx.saved_tensors
    return None, torch.ops.opforge.embedding_backward(grad, ids, ctx.num_weights, ctx.padding_idx), None


define("embedding_backward(Tensor grad, Tensor input, int num_weights, int padding_idx) -> Tensor",
       lambda *a: dispatch.call(OPS["embedding_backward"], *a),
       lambda grad, ids, n, p: (validate_backward(grad, ids, n, p), grad.new_empty((n, grad.shape[-1])))[1])
define("embedding(Tensor input, Tensor weight, int padding_idx) -> Tensor",
       lambda *a: dispatch.call(OPS["embedding"], *a),
       lambda ids, w, p: (validate(ids, w, p), w.new_empty((*ids.shape, w.shape[1])))[1], _backward, _setup)
_packet = torch.ops.opforge.embedding.default


def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``F.embedding(input, weight, padding_idx)``; differentiable in weight."""
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    p = -1 if padding_idx is None else padding_idx
    validate(input, weight, p)
    check_ids(input, weight.shape[0])
    if direct_ok(weight):
        return dispatch.call(OPS["embedding"], input, weight, p)
    return _packet(input, weight, p)


__all__ = ["embedding"]
