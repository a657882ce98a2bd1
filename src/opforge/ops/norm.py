"""Normalization ops: ``opforge.layer_norm`` and ``opforge.rms_norm`` with torch semantics.

``layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5)`` and
``rms_norm(x, normalized_shape, weight=None, eps=None)`` behave like
``torch.nn.functional.layer_norm`` / ``rms_norm``: they normalize over the
trailing ``normalized_shape`` dims of ``x`` (any leading shape, fp16 / bf16 /
fp32 / fp64, empty tensors). ``eps=None`` for ``rms_norm`` means what torch
uses: the machine epsilon of the *compute* dtype, ``torch.finfo(torch.float32).eps``
for fp16/bf16/fp32 inputs and ``torch.finfo(torch.float64).eps`` for fp64
(torch's ``opmath_type``; checked against torch 2.13).

Differences from torch, by design:
* ``weight`` and ``bias`` must have ``x``'s dtype (torch mixes; we raise a clear
  ``TypeError`` instead of silently choosing a promotion).
* A non-contiguous ``x`` (or incoming gradient) is first copied to a
  contiguous tensor: the kernels read rows as a dense ``[rows, cols]`` matrix.
  The output is always contiguous (as torch's is).

Registry ops (each dispatched, tuned and selftested like every op):

* ``layer_norm``  args ``(x, normalized_shape, eps, weight=None, bias=None)`` -> y
* ``rms_norm``    args ``(x, normalized_shape, eps, weight=None)`` -> y
* ``layer_norm_backward`` args ``(grad, x, normalized_shape, eps, weight=None, bias=None)``
* ``rms_norm_backward``   args ``(grad, x, normalized_shape, eps, weight=None)``

(``eps`` comes before the optional tensors so that selftest, which drops
``None`` arguments before calling the reference, keeps positions.) The
backward ops return one *packed* tensor of ``x``'s dtype:
``[dx.flatten(), dweight (if weight), dbias (if bias)]``; the kernels write dx
straight into it, so unpacking is free (views). One tensor output keeps the
registry / selftest contract (a variant returns a tensor) and the
``torch.library`` schema simple.

Variants, in dispatch order: ``triton_row`` (rows of up to ``ROW_MAX``
elements held in registers), ``triton_split`` (forward only: long rows, or
rows too few to fill the SMs, cut into column pieces, one program each, with a
second pass that merges the pieces' statistics), ``triton_looped`` (any row
length, walked in column blocks; the long-row backward), ``torch_eager``
(aten's kernels; CUDA only) and ``reference``. The fused residual-add forms
(``ops.residual_norm``) reuse these kernels and ``backward_into``.

Autograd: the public ``torch.ops.opforge.layer_norm`` / ``rms_norm`` save
``x``, ``weight`` (and ``bias``); their backward calls the registered backward
ops, whose Triton kernels recompute each row's mean/rstd from ``x`` (the
backward loads the row anyway, so this costs no memory traffic) rather than
saving them as extra forward outputs. The forward kernels can still emit the
stats (``kernels.norm`` ``STATS``). Double backward is not supported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from numbers import Number

import torch
import torch.nn.functional as F

from opforge.kernels import norm as K
from opforge.ops.device_gate import unmeasured
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.launch import Launcher
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size, pow2

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_EPS32, _EPS64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def default_rms_eps(dtype: torch.dtype) -> float:
    """torch's ``eps=None`` for rms_norm: the epsilon of the compute (opmath) dtype."""
    return _EPS64 if dtype == torch.float64 else _EPS32


def layer_norm_reference(x, normalized_shape, eps, weight=None, bias=None):
    return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def rms_norm_reference(x, normalized_shape, eps, weight=None):
    return F.rms_norm(x, tuple(normalized_shape), weight, eps)


def _backward_math(grad, x, cols, eps, weight, has_bias, is_rms):
    """Closed-form gradients, computed in ``x``'s dtype (callers upcast)."""
    xs = x.reshape(-1, cols)
    g = grad.reshape(-1, cols)
    if is_rms:
        xc = xs
    else:
        xc = xs - xs.mean(dim=1, keepdim=True)
    rstd = torch.rsqrt((xc * xc).mean(dim=1, keepdim=True) + eps)
    xhat = xc * rstd
    gw = g * weight.reshape(1, cols) if weight is not None else g
    c1 = (gw * xhat).mean(dim=1, keepdim=True)
    if is_rms:
        dx = (gw - xhat * c1) * rstd
    else:
        dx = (gw - xhat * c1 - gw.mean(dim=1, keepdim=True)) * rstd
    parts = [dx.reshape(-1)]
    if weight is not None:
        parts.append((g * xhat).sum(dim=0))
    if has_bias:
        parts.append(g.sum(dim=0))
    return parts


def layer_norm_backward_reference(grad, x, normalized_shape, eps, weight=None, bias=None):
    """The packed gradient ``[dx.flatten(), dweight?, dbias?]`` in ``x``'s dtype."""
    cols = _numel(normalized_shape)
    ct = _opmath(x.dtype)
    parts = _backward_math(grad.to(ct), x.to(ct), cols, eps, None if weight is None else weight.to(ct),
                           bias is not None, False)
    return torch.cat(parts).to(x.dtype)


def rms_norm_backward_reference(grad, x, normalized_shape, eps, weight=None):
    cols = _numel(normalized_shape)
    ct = _opmath(x.dtype)
    parts = _backward_math(grad.to(ct), x.to(ct), cols, eps, None if weight is None else weight.to(ct),
                           False, True)
    return torch.cat(parts).to(x.dtype)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def normalize_shape(name: str, normalized_shape) -> tuple[int, ...]:
    where = f"opforge.{name}"
    if isinstance(normalized_shape, bool):
        raise TypeError(f"{where}: normalized_shape must be an int or a sequence of ints, got bool")
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    try:
        shape = tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"{where}: normalized_shape must be an int or a sequence of ints, "
                        f"got {type(normalized_shape).__name__}") from None
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"{where}: normalized_shape must contain ints, got {shape!r}")
    return shape


def _check_param(where: str, what: str, t, x: torch.Tensor, shape: tuple) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {what} must be a torch.Tensor or None, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{where}: {what} of shape {tuple(t.shape)} does not match "
                         f"normalized_shape {tuple(shape)}")
    if t.dtype != x.dtype:
        raise TypeError(f"{where}: {what} has dtype {t.dtype} but input has {x.dtype}; "
                        f"opforge does not mix dtypes: cast {what} to {x.dtype}")
    if t.device != x.device:
        raise ValueError(f"{where}: {what} is on {t.device} but input is on {x.device}; move them to one device")


def validate(name: str, x, normalized_shape, eps, weight=None, bias=None, grad=None) -> None:
    where = f"opforge.{name}"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: input must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOATS:
        raise TypeError(f"{where}: input must be float16, bfloat16, float32 or float64, got {x.dtype}")
    shape = normalize_shape(name, normalized_shape)
    if len(shape) == 0:
        raise ValueError(f"{where}: normalized_shape must name at least one dim, got ()")
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"{where}: normalized_shape {shape} does not match the trailing dims of "
                         f"input of shape {tuple(x.shape)}")
    if not isinstance(eps, Number) or isinstance(eps, (bool, complex)):
        raise TypeError(f"{where}: eps must be a real number, got {type(eps).__name__}")
    _check_param(where, "weight", weight, x, shape)
    _check_param(where, "bias", bias, x, shape)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"{where}: grad must be a torch.Tensor, got {type(grad).__name__}")
        if grad.shape != x.shape or grad.dtype != x.dtype or grad.device != x.device:
            raise ValueError(f"{where}: grad ({grad.dtype}{tuple(grad.shape)} on {grad.device}) must match "
                             f"input ({x.dtype}{tuple(x.shape)} on {x.device})")


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def _tkey(t):
    return None if t is None else (t.dtype, t.shape, t.get_device() if t.is_cuda else t.device, type(t))


@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts, shared with ``ops.residual_norm``: the
    normalized tensor seen as ``[rows, cols]`` (``cols`` = the product of
    ``normalized_shape``), its element size and the device's SM count; all
    determined by the memo key (dtype, shapes, device)."""

    is_rms: bool
    backward: bool
    rows: int
    cols: int
    itemsize: int
    sms: int


def geometry_at(is_rms: bool, backward: bool, x_at: int, shape_at: int):
    """The geometry function of ops whose normalized tensor is ``args[x_at]``
    and ``normalized_shape`` is ``args[shape_at]``."""
    return functools.partial(_geometry, is_rms, backward, x_at, shape_at)


def _geometry(is_rms, backward, x_at, shape_at, *args) -> Geometry:
    x = args[x_at]
    cols = _numel(args[shape_at])
    return Geometry(is_rms, backward, x.numel() // cols if cols else 0, cols, x.element_size(), _sms(x))


def geometry(name: str):
    backward = name.endswith("_backward")
    return geometry_at(name.startswith("rms"), backward, int(backward), int(backward) + 1)


class Forward:
    """A forward kernel (``row``, ``split`` or ``looped``) into a new output of x's shape."""

    def __init__(self, strategy: str):
        self.launch = {"row": K.launch_fwd_row, "split": K.launch_fwd_split, "looped": K.launch_fwd_looped,
                       "wave": K.launch_fwd_wave}[strategy]

    def __call__(self, g: Geometry, cfg, x, shape, eps, weight=None, bias=None):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rows, cols = g.rows, g.cols
        if rows and cols:
            xc = x.contiguous().view(rows, cols)  # a copy only when x is not contiguous
            self.launch(xc, y.view(rows, cols), weight.contiguous() if weight is not None else None,
                        bias.contiguous() if bias is not None else None, None, None, float(eps), g.is_rms, cfg)
        return y

    def bind(self, g: Geometry, cfg, args):
        """The row kernel on a contiguous input, for one decision: ``x`` and a
        new ``y`` are the ``[rows, cols]`` views themselves, so a call
        allocates ``y`` and launches; grid and constexprs are fixed here."""
        x = args[0]
        if self.launch is not K.launch_fwd_row or not (g.rows and g.cols) or not x.is_contiguous():
            return None
        has_w = len(args) > 3 and args[3] is not None
        has_b = len(args) > 4 and args[4] is not None
        rows, cols = g.rows, g.cols
        grid, kw = K.fwd_row_options(rows, cols, x.dtype, g.is_rms, False, has_w, has_b, False, cfg)
        go, shape, dtype, device, empty = (Launcher(K.norm_fwd_row_kernel, **kw), x.shape, x.dtype, x.device,
                                           torch.empty)

        def run(x, shape_, eps, weight=None, bias=None):
            y = empty(shape, dtype=dtype, device=device)
            w = weight.contiguous() if weight is not None else x
            go(grid, x, x, x, y, w, bias.contiguous() if bias is not None else x, y, y, rows, cols, float(eps))
            return y
        return run


def backward_into(packed, grad, x, rows, cols, eps, weight, bias, is_rms: bool, strategy: str, cfg,
                  grad_res=None):
    """Run a backward kernel into ``packed`` = ``[dx.flatten(), dweight?, dbias?]``.

    ``grad_res`` (the fused residual ops): a gradient added to ``dx`` in the kernel.
    """
    n = rows * cols
    has_w, has_b = weight is not None, bias is not None
    if n == 0:
        packed[n:].zero_()  # no rows: dweight = dbias = 0, as torch gives
        return packed
    launch = K.launch_bwd_row if strategy == "row" else K.launch_bwd_looped
    xc = x.contiguous().view(rows, cols)
    gc = grad.contiguous().view(rows, cols)
    tiles = rows if strategy == "looped" else -(-rows // cfg.get("BLOCK_R", 1))
    programs = K.backward_programs(tiles, x.device, cfg)
    ct = K.torch_compute_dtype(x.dtype)
    alloc = torch.zeros if strategy == "looped" else torch.empty
    dw_part = alloc((programs, cols), dtype=ct, device=x.device) if has_w else None
    db_part = alloc((programs, cols), dtype=ct, device=x.device) if has_b else None
    launch(gc, xc, weight.contiguous() if has_w else None, packed[:n].view(rows, cols), dw_part, db_part,
           float(eps), is_rms, has_b, programs, cfg,
           dres=None if grad_res is None else grad_res.contiguous().view(rows, cols))
    # Deterministic second stage: a fixed-order reduction over the [programs, cols] partials.
    off = n
    for part in (dw_part, db_part):
        if part is not None:
            packed[off:off + cols].copy_(part.sum(dim=0))
            off += cols
    return packed


class Backward:
    """A backward kernel (``row`` or ``looped``) into packed ``[dx, dweight?, dbias?]``."""

    def __init__(self, strategy: str):
        self.strategy = strategy

    def __call__(self, g: Geometry, cfg, grad, x, shape, eps, weight=None, bias=None):
        packed = torch.empty(x.numel() + g.cols * ((weight is not None) + (bias is not None)), dtype=x.dtype,
                             device=x.device)
        return backward_into(packed, grad, x, g.rows, g.cols, eps, weight, bias, g.is_rms, self.strategy, cfg)


def row_configs(rows: int, cols: int) -> list[dict]:
    """Autotune candidates of the row-resident kernels (tiles up to 16384 elements)."""
    bc = pow2(max(cols, 1))
    out = []
    for br in (1, 2, 4, 8, 16):
        if br * bc > 16384 or (br > 1 and br > pow2(max(rows, 1))):
            continue
        for w in (1, 2, 4, 8, 16, 32):
            if 32 * w <= max(br * bc, 32) and 4 <= br * bc // (32 * w) <= 64 or (br * bc < 128 and w == 1):
                out.append({"BLOCK_R": br, "num_warps": w})
    return out or [K.row_default_config(rows, cols)]


def split_configs(rows: int, cols: int) -> list[dict]:
    """Autotune candidates of the split kernels: piece sizes x warps."""
    top = max(K.SPLIT_MIN_CHUNK, min(K.ROW_MAX, pow2(max(cols, 1))))
    out = []
    chunk = K.SPLIT_MIN_CHUNK
    while chunk <= top:
        for w in (4, 8, 16):
            if 4 <= chunk // (32 * w) <= 64:
                out.append({"CHUNK": chunk, "num_warps": w})
        chunk *= 2
    return out


def split_check(rows: int, cols: int, sms: int = 132) -> str | None:
    """Split only pays for long rows, or for rows too few to fill the SMs."""
    if cols <= K.ROW_MAX:
        if cols < 2 * K.SPLIT_MIN_CHUNK:
            return (f"rows of {cols} elements are shorter than two pieces of {K.SPLIT_MIN_CHUNK}: "
                    "nothing to split (use triton_row)")
        if rows >= sms:
            return (f"rows of {cols} elements fit the row-resident kernel and {rows} rows fill the GPU "
                    "(split pays only for long or few rows)")
    return None


def _sms(x: torch.Tensor) -> int:
    if x.device.type == "cuda":
        return torch.cuda.get_device_properties(x.device).multi_processor_count
    return 132


# Checks, configs and buckets of the row, split and looped kernels, on the
# geometry: ``ops.residual_norm`` declares its variants with these too.
def row_check(g: Geometry, hint: str = " (use triton_split)") -> str | None:
    if g.cols > K.ROW_MAX:
        return f"rows of {g.cols} elements exceed the row-resident limit {K.ROW_MAX}{hint}"
    return None


def row_default(g: Geometry):
    pick = K.row_backward_default_config if g.backward else K.row_default_config
    return pick(g.rows, g.cols, g.itemsize)


def row_candidates(g: Geometry):
    return row_configs(g.rows, g.cols)


def split_reason(g: Geometry) -> str | None:
    return split_check(g.rows, g.cols, g.sms)


def split_candidates(g: Geometry):
    return split_configs(g.rows, g.cols)


def split_default(g: Geometry):
    return K.split_default_config(g.rows, g.cols, g.itemsize, g.sms)


def wave_reason(g: Geometry) -> str | None:
    return split_check(g.rows, g.cols, g.sms) or unmeasured("triton_wave")


def wave_candidates(g: Geometry):
    return [dict(c, WAVE_ROWS=K.wave_rows_for(g.cols * g.itemsize, t << 20))
            for c in split_configs(g.rows, g.cols) for t in (2, 4, 8)]


def wave_default(g: Geometry):
    return K.wave_default_config(g.rows, g.cols, g.itemsize)


def looped_configs(g: Geometry):
    return [{"BLOCK_C": bc, "num_warps": w} for bc in (1024, 2048, 4096, 8192) for w in (4, 8, 16)
            if bc // (32 * w) >= 4]


def looped_default(g: Geometry):
    return K.looped_default_config(g.rows, g.cols)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.rows)}x{bucket_size(g.cols)}"


def _reference(g: Geometry):
    if g.backward:
        return rms_norm_backward_reference if g.is_rms else layer_norm_backward_reference
    return rms_norm_reference if g.is_rms else layer_norm_reference


def eager_run(g: Geometry, cfg, *args):
    if not g.backward:
        x, shape, eps, *wb = args
        if g.is_rms:
            return F.rms_norm(x, tuple(shape), wb[0] if wb else None, eps)
        w = wb[0] if wb else None
        b = wb[1] if len(wb) > 1 else None
        return F.layer_norm(x, tuple(shape), w, b, eps)
    grad, x, shape, eps, *wb = args
    w = wb[0] if wb else None
    b = wb[1] if len(wb) > 1 else None
    if g.is_rms:
        return rms_norm_backward_reference(grad, x, shape, eps, w)
    shape = list(shape)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, w, b, eps)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        grad, x, shape, mean, rstd, w, b, [True, w is not None, b is not None])
    return torch.cat([t.reshape(-1) for t in (dx, dw, db) if t is not None])


def _bind_eager(g: Geometry, cfg, args):
    """aten's forward kernels called as ``F.layer_norm`` / ``F.rms_norm`` call them."""
    if g.backward:
        return None
    if g.is_rms:
        return lambda x, shape, eps, w=None: torch.rms_norm(x, shape, w, eps)
    cudnn = torch.backends.cudnn.enabled
    return lambda x, shape, eps, w=None, b=None: torch.layer_norm(x, shape, w, b, eps, cudnn)


eager_run.bind = _bind_eager


def reference_run(g: Geometry, cfg, *args):
    out = _reference(g)(*args)
    return out if g.backward else out.contiguous()


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    backward = name.endswith("_backward")
    what = "backward" if backward else "forward"
    run = Backward if backward else Forward
    split = wave = []
    if not backward:
        wave = [Spec("triton_wave", Forward("wave"), version=K.WAVE_VERSION, dtypes=FLOATS,
                     check=wave_reason, configs=wave_candidates, default_config=wave_default, bucket=bucket,
                     description="forward: the split pieces' statistics and writes in one grid, interleaved "
                                 "by waves of rows so the re-read hits L2 (one HBM read)")]
        split = [Spec("triton_split", Forward("split"), version=K.SPLIT_VERSION, dtypes=FLOATS,
                      check=split_reason, configs=split_candidates, default_config=split_default, bucket=bucket,
                      description="forward: rows cut into column pieces, one program each; piece "
                                  "statistics merged (Chan) in a second pass (long or few rows)")]
    return [
        Spec("triton_row", run("row"), version=K.ROW_VERSION, dtypes=FLOATS, check=row_check,
             configs=row_candidates, default_config=row_default, bucket=bucket,
             description=f"{what}: tiles of whole rows held in registers (cols <= {K.ROW_MAX}); "
                         "exact two-pass mean/variance"),
        *wave,
        # The looped kernel comes before split: on the H200 (2026-11-30) split ran
        # 256x65536 bf16 layer_norm at 0.50 TB/s, looped at 1.7 TB/s (2026-11-29).
        # Split stays a candidate for autotune.
        Spec("triton_looped", run("looped"), version=K.LOOPED_VERSION, dtypes=FLOATS,
             configs=looped_configs, default_config=looped_default, bucket=bucket,
             description=f"{what}: one row per program walked in column blocks; two-pass statistics"),
        *split,
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
             description="aten's own kernels"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, is_rms: bool, backward: bool, device: torch.device) -> list[tuple]:
    """Inputs that reach every variant: with/without weight (and bias), leading
    dims, a transposed (non-contiguous) input, a large mean, and a row longer
    than ``ROW_MAX`` (``triton_split``, ``triton_looped`` and the vendor take
    it); on CUDA also bandwidth-sized shapes (many long rows, many short rows)."""
    g = torch.Generator(device="cpu").manual_seed(7 if is_rms else 11)

    def rand(shape, dtype, shift=0.0):
        return (torch.randn(shape, generator=g) + shift).to(dtype).to(device)

    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        eps = 1e-5 if not is_rms else default_rms_eps(dt)
        cases = [
            (rand((67, 130), dt), (130,), True),
            (rand((3, 5, 40), dt, shift=3.0), (5, 40), True),
            (rand((130, 24), dt).t(), (130,), False),
            (rand((2, K.ROW_MAX + 100), dt), (K.ROW_MAX + 100,), True),
        ]
        if device.type == "cuda" and dt in (torch.float32, torch.bfloat16):
            cases += [(rand((300, 4 * K.ROW_MAX + 5), dt, shift=2.0), (4 * K.ROW_MAX + 5,), True),
                      (rand((4096, 1000), dt), (1000,), True)]
        for x, shape, with_params in cases:
            params = ()
            if with_params:
                params = (rand(shape, dt) * 0.5 + 1.0,) if is_rms else (rand(shape, dt) * 0.5 + 1.0, rand(shape, dt))
            fwd = (x, shape, eps) + params
            out.append((rand(x.shape, dt),) + fwd if backward else fwd)
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _tensors(x, shape, eps, w=None, b=None):
    return tuple(t for t in (x, w, b) if isinstance(t, torch.Tensor))


def _backward_tensors(grad, x, shape, eps, w=None, b=None):
    return tuple(t for t in (x, grad, w, b) if isinstance(t, torch.Tensor))


def _memo_key(x, shape, eps, w=None, b=None):
    # A CUDA device as its index: building and comparing torch.device objects costs more than the rest.
    return (x.dtype, x.shape, x.stride(), x.get_device() if x.is_cuda else x.device, tuple(shape), _tkey(w),
            _tkey(b), type(eps))


def _backward_memo_key(grad, x, shape, eps, w=None, b=None):
    return (x.dtype, x.shape, x.stride(), x.device, grad.dtype, grad.shape, grad.stride(), grad.device,
            tuple(shape), _tkey(w), _tkey(b), type(eps))


def _dtype_key(x, *rest):
    return str(x.dtype).replace("torch.", "")


def _backward_dtype_key(grad, x, *rest):
    return str(x.dtype).replace("torch.", "")


def _validate_backward(name, grad, x, shape, eps, w=None, b=None):
    validate(name, x, shape, eps, w, b, grad=grad)


def _validate(name: str):
    return functools.partial(_validate_backward if name.endswith("_backward") else validate, name)


def _references(name: str):
    return {"layer_norm": layer_norm_reference, "rms_norm": rms_norm_reference,
            "layer_norm_backward": layer_norm_backward_reference,
            "rms_norm_backward": rms_norm_backward_reference}[name]


OPS = registry.register_family(
    ("layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward"), specs, geometry=geometry,
    reference=_references,
    tensors=lambda name: _backward_tensors if name.endswith("_backward") else _tensors,
    memo_key=lambda name: _backward_memo_key if name.endswith("_backward") else _memo_key,
    dtype_key=lambda name: _backward_dtype_key if name.endswith("_backward") else _dtype_key,
    validate=_validate,
    samples=lambda name: functools.partial(sample_inputs, name, name.startswith("rms"), name.endswith("_backward")),
    doc=lambda name: f"{name.removesuffix('_backward')}"
                     f"{' backward (packed [dx, dweight?, dbias?])' if name.endswith('_backward') else ''} "
                     f"over the trailing dims",
)


def _packed_numel(x, shape, has_w, has_b):
    return x.numel() + _numel(shape) * (int(has_w) + int(has_b))


def _unpack(packed, x, shape, weight, bias):
    n = x.numel()
    cols = _numel(shape)
    dx = packed[:n].view(x.shape)
    off = n
    dw = db = None
    if weight is not None:
        dw = packed[off:off + cols].view(weight.shape)
        off += cols
    if bias is not None:
        db = packed[off:off + cols].view(bias.shape)
    return dx, dw, db


# --- layer_norm -------------------------------------------------------------
def _ln_impl(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return dispatch.call(OPS["layer_norm"], x, tuple(normalized_shape), eps, weight, bias)


def _ln_fake(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    validate("layer_norm", x, tuple(normalized_shape), eps, weight, bias)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _ln_setup(ctx, inputs, output):
    x, shape, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.shape, ctx.eps = tuple(shape), eps


def _needs(t) -> bool:
    return t is not None and t.requires_grad


def _ln_backward(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    packed = torch.ops.opforge.layer_norm_backward(grad, x, list(ctx.shape), weight, bias, ctx.eps)
    dx, dw, db = _unpack(packed, x, ctx.shape, weight, bias)
    # Saved tensors keep requires_grad; torch.library's needs_input_grad is
    # laid out over flattened args, so it is not indexed here.
    return (dx if x.requires_grad else None, None, dw if _needs(weight) else None,
            db if _needs(bias) else None, None)


def _ln_bwd_impl(grad, x, normalized_shape, weight, bias, eps):
    return dispatch.call(OPS["layer_norm_backward"], grad, x, tuple(normalized_shape), eps, weight, bias)


def _ln_bwd_fake(grad, x, normalized_shape, weight, bias, eps):
    validate("layer_norm_backward", x, tuple(normalized_shape), eps, weight, bias, grad=grad)
    return x.new_empty(_packed_numel(x, normalized_shape, weight is not None, bias is not None))


# --- rms_norm ---------------------------------------------------------------
def _resolve_eps(x, eps):
    return default_rms_eps(x.dtype) if eps is None else eps


def _rms_impl(x, normalized_shape, weight=None, eps=None):
    return dispatch.call(OPS["rms_norm"], x, tuple(normalized_shape), _resolve_eps(x, eps), weight)


def _rms_fake(x, normalized_shape, weight=None, eps=None):
    validate("rms_norm", x, tuple(normalized_shape), _resolve_eps(x, eps), weight)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _rms_setup(ctx, inputs, output):
    x, shape, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.shape, ctx.eps = tuple(shape), _resolve_eps(x, eps)


def _rms_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    packed = torch.ops.opforge.rms_norm_backward(grad, x, list(ctx.shape), weight, ctx.eps)
    dx, dw, _ = _unpack(packed, x, ctx.shape, weight, None)
    return (dx if x.requires_grad else None, None, dw if _needs(weight) else None, None)


def _rms_bwd_impl(grad, x, normalized_shape, weight, eps):
    return dispatch.call(OPS["rms_norm_backward"], grad, x, tuple(normalized_shape), eps, weight)


def _rms_bwd_fake(grad, x, normalized_shape, weight, eps):
    validate("rms_norm_backward", x, tuple(normalized_shape), eps, weight, grad=grad)
    return x.new_empty(_packed_numel(x, normalized_shape, weight is not None, False))


define("layer_norm_backward(Tensor grad, Tensor input, SymInt[] normalized_shape, Tensor? weight, "
       "Tensor? bias, float eps) -> Tensor", _ln_bwd_impl, _ln_bwd_fake)
define("rms_norm_backward(Tensor grad, Tensor input, SymInt[] normalized_shape, Tensor? weight, "
       "float eps) -> Tensor", _rms_bwd_impl, _rms_bwd_fake)
define("layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
       "float eps=1e-05) -> Tensor", _ln_impl, _ln_fake, _ln_backward, _ln_setup)
define("rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
       _rms_impl, _rms_fake, _rms_backward, _rms_setup)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------
_Tensor = torch.Tensor
_LAYER_NORM, _RMS_NORM = OPS["layer_norm"], OPS["rms_norm"]


def _check_common(name, input, eps):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"opforge.{name}: input must be a torch.Tensor, got {type(input).__name__}")
    if eps is not None and (not isinstance(eps, Number) or isinstance(eps, (bool, complex))):
        raise TypeError(f"opforge.{name}: eps must be a real number, got {type(eps).__name__}")


def _plain_shape(name: str, normalized_shape) -> tuple[int, ...]:
    """``normalize_shape``, with the common one-int forms checked first."""
    t = type(normalized_shape)
    if t is int:
        return (normalized_shape,)
    if (t is tuple or t is list or t is torch.Size) and len(normalized_shape) == 1 \
            and type(normalized_shape[0]) is int:
        return (normalized_shape[0],)
    return normalize_shape(name, normalized_shape)


def layer_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``torch.nn.functional.layer_norm`` run by opforge's dispatcher."""
    if type(eps) is float and direct_ok(input, weight) and (bias is None or (
            type(bias) is _Tensor and not (bias.requires_grad and torch.is_grad_enabled()))):
        return dispatch.call(_LAYER_NORM, input, _plain_shape("layer_norm", normalized_shape), eps, weight, bias)
    _check_common("layer_norm", input, eps)
    shape = normalize_shape("layer_norm", normalized_shape)
    eps = float(eps)
    if direct_ok(input, weight) and (bias is None or (type(bias) is _Tensor and not
                                                      (bias.requires_grad and torch.is_grad_enabled()))):
        return dispatch.call(OPS["layer_norm"], input, shape, eps, weight, bias)
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"opforge.layer_norm: {what} must be a torch.Tensor or None, got {type(t).__name__}")
    return torch.ops.opforge.layer_norm(input, list(shape), weight, bias, eps)


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` run by opforge's dispatcher (``eps=None``: torch's default)."""
    if (eps is None or type(eps) is float) and direct_ok(input, weight):
        return dispatch.call(_RMS_NORM, input, _plain_shape("rms_norm", normalized_shape),
                             _resolve_eps(input, eps), weight)
    _check_common("rms_norm", input, eps)
    shape = normalize_shape("rms_norm", normalized_shape)
    eps = None if eps is None else float(eps)
    if direct_ok(input, weight):
        return dispatch.call(OPS["rms_norm"], input, shape, _resolve_eps(input, eps), weight)
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise TypeError(f"opforge.rms_norm: weight must be a torch.Tensor or None, got {type(weight).__name__}")
    return torch.ops.opforge.rms_norm(input, list(shape), weight, eps)


__all__ = ["layer_norm", "rms_norm"]
