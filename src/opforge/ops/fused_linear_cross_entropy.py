"""Fused linear cross-entropy: ``opforge.fused_linear_cross_entropy(hidden, weight,
target, bias=None, ignore_index=-100, reduction="mean", label_smoothing=0.0)``.

The loss ``F.cross_entropy(hidden @ weight.T + bias, target, ...)`` of an LM
head, computed without ever holding the ``[tokens, vocab]`` logits: the rows
are taken in chunks; each chunk's logits are one GEMM (``opforge.matmul``),
then ``cross_entropy_fused`` writes the chunk's loss rows and the gradient
of the reduced loss with respect to those logits in one kernel, and two more
GEMMs turn that into the chunk's ``d hidden`` and add its share of ``d
weight`` (for 16-bit inputs on CUDA the three GEMMs are cuBLAS's, see
``vendor_gemms``). The logits come out of their GEMM in fp32 (fp64 for fp64), so the
loss is as accurate as fp32 allows (the unfused model rounds its logits to
bf16 first); their gradient goes back to the input dtype for the GEMMs. Only one chunk's logits and their gradient are alive at a time
(about 256 MiB by default), against ``tokens x vocab`` for logits + loss +
their gradients (8192 x 128256 in bf16: 2 GiB each) in the unfused model.

So the gradients are computed in the forward (when hidden or weight needs
one) and the backward only scales them by the loss's incoming gradient
(skipped when it is 1, the usual ``loss.backward()``). The loss is fp32 for
16-bit inputs (transformers upcasts the logits before its loss), fp64 for
fp64; ``reduction`` is ``"mean"`` (over rows whose target is not
``ignore_index``) or ``"sum"``. ``hidden`` is ``[..., H]`` and ``target``
its leading shape; ``weight`` ``[V, H]``, ``bias`` ``[V]``. The weight's
gradient is accumulated over chunks in fp32 (a bf16 sum over eight chunks
lost 1 % of its accuracy; the fp32 buffer costs ``V x H x 4`` bytes, 1 GiB
for Llama-3's head, while the head runs), updated in place by cuBLAS or, through
opforge's GEMM, in vocabulary slices of at most 256 MiB: a GEMM with a residual
writes a new output, so a single buffer would be held twice (2 GiB) during every
chunk's update.

Registry op ``fused_linear_cross_entropy``, args ``(hidden, weight, target,
ignore_index, label_smoothing, reduction, need_grad, chunk_rows, bias=None)``
-> ``(loss, d_hidden, d_weight, d_bias)`` (empty gradients when
``need_grad`` is false or no bias); variants ``chunked`` (the GEMMs and the
cross-entropy kernels through opforge's dispatch) and ``reference`` (the
whole logits in plain torch and torch autograd: the oracle).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from opforge.ops import cross_entropy as CE
from opforge.ops.checks import check_tensor
from opforge.ops.library import define
from opforge.ops.matmul import matmul
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, pow2

NAME = "fused_linear_cross_entropy"
WHERE = f"opforge.{NAME}"
FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
ACCEPTED = FLOATS | CE.TARGET_DTYPES
REDUCTIONS = ("mean", "sum")
CHUNK_BYTES = 1 << 28  # one chunk's logits (and as much again for their gradient)
DW_SLICE_BYTES = 1 << 28  # the fp32 weight gradient is replaced this much at a time (see chunked_run)


# ---------------------------------------------------------------------------
# Reference semantics (plain torch)
# ---------------------------------------------------------------------------
def reference(hidden, weight, target, ignore_index, label_smoothing, reduction, need_grad, chunk_rows, bias=None):
    """The whole logits in the loss dtype, the gradients in closed form (an op's
    implementation runs below autograd): ``d logits = (softmax - (1 - eps) onehot
    - eps / V) * row scale``, zero on ignored rows."""
    dtype = CE.stats_dtype(hidden.dtype)
    h = hidden.detach().reshape(-1, hidden.shape[-1]).to(dtype)
    w = weight.detach().to(dtype)
    logits = F.linear(h, w, None if bias is None else bias.detach().to(dtype))
    t = target.reshape(-1).long()
    active = t != ignore_index
    safe = torch.where(active, t, torch.zeros_like(t))
    lse = torch.logsumexp(logits, -1)
    eps, vocab = float(label_smoothing), logits.shape[-1]
    rows = (1 - eps) * (lse - logits.gather(1, safe[:, None])[:, 0]) + eps * (lse - logits.mean(-1))
    scale = 1 / active.sum().to(dtype) if reduction == "mean" else torch.ones((), dtype=dtype, device=h.device)
    loss = torch.where(active, rows, torch.zeros_like(rows)).sum() * scale
    if not need_grad:
        return loss, *_no_grads(hidden, weight, bias)
    d = torch.softmax(logits, -1) - eps / vocab
    d.scatter_add_(1, safe[:, None], torch.full_like(d[:, :1], -(1 - eps)))
    d *= (active.to(dtype) * scale)[:, None]
    db = d.sum(0).to(bias.dtype) if bias is not None else weight.new_empty(0)
    return loss, (d @ w).to(hidden.dtype).reshape(hidden.shape), (d.t() @ h).to(weight.dtype), db


def _no_grads(hidden, weight, bias):
    return hidden.new_empty(0), weight.new_empty(0), weight.new_empty(0)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate(hidden, weight, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", need_grad=False,
             chunk_rows=0, bias=None) -> None:
    for arg, t in (("hidden", hidden), ("weight", weight)):
        check_tensor(WHERE, arg, t)
        if t.dtype not in FLOATS:
            raise TypeError(f"{WHERE}: {arg} must be fp16, bf16, fp32 or fp64, got {t.dtype}")
    if hidden.dim() < 1:
        raise ValueError(f"{WHERE}: hidden must be [..., H], got a 0-dim tensor")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{WHERE}: weight must be [V, H] with H = hidden.shape[-1] = {hidden.shape[-1]}, "
                         f"got {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{WHERE}: weight is {weight.dtype} but hidden is {hidden.dtype}; they must match")
    if not isinstance(target, torch.Tensor) or target.dtype not in CE.TARGET_DTYPES:
        raise TypeError(f"{WHERE}: target must be a tensor of class indices (int64, int32 or uint8), got "
                        f"{getattr(target, 'dtype', type(target).__name__)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{WHERE}: target has shape {tuple(target.shape)}; expected hidden's leading shape "
                         f"{tuple(hidden.shape[:-1])}")
    if bias is not None:
        check_tensor(WHERE, "bias", bias)
        if bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype:
            raise ValueError(f"{WHERE}: bias must be [{weight.shape[0]}] of {weight.dtype}, got "
                             f"{tuple(bias.shape)} of {bias.dtype}")
    for arg, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{WHERE}: {arg} is on {t.device} but hidden is on {hidden.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{WHERE}: reduction must be 'mean' or 'sum' (per-row losses would need the gradient "
                         f"per row: use opforge.cross_entropy), got {reduction!r}")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 0:
        raise ValueError(f"{WHERE}: chunk_rows must be an int >= 0 (0: chosen from the vocabulary), got {chunk_rows!r}")
    CE.validate_scalars(WHERE, ignore_index, label_smoothing)


# ---------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """Rows (tokens), hidden size, vocabulary; the chunk height in rows."""

    rows: int
    hidden: int
    vocab: int
    chunk: int
    need_grad: bool


def default_chunk(rows: int, vocab: int, itemsize: int) -> int:
    """A power of two of rows whose logits fit ``CHUNK_BYTES`` (at least 16 rows)."""
    fit = max(16, CHUNK_BYTES // max(1, vocab * itemsize))
    return max(1, min(pow2(max(rows, 1)), 1 << (fit.bit_length() - 1)))


def vocab_slices(vocab: int, hidden: int, itemsize: int) -> list[tuple[int, int]]:
    """Row ranges of the weight gradient of at most ``DW_SLICE_BYTES`` each (its accumulator dtype)."""
    rows = max(1, DW_SLICE_BYTES // max(1, hidden * itemsize))
    return [(v, min(v + rows, vocab)) for v in range(0, vocab, rows)]


def geometry(hidden, weight, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", need_grad=False,
             chunk_rows=0, bias=None) -> Geometry:
    rows = target.numel()
    vocab = weight.shape[0]
    chunk = chunk_rows or default_chunk(rows, vocab, CE.stats_dtype(hidden.dtype).itemsize)
    return Geometry(rows, hidden.shape[-1], vocab, chunk, need_grad)


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def chunked_run(g: Geometry, cfg, hidden, weight, target, ignore_index, eps, reduction, need_grad, chunk_rows,
                bias=None):
    dtype = CE.stats_dtype(hidden.dtype)
    h2, t1 = hidden.reshape(-1, g.hidden), target.reshape(-1)
    CE.check_target_range(t1, g.vocab, ignore_index, WHERE)
    if reduction == "mean":
        scale = torch.reciprocal((t1 != ignore_index).sum().to(dtype)).reshape(1)
    else:
        scale = torch.ones(1, dtype=dtype, device=hidden.device)
    total = torch.zeros((), dtype=dtype, device=hidden.device)
    dh = torch.empty_like(h2) if need_grad else None
    vendor = vendor_gemms(hidden)
    # d weight in vocabulary slices: each chunk's GEMM writes a new accumulator
    # (residual + product), so one slice is doubled at a time, not the whole V x H x 4;
    # cuBLAS adds into one accumulator in place
    if not need_grad:
        slices = []
    elif vendor:
        slices = [(0, g.vocab)]
    else:
        slices = vocab_slices(g.vocab, g.hidden, dtype.itemsize)
    dws = [torch.zeros((v1 - v0, g.hidden), dtype=dtype, device=weight.device) for v0, v1 in slices]
    db = torch.zeros(g.vocab, dtype=dtype, device=hidden.device) if need_grad and bias is not None else None
    wt = weight.t()
    for start in range(0, g.rows, g.chunk):
        h, t = h2[start:start + g.chunk], t1[start:start + g.chunk]
        logits = _logits(h, wt, bias, dtype, vendor)
        if not need_grad:
            stats = dispatch.call(CE.FORWARD_OP, logits, t, ignore_index, eps, None)
            total += stats[0].sum()
            continue
        stats = torch.empty((3, h.shape[0]), dtype=dtype, device=hidden.device)
        dlogits = dispatch.call(CE.FUSED_OP, logits, t, stats, scale, ignore_index, eps, None).to(hidden.dtype)
        del logits
        total += stats[0].sum()
        dlogits_t = dlogits.t()
        if vendor:
            torch.mm(dlogits, weight, out=dh[start:start + g.chunk])
            torch.addmm(dws[0], dlogits_t, h, out_dtype=dtype, out=dws[0])
        else:
            dh[start:start + g.chunk] = matmul(dlogits, weight)
            for i, (v0, v1) in enumerate(slices):
                dws[i] = matmul(dlogits_t[v0:v1], h, residual=dws[i], out_dtype=dtype)
        if db is not None:
            db += dlogits.sum(0, dtype=dtype)
    loss = total * scale[0]
    if not need_grad:
        return loss, *_no_grads(hidden, weight, bias)
    db = db.to(weight.dtype) if db is not None else weight.new_empty(0)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    for i, (v0, v1) in enumerate(slices):
        dw[v0:v1] = dws[i]
        dws[i] = None  # freed as it is copied
    return loss, dh.reshape(hidden.shape), dw, db


def vendor_gemms(hidden: torch.Tensor) -> bool:
    """The chunk GEMMs through cuBLAS (aten's ``mm`` / ``addmm`` with ``out_dtype``)
    for 16-bit inputs on CUDA. Their shapes are the hard ones for a tiled kernel:
    ``d hidden`` has K = vocab with few output tiles (cuBLAS splits K), and
    ``d weight`` adds a K = chunk product into the fp32 accumulator, which
    cuBLAS does in place (beta = 1) where our GEMM writes a new residual output.
    On the H200, Llama-3's head (8192 x 2048 x 128256) spent 35 ms a step in this op
    through opforge's GEMMs against 27 ms for Liger's cuBLAS chunks."""
    return hidden.is_cuda and hidden.dtype in (torch.float16, torch.bfloat16)


def _logits(h, wt, bias, dtype, vendor: bool):
    """One chunk's logits in the loss dtype, straight from the GEMM's accumulator."""
    if not vendor:
        return matmul(h, wt, bias=bias, out_dtype=dtype)
    logits = torch.mm(h, wt, out_dtype=dtype)
    return logits if bias is None else logits.add_(bias)


def reference_run(g: Geometry, cfg, *args):
    CE.check_target_range(args[2].reshape(-1), g.vocab, args[3], WHERE)
    return reference(*args)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.hidden)}x{bucket_size(g.vocab)}:{'g' if g.need_grad else 'f'}"


SPECS = [
    Spec("chunked", chunked_run, version="1", dtypes=ACCEPTED, devices=("cuda",), bucket=bucket,
         description="row chunks: the logits GEMM, the fused loss + logits-gradient kernel, then the d hidden and "
                     "d weight GEMMs; one chunk of logits alive at a time"),
    Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
         description="plain torch: the whole logits and torch autograd (the oracle and the CPU fallback)"),
]


# ---------------------------------------------------------------------------
# Selftest inputs, registration, torch.library op and autograd
# ---------------------------------------------------------------------------
def sample_inputs(device: torch.device) -> list[tuple]:
    """Chunked rows with ignored targets, a bias, sum and mean, with and without gradients."""
    g = torch.Generator(device="cpu").manual_seed(30)
    out = []
    for dt in (torch.float32, torch.bfloat16):
        h = torch.randn((3, 11, 32), generator=g).to(dt).to(device)
        w = (torch.randn((67, 32), generator=g) / 6).to(dt).to(device)
        t = torch.randint(0, 67, (3, 11), generator=g)
        t[0, :4] = -100
        t = t.to(device)
        b = torch.randn(67, generator=g).to(dt).to(device)
        out += [(h, w, t, -100, 0.0, "mean", True, 8), (h, w, t, -100, 0.1, "sum", False, 16, b),
                (h, w, t, -100, 0.0, "mean", True, 0, b)]
    return out


def _key(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _memo_key(hidden, weight, target, *rest):
    scalars, bias = rest[:5], rest[5] if len(rest) > 5 else None
    return (_key(hidden), _key(weight), _key(target), *scalars, _key(bias))


def _tensors(hidden, weight, target, *rest):
    bias = rest[5] if len(rest) > 5 else None
    return tuple(t for t in (hidden, weight, target, bias) if t is not None)


OP = registry.register_op(
    NAME, SPECS, geometry=geometry, reference=reference, tensors=_tensors, memo_key=_memo_key,
    dtype_key=lambda hidden, *rest: f"{hidden.dtype}".replace("torch.", ""), validate=validate,
    samples=sample_inputs, doc="cross-entropy of an LM head's logits, computed in row chunks with its gradients")


def _impl(hidden, weight, target, bias, ignore_index, label_smoothing, reduction, need_grad, chunk_rows):
    return dispatch.call(OP, hidden, weight, target, ignore_index, label_smoothing, reduction, need_grad,
                         chunk_rows, bias)


def _fake(hidden, weight, target, bias, ignore_index, label_smoothing, reduction, need_grad, chunk_rows):
    validate(hidden, weight, target, ignore_index, label_smoothing, reduction, need_grad, chunk_rows, bias)
    loss = hidden.new_empty((), dtype=CE.stats_dtype(hidden.dtype))
    if not need_grad:
        return loss, *_no_grads(hidden, weight, bias)
    db = torch.empty_like(bias) if bias is not None else weight.new_empty(0)
    return loss, torch.empty_like(hidden, memory_format=torch.contiguous_format), torch.empty_like(weight), db


def _setup(ctx, inputs, output):
    _, dh, dw, db = output
    ctx.save_for_backward(dh, dw, db)
    ctx.mark_non_differentiable(dh, dw, db)
    ctx.has_bias = inputs[3] is not None


def _scaled(grad, g):
    """``g`` times the loss's incoming gradient; ``g`` itself when that is 1 (a
    real tensor only: one scalar read, as ``loss.backward()`` always passes 1)."""
    if g.numel() == 0:
        return None
    if CE._concrete(grad) and bool(grad == 1):
        return g
    return g * grad.to(g.dtype)


def _backward(ctx, grad, *unused):
    dh, dw, db = ctx.saved_tensors
    return (_scaled(grad, dh), _scaled(grad, dw), None, _scaled(grad, db) if ctx.has_bias else None,
            None, None, None, None, None)


define(f"{NAME}(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, float label_smoothing, "
       f"str reduction, bool need_grad, int chunk_rows) -> (Tensor, Tensor, Tensor, Tensor)",
       _impl, _fake, _backward, _setup)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                               label_smoothing: float = 0.0, chunk_rows: int = 0) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias), target, ...)`` (flattened
    rows) without the full logits; differentiable in hidden, weight and bias."""
    need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    validate(hidden, weight, target, ignore_index, label_smoothing, reduction, need_grad, chunk_rows, bias)
    out = torch.ops.opforge.fused_linear_cross_entropy(hidden, weight, target, bias, ignore_index,
                                                       float(label_smoothing), reduction, need_grad, chunk_rows)
    return out[0]


__all__ = ["fused_linear_cross_entropy"]
