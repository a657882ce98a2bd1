"""Quantization ops: ``opforge.quantize`` and ``opforge.dequantize``.

``quantize(x, dtype, granularity, block=, axis=, symmetric=, scale=, zero_point=)``
returns a :class:`QuantizedTensor`: ``data`` (x's shape, contiguous, int8 or
fp8), ``scale`` (fp32) and ``zero_point`` (int32, None when symmetric), laid
out so a GEMM can take ``(q.data, q.scale)`` directly:

==============  ================================  ==================================
granularity     one scale per                     ``scale.shape``
==============  ================================  ==================================
``"tensor"``    the whole tensor                  ``()``
``"token"``     row (the last dim reduced)         ``x.shape[:-1] + (1,)``: ``[M, 1]``
``"channel"``   index of ``axis`` (others reduced)  ``x.shape`` with 1 off ``axis``:
                                                  ``[1, N]`` (axis -1), ``[N, 1]`` (axis 0)
``"block"``     ``bm x bk`` block of a 2-D tensor  ``[ceil(M / bm), ceil(K / bk)]``
==============  ================================  ==================================

Per-block tiles the tensor from the top-left corner; when ``bm`` or ``bk``
does not divide the size, the last block of a row/column is smaller and its
scale covers just its valid values (ragged edges are allowed).

Formats: ``torch.int8`` symmetric uses -127..127 (a symmetric range, so
``-q`` is always representable), asymmetric -128..127 with
``zero_point = clamp(rne(-min / scale) - 128, -128, 127)`` (int32);
``torch.float8_e4m3fn`` (max 448) and ``torch.float8_e5m2`` (max 57344) are
symmetric only. Values saturate to the finite range (+-inf included); a NaN
quantizes to NaN in fp8 and to 0 in int8. Scales come from finite values
only, over a range that always contains 0; an all-zero group gets the
smallest normal fp32 as its scale (never a division by zero). Rounding is
half to even everywhere; the arithmetic is fp32 (an fp64 input is rounded to
fp32 first) and identical, step for step, in the kernels and in
:func:`quantize_reference`, so results are bit-exact (see
``opforge.kernels.quant``). Static quantization passes ``scale=`` (and
``zero_point=`` when asymmetric): calibrated activations, one pass.

``dequantize(q, dtype=None)`` computes ``(data - zero_point) * scale`` in fp32
and rounds once to ``dtype`` (default: the dtype ``x`` had).

Not differentiable: outputs carry no gradient (straight-through estimators
are out of scope).

Registry ops: ``quantize`` (variants ``triton_static``, ``triton_fused``,
``triton_stats``, ``torch_eager``, ``reference``) returns ``(data, scale,
zero_point)`` with an empty int32 zero point when symmetric; ``dequantize``
(``triton``, ``torch_eager``, ``reference``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opforge.kernels import quant as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

INPUT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
QDTYPES = frozenset(QMAX)
OUT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
GRANULARITIES = ("tensor", "token", "channel", "block")
DEFAULT_BLOCK = (128, 128)
FLT_MIN = torch.finfo(torch.float32).tiny

_Q = "opforge.quantize"
_DQ = "opforge.dequantize"


@dataclass
class QuantizedTensor:
    """A quantized tensor. ``data`` and ``scale`` are what a GEMM consumes."""

    data: torch.Tensor  # x's shape, contiguous, int8 / float8
    scale: torch.Tensor  # fp32, shape per granularity (module docstring)
    zero_point: torch.Tensor | None  # int32, scale's shape; None when symmetric
    granularity: str
    block: tuple[int, int] | None = None  # (bm, bk) for "block"
    axis: int | None = None  # the kept dim for "channel" (non-negative)
    dtype: torch.dtype = torch.float32  # what dequantize returns by default

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(self, dtype)


# ---------------------------------------------------------------------------
# Geometry: how a granularity maps a shape onto the kernels' [R, C] view (the
# plan), and the facts every variant decides and runs on
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """``kind``: "flat" ([1, N], one scale), "rows" ([R, C], a scale per row
    or per bm x bk block), "cols" ([R, C], a scale per column), "moved" (the
    channel axis is moved last by a copy, then "cols")."""

    kind: str
    R: int
    C: int
    bm: int
    bk: int
    scale_shape: tuple[int, ...]
    axis: int | None = None

    @property
    def mode(self) -> int:  # kernels' scale-index MODE
        if self.kind == "flat":
            return 0
        if self.kind in ("cols", "moved"):
            return 2
        return 1 if self.bk >= self.C else 3

    @property
    def groups(self) -> tuple[int, int]:
        return -(-self.R // self.bm), -(-self.C // self.bk)


def plan(shape: tuple[int, ...], granularity: str, block, axis: int | None) -> Plan:
    n = math.prod(shape)
    if granularity == "tensor":
        return Plan("flat", 1, n, 1, max(n, 1), ())
    if granularity == "token":
        C = shape[-1]
        R = n // C if C else math.prod(shape[:-1])
        return Plan("rows", R, C, 1, max(C, 1), tuple(shape[:-1]) + (1,))
    if granularity == "channel":
        a = axis % len(shape)
        outer, A, inner = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])
        sshape = tuple(s if i == a else 1 for i, s in enumerate(shape))
        if inner == 1:
            return Plan("cols", outer, A, max(outer, 1), 1, sshape, a)
        if outer == 1:
            return Plan("rows", A, inner, 1, inner, sshape, a)
        return Plan("moved", outer * inner, A, max(outer * inner, 1), 1, sshape, a)
    bm, bk = block
    R, C = shape
    return Plan("rows", R, C, bm, bk, (-(-R // bm), -(-C // bk)))


def _norm_block(block) -> tuple[int, int]:
    if block is None:
        return DEFAULT_BLOCK
    if not isinstance(block, (tuple, list)):
        raise TypeError(f"{_Q}: block must be a pair of ints (bm, bk), got {block!r}")
    return tuple(block)


def _args(args):
    """quantize's arguments in full: ``block`` a tuple, absent scale and zero point None."""
    x, dtype, granularity, block, axis, symmetric = args[:6]
    scale = args[6] if len(args) > 6 else None
    zp = args[7] if len(args) > 7 else None
    return x, dtype, granularity, tuple(block), axis, symmetric, scale, zp


def _dq_args(args):
    """dequantize's arguments in full: ``block`` a tuple, an absent zero point None."""
    data, scale, granularity, block, axis, out_dtype = args[:6]
    zp = args[6] if len(args) > 6 else None
    return data, scale, granularity, tuple(block), axis, out_dtype, zp


@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's facts, all in the memo key: the plan, the granularity, the
    dtype made (quantize: the quantized one; dequantize: the float one), whether
    there is no zero point, and whether the scales are given (static)."""

    plan: Plan
    granularity: str
    dtype: torch.dtype
    symmetric: bool
    static: bool

    @property
    def rc(self) -> tuple[int, int]:
        return self.plan.R, self.plan.C


def quantize_geometry(x, dtype, granularity, block, axis, symmetric, scale=None, zero_point=None) -> Geometry:
    return Geometry(plan(tuple(x.shape), granularity, tuple(block), axis), granularity, dtype, symmetric,
                    scale is not None)


def dequantize_geometry(data, scale, granularity, block, axis, out_dtype, zero_point=None) -> Geometry:
    return Geometry(plan(tuple(data.shape), granularity, tuple(block), axis), granularity, out_dtype,
                    zero_point is None, False)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _check_dtype(where, dtype):
    if dtype not in QDTYPES:
        raise TypeError(f"{where}: dtype must be one of torch.int8, torch.float8_e4m3fn, torch.float8_e5m2; "
                        f"got {dtype}")


def _check_geometry(where, shape, granularity, block, axis):
    if granularity not in GRANULARITIES:
        raise ValueError(f"{where}: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if granularity in ("token", "channel") and len(shape) == 0:
        raise ValueError(f"{where}: granularity {granularity!r} needs a tensor with at least 1 dim, got a 0-dim one")
    if granularity == "channel":
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"{where}: axis must be an int, got {type(axis).__name__}")
        if not -len(shape) <= axis < len(shape):
            raise ValueError(f"{where}: axis {axis} is out of range for a tensor with {len(shape)} dims "
                             f"(expected {-len(shape)} <= axis < {len(shape)})")
    if granularity == "block":
        if len(shape) != 2:
            raise ValueError(f"{where}: granularity 'block' needs a 2-D tensor, got {len(shape)} dims "
                             f"(reshape leading dims into rows first)")
        if (not isinstance(block, (tuple, list)) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in block)):
            raise TypeError(f"{where}: block must be a pair of ints (bm, bk), got {block!r}")
        if block[0] < 1 or block[1] < 1:
            raise ValueError(f"{where}: block sizes must be positive, got {tuple(block)}")
    elif block:
        raise ValueError(f"{where}: block={tuple(block)} is only for granularity 'block', "
                         f"not {granularity!r}")


def _check_scale(where, t, name, expected_shape, dtype, device, granularity):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{where}: {name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{where}: {name} is on {t.device} but the data is on {device}")
    ok = t.numel() == 1 if granularity == "tensor" else tuple(t.shape) == tuple(expected_shape)
    if not ok:
        raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}; granularity {granularity!r} needs "
                         f"{tuple(expected_shape)}")


def validate(x, dtype, granularity, block, axis, symmetric, scale=None, zero_point=None) -> None:
    check_tensor(_Q, "input", x)
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{_Q}: input must be float16, bfloat16, float32 or float64, got {x.dtype}")
    _check_dtype(_Q, dtype)
    if not isinstance(symmetric, bool):
        raise TypeError(f"{_Q}: symmetric must be a bool, got {type(symmetric).__name__}")
    if not symmetric and dtype != torch.int8:
        raise ValueError(f"{_Q}: asymmetric quantization is int8 only (fp8 is symmetric), got dtype {dtype}")
    _check_geometry(_Q, tuple(x.shape), granularity, block, axis)
    if scale is None and zero_point is not None:
        raise ValueError(f"{_Q}: zero_point is given without scale (static quantization needs both)")
    if scale is not None:
        p = plan(tuple(x.shape), granularity, block, axis)
        _check_scale(_Q, scale, "scale", p.scale_shape, torch.float32, x.device, granularity)
        if symmetric and zero_point is not None:
            raise ValueError(f"{_Q}: zero_point is given but symmetric=True")
        if not symmetric:
            if zero_point is None:
                raise ValueError(f"{_Q}: asymmetric static quantization needs zero_point with scale")
            _check_scale(_Q, zero_point, "zero_point", p.scale_shape, torch.int32, x.device, granularity)


def validate_dequantize(data, scale, granularity, block, axis, out_dtype, zero_point=None) -> None:
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{_DQ}: data must be a torch.Tensor, got {type(data).__name__}")
    _check_dtype(_DQ, data.dtype)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"{_DQ}: dtype must be float16, bfloat16 or float32, got {out_dtype}")
    _check_geometry(_DQ, tuple(data.shape), granularity, block, axis)
    p = plan(tuple(data.shape), granularity, block, axis)
    _check_scale(_DQ, scale, "scale", p.scale_shape, torch.float32, data.device, granularity)
    if zero_point is not None:
        if data.dtype != torch.int8:
            raise ValueError(f"{_DQ}: a zero_point is int8 only, data is {data.dtype}")
        _check_scale(_DQ, zero_point, "zero_point", p.scale_shape, torch.int32, data.device, granularity)


# ---------------------------------------------------------------------------
# Reference semantics (plain torch; every step one fp32 operation)
# ---------------------------------------------------------------------------
def _expand(t: torch.Tensor, p: Plan, shape) -> torch.Tensor:
    """A per-group tensor broadcast to x's shape."""
    if p.kind == "flat":
        return t.reshape(())
    if len(shape) == 2 and tuple(t.shape) == p.groups and (p.bm > 1 or p.bk < p.C):
        return t.repeat_interleave(p.bm, 0)[: p.R].repeat_interleave(p.bk, 1)[:, : p.C]
    return t


def _group_stats(xz: torch.Tensor, p: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """max(x, 0) and min(x, 0) per group, shaped like the scale."""
    if xz.numel() == 0:
        z = torch.zeros(p.scale_shape, dtype=torch.float32, device=xz.device)
        return z, z.clone()
    if p.kind == "flat":
        return xz.amax().clamp_min(0), xz.amin().clamp_max(0)
    if len(p.scale_shape) == 2 and p.scale_shape == p.groups and xz.dim() == 2 and (p.bm > 1 or p.bk < p.C):
        nr, nc = p.groups
        padded = xz.new_zeros(nr * p.bm, nc * p.bk)
        padded[: p.R, : p.C] = xz
        v = padded.view(nr, p.bm, nc, p.bk)
        return v.amax(dim=(1, 3)).clamp_min(0), v.amin(dim=(1, 3)).clamp_max(0)
    dims = tuple(i for i, s in enumerate(p.scale_shape) if s == 1 and xz.shape[i] != 1) or None
    if dims is None:
        return xz.clamp_min(0), xz.clamp_max(0)
    return xz.amax(dim=dims, keepdim=True).clamp_min(0), xz.amin(dim=dims, keepdim=True).clamp_max(0)


def quantize_reference(x, dtype, granularity="tensor", block=(), axis=-1, symmetric=True,
                       scale=None, zero_point=None):
    """The semantics, in torch: returns ``(data, scale, zero_point)`` (an empty
    int32 zero point when symmetric). Bit-exact with the kernels."""
    p = plan(tuple(x.shape), granularity, block, axis)
    x32 = x.to(torch.float32)
    qmax = QMAX[dtype]
    if scale is None:
        xz = torch.where(x32.abs() < math.inf, x32, torch.zeros((), dtype=torch.float32, device=x.device))
        mx, mn = _group_stats(xz, p)
        # A tensor divisor: torch divides a CUDA tensor by a Python scalar as a
        # multiply by its rounded reciprocal, one rounding off the kernels' div_rn.
        if symmetric:
            s = torch.maximum(mx, -mn) / torch.full_like(mx, qmax)
        else:
            s = (mx - mn) / torch.full_like(mx, 255.0)
        s = s.clamp_min(FLT_MIN)
        inv = 1.0 / s
        zp = None if symmetric else (torch.round(-mn * inv) - 128.0).clamp(-128, 127)
    else:
        s = scale.to(torch.float32).reshape(p.scale_shape)
        inv = 1.0 / s.clamp_min(FLT_MIN)
        zp = None if symmetric else zero_point.reshape(p.scale_shape).to(torch.float32)
    v = x32 * _expand(inv, p, x.shape)
    if dtype == torch.int8:
        r = torch.round(v)
        if symmetric:
            r = r.clamp(-qmax, qmax)
        else:
            r = (r + _expand(zp, p, x.shape)).clamp(-128, 127)
        data = torch.where(torch.isnan(r), torch.zeros((), device=x.device), r).to(torch.int8)
    else:
        data = v.clamp(-qmax, qmax).to(dtype)
    empty = torch.empty(0, dtype=torch.int32, device=x.device)
    zp_out = empty if zp is None else zp.to(torch.int32).reshape(p.scale_shape).contiguous()
    return data.contiguous(), s.reshape(p.scale_shape).contiguous(), zp_out


def dequantize_reference(data, scale, granularity="tensor", block=(), axis=-1, out_dtype=torch.float32,
                         zero_point=None):
    p = plan(tuple(data.shape), granularity, block, axis)
    q = data.to(torch.float32)
    if zero_point is not None:
        q = q - _expand(zero_point.reshape(p.scale_shape).to(torch.float32), p, data.shape)
    s = scale.reshape(p.scale_shape)
    return (q * _expand(s.to(torch.promote_types(s.dtype, torch.float32)), p, data.shape)).to(out_dtype)


# ---------------------------------------------------------------------------
# Variants: buffers and runners, then checks, configs and buckets, then the specs
# ---------------------------------------------------------------------------
def _rows(t: torch.Tensor, p: Plan) -> torch.Tensor:
    """``t`` as the plan's [R, C] view with unit column stride (a copy only
    when the layout does not allow a view)."""
    if p.kind == "moved":
        return t.movedim(p.axis, -1).contiguous().view(p.R, p.C)
    if p.kind == "flat":
        return t.reshape(1, p.C)
    try:
        v = t.view(p.R, p.C)
        if v.stride(1) == 1 or p.C <= 1:
            return v
    except RuntimeError:
        pass
    return t.contiguous().view(p.R, p.C)


def _outputs(x, dtype, p: Plan, symmetric: bool):
    data = torch.empty(x.shape, dtype=dtype, device=x.device)
    scale = torch.empty(p.scale_shape, dtype=torch.float32, device=x.device)
    zp = torch.empty(p.scale_shape if not symmetric else (0,), dtype=torch.int32, device=x.device)
    return data, scale, zp


def _empty_groups(s_out, z_out, symmetric):
    """Groups with no values (e.g. rows of zero length): scale FLT_MIN, zp -128."""
    s_out.fill_(FLT_MIN)
    if not symmetric:
        z_out.fill_(-128)


def _data_rows(data: torch.Tensor, p: Plan):
    """The [R, C] buffer the kernel writes and a function that puts it in ``data``."""
    if p.kind != "moved":
        return data.view(p.R, p.C), lambda: None
    moved = data.movedim(p.axis, -1)
    buf = torch.empty(moved.shape, dtype=data.dtype, device=data.device)
    return buf.view(p.R, p.C), lambda: moved.copy_(buf)


def _scale_strides(p: Plan) -> tuple[int, int]:
    if p.kind == "flat":
        return 0, 0
    if p.mode == 3:
        return p.groups[1], 1
    return (1, 0) if p.mode == 1 else (0, 1)


def static_run(g: Geometry, cfg, x, dtype, granularity, block, axis, symmetric, scale=None, zero_point=None):
    p = g.plan
    data, s_out, z_out = _outputs(x, dtype, p, symmetric)
    s_out.copy_(scale.reshape(p.scale_shape))
    if not symmetric:
        z_out.copy_(zero_point.reshape(p.scale_shape))
    if x.numel():
        rows, finish = _data_rows(data, p)
        ssr, ssc = _scale_strides(p)
        K.launch_apply(_rows(x, p), rows, s_out, None if symmetric else z_out, p.mode, p.bm, p.bk, ssr, ssc,
                       QMAX[dtype], symmetric, cfg)
        finish()
    return data, s_out, z_out


def fused_run(g: Geometry, cfg, x, *rest):
    p, dtype, symmetric = g.plan, g.dtype, g.symmetric
    data, s_out, z_out = _outputs(x, dtype, p, symmetric)
    nr, nc = p.groups
    if x.numel():
        K.launch_group_quant(_rows(x, p), data.view(p.R, p.C), s_out.view(nr, nc),
                             None if symmetric else z_out.view(nr, nc), p.bm, p.bk, QMAX[dtype], symmetric, cfg)
    elif s_out.numel():
        _empty_groups(s_out, z_out, symmetric)
    return data, s_out, z_out


def stats_run(g: Geometry, cfg, x, *rest):
    p, dtype, symmetric = g.plan, g.dtype, g.symmetric
    data, s_out, z_out = _outputs(x, dtype, p, symmetric)
    zbuf = None if symmetric else z_out
    if x.numel() == 0:
        if s_out.numel():
            _empty_groups(s_out, z_out, symmetric)
        return data, s_out, z_out
    xr = _rows(x, p)
    if p.kind == "flat":
        K.launch_tensor_stats(xr.view(-1), s_out, zbuf, QMAX[dtype], symmetric, cfg)
    else:
        K.launch_rc_stats(xr, s_out, zbuf, p.kind in ("cols", "moved"), QMAX[dtype], symmetric, cfg)
    rows, finish = _data_rows(data, p)
    ssr, ssc = _scale_strides(p)
    K.launch_apply(xr, rows, s_out, zbuf, p.mode, p.bm, p.bk, ssr, ssc, QMAX[dtype], symmetric,
                   K.apply_default_config(p.R, p.C))
    finish()
    return data, s_out, z_out


def dequantize_run(g: Geometry, cfg, data, scale, granularity, block, axis, out_dtype, zero_point=None):
    p = g.plan
    y = torch.empty(data.shape, dtype=out_dtype, device=data.device)
    if data.numel():
        rows, finish = _data_rows(y, p)
        ssr, ssc = _scale_strides(p)
        K.launch_dequant(_rows(data, p), rows, scale.contiguous(),
                         None if zero_point is None else zero_point.contiguous(), p.mode, p.bm, p.bk, ssr, ssc, cfg)
        finish()
    return y


def quantize_eager_run(g: Geometry, cfg, *args):
    return quantize_reference(*_args(args))


def dequantize_eager_run(g: Geometry, cfg, *args):
    return dequantize_reference(*_dq_args(args))


def static_check(g: Geometry) -> str | None:
    return None if g.static else "no scale given (static quantization only)"


def fused_check(g: Geometry) -> str | None:
    if g.static:
        return "a scale is given (static quantization runs triton_static)"
    p = g.plan
    if p.kind != "rows":
        return f"groups of a {p.kind} plan do not fit one program"
    if not K.fused_fits(p.bm, p.bk):
        return f"groups of {p.bm}x{p.bk} exceed {K.ROW_LIMIT} values a program"
    return None


def stats_check(g: Geometry) -> str | None:
    if g.static:
        return "a scale is given (static quantization runs triton_static)"
    if g.plan.kind == "rows" and g.plan.mode == 3:
        return "per-block groups run fused (triton_fused) or not at all"
    return None


def apply_configs(g: Geometry):
    return K.apply_configs(*g.rc)


def apply_default(g: Geometry):
    return K.apply_default_config(*g.rc)


def fused_configs(g: Geometry):
    return K.fused_configs(*g.rc, g.plan.bm, g.plan.bk)


def fused_default(g: Geometry):
    return K.fused_default_config(*g.rc, g.plan.bm, g.plan.bk)


def stats_configs(g: Geometry):
    return K.stats_configs(*g.rc)


def stats_default(g: Geometry):
    return K.stats_default_config(*g.rc)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def quantize_bucket(g: Geometry) -> str:
    tag = f"{g.granularity}:{_dtype_name(g.dtype)}:{'s' if g.symmetric else 'a'}"
    if g.granularity == "block":
        tag += f":{g.plan.bm}x{g.plan.bk}"
    return f"{bucket_size(g.plan.R)}x{bucket_size(g.plan.C)}:{tag}:{'static' if g.static else 'dyn'}"


def dequantize_bucket(g: Geometry) -> str:
    return f"{bucket_size(g.plan.R)}x{bucket_size(g.plan.C)}:{g.granularity}:{_dtype_name(g.dtype)}" \
           f":{'s' if g.symmetric else 'a'}"


def specs(name: str) -> list[Spec]:
    """The variants of op ``name``, in dispatch order."""
    eager = "the reference's torch ops, on the GPU"
    reference = "plain torch (the oracle and the CPU fallback)"
    if name == "dequantize":
        return [
            Spec("triton_apply", dequantize_run, version=K.DEQUANT_VERSION, dtypes=QDTYPES, configs=apply_configs,
                 default_config=apply_default, bucket=dequantize_bucket,
                 description="(q - zp) * scale, one read, one write"),
            Spec("torch_eager", dequantize_eager_run, kind="vendor", devices=("cuda",), dtypes=QDTYPES,
                 bucket=dequantize_bucket, description=eager),
            Spec("reference", dequantize_eager_run, kind="reference", devices=("cpu", "cuda"), description=reference),
        ]
    return [
        Spec("triton_static", static_run, version=K.STATIC_VERSION, dtypes=INPUT_DTYPES, check=static_check,
             configs=apply_configs, default_config=apply_default, bucket=quantize_bucket,
             description="given scales (static quantization): one read, one write"),
        Spec("triton_fused", fused_run, version=K.FUSED_VERSION, dtypes=INPUT_DTYPES, check=fused_check,
             configs=fused_configs, default_config=fused_default, bucket=quantize_bucket,
             description="per-token / per-block: each group's absmax and its quantization in one "
                         "program; one read, one write"),
        Spec("triton_stats", stats_run, version=K.STATS_VERSION, dtypes=INPUT_DTYPES, check=stats_check,
             configs=stats_configs, default_config=stats_default, bucket=quantize_bucket,
             description="per-tensor / per-channel / long rows: partial min/max, finalize, then "
                         "quantize; two reads, one write"),
        Spec("torch_eager", quantize_eager_run, kind="vendor", devices=("cuda",), dtypes=INPUT_DTYPES,
             bucket=quantize_bucket, description=eager),
        Spec("reference", quantize_eager_run, kind="reference", devices=("cpu", "cuda"), description=reference),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _rand(shape, g, dtype, scale=2.0, device="cpu"):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def sample_inputs(device: torch.device) -> list[tuple]:
    """Every granularity, format and input dtype; ragged blocks, a transposed
    input, long rows (the stats path), static scales; a few larger shapes."""
    g = torch.Generator(device="cpu").manual_seed(7)
    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for q in QMAX:  # a dict: its order is fixed (a frozenset's varies between runs)
            out += [
                (_rand((37, 200), g, dt, device=device), q, "token", (), -1, True),
                (_rand((130, 260), g, dt, device=device), q, "block", (128, 128), -1, True),
                (_rand((5, 7, 33), g, dt, device=device), q, "tensor", (), -1, True),
                (_rand((64, 48), g, dt, device=device), q, "channel", (), -1, True),
            ]
        out += [
            (_rand((37, 200), g, dt, device=device), torch.int8, "token", (), -1, False),
            (_rand((64, 40), g, dt, device=device).t(), torch.int8, "channel", (), 0, False),
            (_rand((3, 20, 9), g, dt, device=device), torch.int8, "channel", (), 1, False),
        ]
    out += [
        (_rand((4, 40000), g, torch.bfloat16, device=device), torch.float8_e4m3fn, "token", (), -1, True),
        (_rand((1024, 4096), g, torch.bfloat16, device=device), torch.float8_e4m3fn, "block", (1, 128), -1, True),
        (_rand((2048, 4096), g, torch.bfloat16, device=device), torch.int8, "tensor", (), -1, True),
        (_rand((96, 200), g, torch.float32, device=device), torch.int8, "block", (32, 64), -1, False),
    ]
    # Specials: a row max of qmax makes the scale 1, so halves are exact ties
    # and fp8 subnormals are hit exactly; NaN and +-inf in every row.
    for q, top, tiny in ((torch.int8, 127.0, 0.5), (torch.float8_e4m3fn, 448.0, 2.0 ** -10),
                         (torch.float8_e5m2, 57344.0, 2.0 ** -17)):
        row = torch.tensor([top, 0.5, 1.5, 2.5, -2.5, -0.5, float("nan"), float("inf"), float("-inf"),
                            3 * tiny, 5 * tiny, -tiny, 1.0 + 2.0 ** -4, 0.0, -0.0, 126.5], dtype=torch.float32)
        xs = torch.cat([row, _rand((48,), g, torch.float32)]).repeat(8, 4).to(device)
        out.append((xs, q, "token", (), -1, True))
        out.append((xs, q, "block", (4, 64), -1, True))
    x = _rand((300, 256), g, torch.bfloat16, device=device)
    _, s, _ = quantize_reference(x, torch.int8, "tensor")
    out.append((x, torch.int8, "tensor", (), -1, True, s * 1.5))
    _, s, z = quantize_reference(x, torch.int8, "token", symmetric=False)
    out.append((x, torch.int8, "token", (), -1, False, s, z))
    _, s, _ = quantize_reference(x, torch.float8_e4m3fn, "block", (64, 128))
    out.append((x, torch.float8_e4m3fn, "block", (64, 128), -1, True, s))
    return out


def dequantize_sample_inputs(device: torch.device) -> list[tuple]:
    out = []
    for args in sample_inputs(device)[::3]:
        data, s, z = quantize_reference(*_args(args))
        x, _, granularity, block, axis, symmetric = args[:6]
        for od in (torch.float32, torch.bfloat16):
            out.append((data, s, granularity, block, axis, od) + (() if symmetric else (z,)))
    return out


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------
def _meta(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _quantize_memo_key(x, dtype, granularity, block, axis, symmetric, scale=None, zero_point=None):
    return (x.dtype, x.shape, x.stride(), x.device, dtype, granularity, tuple(block), axis, symmetric,
            _meta(scale), _meta(zero_point))


def _dequantize_memo_key(data, scale, granularity, block, axis, out_dtype, zero_point=None):
    return (data.dtype, data.shape, data.stride(), data.device, _meta(scale), granularity, tuple(block), axis,
            out_dtype, _meta(zero_point))


def _quantize_dtype_key(x, dtype, *rest):
    return f"{x.dtype}->{dtype}".replace("torch.", "")


def _dequantize_dtype_key(data, scale, granularity, block, axis, out_dtype, *rest):
    return f"{data.dtype}->{out_dtype}".replace("torch.", "")


def _first_tensor(t, *rest):
    return (t,)


def _validate_quantize(*args):
    validate(*_args(args))


def _validate_dequantize(*args):
    validate_dequantize(*_dq_args(args))


OPS = registry.register_family(
    ("quantize", "dequantize"), specs,
    geometry=lambda name: quantize_geometry if name == "quantize" else dequantize_geometry,
    reference=lambda name: quantize_reference if name == "quantize" else dequantize_reference,
    tensors=lambda name: _first_tensor,
    memo_key=lambda name: _quantize_memo_key if name == "quantize" else _dequantize_memo_key,
    dtype_key=lambda name: _quantize_dtype_key if name == "quantize" else _dequantize_dtype_key,
    validate=lambda name: _validate_quantize if name == "quantize" else _validate_dequantize,
    samples=lambda name: sample_inputs if name == "quantize" else dequantize_sample_inputs,
    doc=lambda name: "quantize to int8 / fp8 with per-tensor, per-token, per-channel or per-block scales"
    if name == "quantize" else "(data - zero_point) * scale back to a float dtype",
)
QUANTIZE, DEQUANTIZE = OPS["quantize"], OPS["dequantize"]


def _quantize_impl(x, dtype, granularity, block, axis, symmetric, scale, zero_point):
    args = (x, dtype, granularity, list(block), axis, symmetric)
    if scale is not None:
        args += (scale,) if zero_point is None else (scale, zero_point)
    return tuple(dispatch.call(QUANTIZE, *args))


def _quantize_fake(x, dtype, granularity, block, axis, symmetric, scale, zero_point):
    validate(x, dtype, granularity, tuple(block), axis, symmetric, scale, zero_point)
    p = plan(tuple(x.shape), granularity, tuple(block), axis)
    return _outputs(x, dtype, p, symmetric)


define("quantize(Tensor x, ScalarType dtype, str granularity, int[] block, int axis, bool symmetric, "
       "Tensor? scale, Tensor? zero_point) -> (Tensor, Tensor, Tensor)", _quantize_impl, _quantize_fake)


def _dequantize_impl(data, scale, zero_point, granularity, block, axis, dtype):
    args = (data, scale, granularity, list(block), axis, dtype)
    if zero_point is not None:
        args += (zero_point,)
    return dispatch.call(DEQUANTIZE, *args)


def _dequantize_fake(data, scale, zero_point, granularity, block, axis, dtype):
    validate_dequantize(data, scale, granularity, tuple(block), axis, dtype, zero_point)
    return torch.empty(data.shape, dtype=dtype, device=data.device)


define("dequantize(Tensor data, Tensor scale, Tensor? zero_point, str granularity, int[] block, int axis, "
       "ScalarType dtype) -> Tensor", _dequantize_impl, _dequantize_fake)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------
def quantize(x: torch.Tensor, dtype: torch.dtype = torch.int8, granularity: str = "tensor", *,
             block: tuple[int, int] | None = None, axis: int = -1, symmetric: bool = True,
             scale: torch.Tensor | None = None, zero_point: torch.Tensor | None = None) -> QuantizedTensor:
    """Quantize ``x`` to ``dtype`` (int8, float8_e4m3fn, float8_e5m2) with one
    scale per ``granularity`` group ("tensor", "token", "channel" over
    ``axis``, "block" of ``block=(bm, bk)``, default 128x128). ``scale=``
    (and ``zero_point=``) quantize with given scales (static). Not
    differentiable. See the module docstring for the exact semantics."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
    blk = list(_norm_block(block)) if granularity == "block" or block is not None else []
    if direct_ok(x) and type(scale) in (type(None), torch.Tensor) and type(zero_point) in (type(None), torch.Tensor):
        args = (x, dtype, granularity, blk, axis, symmetric)
        if scale is not None or zero_point is not None:
            args += (scale, zero_point)
        data, s, z = dispatch.call(QUANTIZE, *args)
    else:
        validate(x, dtype, granularity, blk, axis, symmetric, scale, zero_point)
        data, s, z = torch.ops.opforge.quantize.default(x, dtype, granularity, blk, axis, symmetric,
                                                         scale, zero_point)
    return QuantizedTensor(
        data, s, None if symmetric else z, granularity,
        tuple(blk) if granularity == "block" else None,
        axis % x.dim() if granularity == "channel" else None,
        x.dtype if x.dtype in OUT_DTYPES else torch.float32,
    )


def dequantize(q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(q.data - q.zero_point) * q.scale`` rounded to ``dtype`` (default ``q.dtype``)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"{_DQ}: expected a QuantizedTensor, got {type(q).__name__}")
    dtype = dtype or q.dtype
    blk = list(q.block) if q.block else []
    axis = q.axis if q.axis is not None else -1
    if direct_ok(q.data) and type(q.scale) is torch.Tensor and type(q.zero_point) in (type(None), torch.Tensor):
        args = (q.data, q.scale, q.granularity, blk, axis, dtype)
        if q.zero_point is not None:
            args += (q.zero_point,)
        return dispatch.call(DEQUANTIZE, *args)
    validate_dequantize(q.data, q.scale, q.granularity, blk, axis, dtype, q.zero_point)
    return torch.ops.opforge.dequantize.default(q.data, q.scale, q.zero_point, q.granularity, blk, axis, dtype)


__all__ = ["QuantizedTensor", "quantize", "dequantize", "quantize_reference", "dequantize_reference"]
