"""Cross-entropy: ``opforge.cross_entropy(input, target, weight=None, ignore_index=-100,
reduction="mean", label_smoothing=0.0)`` as ``torch.nn.functional.cross_entropy``.

Class-index targets (int64 or uint8 as torch; int32 accepted too): input
``[N, C]`` with target ``[N]``, ``[C]`` with a 0-dim target, or
``[N, C, d1, ...]`` with target ``[N, d1, ...]``. Optional class ``weight``
``[C]`` of the input's dtype. Loss of a row with target ``t`` (torch's formula,
``aten/src/ATen/native/LossNLL.cpp``):

    (1 - eps) * w_t * (lse - x_t) + eps / C * sum_c w_c * (lse - x_c)

rows whose target is ``ignore_index`` give 0 (loss and gradient) and leave the
mean's denominator, which is ``sum of w_t`` over the other rows (their count
without weights); all rows ignored: the mean is NaN, as torch's. The result has
the input's dtype (arithmetic in fp32, fp64 for fp64). Probability targets (a
float target of the input's shape) are supported in plain torch ops (torch's
``log_softmax`` and elementwise ops, as torch defines them), not by the kernels.

Out-of-range targets (not ``ignore_index``, not in ``[0, C)``) raise a
``ValueError`` for CPU tensors. For CUDA tensors they are not checked (a check
would synchronise with the device on every call): the kernels clamp the index
they load, so such a row gives an unspecified loss and never a memory fault.

Layout. The class dim moves last: ``[rows, C]`` with unit column stride, a
view when the input allows it (``[N, C]`` with any row stride; a channels-last
``[N, C, d...]``), else one contiguous copy. The gradient is allocated dense in
that moved layout and returned moved back (same values and shape as torch's).

Registry ops (dispatched, tuned and selftested like every op):

* ``cross_entropy_forward`` args ``(input, target, ignore_index, label_smoothing,
  weight=None)`` -> ``[3, rows]`` fp32 (fp64 for fp64 input): per-row loss (not
  reduced), row max ``m`` and ``log(sum(exp(x - m)))``; ``lse = m + log-sum``
  is kept as two numbers for accuracy near 1e4 (see ``kernels/cross_entropy.py``).
  Ignored rows: zeros. Variants: ``triton_online`` (one pass of online max /
  sum over column blocks, several short rows per program; steps aside for a
  few long rows), ``triton_split`` (each row cut into chunks reduced by
  separate programs, then combined: fills the GPU when rows are fewer than its
  SMs), ``torch_eager`` (CUDA) and ``reference``.
* ``cross_entropy_backward`` args ``(grad, input, target, stats, ignore_index,
  label_smoothing, weight=None)`` -> ``dinput`` (``grad`` is the per-row loss
  gradient, ``stats`` the forward's output). Variants: ``triton_tiled`` (one
  read of the logits, one write of the gradient, softmax recomputed from the
  saved statistics), ``torch_eager`` (CUDA) and ``reference``.

* ``cross_entropy_fused`` args ``(input, target, stats_out, scale,
  ignore_index, label_smoothing, weight=None)`` -> the gradient of the reduced
  loss ``scale * sum(loss rows)``, written in the same kernel that computes the
  statistics (into ``stats_out``, the one argument a variant writes).
  Variants: ``triton_fused`` (the online forward, then a second sweep of the
  row, last block first so that it mostly hits L2, writing the gradient),
  ``torch_eager`` (CUDA) and ``reference``.

The optional tensor comes last in the registry arguments because selftest
drops ``None`` arguments before calling the reference.

Autograd, two paths:

* Fused (a ``mean`` / ``sum`` loss of a plain tensor that requires grad, in
  eager mode, whose rows fill the GPU): ``torch.ops.opforge.cross_entropy_fused``
  returns the statistics and the gradient of the loss for a unit incoming
  gradient; the loss is ``sum(rows) * scale`` (``scale`` = 1, or 1 / the mean's
  denominator, on the device: no sync). The backward hands the saved gradient
  back when the rows' incoming gradient equals ``scale`` (``loss.backward()``;
  one scalar compare, which reads one value from the device), else rescales
  each row (one more pass). One read of the logits from HBM in the common case
  (the second sweep mostly hits L2) and one write; memory: one logits-sized
  buffer, allocated at the forward instead of the backward.
* Separate (``reduction="none"``, ``torch.compile``, few long rows, other
  modes): ``torch.ops.opforge.cross_entropy_forward`` saves the input, target,
  weight and its own output; its backward calls ``cross_entropy_backward`` with
  the gradient of the loss row (one read, one write).

The statistics rows (and the fused op's gradient output) are auxiliary
outputs treated as constants: their incoming gradient is ignored. The
reduction over rows is plain torch over the ``[rows]`` losses: a fixed-order,
deterministic sum. ``weight`` gets no gradient (torch gives none either), and
double backward is not supported. By design an ignored row's gradient is
exactly 0 even when its logits hold NaN (its logits are never read; torch's
gradient there is NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from opforge.kernels import cross_entropy as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import device as devmod
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, empty_moved, rows_view

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
TARGET_DTYPES = frozenset({torch.int64, torch.uint8, torch.int32})
REDUCTIONS = ("none", "mean", "sum")
WHERE = "opforge.cross_entropy"


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Per-row losses and statistics: fp64 for fp64 input, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def class_dim(x: torch.Tensor) -> int:
    return 1 if x.dim() >= 2 else 0


def num_classes(x: torch.Tensor) -> int:
    return x.shape[class_dim(x)]


def expected_target_shape(x: torch.Tensor) -> tuple[int, ...]:
    if x.dim() == 1:
        return ()
    return (x.shape[0],) + tuple(x.shape[2:])


def _num_rows(x: torch.Tensor) -> int:
    return math.prod(expected_target_shape(x))


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _rows_plain(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(class_dim(x), -1).reshape(-1, num_classes(x))


def _forward_math(x, target, ignore_index, label_smoothing, weight, dtype):
    """Per-row loss, max and log-sum in ``dtype`` (torch's formula, written out)."""
    x2 = _rows_plain(x).to(dtype)
    rows, cols = x2.shape
    t = target.reshape(-1).long()
    out = torch.zeros((3, rows), dtype=dtype, device=x.device)
    if rows == 0 or cols == 0:
        return out
    active = t != ignore_index
    tc = t.clamp(0, cols - 1)
    logp = torch.log_softmax(x2, 1)
    nll = -logp.gather(1, tc[:, None])[:, 0]
    w = None if weight is None else weight.to(dtype)
    wt = torch.ones_like(nll) if w is None else w[tc]
    loss = wt * nll
    if label_smoothing > 0:
        smooth = -(logp if w is None else logp * w).sum(1)
        loss = (1 - label_smoothing) * loss + label_smoothing / cols * smooth
    m = x2.amax(1)
    ls = (x2 - m[:, None]).exp().sum(1).log()
    zero = torch.zeros((), dtype=dtype, device=x.device)
    out[0] = torch.where(active, loss, zero)
    out[1] = torch.where(active, m, zero)
    out[2] = torch.where(active, ls, zero)
    return out


def _backward_math(grad, x, target, stats, ignore_index, label_smoothing, weight, dtype):
    """dinput = g * (p * ((1-eps) w_t + eps/C W) - (1-eps) w_t onehot - eps/C w), p from the stats."""
    x2 = _rows_plain(x).to(dtype)
    rows, cols = x2.shape
    dx = empty_moved(x, class_dim(x))
    if dx.numel() == 0:
        return dx
    t = target.reshape(-1).long()
    active = t != ignore_index
    tc = t.clamp(0, cols - 1)
    g = grad.reshape(-1).to(dtype)
    m, ls = stats[1].to(dtype), stats[2].to(dtype)
    p = torch.exp((x2 - m[:, None]) - ls[:, None])
    w = torch.ones(cols, dtype=dtype, device=x.device) if weight is None else weight.to(dtype)
    wt = w[tc]
    eps = label_smoothing
    coef_p = (1 - eps) * wt + eps / cols * w.sum()
    onehot = torch.zeros_like(p).scatter_(1, tc[:, None], 1.0)
    d = p * coef_p[:, None] - onehot * ((1 - eps) * wt)[:, None] - (eps / cols) * w[None, :]
    d = torch.where(active[:, None], d * g[:, None], torch.zeros((), dtype=dtype, device=x.device))
    rows_view(dx, class_dim(x)).copy_(d)
    return dx


def cross_entropy_forward_reference(x, target, ignore_index, label_smoothing, weight=None):
    return _forward_math(x, target, ignore_index, label_smoothing, weight, stats_dtype(x.dtype))


def cross_entropy_backward_reference(grad, x, target, stats, ignore_index, label_smoothing, weight=None):
    return _backward_math(grad, x, target, stats, ignore_index, label_smoothing, weight, stats_dtype(x.dtype))


def cross_entropy_fused_reference(x, target, stats_out, scale, ignore_index, label_smoothing, weight=None):
    """Statistics into ``stats_out``; returns the gradient of the reduced loss, whose
    row scale is ``scale`` (1 for sum, 1 / denominator for mean)."""
    dtype = stats_dtype(x.dtype)
    stats = _forward_math(x, target, ignore_index, label_smoothing, weight, dtype)
    stats_out.copy_(stats)
    g = scale.reshape(()).to(dtype).expand(stats.shape[1])
    return _backward_math(g, x, target, stats, ignore_index, label_smoothing, weight, dtype)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate_scalars(where: str, ignore_index, label_smoothing) -> None:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{where}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"{where}: label_smoothing must be a float, got {type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{where}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")


def _check_weight(where: str, weight, x: torch.Tensor) -> None:
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{where}: weight must be a torch.Tensor or None, got {type(weight).__name__}")
    c = num_classes(x)
    if weight.dim() != 1 or weight.shape[0] != c:
        raise ValueError(f"{where}: weight has shape {tuple(weight.shape)}; expected ({c},), one per class")
    if weight.dtype != x.dtype:
        raise TypeError(f"{where}: weight is {weight.dtype} but input is {x.dtype}; they must match")
    if weight.device != x.device:
        raise ValueError(f"{where}: weight is on {weight.device} but input is on {x.device}")


def validate(x, target, ignore_index=-100, label_smoothing=0.0, weight=None, where: str = WHERE) -> None:
    check_tensor(where, "input", x)
    if x.dim() == 0:
        raise ValueError(f"{where}: input must have at least 1 dim (classes), got a 0-dim tensor")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{where}: target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"{where}: target must hold class indices (int64, uint8 or int32) or probabilities "
                        f"of input's dtype, got {target.dtype}")
    if target.device != x.device:
        raise ValueError(f"{where}: target is on {target.device} but input is on {x.device}")
    want = expected_target_shape(x)
    if tuple(target.shape) != want:
        raise ValueError(f"{where}: target has shape {tuple(target.shape)} but input of shape {tuple(x.shape)} "
                         f"needs {want} (input is [N, C, d1, ...] or [C]; target [N, d1, ...] or [])")
    if num_classes(x) == 0 and target.numel() > 0:
        raise ValueError(f"{where}: input has 0 classes (dim {class_dim(x)} is empty)")
    _check_weight(where, weight, x)
    validate_scalars(where, ignore_index, label_smoothing)


def validate_backward(grad, x, target, stats, ignore_index=-100, label_smoothing=0.0, weight=None) -> None:
    where = "opforge.cross_entropy_backward"
    validate(x, target, ignore_index, label_smoothing, weight, where=where)
    rows = _num_rows(x)
    check_tensor(where, "grad", grad)
    check_tensor(where, "stats", stats)
    if grad.shape != (rows,):
        raise ValueError(f"{where}: grad has shape {tuple(grad.shape)}; expected ({rows},), one per row")
    if stats.shape != (3, rows):
        raise ValueError(f"{where}: stats has shape {tuple(stats.shape)}; expected (3, {rows}) "
                         f"(the output of cross_entropy_forward)")
    for what, t in (("grad", grad), ("stats", stats)):
        if t.device != x.device:
            raise ValueError(f"{where}: {what} is on {t.device} but input is on {x.device}")


def validate_fused(x, target, stats_out, scale, ignore_index=-100, label_smoothing=0.0, weight=None) -> None:
    where = "opforge.cross_entropy_fused"
    validate(x, target, ignore_index, label_smoothing, weight, where=where)
    rows = _num_rows(x)
    check_tensor(where, "scale", scale)
    if scale.numel() != 1:
        raise ValueError(f"{where}: scale must hold one value, got shape {tuple(scale.shape)}")
    if stats_out.shape != (3, rows) or stats_out.dtype != stats_dtype(x.dtype) or not stats_out.is_contiguous():
        raise ValueError(f"{where}: stats_out must be a contiguous {stats_dtype(x.dtype)} tensor of shape (3, {rows})")
    for what, t in (("scale", scale), ("stats_out", stats_out)):
        if t.device != x.device:
            raise ValueError(f"{where}: {what} is on {t.device} but input is on {x.device}")


def check_target_range(target: torch.Tensor, cols: int, ignore_index: int, where: str = WHERE) -> None:
    """Out-of-range class indices raise on CPU tensors (free there); CUDA is not checked (no sync)."""
    if target.device.type != "cpu" or target.numel() == 0:
        return
    t = target.long()
    bad = (t != ignore_index) & ((t < 0) | (t >= cols))
    if bool(bad.any()):
        v = int(t[bad][0])
        raise ValueError(f"{where}: target {v} is out of range for {cols} classes "
                         f"(expected 0 <= target < {cols}, or ignore_index={ignore_index})")


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts, from what the memo key holds: ``[rows, cols]``
    of the logits with the class dim last, whether class weights are given and
    whether label smoothing is on (both change the kernels' arithmetic, so
    the tuning key's bucket names them)."""

    rows: int
    cols: int
    weighted: bool
    smoothing: bool


def _facts(x: torch.Tensor, eps, weight) -> Geometry:
    return Geometry(_num_rows(x), num_classes(x), weight is not None, bool(eps))


def forward_geometry(x, target, ignore_index=-100, eps=0.0, weight=None) -> Geometry:
    return _facts(x, eps, weight)


def backward_geometry(grad, x, target, stats, ignore_index=-100, eps=0.0, weight=None) -> Geometry:
    return _facts(x, eps, weight)


def fused_geometry(x, target, stats_out, scale, ignore_index=-100, eps=0.0, weight=None) -> Geometry:
    return _facts(x, eps, weight)


# ---------------------------------------------------------------------------
# Variants: shared pieces, then each op's runners and specs
# ---------------------------------------------------------------------------
def _wsum(weight, x, eps):
    """W = sum of the class weights, on the device (no sync); only smoothing reads it."""
    if weight is None or eps <= 0:
        return None
    return weight.sum(dtype=stats_dtype(x.dtype)).reshape(1)


def _flat_target(target: torch.Tensor) -> torch.Tensor:
    return target.reshape(-1)


def _dense(weight):
    return weight.contiguous() if weight is not None else None


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.cols)}{':w' if g.weighted else ''}{':s' if g.smoothing else ''}"


def has_classes(g: Geometry) -> str | None:
    return "input has no classes" if g.cols == 0 else None


def online_check(g: Geometry) -> str | None:
    if g.cols == 0:
        return has_classes(g)
    if K.split_pays(g.rows, g.cols):
        return f"{g.rows} rows of {g.cols} classes leave SMs idle; triton_split cuts each row into chunks"
    return None


def _sized(config_fn):
    """``config_fn(rows, cols)`` (the kernels' configs take plain sizes) as a function of the geometry."""
    return lambda g: config_fn(g.rows, g.cols)


def _forward_prepare(x, target, ignore_index, eps, weight):
    check_target_range(target, num_classes(x), ignore_index)
    out = torch.empty((3, _num_rows(x)), dtype=stats_dtype(x.dtype), device=x.device)
    return rows_view(x, class_dim(x)), _flat_target(target), _dense(weight), _wsum(weight, x, eps), out


def online_run(g: Geometry, cfg, x, target, ignore_index, eps, weight=None):
    x2, t, w, ws, out = _forward_prepare(x, target, ignore_index, eps, weight)
    K.launch_forward(x2, t, w, ws, out, ignore_index, float(eps), cfg)
    return out


def split_run(g: Geometry, cfg, x, target, ignore_index, eps, weight=None):
    x2, t, w, ws, out = _forward_prepare(x, target, ignore_index, eps, weight)
    K.launch_split_forward(x2, t, w, ws, out, ignore_index, float(eps), cfg)
    return out


def forward_eager_run(g: Geometry, cfg, x, target, ignore_index, eps, weight=None):
    check_target_range(target, num_classes(x), ignore_index)
    return _forward_math(x, target, ignore_index, eps, weight, stats_dtype(x.dtype))


def forward_reference_run(g: Geometry, cfg, *args):
    check_target_range(args[1], num_classes(args[0]), args[2])
    return cross_entropy_forward_reference(*args)


FORWARD_SPECS = [
    Spec("triton_online", online_run, version=K.ONLINE_VERSION, dtypes=FLOATS, check=online_check,
         configs=_sized(K.online_configs), default_config=_sized(K.online_default_config), bucket=bucket,
         description="one pass over column blocks with a running max and rescaled sum; "
                     "several short rows per program"),
    Spec("triton_split", split_run, version=K.SPLIT_VERSION, dtypes=FLOATS, check=has_classes,
         configs=_sized(K.split_configs), default_config=_sized(K.split_default_config), bucket=bucket,
         description="a few long rows: chunks of each row reduced by separate programs "
                     "(online max / sum), then a combine launch finishes each row"),
    Spec("torch_eager", forward_eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
         description="torch's log_softmax and gathers in fp32"),
    Spec("reference", forward_reference_run, kind="reference", devices=("cpu", "cuda"),
         description="plain torch (the oracle and the CPU fallback)"),
]

_BACKWARD = "opforge.cross_entropy_backward"


def tiled_run(g: Geometry, cfg, grad, x, target, stats, ignore_index, eps, weight=None):
    check_target_range(target, num_classes(x), ignore_index, _BACKWARD)
    dx = empty_moved(x, class_dim(x))
    if dx.numel():
        K.launch_backward(grad, rows_view(x, class_dim(x)), _flat_target(target), _dense(weight),
                          _wsum(weight, x, eps), stats.contiguous(), rows_view(dx, class_dim(x)), ignore_index,
                          float(eps), cfg)
    return dx


def backward_eager_run(g: Geometry, cfg, grad, x, target, stats, ignore_index, eps, weight=None):
    check_target_range(target, num_classes(x), ignore_index, _BACKWARD)
    return _backward_math(grad, x, target, stats, ignore_index, eps, weight, stats_dtype(x.dtype))


def backward_reference_run(g: Geometry, cfg, *args):
    check_target_range(args[2], num_classes(args[1]), args[4], _BACKWARD)
    return cross_entropy_backward_reference(*args)


BACKWARD_SPECS = [
    Spec("triton_tiled", tiled_run, version=K.BACKWARD_VERSION, dtypes=FLOATS, check=has_classes,
         configs=_sized(K.backward_configs), default_config=_sized(K.backward_default_config), bucket=bucket,
         description="one read of the logits and one write of the gradient per [rows, chunk] "
                     "tile; softmax recomputed from the saved max and log-sum"),
    Spec("torch_eager", backward_eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
         description="the gradient formula in torch ops, fp32"),
    Spec("reference", backward_reference_run, kind="reference", devices=("cpu", "cuda"),
         description="plain torch (the oracle and the CPU fallback)"),
]

_FUSED = "opforge.cross_entropy_fused"


def fused_run(g: Geometry, cfg, x, target, stats_out, scale, ignore_index, eps, weight=None):
    check_target_range(target, num_classes(x), ignore_index, _FUSED)
    dx = empty_moved(x, class_dim(x))
    if dx.numel() or stats_out.numel():
        K.launch_forward(rows_view(x, class_dim(x)), _flat_target(target), _dense(weight), _wsum(weight, x, eps),
                         stats_out, ignore_index, float(eps), cfg, dx=rows_view(dx, class_dim(x)),
                         scale=scale.reshape(1))
    return dx


def two_pass_run(g: Geometry, cfg, x, target, stats_out, scale, ignore_index, eps, weight=None):
    """The forward kernel as the forward op runs it (online, or split for a few long
    rows), then the tiled backward with the reduced loss's scale as every row's
    upstream gradient (a stride-0 view): two reads of the logits, one write."""
    check_target_range(target, num_classes(x), ignore_index, _FUSED)
    dx = empty_moved(x, class_dim(x))
    rows, cols = g.rows, g.cols
    if rows == 0:
        return dx
    x2, t, w, ws = rows_view(x, class_dim(x)), _flat_target(target), _dense(weight), _wsum(weight, x, eps)
    if K.split_pays(rows, cols):
        K.launch_split_forward(x2, t, w, ws, stats_out, ignore_index, float(eps), K.split_default_config(rows, cols))
    else:
        K.launch_forward(x2, t, w, ws, stats_out, ignore_index, float(eps), K.online_default_config(rows, cols))
    K.launch_backward(scale.reshape(1).expand(rows), x2, t, w, ws, stats_out, rows_view(dx, class_dim(x)),
                      ignore_index, float(eps), cfg)
    return dx


def fused_reference_run(g: Geometry, cfg, *args):
    check_target_range(args[1], num_classes(args[0]), args[4], _FUSED)
    return cross_entropy_fused_reference(*args)


FUSED_SPECS = [
    Spec("triton_fused", fused_run, version=K.ONLINE_VERSION, dtypes=FLOATS, check=has_classes,
         configs=_sized(K.online_configs), default_config=_sized(K.fused_default_config), bucket=bucket,
         description="the online forward, then a second sweep of the row (last block first, "
                     "from L2 where it can) that writes the gradient of the reduced loss"),
    # For autotune to weigh: on the H200 (2026-11-30) it matched the one-kernel sweep within
    # -17 % / +6 %, both at 27-53 % of copy bandwidth: the gradient pass is the slow part.
    Spec("triton_two_pass", two_pass_run, version=f"{K.ONLINE_VERSION}.{K.SPLIT_VERSION}.{K.BACKWARD_VERSION}",
         dtypes=FLOATS, check=has_classes, configs=_sized(K.backward_configs),
         default_config=_sized(K.backward_default_config), bucket=bucket,
         description="the forward kernel writes the loss and row statistics, then the tiled "
                     "backward writes the gradient of the reduced loss"),
    Spec("torch_eager", fused_reference_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
         description="the loss and gradient formulas in torch ops"),
    Spec("reference", fused_reference_run, kind="reference", devices=("cpu", "cuda"),
         description="plain torch (the oracle and the CPU fallback)"),
]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _sample_forward(device: torch.device) -> list[tuple]:
    """Inputs reaching every variant and dtype: short rows, [N, C, d] inputs, a
    transposed input, class weights, label smoothing, ignored rows, logits near
    1e4, a long vocabulary with few rows (split) and larger shapes."""
    g = torch.Generator(device="cpu").manual_seed(2024)

    def rand(shape, dtype, scale=3.0):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    def targets(shape, cols, ignore=-100):
        t = torch.randint(0, cols, shape, generator=g)
        t[torch.rand(shape, generator=g) < 0.15] = ignore
        return t.to(device)

    def weight(cols, dtype):
        return (torch.rand(cols, generator=g, dtype=torch.float64) + 0.5).to(dtype).to(device)

    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        out += [
            (rand((67, 130), dt), targets((67,), 130), -100, 0.0),
            (rand((5, 33, 7), dt), targets((5, 7), 33, 3), 3, 0.1),
            (rand((130, 67), dt).t(), targets((67,), 130), -100, 0.2),
            (rand((9, 1000), dt), targets((9,), 1000), -100, 0.1, weight(1000, dt)),
            (rand((17,), dt), torch.tensor(4, device=device), -100, 0.0),
        ]
    out += [
        (rand((3, 70000), torch.float32), targets((3,), 70000), -100, 0.1),
        (rand((4, 300), torch.float32, 1e4), targets((4,), 300), -100, 0.1),
        (rand((2, 20000), torch.bfloat16), targets((2,), 20000), -100, 0.0, weight(20000, torch.bfloat16)),
    ]
    if device.type == "cuda":  # larger shapes: launch geometry of real vocabularies
        out += [
            (rand((64, 128256), torch.bfloat16), targets((64,), 128256), -100, 0.1),
            (rand((1024, 32000), torch.bfloat16), targets((1024,), 32000), -100, 0.0),
            (rand((512, 32000), torch.float32), targets((512,), 32000), -100, 0.1, weight(32000, torch.float32)),
        ]
    return out


def _sample_backward(device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(4048)
    out = []
    for args in _sample_forward(device):
        x, t, ii, eps, *w = args
        stats = cross_entropy_forward_reference(x.double(), t, ii, eps, *(v.double() for v in w))
        rows = stats.shape[1]
        grad = torch.randn(rows, generator=g, dtype=torch.float64).to(stats_dtype(x.dtype)).to(device)
        out.append((grad, x, t, stats.to(stats_dtype(x.dtype)), ii, eps, *w))
    return out


def _sample_fused(device: torch.device) -> list[tuple]:
    out = []
    for i, args in enumerate(_sample_forward(device)):
        x, t, ii, eps, *w = args
        rows = _num_rows(x)
        stats_out = torch.empty((3, rows), dtype=stats_dtype(x.dtype), device=device)
        scale = torch.full((1,), 1.0 if i % 2 else 1.0 / max(rows, 1), dtype=stats_dtype(x.dtype), device=device)
        out.append((x, t, stats_out, scale, ii, eps, *w))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _tkey(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _fwd_tensors(x, target, ignore_index=-100, eps=0.0, weight=None):
    return (x,) if weight is None else (x, weight)


def _bwd_tensors(grad, x, target, stats, ignore_index=-100, eps=0.0, weight=None):
    return (x, grad, stats) if weight is None else (x, grad, stats, weight)


def _fused_tensors(x, target, stats_out, scale, ignore_index=-100, eps=0.0, weight=None):
    return (x, stats_out, scale) if weight is None else (x, stats_out, scale, weight)


def _fwd_memo_key(x, target, ignore_index=-100, eps=0.0, weight=None):
    return (_tkey(x), _tkey(target), _tkey(weight), ignore_index, eps)


def _bwd_memo_key(grad, x, target, stats, ignore_index=-100, eps=0.0, weight=None):
    return (_tkey(grad), _tkey(x), _tkey(target), _tkey(stats), _tkey(weight), ignore_index, eps)


def _fused_memo_key(x, target, stats_out, scale, ignore_index=-100, eps=0.0, weight=None):
    return (_tkey(x), _tkey(target), _tkey(stats_out), _tkey(scale), _tkey(weight), ignore_index, eps)


def _x_dtype_key(x, *rest):
    return str(x.dtype).replace("torch.", "")


def _bwd_dtype_key(grad, x, *rest):
    return str(x.dtype).replace("torch.", "")


class Member(NamedTuple):
    """What differs between the family's three ops (each a field of ``registry.Op``)."""

    specs: list[Spec]
    geometry: Callable[..., Geometry]
    reference: Callable
    tensors: Callable
    memo_key: Callable
    dtype_key: Callable
    validate: Callable
    samples: Callable
    doc: str


_FAMILY = {
    "cross_entropy_forward": Member(
        FORWARD_SPECS, forward_geometry, cross_entropy_forward_reference, _fwd_tensors, _fwd_memo_key,
        _x_dtype_key, validate, _sample_forward,
        "per-row cross-entropy loss with max and log-sum statistics ([3, rows])"),
    "cross_entropy_backward": Member(
        BACKWARD_SPECS, backward_geometry, cross_entropy_backward_reference, _bwd_tensors, _bwd_memo_key,
        _bwd_dtype_key, validate_backward, _sample_backward,
        "gradient of cross_entropy_forward's loss row with respect to the logits"),
    "cross_entropy_fused": Member(
        FUSED_SPECS, fused_geometry, cross_entropy_fused_reference, _fused_tensors, _fused_memo_key,
        _x_dtype_key, validate_fused, _sample_fused,
        "forward statistics (into stats_out) and the gradient of the reduced loss in one pass"),
}


def _member(field: str):
    return lambda name: getattr(_FAMILY[name], field)


OPS = registry.register_family(
    tuple(_FAMILY), _member("specs"), geometry=_member("geometry"),
    **{f: _member(f) for f in ("reference", "tensors", "memo_key", "dtype_key", "validate", "samples", "doc")})
FORWARD_OP = OPS["cross_entropy_forward"]
BACKWARD_OP = OPS["cross_entropy_backward"]
FUSED_OP = OPS["cross_entropy_fused"]


def _fwd_impl(input, target, weight, ignore_index, label_smoothing):
    return dispatch.call(FORWARD_OP, input, target, ignore_index, label_smoothing, weight)


def _fwd_fake(input, target, weight, ignore_index, label_smoothing):
    validate(input, target, ignore_index, label_smoothing, weight)
    return input.new_empty((3, _num_rows(input)), dtype=stats_dtype(input.dtype))


def _fwd_setup(ctx, inputs, output):
    x, target, weight, ignore_index, label_smoothing = inputs
    ctx.save_for_backward(x, target, weight, output)
    ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing


def _fwd_backward(ctx, grad):
    x, target, weight, stats = ctx.saved_tensors
    dx = None
    if x.requires_grad:
        dx = torch.ops.opforge.cross_entropy_backward(grad[0], x, target, stats, weight, ctx.ignore_index,
                                                      ctx.label_smoothing)
    return dx, None, None, None, None


def _bwd_impl(grad, input, target, stats, weight, ignore_index, label_smoothing):
    return dispatch.call(BACKWARD_OP, grad, input, target, stats, ignore_index, label_smoothing, weight)


def _bwd_fake(grad, input, target, stats, weight, ignore_index, label_smoothing):
    validate_backward(grad, input, target, stats, ignore_index, label_smoothing, weight)
    return empty_moved(input, class_dim(input))


def _fused_impl(input, target, weight, scale, ignore_index, label_smoothing, grad_owned=False):
    stats = torch.empty((3, _num_rows(input)), dtype=stats_dtype(input.dtype), device=input.device)
    dx = dispatch.call(FUSED_OP, input, target, stats, scale, ignore_index, label_smoothing, weight)
    return stats, dx


def _fused_fake(input, target, weight, scale, ignore_index, label_smoothing, grad_owned=False):
    validate(input, target, ignore_index, label_smoothing, weight, where="opforge.cross_entropy_fused")
    stats = input.new_empty((3, _num_rows(input)), dtype=stats_dtype(input.dtype))
    return stats, empty_moved(input, class_dim(input))


def _fused_setup(ctx, inputs, output):
    input, target, weight, scale, ignore_index, label_smoothing, *owned = inputs
    ctx.save_for_backward(output[1], scale)
    ctx.mark_non_differentiable(output[1])
    # no zero-filled logits-sized gradient for the gradient output (nobody differentiates it):
    # on the H200 that fill took 78 us of a 1.06 ms training step
    ctx.set_materialize_grads(False)
    ctx.needs_dx = input.requires_grad
    ctx.grad_owned = bool(owned and owned[0])


def _concrete(t: torch.Tensor) -> bool:
    """A real tensor whose values may be read (not fake, not traced, not captured)."""
    if type(t) is not torch.Tensor or torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _rescale_in_place(ctx, dx, g, scale) -> bool:
    """First backward of a fused pass whose gradient output nobody holds (``grad_owned``: the
    public ``cross_entropy``), on the GPU or the interpreter: rows whose incoming
    gradient differs from ``scale`` are rescaled in place by a kernel that decides per row on the
    device, so the usual case (``loss.backward()``: every row equals ``scale``) costs no pass
    over the gradient and no host sync. Later backwards through a retained graph take the
    out-of-place path, since the first one handed ``dx`` out; if that one changed it, the
    original is gone and they raise."""
    changed = getattr(ctx, "rescaled", None)
    if changed is not None:
        if bool(changed.item()):
            raise RuntimeError("opforge.cross_entropy: a second backward through a retained graph after a "
                               "backward whose incoming gradient was not the loss's own scale; the fused pass "
                               "rescaled its saved gradient in place. Compute the loss again for each backward.")
        return False
    if not (dx.is_cuda or devmod.interpret_mode()) or g.dtype != scale.dtype or g.dim() != 1:
        return False
    rows = rows_view(dx, class_dim(dx))
    if rows.data_ptr() != dx.data_ptr() or not rows.is_contiguous():
        return False
    ctx.rescaled = torch.zeros(1, dtype=torch.int32, device=dx.device)
    K.rescale_rows(rows, g.contiguous(), scale.reshape(1), ctx.rescaled, torch.finfo(g.dtype).max)
    return True


def _fused_backward(ctx, grad_stats, grad_dx):
    """The gradient was computed in the forward for row scale ``scale``; the loss
    row's incoming gradient is ``scale`` on every row under ``loss.backward()`` of
    opforge's sum / mean, and the saved gradient is returned as it is. Any other
    incoming gradient rescales each row (see :func:`_rescale_in_place`)."""
    dx, scale = ctx.saved_tensors
    if not ctx.needs_dx or grad_stats is None:
        return None, None, None, None, None, None, None
    g = grad_stats[0]
    if g.numel() == 0 or dx.numel() == 0:
        return dx, None, None, None, None, None, None
    if ctx.grad_owned and _concrete(g) and _rescale_in_place(ctx, dx, g, scale):
        return dx, None, None, None, None, None, None
    if _concrete(g) and bool(torch.equal(g, scale.reshape(()).expand(g.shape).to(g.dtype))):
        return dx, None, None, None, None, None, None
    cd = 1 if dx.dim() >= 2 else 0
    ratio = (g / scale.reshape(()).to(g.dtype)).nan_to_num(nan=0.0)
    out = empty_moved(dx, cd)
    rows_view(out, cd).copy_(rows_view(dx, cd).to(g.dtype) * ratio[:, None])
    return out, None, None, None, None, None, None


define("cross_entropy_fused(Tensor input, Tensor target, Tensor? weight, Tensor scale, int ignore_index, "
       "float label_smoothing, bool grad_owned=False) -> (Tensor, Tensor)",
       _fused_impl, _fused_fake, _fused_backward, _fused_setup)
define("cross_entropy_backward(Tensor grad, Tensor input, Tensor target, Tensor stats, Tensor? weight, "
       "int ignore_index, float label_smoothing) -> Tensor", _bwd_impl, _bwd_fake)
define("cross_entropy_forward(Tensor input, Tensor target, Tensor? weight, int ignore_index, "
       "float label_smoothing) -> Tensor", _fwd_impl, _fwd_fake, _fwd_backward, _fwd_setup)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------
_Tensor = torch.Tensor
_forward_packet = torch.ops.opforge.cross_entropy_forward.default


def _reduce(loss_rows, x, target, weight, ignore_index, reduction):
    if reduction == "none":
        return loss_rows.to(x.dtype).reshape(target.shape)
    total = loss_rows.sum()
    if reduction == "sum":
        return total.to(x.dtype)
    return (total / _denominator(x, target, weight, ignore_index, total.dtype)).to(x.dtype)


def _denominator(x, target, weight, ignore_index, dtype):
    t = target.reshape(-1)
    active = t != ignore_index
    if weight is None:
        return active.sum().to(dtype)
    # Detached: the weights get no gradient (torch's nll_loss gives none either).
    wt = weight.detach().to(dtype).gather(0, t.long().clamp(0, max(num_classes(x) - 1, 0)))
    return torch.where(active, wt, torch.zeros((), dtype=dtype, device=wt.device)).sum()


def _fused_pays(input, target, weight) -> bool:
    """Eager autograd of a sum / mean loss on a plain tensor whose rows fill the GPU."""
    if not (type(input) is _Tensor and input.requires_grad and torch.is_grad_enabled()
            and type(target) is _Tensor and (weight is None or type(weight) is _Tensor)):
        return False
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() \
            or torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    validate(input, target, -100, 0.0, weight)  # shapes and dtypes; the scalars are checked by the caller
    rows, cols = _num_rows(input), num_classes(input)
    return rows > 0 and cols > 0 and not K.split_pays(rows, cols)


def _fused(input, target, weight, ignore_index, reduction, eps):
    """Loss and gradient in one pass (see ``cross_entropy_fused``); the value is
    ``sum(rows) * scale`` so that its gradient reaching the rows is exactly ``scale``."""
    dtype = stats_dtype(input.dtype)
    if reduction == "mean":
        scale = torch.reciprocal(_denominator(input, target, weight, ignore_index, dtype)).reshape(1)
    else:
        scale = torch.ones(1, dtype=dtype, device=input.device)
    # grad_owned: nobody else holds the gradient output, so the backward may rescale it in place
    stats, _ = torch.ops.opforge.cross_entropy_fused(input, target, weight, scale, ignore_index, eps, True)
    return (stats[0].sum() * scale[0]).to(input.dtype)


def _probability_targets(input, target, weight, reduction, label_smoothing):
    """Soft targets as torch defines them: -sum_c w_c q_c log p_c with
    q = (1 - eps) * target + eps / C; the mean divides by the number of rows.
    Plain torch ops (the eager route; differentiable and traceable)."""
    check_tensor(WHERE, "input", input)
    if input.dim() == 0:
        raise ValueError(f"{WHERE}: input must have at least 1 dim (classes), got a 0-dim tensor")
    if target.shape != input.shape:
        raise ValueError(f"{WHERE}: probability target has shape {tuple(target.shape)} but input has "
                         f"{tuple(input.shape)}; they must match")
    if target.dtype != input.dtype:
        raise TypeError(f"{WHERE}: probability target is {target.dtype} but input is {input.dtype}; they must match")
    _check_weight(WHERE, weight, input)
    cd = class_dim(input)
    cols = num_classes(input)
    q = target if label_smoothing == 0 else target * (1 - label_smoothing) + label_smoothing / cols
    lp = torch.log_softmax(input, cd)
    if weight is not None:
        shape = [1] * input.dim()
        shape[cd] = cols
        lp = lp * weight.view(shape)
    rows_loss = -(lp * q).sum(cd)
    if reduction == "none":
        return rows_loss
    if reduction == "sum":
        return rows_loss.sum()
    return rows_loss.sum() / (input.numel() // cols if cols else 0)


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy`` run by opforge's dispatcher; forward and
    backward through opforge's kernels, the probability matrix never stored."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{WHERE}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    validate_scalars(WHERE, ignore_index, label_smoothing)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        return _probability_targets(input, target, weight, reduction, float(label_smoothing))
    eps = float(label_smoothing)
    if reduction != "none" and _fused_pays(input, target, weight):
        return _fused(input, target, weight, ignore_index, reduction, eps)
    if direct_ok(input, weight) and type(target) is _Tensor:
        stats = dispatch.call(FORWARD_OP, input, target, ignore_index, eps, weight)
    else:
        validate(input, target, ignore_index, eps, weight)
        stats = _forward_packet(input, target, weight, ignore_index, eps)
    return _reduce(stats[0], input, target, weight, ignore_index, reduction)


__all__ = ["cross_entropy"]
