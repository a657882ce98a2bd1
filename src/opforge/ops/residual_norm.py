"""Fused residual add + norm: ``opforge.add_rms_norm`` and ``opforge.add_layer_norm``.

The pattern of a pre-norm transformer block (vLLM's ``fused_add_rms_norm``,
Apex / FlashAttention's ``dropout_add_layer_norm`` without dropout)::

    new_residual = input + residual          # rounded to input's dtype, as torch rounds it
    out = norm(new_residual)                 # rms_norm or layer_norm over normalized_shape
    return out, new_residual

One kernel reads ``input`` and ``residual`` once and writes ``new_residual`` and
``out`` once (``kernels.norm`` ``HAS_RES``): 2 reads + 2 writes instead of the
3 reads + 2 writes of ``x + r`` followed by a norm. The norm sees the *rounded*
sum, so ``out`` equals ``F.rms_norm(input + residual, ...)`` evaluated by torch
in the input dtype.

Semantics and dtype rules are those of ``opforge.rms_norm`` / ``layer_norm``
(see ``ops.norm``), plus: ``residual`` must have ``input``'s shape, dtype and
device (no broadcasting, no promotion: a clear error instead).

Registry ops (``opforge::<name>``), each returning one tensor so that
dispatch, tuning and selftest treat them like every op:

* ``add_rms_norm``   args ``(input, residual, normalized_shape, eps, weight=None, bias=None, outs=None)``
  (``bias`` must be None)
* ``add_layer_norm`` args ``(input, residual, normalized_shape, eps, weight=None, bias=None, outs=None)``
  -> ``[2, *input.shape]``: ``[out, new_residual]`` (the kernels write each
  half), or, when ``outs = (out, new_residual)`` are given, those filled and
  ``out`` returned. The public functions and the ``torch.library`` ops pass
  ``outs``: a custom op's outputs must not share storage, and two separate
  allocations cost nothing extra.
* ``add_rms_norm_backward``   args ``(grad_out, grad_residual, new_residual, normalized_shape, eps, weight=None)``
* ``add_layer_norm_backward`` args ``(..., weight=None, bias=None)``
  -> packed ``[d_new_residual.flatten(), dweight?, dbias?]``, where
  ``d_new_residual = norm_backward(grad_out) + grad_residual`` is the gradient
  of both ``input`` and ``residual``. The norm's backward kernels add
  ``grad_residual`` before their store (``HAS_DRES``), so the add costs one
  extra read and no extra pass.

Variants, in dispatch order: forward ``triton_row`` (rows up to ``ROW_MAX``),
``triton_split`` (long or few rows), ``torch_eager`` (CUDA), ``reference``;
backward ``triton_row``, ``triton_looped``, ``torch_eager``, ``reference``.

Autograd saves ``new_residual`` (an output: no extra memory) and the params;
the backward recomputes each row's statistics from it, as ``ops.norm`` does.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from opforge.kernels import norm as K
from opforge.ops import norm as N
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec

FLOATS = N.FLOATS
_Tensor = torch.Tensor


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def add_rms_norm_reference(x, residual, normalized_shape, eps, weight=None, bias=None, outs=None):
    """``[2, *x.shape]``: ``[rms_norm(x + residual), x + residual]`` (``bias`` must be None)."""
    s = x + residual
    return _packed_or_outs(F.rms_norm(s, tuple(normalized_shape), weight, eps), s, outs)


def add_layer_norm_reference(x, residual, normalized_shape, eps, weight=None, bias=None, outs=None):
    s = x + residual
    return _packed_or_outs(F.layer_norm(s, tuple(normalized_shape), weight, bias, eps), s, outs)


def _packed_or_outs(y, s, outs):
    """The registry result: packed ``[y, s]``, or ``y`` after filling caller-given ``outs``."""
    if outs is None:
        return torch.stack([y, s])
    outs[0].copy_(y)
    outs[1].copy_(s)
    return outs[0]


def _backward_reference(is_rms):
    def ref(grad, grad_res, s, normalized_shape, eps, weight=None, bias=None):
        cols = N._numel(normalized_shape)
        ct = N._opmath(s.dtype)
        parts = N._backward_math(grad.to(ct), s.to(ct), cols, eps, None if weight is None else weight.to(ct),
                                 bias is not None, is_rms)
        parts[0] = parts[0] + grad_res.to(ct).reshape(-1)
        return torch.cat(parts).to(s.dtype)

    return ref


add_rms_norm_backward_reference = _backward_reference(True)
add_layer_norm_backward_reference = _backward_reference(False)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate(name: str, x, residual, normalized_shape, eps, weight=None, bias=None, outs=None) -> None:
    N.validate(name, x, normalized_shape, eps, weight, bias)
    where = f"opforge.{name}"
    if bias is not None and name == "add_rms_norm":
        raise TypeError(f"{where}: rms_norm takes no bias")
    if outs is not None and (len(outs) != 2 or any(
            not isinstance(t, torch.Tensor) or t.shape != x.shape or t.dtype != x.dtype or t.device != x.device
            or not t.is_contiguous() for t in outs)):
        raise ValueError(f"{where}: outs must be two contiguous tensors like input")
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"{where}: residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.dtype != x.dtype:
        raise TypeError(f"{where}: residual has dtype {residual.dtype} but input has {x.dtype}; "
                        f"opforge does not mix dtypes: cast residual to {x.dtype}")
    if residual.shape != x.shape:
        raise ValueError(f"{where}: residual of shape {tuple(residual.shape)} must match input of shape "
                         f"{tuple(x.shape)} (no broadcasting)")
    if residual.device != x.device:
        raise ValueError(f"{where}: residual is on {residual.device} but input is on {x.device}; "
                         "move them to one device")


def validate_backward(name: str, grad, grad_res, s, normalized_shape, eps, weight=None, bias=None) -> None:
    N.validate(name, s, normalized_shape, eps, weight, bias, grad=grad)
    where = f"opforge.{name}"
    if not isinstance(grad_res, torch.Tensor):
        raise TypeError(f"{where}: grad_residual must be a torch.Tensor, got {type(grad_res).__name__}")
    if grad_res.shape != s.shape or grad_res.dtype != s.dtype or grad_res.device != s.device:
        raise ValueError(f"{where}: grad_residual ({grad_res.dtype}{tuple(grad_res.shape)} on {grad_res.device}) "
                         f"must match new_residual ({s.dtype}{tuple(s.shape)} on {s.device})")


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
class Forward:
    """A forward kernel (``row`` or ``split``) writing ``out`` and ``new_residual``."""

    def __init__(self, strategy: str):
        self.launch = K.launch_fwd_row if strategy == "row" else K.launch_fwd_split

    def __call__(self, g: N.Geometry, cfg, x, residual, shape, eps, weight=None, bias=None, outs=None):
        packed = None
        if outs is None:
            packed = torch.empty((2,) + tuple(x.shape), dtype=x.dtype, device=x.device)
            outs = (packed[0], packed[1])
        rows, cols = g.rows, g.cols
        if rows and cols:
            xc = x.contiguous().view(rows, cols)  # copies only for non-contiguous inputs
            rc = residual.contiguous().view(rows, cols)
            self.launch(xc, outs[0].view(rows, cols), weight.contiguous() if weight is not None else None,
                        bias.contiguous() if bias is not None else None, None, None, float(eps), g.is_rms, cfg,
                        res=rc, s=outs[1].view(rows, cols))
        return outs[0] if packed is None else packed


class Backward:
    """A backward kernel (``row`` or ``looped``) with the residual's gradient added in the kernel."""

    def __init__(self, strategy: str):
        self.strategy = strategy

    def __call__(self, g: N.Geometry, cfg, grad, grad_res, s, shape, eps, weight=None, bias=None):
        packed = torch.empty(s.numel() + g.cols * ((weight is not None) + (bias is not None)),
                             dtype=s.dtype, device=s.device)
        return N.backward_into(packed, grad, s, g.rows, g.cols, eps, weight, bias, g.is_rms, self.strategy, cfg,
                               grad_res=grad_res)


def geometry(name: str):
    """The normalized tensor: ``new_residual`` (backward, ``args[2]``) or ``input``."""
    backward = name.endswith("_backward")
    return N.geometry_at(name == "add_rms_norm" or name == "add_rms_norm_backward", backward,
                         2 if backward else 0, 3 if backward else 2)


def _reference(g: N.Geometry):
    if g.backward:
        return add_rms_norm_backward_reference if g.is_rms else add_layer_norm_backward_reference
    return add_rms_norm_reference if g.is_rms else add_layer_norm_reference


def eager_run(g: N.Geometry, cfg, *args):
    if g.backward:
        grad, grad_res, s, shape, eps, weight, bias = (args + (None, None))[:7]
        if g.is_rms:
            return add_rms_norm_backward_reference(grad, grad_res, s, shape, eps, weight)
        shape = list(shape)
        _, mean, rstd = torch.ops.aten.native_layer_norm(s, shape, weight, bias, eps)
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad, s, shape, mean, rstd, weight, bias, [True, weight is not None, bias is not None])
        return torch.cat([t.reshape(-1) for t in (dx + grad_res, dw, db) if t is not None])
    x, residual, shape, eps, weight, bias, outs = (args + (None, None, None))[:7]
    s = x + residual
    if g.is_rms:
        y = F.rms_norm(s, tuple(shape), weight, eps)
    else:
        y = F.layer_norm(s, tuple(shape), weight, bias, eps)
    return _packed_or_outs(y, s, outs)


def reference_run(g: N.Geometry, cfg, *args):
    return _reference(g)(*args).contiguous()  # outs (when given) are filled by the reference itself


row_check = functools.partial(N.row_check, hint="")


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order: the norm's checks and configs, residual runners."""
    if name.endswith("_backward"):
        what = "backward (norm backward + the residual's gradient, added in the kernel)"
        triton = [
            Spec("triton_row", Backward("row"), version=K.ROW_VERSION, dtypes=FLOATS, check=row_check,
                 configs=N.row_candidates, default_config=N.row_default, bucket=N.bucket,
                 description=f"{what}: tiles of whole rows in registers"),
            Spec("triton_looped", Backward("looped"), version=K.LOOPED_VERSION, dtypes=FLOATS,
                 configs=N.looped_configs, default_config=N.looped_default, bucket=N.bucket,
                 description=f"{what}: one row per program walked in column blocks"),
        ]
    else:
        what = "forward: x + residual stored and normalized in one pass"
        triton = [
            Spec("triton_row", Forward("row"), version=K.ROW_VERSION, dtypes=FLOATS, check=row_check,
                 configs=N.row_candidates, default_config=N.row_default, bucket=N.bucket,
                 description=f"{what}; tiles of whole rows in registers (cols <= {K.ROW_MAX})"),
            Spec("triton_split", Forward("split"), version=K.SPLIT_VERSION, dtypes=FLOATS, check=N.split_reason,
                 configs=N.split_candidates, default_config=N.split_default, bucket=N.bucket,
                 description=f"{what}; rows cut into column pieces, statistics merged in a second pass"),
        ]
    return triton + [
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=N.bucket,
             description="x + residual, then aten's norm kernels"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(is_rms: bool, backward: bool, device: torch.device) -> list[tuple]:
    """Inputs that reach every variant: with/without params, leading dims, a
    transposed input, a large common offset, a row longer than ``ROW_MAX``,
    and on CUDA bandwidth-sized shapes."""
    g = torch.Generator(device="cpu").manual_seed(17 if is_rms else 19)

    def rand(shape, dtype, shift=0.0):
        return (torch.randn(shape, generator=g) + shift).to(dtype).to(device)

    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        eps = N.default_rms_eps(dt) if is_rms else 1e-5
        shapes = [((67, 130), (130,), True, 0.0), ((3, 5, 40), (5, 40), True, 3.0),
                  ((130, 24), (24,), False, 0.0), ((2, K.ROW_MAX + 100), (K.ROW_MAX + 100,), True, 0.0)]
        if device.type == "cuda" and dt in (torch.float32, torch.bfloat16):
            shapes += [((300, 4 * K.ROW_MAX + 5), (4 * K.ROW_MAX + 5,), True, 2.0), ((4096, 1000), (1000,), True, 0.0)]
        for i, (shape, nshape, with_params, shift) in enumerate(shapes):
            x = rand(shape, dt, shift)
            if i == 2:
                x = rand(shape[::-1], dt).t()  # non-contiguous input
            params = ()
            if with_params:
                params = (rand(nshape, dt) * 0.5 + 1.0,) if is_rms else (rand(nshape, dt) * 0.5 + 1.0, rand(nshape, dt))
            if backward:
                s = x + rand(shape, dt)
                out.append((rand(shape, dt), rand(shape, dt), s, nshape, eps) + params)
            else:
                out.append((x, rand(shape, dt), nshape, eps) + params)
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _tensors(x, residual, shape, eps, w=None, b=None, outs=None):
    return tuple(t for t in (x, residual, w, b) if isinstance(t, torch.Tensor))


def _backward_tensors(grad, grad_res, s, shape, eps, w=None, b=None):
    return tuple(t for t in (s, grad, grad_res, w, b) if isinstance(t, torch.Tensor))


def _memo_key(x, residual, shape, eps, w=None, b=None, outs=None):
    return (x.dtype, x.shape, x.stride(), x.device, N._tkey(residual), residual.stride(), tuple(shape),
            N._tkey(w), N._tkey(b), type(eps), outs is None)


def _backward_memo_key(grad, grad_res, s, shape, eps, w=None, b=None):
    return (s.dtype, s.shape, s.stride(), s.device, N._tkey(grad), grad.stride(), N._tkey(grad_res),
            grad_res.stride(), tuple(shape), N._tkey(w), N._tkey(b), type(eps))


def _dtype_key(x, *rest):
    return str(x.dtype).replace("torch.", "")


def _backward_dtype_key(grad, grad_res, s, *rest):
    return str(s.dtype).replace("torch.", "")


def _references(name: str):
    return {"add_rms_norm": add_rms_norm_reference, "add_layer_norm": add_layer_norm_reference,
            "add_rms_norm_backward": add_rms_norm_backward_reference,
            "add_layer_norm_backward": add_layer_norm_backward_reference}[name]


def _doc(name: str) -> str:
    backward = name.endswith("_backward")
    return ("residual add + " + ("rms_norm" if name.startswith("add_rms") else "layer_norm")
            + (" backward (packed [d_input = d_residual, dweight?, dbias?])" if backward
               else " (packed [out, new_residual])"))


OPS = registry.register_family(
    ("add_rms_norm", "add_layer_norm", "add_rms_norm_backward", "add_layer_norm_backward"), specs,
    geometry=geometry, reference=_references,
    tensors=lambda name: _backward_tensors if name.endswith("_backward") else _tensors,
    memo_key=lambda name: _backward_memo_key if name.endswith("_backward") else _memo_key,
    dtype_key=lambda name: _backward_dtype_key if name.endswith("_backward") else _dtype_key,
    validate=lambda name: functools.partial(validate_backward if name.endswith("_backward") else validate, name),
    samples=lambda name: functools.partial(sample_inputs, name.startswith("add_rms"), name.endswith("_backward")),
    doc=_doc,
)


def _new_outs(x):
    """``(out, new_residual)``: two tensors (torch.library outputs must not share storage)."""
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device))


def _call(name, x, residual, shape, eps, weight, bias=None):
    outs = _new_outs(x)
    dispatch.call(OPS[name], x, residual, shape, eps, weight, bias, outs)
    return outs


def _needs(t) -> bool:
    return t is not None and t.requires_grad


def _grads(ctx, packed, s, weight, bias):
    ds, dw, db = N._unpack(packed, s, ctx.shape, weight, bias)
    return (ds if ctx.needs_x else None, ds if ctx.needs_res else None, None,
            dw if _needs(weight) else None, db if _needs(bias) else None)


# --- add_rms_norm -----------------------------------------------------------
def _rms_impl(x, residual, normalized_shape, weight=None, eps=None):
    return _call("add_rms_norm", x, residual, tuple(normalized_shape), N._resolve_eps(x, eps), weight)


def _rms_fake(x, residual, normalized_shape, weight=None, eps=None):
    validate("add_rms_norm", x, residual, tuple(normalized_shape), N._resolve_eps(x, eps), weight)
    return _new_outs(x)


def _rms_setup(ctx, inputs, output):
    x, residual, shape, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.shape, ctx.eps = tuple(shape), N._resolve_eps(x, eps)
    ctx.needs_x, ctx.needs_res = x.requires_grad, residual.requires_grad


def _rms_backward(ctx, grad_out, grad_res):
    s, weight = ctx.saved_tensors
    packed = torch.ops.opforge.add_rms_norm_backward(grad_out, grad_res, s, list(ctx.shape), weight, ctx.eps)
    return _grads(ctx, packed, s, weight, None)


def _rms_bwd_impl(grad, grad_res, s, normalized_shape, weight, eps):
    return dispatch.call(OPS["add_rms_norm_backward"], grad, grad_res, s, tuple(normalized_shape), eps, weight)


def _rms_bwd_fake(grad, grad_res, s, normalized_shape, weight, eps):
    validate_backward("add_rms_norm_backward", grad, grad_res, s, tuple(normalized_shape), eps, weight)
    return s.new_empty(N._packed_numel(s, normalized_shape, weight is not None, False))


# --- add_layer_norm ---------------------------------------------------------
def _ln_impl(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _call("add_layer_norm", x, residual, tuple(normalized_shape), eps, weight, bias)


def _ln_fake(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    validate("add_layer_norm", x, residual, tuple(normalized_shape), eps, weight, bias)
    return _new_outs(x)


def _ln_setup(ctx, inputs, output):
    x, residual, shape, weight, bias, eps = inputs
    ctx.save_for_backward(output[1], weight, bias)
    ctx.shape, ctx.eps = tuple(shape), eps
    ctx.needs_x, ctx.needs_res = x.requires_grad, residual.requires_grad


def _ln_backward(ctx, grad_out, grad_res):
    s, weight, bias = ctx.saved_tensors
    packed = torch.ops.opforge.add_layer_norm_backward(grad_out, grad_res, s, list(ctx.shape), weight, bias,
                                                       ctx.eps)
    return _grads(ctx, packed, s, weight, bias) + (None,)


def _ln_bwd_impl(grad, grad_res, s, normalized_shape, weight, bias, eps):
    return dispatch.call(OPS["add_layer_norm_backward"], grad, grad_res, s, tuple(normalized_shape), eps,
                         weight, bias)


def _ln_bwd_fake(grad, grad_res, s, normalized_shape, weight, bias, eps):
    validate_backward("add_layer_norm_backward", grad, grad_res, s, tuple(normalized_shape), eps, weight, bias)
    return s.new_empty(N._packed_numel(s, normalized_shape, weight is not None, bias is not None))


define("add_rms_norm_backward(Tensor grad, Tensor grad_residual, Tensor new_residual, SymInt[] normalized_shape, "
       "Tensor? weight, float eps) -> Tensor", _rms_bwd_impl, _rms_bwd_fake)
define("add_layer_norm_backward(Tensor grad, Tensor grad_residual, Tensor new_residual, "
       "SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor", _ln_bwd_impl, _ln_bwd_fake)
define("add_rms_norm(Tensor input, Tensor residual, SymInt[] normalized_shape, Tensor? weight=None, "
       "float? eps=None) -> (Tensor, Tensor)", _rms_impl, _rms_fake, _rms_backward, _rms_setup)
define("add_layer_norm(Tensor input, Tensor residual, SymInt[] normalized_shape, Tensor? weight=None, "
       "Tensor? bias=None, float eps=1e-05) -> (Tensor, Tensor)", _ln_impl, _ln_fake, _ln_backward, _ln_setup)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------
_grad_enabled = torch.is_grad_enabled


def _direct(input, residual, *params) -> bool:
    """The dispatcher can be called directly (see ``library.direct_ok``), params included."""
    if not direct_ok(input, residual) or type(residual) is not _Tensor:
        return False
    return all(p is None or (type(p) is _Tensor and not (p.requires_grad and _grad_enabled())) for p in params)


def _check_public(name, input, residual, eps, params):
    N._check_common(name, input, eps)
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"opforge.{name}: residual must be a torch.Tensor, got {type(residual).__name__}")
    for what, t in params:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"opforge.{name}: {what} must be a torch.Tensor or None, got {type(t).__name__}")


def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape,
                 weight: torch.Tensor | None = None, eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(input + residual), input + residual)`` in one pass (``eps=None``: torch's default)."""
    _check_public("add_rms_norm", input, residual, eps, (("weight", weight),))
    shape = N.normalize_shape("add_rms_norm", normalized_shape)
    eps = None if eps is None else float(eps)
    if _direct(input, residual, weight):
        return _call("add_rms_norm", input, residual, shape, N._resolve_eps(input, eps), weight)
    return torch.ops.opforge.add_rms_norm(input, residual, list(shape), weight, eps)


def add_layer_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape,
                   weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer_norm(input + residual), input + residual)`` in one pass."""
    _check_public("add_layer_norm", input, residual, eps, (("weight", weight), ("bias", bias)))
    shape = N.normalize_shape("add_layer_norm", normalized_shape)
    eps = float(eps)
    if _direct(input, residual, weight, bias):
        return _call("add_layer_norm", input, residual, shape, eps, weight, bias)
    return torch.ops.opforge.add_layer_norm(input, residual, list(shape), weight, bias, eps)


__all__ = ["add_rms_norm", "add_layer_norm"]
