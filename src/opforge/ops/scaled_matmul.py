"""Scaled 8-bit GEMM: ``opforge.scaled_matmul`` and ``opforge.quantized_matmul``.

Semantics. ``a`` and ``b`` hold quantized values; the result is the product
of the dequantized operands, computed with the scales applied late:

    y = act((a * scale_a) @ (b * scale_b) + bias), rounded once to out_dtype

* ``a``: ``[..., K]`` (any leading dims, flattened to ``M`` rows);
  ``b``: ``[K, N]`` with any strides (typically ``W.t()`` of a Linear weight
  ``W [N, K]``: K-major, what the Hopper kernel wants).
* dtypes: both ``int8`` (int32 accumulation, exact while K < 133,143), or
  both fp8 (``float8_e4m3fn`` / ``float8_e5m2``; one of each is allowed,
  ``e5m2 x e5m2`` is rejected as torch._scaled_mm rejects it).
* ``scale_a`` (fp32): per tensor (one element: ``()``, ``(1,)``, ``(1, 1)``),
  per token ``a.shape[:-1] + (1,)`` (``[M, 1]``), or DeepSeek-V3 1 x 128
  blocks ``a.shape[:-1] + (ceil(K / 128),)``.
  ``scale_b`` (fp32): per tensor, per channel ``(1, N)``, or 128 x 128 blocks
  ``(ceil(K / 128), ceil(N / 128))``. The two sides combine freely; when a
  shape fits two modes (K <= 128) they mean the same numbers.
* ``bias``: ``[N]``, fp32 or ``out_dtype``; ``activation``: None, "gelu",
  "gelu_tanh", "silu", "relu" (``opforge.matmul``'s); ``out_dtype``: bf16
  (default), fp16 or fp32. Output: ``a.shape[:-1] + (N,)``, contiguous.
* ``use_fast_accum`` (fp8 only, as in torch._scaled_mm): let the fp8 tensor
  cores accumulate the whole K loop in their reduced internal precision
  (faster on Hopper, less accurate); by default the kernels promote to fp32
  every ``BLOCK_K`` (see ``opforge.kernels.gemm_scaled``).

Not differentiable (the operands are quantized integers / fp8 codes). NaN
in an operand or a scale propagates as in the reference; an infinite scale
is the one place where "late" and "early" scaling differ (``(a @ b) * inf``
is +-inf where ``(a * inf) @ b`` may be NaN): the kernels scale late.

``quantized_matmul(qa, qb)`` takes two symmetric :class:`QuantizedTensor`
(``qa [..., K]``, ``qb [K, N]``) and maps their granularities onto the
scales above: ``qa`` per tensor / "token" / "channel" along rows (axis 0 of a
2-D ``qa``) / "block" ``(1, 128)``; ``qb`` per tensor / "channel" along N
(``axis=-1``, scale ``[1, N]``) / "block" ``(128, 128)``.

Variants, in dispatch order: ``gluon_ws`` (opt-in: ``opforge.ops.scaled_matmul_gluon``), ``triton_splitk`` (decode: M <= 64, K cut across
programs), ``triton_tma_persistent`` (Hopper TMA + QGMMA / IGMMA; both
operands K-major and 16-byte aligned), ``triton_tiled`` (portable, any
strides), ``torch_scaled_mm`` (torch._scaled_mm for fp8 per-tensor / rowwise,
torch._int_mm plus a separate dequantize for int8) and ``reference`` (float64
math on the dequantized values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from opforge.kernels import gemm_scaled as K
from opforge.kernels.gemm import ACTIVATIONS as ACT_CODES
from opforge.ops.library import define, direct_ok
from opforge.ops.matmul import ACTIVATIONS, _act, _sms
from opforge.ops.matmul import _dtype_name as _dname
from opforge.ops.quant import QuantizedTensor
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_dims

I8, E4M3, E5M2 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
FP8 = frozenset({E4M3, E5M2})
OUT_DTYPES = frozenset({F16, BF16, F32})
TENSOR, ROW, BLOCK = 0, 1, 2  # scale modes (opforge.kernels.gemm_scaled)
MODE_NAMES = {TENSOR: "tensor", ROW: "row", BLOCK: "block"}
SCALE_BLOCK = 128
INT8_MAX_K = (2**31 - 1) // (127 * 127)
WHERE = "opforge.scaled_matmul"
_QWHERE = "opforge.quantized_matmul"


class ScaledEpilogue(NamedTuple):
    """What follows the product, as the registry op and the dispatch key see it."""

    out_dtype: torch.dtype = BF16
    activation: str | None = None
    fast_accum: bool = False
    bias: bool = False


# ---------------------------------------------------------------------------
# Scale layouts
# ---------------------------------------------------------------------------
def _k_blocks(K: int) -> int:
    return -(-K // SCALE_BLOCK)


def scale_modes(a, b, scale_a, scale_b) -> tuple[int, int]:
    """(mode of scale_a, mode of scale_b); ValueError for a shape that fits none."""
    lead = tuple(a.shape[:-1])
    K, N = a.shape[-1], b.shape[-1]
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    if scale_a.numel() == 1 and scale_a.dim() <= max(a.dim(), 2):
        ma = TENSOR
    elif sa == lead + (1,):
        ma = ROW
    elif sa == lead + (_k_blocks(K),):
        ma = BLOCK
    else:
        raise ValueError(f"{WHERE}: scale_a has shape {sa}; expected one element (per tensor), "
                         f"{lead + (1,)} (per token) or {lead + (_k_blocks(K),)} (1x{SCALE_BLOCK} blocks)")
    if scale_b.numel() == 1 and scale_b.dim() <= 2:
        mb = TENSOR
    elif sb == (1, N):
        mb = ROW
    elif sb == (_k_blocks(K), _k_blocks(N)):
        mb = BLOCK
    else:
        raise ValueError(f"{WHERE}: scale_b has shape {sb}; expected one element (per tensor), (1, {N}) "
                         f"(per channel) or {(_k_blocks(K), _k_blocks(N))} ({SCALE_BLOCK}x{SCALE_BLOCK} blocks)")
    return ma, mb


def scales_2d(a, scale_a, scale_b, modes) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales as the kernels index them: 2-D views (a copy only when a's
    leading dims cannot be viewed as one)."""
    ma, mb = modes
    K = a.shape[-1]
    sa = scale_a.reshape(1, 1) if ma == TENSOR else scale_a.reshape(-1, 1 if ma == ROW else _k_blocks(K))
    sb = scale_b.reshape(1, 1) if mb == TENSOR else scale_b
    return sa, sb


def _expand_a(sa, mode, M, K):
    if mode == TENSOR:
        return sa.reshape(())
    if mode == ROW:
        return sa.reshape(M, 1)
    return sa.reshape(M, _k_blocks(K)).repeat_interleave(SCALE_BLOCK, 1)[:, :K]


def _expand_b(sb, mode, K, N):
    if mode == TENSOR:
        return sb.reshape(())
    if mode == ROW:
        return sb.reshape(1, N)
    return sb.repeat_interleave(SCALE_BLOCK, 0)[:K].repeat_interleave(SCALE_BLOCK, 1)[:, :N]


# ---------------------------------------------------------------------------
# Reference semantics (float64 on the dequantized values)
# ---------------------------------------------------------------------------
def reference(a, b, scale_a, scale_b, *rest):
    """``act((a * scale_a) @ (b * scale_b) + bias)`` in float64, rounded once.
    ``rest`` is ``(bias, epi)``, or ``(epi,)`` / ``()`` without a bias (as
    selftest passes the arguments, Nones dropped)."""
    epi = rest[-1] if rest and isinstance(rest[-1], ScaledEpilogue) else ScaledEpilogue()
    bias = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
    ma, mb = scale_modes(a, b, scale_a, scale_b)
    M, N, K = _dims(a, b)
    A = a.reshape(M, K).to(F64)
    A = A * _expand_a(scale_a.to(F64), ma, M, K)
    B = b.to(F64) * _expand_b(scale_b.to(F64), mb, K, N)
    z = A @ B
    if bias is not None:
        z = z + bias.to(F64)
    return _act(z, epi.activation).to(epi.out_dtype).reshape(tuple(a.shape[:-1]) + (N,))


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _check(cond, exc, msg):
    if not cond:
        raise exc(msg)


def validate(a, b, scale_a, scale_b, bias=None, epi: ScaledEpilogue = ScaledEpilogue()) -> None:
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        _check(isinstance(t, torch.Tensor), TypeError,
               f"{WHERE}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("a", a), ("b", b)):
        _check(t.dtype == I8 or t.dtype in FP8, TypeError,
               f"{WHERE}: {name} must be int8, float8_e4m3fn or float8_e5m2, got {_dname(t.dtype)}")
    pair = (a.dtype, b.dtype)
    _check((a.dtype == I8) == (b.dtype == I8), TypeError,
           f"{WHERE}: a is {_dname(a.dtype)} but b is {_dname(b.dtype)}; int8 pairs with int8 and fp8 with fp8")
    _check(pair != (E5M2, E5M2), TypeError,
           f"{WHERE}: float8_e5m2 x float8_e5m2 is not supported (as in torch._scaled_mm); "
           f"quantize one operand to float8_e4m3fn")
    _check(a.dim() >= 1, ValueError, f"{WHERE}: a is 0-dim; it must be [..., K]")
    _check(b.dim() == 2, ValueError, f"{WHERE}: b must be 2-D [K, N], got {b.dim()} dims of shape {tuple(b.shape)}")
    _check(a.shape[-1] == b.shape[0], ValueError,
           f"{WHERE}: a has K={a.shape[-1]} (its last dim) but b has K={b.shape[0]} (its first dim); shapes "
           f"{tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    for name, t in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        _check(t.device == a.device, ValueError, f"{WHERE}: {name} is on {t.device} but a is on {a.device}")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        _check(t.dtype == F32, TypeError, f"{WHERE}: {name} must be float32, got {_dname(t.dtype)}")
    scale_modes(a, b, scale_a, scale_b)
    if a.dtype == I8:
        _check(a.shape[-1] <= INT8_MAX_K, ValueError,
               f"{WHERE}: int8 with K={a.shape[-1]} could overflow the int32 accumulator (K <= {INT8_MAX_K})")
    od = epi.out_dtype
    _check(isinstance(od, torch.dtype) and od in OUT_DTYPES, TypeError,
           f"{WHERE}: out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {od!r}")
    act = epi.activation
    _check(act is None or (isinstance(act, str) and act in ACTIVATIONS), ValueError,
           f"{WHERE}: activation must be None or one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
    _check(isinstance(epi.fast_accum, bool), TypeError,
           f"{WHERE}: use_fast_accum must be a bool, got {type(epi.fast_accum).__name__}")
    if bias is not None:
        _check(isinstance(bias, torch.Tensor), TypeError, f"{WHERE}: bias must be a torch.Tensor or None")
        N = b.shape[1]
        _check(bias.dim() == 1 and bias.shape[0] == N, ValueError,
               f"{WHERE}: bias must have shape ({N},) (N = b.shape[1]), got {tuple(bias.shape)}")
        _check(bias.dtype in (F32, od), TypeError,
               f"{WHERE}: bias is {_dname(bias.dtype)}; expected float32 or the out_dtype {_dname(od)}")
        _check(bias.device == a.device, ValueError, f"{WHERE}: bias is on {bias.device} but a is on {a.device}")


def out_shape(a, b) -> tuple[int, ...]:
    return tuple(a.shape[:-1]) + (b.shape[1],)


# ---------------------------------------------------------------------------
# Geometry: the shape facts every variant decides and runs on
# ---------------------------------------------------------------------------
def _dims(a, b) -> tuple[int, int, int]:
    K = a.shape[-1]
    return (a.numel() // K if K else math.prod(a.shape[:-1])), b.shape[1], K


@dataclass(frozen=True, slots=True)
class Geometry:
    """The 2-D problem ``[M, K] @ [K, N]`` (a's leading dims flattened), the
    scale modes, the dtypes and epilogue flags the kernels specialize on,
    the device's SM count and whether the Hopper kernel can load the operands
    through TMA (``tma``). The memo key holds all of it (alignment included)."""

    M: int
    N: int
    K: int
    modes: tuple[int, int]
    a_dtype: torch.dtype
    b_dtype: torch.dtype
    out_dtype: torch.dtype
    fast_accum: bool
    sms: int
    tma: bool


def geometry(a, b, scale_a, scale_b, *rest) -> Geometry:
    epi = rest[-1] if rest and isinstance(rest[-1], ScaledEpilogue) else ScaledEpilogue()
    M, N, KK = _dims(a, b)
    tma = M == 0 or N == 0 or KK == 0 or K.tma_layout(a.reshape(M, KK), b) is not None  # empty: nothing to load
    return Geometry(M, N, KK, scale_modes(a, b, scale_a, scale_b), a.dtype, b.dtype, epi.out_dtype,
                    epi.fast_accum, _sms(a), tma)


def _kw(g: Geometry) -> dict:
    return {"fp8": g.a_dtype in FP8, "fast_acc": g.fast_accum, "block_scaled": BLOCK in g.modes}


def _act_code(epi) -> int:
    return ACT_CODES[epi.activation]


# ---------------------------------------------------------------------------
# Variants: the runner, checks and configs of the geometry, then the specs
# ---------------------------------------------------------------------------
class Scaled:
    """A Triton variant's run: a flattened, the empty and K = 0 cases, then the
    launch (``tma``: the Hopper kernel)."""

    def __init__(self, tma: bool):
        self.tma = tma

    def __call__(self, g: Geometry, cfg, a, b, scale_a, scale_b, bias, epi):
        M, N, KK = g.M, g.N, g.K
        C = torch.empty((M, N), dtype=epi.out_dtype, device=a.device)
        if C.numel() == 0:
            return C.view(out_shape(a, b))
        if KK == 0:
            return C.copy_(reference(a, b, scale_a, scale_b, bias, epi).reshape(M, N)).view(out_shape(a, b))
        A = a.reshape(M, KK)
        SA, SB = scales_2d(a, scale_a, scale_b, g.modes)
        if self.tma:
            K.launch_tma(A, b, C, SA, SB, *g.modes, bias, _act_code(epi), epi.fast_accum, cfg, g.sms)
        else:
            K.launch_tiled(A, b, C, SA, SB, *g.modes, bias, _act_code(epi), epi.fast_accum, cfg)
        return C.view(out_shape(a, b))


def vendor_check(g: Geometry) -> str | None:
    ma, mb = g.modes
    M, N, KK = g.M, g.N, g.K
    if BLOCK in (ma, mb):
        return "block scales are not mapped to torch._scaled_mm / torch._int_mm here"
    if g.a_dtype == I8:
        if M <= 16:
            return f"torch._int_mm needs M > 16, got M={M}"
        if KK % 8 or N % 8:
            return f"torch._int_mm needs K and N multiples of 8, got K={KK}, N={N}"
        return None
    if ma != mb:
        return "torch._scaled_mm takes both scales per tensor or both rowwise"
    if KK % 16 or N % 16:
        return f"torch._scaled_mm needs K and N multiples of 16, got K={KK}, N={N}"
    if ma == ROW and (g.a_dtype != E4M3 or g.b_dtype != E4M3 or g.out_dtype != BF16):
        return "torch._scaled_mm rowwise scaling takes float8_e4m3fn operands and a bfloat16 output"
    return None


def vendor_run(g: Geometry, cfg, a, b, scale_a, scale_b, bias, epi):
    """torch._scaled_mm (fp8) or torch._int_mm then a separate dequantize (int8);
    the bias and activation as separate torch ops."""
    ma, mb = g.modes
    M, N, KK = g.M, g.N, g.K
    A = a.reshape(M, KK).contiguous()
    B = b if b.stride(0) == 1 and b.stride(1) >= max(KK, 1) else b.t().contiguous().t()  # column-major
    if a.dtype == I8:
        z = torch._int_mm(A, B).to(F32)
        z = z * _expand_a(scale_a.to(F32), ma, M, KK) * _expand_b(scale_b.to(F32), mb, KK, N)
    else:
        sa = scale_a.reshape(()) if ma == TENSOR else scale_a.reshape(M, 1).contiguous()
        sb = scale_b.reshape(()) if mb == TENSOR else scale_b.reshape(1, N).contiguous()
        fused = bias is None and epi.activation is None
        z = torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=epi.out_dtype if fused or ma == ROW else F32,
                             use_fast_accum=epi.fast_accum)
    if bias is not None:
        z = z.to(F32) + bias.to(F32)
    return _act(z, epi.activation).to(epi.out_dtype).reshape(out_shape(a, b))


def reference_run(g: Geometry, cfg, a, b, scale_a, scale_b, bias, epi):
    return reference(a, b, scale_a, scale_b, bias, epi).contiguous()


def tma_check(g: Geometry) -> str | None:
    if not g.tma:
        return ("TMA + 8-bit wgmma need both operands K-major (a row-major, b = W.t() of a row-major W) "
                "with 16-byte aligned bases and leading strides (K a multiple of 16)")
    return None


def splitk_check(g: Geometry) -> str | None:
    if g.M > K.SPLITK_MAX_M:
        return f"M={g.M} > {K.SPLITK_MAX_M}: enough output tiles without cutting K"
    if splitk_default(g)["SPLIT_K"] < 2:
        return f"K={g.K} is too short to cut, or the output tiles already fill the GPU"
    return None


def tile_default(g: Geometry):
    return K.tile_default_config(g.M, g.N, g.K, sms=g.sms, **_kw(g))


def tile_configs(g: Geometry):
    return K.tile_configs(g.M, g.N, g.K, **_kw(g))


def tma_default(g: Geometry):
    return K.tma_default_config(g.M, g.N, g.K, sms=g.sms, **_kw(g))


def tma_configs(g: Geometry):
    return K.tma_configs(g.M, g.N, g.K, **_kw(g))


def splitk_default(g: Geometry):
    return K.splitk_default_config(g.M, g.N, g.K, sms=g.sms, **_kw(g))


def splitk_configs(g: Geometry):
    return K.splitk_configs(g.M, g.N, g.K, sms=g.sms, **_kw(g))


def shape_bucket(g: Geometry) -> str:
    ma, mb = g.modes
    return f"{bucket_dims(g.M, g.N, g.K)}:{MODE_NAMES[ma][0]}{MODE_NAMES[mb][0]}"


def bucket(a, b, scale_a, scale_b, *rest) -> str:
    """The tuning key's shape bucket of these arguments."""
    return shape_bucket(geometry(a, b, scale_a, scale_b, *rest))


def _vendor_reason(*args) -> str | None:
    """Why torch._scaled_mm / torch._int_mm cannot take these arguments, or None."""
    return vendor_check(geometry(*args))


def specs(name: str) -> list[Spec]:
    """The variants of ``scaled_matmul``, in dispatch order."""
    from opforge.ops import scaled_matmul_gluon

    return [
        scaled_matmul_gluon.spec(),  # opt-in (OPFORGE_GLUON=1 or forced) until measured
        Spec("triton_splitk", Scaled(tma=False), version=K.SPLITK_VERSION, check=splitk_check,
             configs=splitk_configs, default_config=splitk_default, bucket=shape_bucket,
             description="decode shapes (M <= 64): K cut across programs, scaled fp32 partials summed "
                         "in a fixed order by a second kernel that runs bias and activation"),
        Spec("triton_tma_persistent", Scaled(tma=True), version=K.TMA_VERSION, min_capability=(9, 0),
             check=tma_check, configs=tma_configs, default_config=tma_default, bucket=shape_bucket,
             description="Hopper: TMA descriptor loads of K-major operands, QGMMA / IGMMA via tl.dot, one "
                         "program per SM over grouped output tiles, scales in the epilogue"),
        Spec("triton_tiled", Scaled(tma=False), version=K.TILED_VERSION, configs=tile_configs,
             default_config=tile_default, bucket=shape_bucket,
             description="portable: pointer-based block loads with any strides, grouped tiles"),
        Spec("torch_scaled_mm", vendor_run, kind="vendor", devices=("cuda",), check=vendor_check, bucket=shape_bucket,
             description="torch._scaled_mm (fp8) or torch._int_mm + separate dequantize (int8), then "
                         "torch ops for bias and activation"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="float64 torch on the dequantized operands (the oracle and the CPU fallback)"),
    ]


def _dtype_key(a, b, scale_a, scale_b, bias=None, epi=ScaledEpilogue()) -> str:
    key = f"{_dname(a.dtype)}x{_dname(b.dtype)}->{_dname(epi.out_dtype)}"
    return key + ("+fastacc" if epi.fast_accum and a.dtype in FP8 else "")


def _meta(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _tensors(a, b, scale_a, scale_b, bias=None, epi=None):
    return tuple(t for t in (a, b, scale_a, scale_b, bias) if t is not None)


def memo_key(a, b, scale_a, scale_b, bias=None, epi=ScaledEpilogue()) -> tuple:
    # Alignment decides whether TMA can take the operands; scale shapes decide the modes.
    return (_meta(a), a.data_ptr() % 16, _meta(b), b.data_ptr() % 16, _meta(scale_a), _meta(scale_b),
            _meta(bias), epi)


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _q(x: torch.Tensor, dtype) -> torch.Tensor:
    """Values already in ``dtype``'s range, as ``dtype``."""
    if dtype == I8:
        return x.round().clamp(-127, 127).to(I8)
    return x.clamp(-448, 448).to(dtype)


def sample_inputs(device: torch.device) -> list[tuple]:
    """Random operands reaching every variant and dtype: K-major aligned
    problems (TMA), row-major b and odd sizes (tiled), decode shapes (split-K),
    every scale mode, bias, activation and out_dtype; a few larger shapes."""
    g = torch.Generator(device="cpu").manual_seed(2025)

    def rand(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=F32) * scale

    def qdata(dtype, *shape):
        return _q(rand(*shape, scale=40.0 if dtype == I8 else 3.0), dtype).to(device)

    def scales(*shape):
        return (rand(*shape).abs() * 0.01 + 0.001).to(device)

    def epi(out_dtype=BF16, activation=None, fast=False, bias=None):
        return ScaledEpilogue(out_dtype, activation, fast, bias is not None)

    out = []
    for dt, dtb in ((E4M3, E4M3), (I8, I8), (E4M3, E5M2)):
        M, N, K = 256, 384, 512
        a = qdata(dt, M, K)
        w = qdata(dtb, N, K)
        bias = rand(N).to(device)
        out += [
            (a, w.t(), scales(), scales(), None, epi()),
            (a, w.t(), scales(M, 1), scales(1, N), bias, epi(activation="gelu", bias=bias)),
            (a, w.t(), scales(M, 4), scales(4, 3), None, epi(out_dtype=F32)),
            (qdata(dt, 2, 40, K), w.t(), scales(2, 40, 1), scales(1, N), bias.to(F16),
             epi(out_dtype=F16, activation="silu", bias=bias)),
            (qdata(dt, 97, 200), qdata(dtb, 200, 131), scales(97, 1), scales(1, 131), None, epi()),  # tiled
            (qdata(dt, 16, 4096), qdata(dtb, 1024, 4096).t(), scales(16, 1), scales(1, 1024), rand(1024).to(device),
             epi(bias=bias)),  # split-K
            (qdata(dt, 1, 2048), qdata(dtb, 512, 2048).t(), scales(1, 16), scales(16, 4), None, epi()),
        ]
    out += [
        (qdata(E4M3, 1024, 1024), qdata(E4M3, 1024, 1024).t(), scales(), scales(), None, epi(fast=True)),
        (qdata(E4M3, 512, 2048), qdata(E4M3, 1536, 2048).t(), scales(512, 1), scales(1, 1536), None, epi()),
        (qdata(I8, 1024, 1024), qdata(I8, 1024, 1024).t(), scales(1024, 1), scales(1, 1024), None,
         epi(activation="relu")),
        (qdata(E5M2, 64, 96), qdata(E4M3, 96, 80), scales(), scales(1, 80), None, epi(out_dtype=F32)),
    ]
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op
# ---------------------------------------------------------------------------
OP = registry.register_op(
    "scaled_matmul", specs("scaled_matmul"), geometry=geometry,
    reference=reference,
    tensors=_tensors,
    memo_key=memo_key,
    dtype_key=_dtype_key,
    validate=validate,
    samples=sample_inputs,
    doc="FP8 / INT8 GEMM with per-tensor, rowwise or block scales, bias and activation in the epilogue",
)

SCHEMA = ("scaled_matmul(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
          "ScalarType out_dtype, str? activation=None, bool use_fast_accum=False) -> Tensor")


def _impl(a, b, scale_a, scale_b, bias=None, out_dtype=BF16, activation=None, use_fast_accum=False):
    return dispatch.call(OP, a, b, scale_a, scale_b, bias,
                         ScaledEpilogue(out_dtype, activation, use_fast_accum, bias is not None))


def _fake(a, b, scale_a, scale_b, bias=None, out_dtype=BF16, activation=None, use_fast_accum=False):
    validate(a, b, scale_a, scale_b, bias, ScaledEpilogue(out_dtype, activation, use_fast_accum, bias is not None))
    return torch.empty(out_shape(a, b), dtype=out_dtype, device=a.device)


define(SCHEMA, _impl, _fake)

_packet = torch.ops.opforge.scaled_matmul.default
_call = dispatch.call
_Tensor = torch.Tensor


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  activation: str | None = None, use_fast_accum: bool = False) -> torch.Tensor:
    """``act((a * scale_a) @ (b * scale_b) + bias)`` rounded once to ``out_dtype``.

    ``a [..., K]`` and ``b [K, N]`` both int8 or both fp8 (not e5m2 x e5m2);
    ``scale_a``: one element, ``a.shape[:-1] + (1,)`` per token, or
    ``a.shape[:-1] + (ceil(K/128),)`` per 1x128 block; ``scale_b``: one
    element, ``(1, N)`` per channel, or ``(ceil(K/128), ceil(N/128))`` per
    128x128 block; all fp32. ``bias [N]`` fp32 or ``out_dtype``.
    ``activation``: None, "gelu", "gelu_tanh", "silu", "relu". Returns
    ``a.shape[:-1] + (N,)``. Not differentiable.
    """
    epi = ScaledEpilogue(out_dtype, activation, use_fast_accum, bias is not None)
    if (direct_ok(a, b) and type(scale_a) is _Tensor and type(scale_b) is _Tensor
            and (bias is None or type(bias) is _Tensor) and type(out_dtype) is torch.dtype):
        return _call(OP, a, b, scale_a, scale_b, bias, epi)
    validate(a, b, scale_a, scale_b, bias, epi)
    return _packet(a, b, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum)


def quantized_scales(qa: QuantizedTensor, qb: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) of ``scaled_matmul`` for two symmetric QuantizedTensors."""
    for name, q in (("qa", qa), ("qb", qb)):
        if not isinstance(q, QuantizedTensor):
            raise TypeError(f"{_QWHERE}: {name} must be a QuantizedTensor, got {type(q).__name__}")
        if not q.symmetric:
            raise ValueError(f"{_QWHERE}: {name} is asymmetric (has a zero point); the scaled GEMM takes "
                             f"symmetric quantization only")
    if qb.data.dim() != 2:
        raise ValueError(f"{_QWHERE}: qb must be 2-D [K, N], got shape {tuple(qb.shape)}")
    if qa.data.dim() < 1:
        raise ValueError(f"{_QWHERE}: qa is 0-dim; it must be [..., K]")
    ga, gb = qa.granularity, qb.granularity
    if ga == "tensor" or ga == "token":
        sa = qa.scale
    elif ga == "channel" and qa.data.dim() == 2 and qa.axis == 0:
        sa = qa.scale  # [M, 1]: one scale per row
    elif ga == "block" and tuple(qa.block) == (1, SCALE_BLOCK):
        sa = qa.scale
    else:
        raise ValueError(f"{_QWHERE}: qa's granularity {ga!r} (axis={qa.axis}, block={qa.block}) has no GEMM "
                         f"scale layout; use 'tensor', 'token', 'channel' with axis=0, or 'block' with "
                         f"block=(1, {SCALE_BLOCK})")
    if gb == "tensor":
        sb = qb.scale
    elif gb == "channel" and qb.axis == 1:
        sb = qb.scale  # [1, N]
    elif gb == "block" and tuple(qb.block) == (SCALE_BLOCK, SCALE_BLOCK):
        sb = qb.scale
    else:
        raise ValueError(f"{_QWHERE}: qb's granularity {gb!r} (axis={qb.axis}, block={qb.block}) has no GEMM "
                         f"scale layout; use 'tensor', 'channel' with axis=-1 (per output column), or 'block' "
                         f"with block=({SCALE_BLOCK}, {SCALE_BLOCK})")
    return sa, sb


def quantized_matmul(qa: QuantizedTensor, qb: QuantizedTensor, *, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype = torch.bfloat16, activation: str | None = None,
                     use_fast_accum: bool = False) -> torch.Tensor:
    """``scaled_matmul(qa.data, qb.data, *scales)`` for symmetric QuantizedTensors
    ``qa [..., K]`` and ``qb [K, N]`` (granularities mapped as in the module
    docstring; asymmetric or unmappable granularities raise ValueError)."""
    sa, sb = quantized_scales(qa, qb)
    return scaled_matmul(qa.data, qb.data, sa, sb, bias=bias, out_dtype=out_dtype, activation=activation,
                         use_fast_accum=use_fast_accum)


__all__ = ["scaled_matmul", "quantized_matmul"]
