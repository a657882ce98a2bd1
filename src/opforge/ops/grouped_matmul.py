"""Grouped GEMM (MoE experts):
``opforge.grouped_matmul(a, b, offsets=None, *, bias=None, activation=None, out_dtype=None)``.

Two forms, both ``y = act(a_g @ b_g + bias_g)`` per group with fp32
accumulation (fp64 for fp64) and one rounding to ``out_dtype`` (default: the
input dtype). ``activation`` is one of ``"gelu"`` (erf), ``"gelu_tanh"``,
``"silu"``, ``"relu"`` or None, as ``opforge.matmul``. ``a`` and ``b`` share
one dtype (fp16, bf16, fp32, fp64); ``bias`` is the input dtype or fp32.

* Packed (the MoE form, as ``torch._grouped_mm``): ``a [M_total, K]`` holds
  the tokens of all experts sorted by expert, ``b [G, K, N]`` the experts'
  weights, ``offsets [G]`` (int32) the cumulative END row of each group:
  group ``g`` is rows ``offsets[g-1]:offsets[g]`` (from 0 for ``g = 0``), so
  ``offsets`` is non-decreasing, groups may be empty and ``offsets[-1] ==
  M_total``. ``bias`` is ``[G, N]``. Returns ``[M_total, N]`` (contiguous).
  The host never reads ``offsets`` on CUDA (no sync, CUDA-graph capturable):
  their values are checked only when they live on the CPU; on the GPU the
  kernels clamp them, so malformed offsets give unspecified rows (rows past
  ``offsets[-1]`` are left unwritten), never a fault. Differentiable in
  ``a``, ``b`` and ``bias``: ``dA = grouped(dZ, B^T)`` (the same op on the
  transposed weights, no copy), ``dB[g] = A_g^T dZ_g`` (op
  ``grouped_matmul_wgrad``, one launch over ``(g, k, n)`` tiles), ``dbias[g]``
  = the segment sum of dZ; with an activation ``dZ = dY * act'(Z)`` comes
  from rerunning the forward with the GEMM family's gradient epilogue (Z is
  never stored).
* List: ``grouped_matmul([a_0, a_1, ...], [b_0, b_1, ...])`` with
  ``a_i [M_i, K_i]``, ``b_i [K_i, N_i]`` (each group its own shape and
  strides), ``bias`` None or a list of ``[N_i]``; returns the list of
  ``[M_i, N_i]``. One launch reads a per-group int64 table of addresses,
  sizes and strides. Differentiable (two more list launches on transposed
  views; with an activation ``Z`` is recomputed by a third).

Variants of the packed op, in dispatch order: ``triton_persistent`` (Hopper:
TMA descriptors, one program per SM over the group-major tile schedule;
16-bit or fp32 operands with a unit stride and 16-byte alignment),
``triton_grouped`` (portable pointer loads, any strides, fp64 too; the
interpreter's path), ``torch_grouped_mm`` (``torch._grouped_mm`` where the
running torch has it: bf16, then torch epilogue ops), ``torch_loop`` (one
cuBLAS call per group: the baseline the issue measures against; reads the
offsets on the host) and ``reference`` (plain torch, float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from opforge.kernels import grouped_gemm as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.ops.matmul import (
    ACTIVATIONS, GRAD_ACTIVATIONS, Epilogue, _act, _act_code, _act_grad, _check_epilogue, _check_operands,
    _dtype_name, _meta, _plain, _sms, _split_rest, epilogue_dtype_key, make_epilogue,
)
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_dims, bucket_size, major

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
I32 = torch.int32
FLOATS = frozenset({F16, BF16, F32, F64})
TENSOR_CORE = frozenset({F16, BF16, F32})
WHERE = "opforge.grouped_matmul"
_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64)
# ---------------------------------------------------------------------------
def group_bounds(offsets: torch.Tensor, M_total: int) -> list[tuple[int, int]]:
    """(first row, end row) of each group, clamped as the kernels clamp (host read)."""
    out, lo = [], 0
    for end in offsets.tolist():
        end = min(max(end, 0), M_total)
        out.append((min(lo, M_total), max(end, min(lo, M_total))))
        lo = max(end, 0)
    return out


def _torch_epilogue(z, bias, residual, act):
    """bias, then the activation or the gradient epilogue, as torch ops in z's dtype
    (float64 for the references; a bias or residual of another dtype is promoted)."""
    if bias is not None:
        z = z + bias
    if act in GRAD_ACTIVATIONS:
        return _act_grad(residual.to(z.dtype), z, act[: -len("_grad")])
    return _act(z, act)


def reference(a, b, offsets, *rest):
    """Per group ``act(a[s:e] @ b[g] + bias[g])`` (or the gradient epilogue
    ``residual * act'(...)``) in float64, cast to out_dtype. Rows no group
    covers are zero."""
    bias, residual, epi = _split_rest(rest)
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=F64, device=a.device)
    for g, (s, e) in enumerate(group_bounds(offsets, a.shape[0])):
        if e > s:
            z = a[s:e].to(F64) @ b[g].to(F64)
            out[s:e] = _torch_epilogue(z, bias[g] if bias is not None else None,
                                   residual[s:e] if residual is not None else None, epi.activation)
    return out.to(epi.out_dtype or a.dtype)


def wgrad_reference(a, grad, offsets):
    """``dB[g] = a[s:e]^T @ grad[s:e]`` in float64, cast to a's dtype; zeros for an empty group."""
    out = torch.zeros((offsets.shape[0], a.shape[1], grad.shape[1]), dtype=F64, device=a.device)
    for g, (s, e) in enumerate(group_bounds(offsets, a.shape[0])):
        if e > s:
            out[g] = a[s:e].to(F64).t() @ grad[s:e].to(F64)
    return out.to(a.dtype)


def list_reference(a_list, b_list, *rest):
    """Per group ``act(a_i @ b_i + bias_i)`` in float64, cast to out_dtype."""
    epi = rest[-1]
    biases = rest[0] if epi.bias else None
    od = epi.out_dtype or a_list[0].dtype
    return [_torch_epilogue(a.to(F64) @ b.to(F64), biases[i] if biases is not None else None, None,
                            epi.activation).to(od)
            for i, (a, b) in enumerate(zip(a_list, b_list))]


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _check_bias(where, bias, shape, a, what="bias") -> None:
    check_tensor(where, what, bias)
    if tuple(bias.shape) != tuple(shape):
        raise ValueError(f"{where}: {what} must have shape {tuple(shape)}, got {tuple(bias.shape)}")
    if bias.dtype not in (a.dtype, F32):
        raise TypeError(f"{where}: {what} is {bias.dtype}; expected {a.dtype} (the input dtype) or float32")
    if bias.device != a.device:
        raise ValueError(f"{where}: {what} is on {bias.device} but a is on {a.device}")


def _check_offsets(where, a, offsets, G) -> None:
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"{where}: offsets must be an int32 torch.Tensor of cumulative end rows, "
                        f"got {type(offsets).__name__}")
    if offsets.dtype != I32:
        raise TypeError(f"{where}: offsets must be int32 (cumulative end rows, as torch._grouped_mm), "
                        f"got {offsets.dtype}")
    if offsets.dim() != 1 or offsets.shape[0] != G:
        raise ValueError(f"{where}: offsets must have shape ({G},), one end row per group of b "
                         f"(b.shape[0] = {G}), got {tuple(offsets.shape)}")
    if offsets.device != a.device:
        raise ValueError(f"{where}: offsets is on {offsets.device} but a is on {a.device}")


def check_offset_values(offsets: torch.Tensor, M_total: int, where: str = WHERE) -> None:
    """Non-decreasing, >= 0, last == M_total. Reads the values: CPU offsets only
    (on CUDA it would be a host sync per call), never fake or traced ones."""
    if (torch.compiler.is_compiling() or type(offsets) is not torch.Tensor or offsets.device.type != "cpu"
            or offsets.numel() == 0):
        return
    v = offsets.tolist()
    if v[0] < 0:
        raise ValueError(f"{where}: offsets must be >= 0 (cumulative end rows), got offsets[0] = {v[0]}")
    for i in range(1, len(v)):
        if v[i] < v[i - 1]:
            raise ValueError(f"{where}: offsets must be non-decreasing (cumulative end rows), got "
                             f"offsets[{i - 1}] = {v[i - 1]} > offsets[{i}] = {v[i]}")
    if v[-1] != M_total:
        raise ValueError(f"{where}: the last offset must equal the rows of a (M_total = {M_total}), "
                         f"got offsets[-1] = {v[-1]}")


def validate(a, b, offsets, bias=None, residual=None, epi: Epilogue = Epilogue(), *, internal: bool = True) -> None:
    """Shapes, dtypes, devices and epilogue of the packed form (and the offset values on the CPU)."""
    _check_operands(WHERE, a, b)
    if a.dim() != 2:
        raise ValueError(f"{WHERE}: a must be 2-D [M_total, K] (rows of all groups), got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"{WHERE}: b must be 3-D [G, K, N] (one weight per group), got shape {tuple(b.shape)}")
    G, Kb, N = b.shape
    if G == 0:
        raise ValueError(f"{WHERE}: b has no groups (b.shape[0] = 0)")
    if a.shape[1] != Kb:
        raise ValueError(f"{WHERE}: a has K={a.shape[1]} (its last dim) but b has K={Kb} (b.shape[1]); "
                         f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] > _INT32_MAX:
        raise ValueError(f"{WHERE}: a has {a.shape[0]} rows; int32 offsets address at most {_INT32_MAX}")
    _check_offsets(WHERE, a, offsets, G)
    _check_epilogue(WHERE, epi, internal)
    if bias is not None:
        _check_bias(WHERE, bias, (G, N), a)
    if residual is not None:
        check_tensor(WHERE, "residual", residual)
        if tuple(residual.shape) != (a.shape[0], N):
            raise ValueError(f"{WHERE}: residual must have shape {(a.shape[0], N)}, got {tuple(residual.shape)}")
        if residual.device != a.device:
            raise ValueError(f"{WHERE}: residual is on {residual.device} but a is on {a.device}")
    if epi.activation in GRAD_ACTIVATIONS and residual is None:
        raise ValueError(f"{WHERE}: activation {epi.activation!r} (a gradient epilogue) needs the gradient "
                         f"as residual")
    if residual is not None and epi.activation not in GRAD_ACTIVATIONS:
        raise ValueError(f"{WHERE}: residual is internal to the gradient epilogues")
    check_offset_values(offsets, a.shape[0])


def validate_wgrad(a, grad, offsets) -> None:
    where = "opforge.grouped_matmul_wgrad"
    _check_operands(where, a, grad)
    if a.dim() != 2 or grad.dim() != 2 or a.shape[0] != grad.shape[0]:
        raise ValueError(f"{where}: a [M_total, K] and grad [M_total, N] must be 2-D with the same rows, "
                         f"got {tuple(a.shape)} and {tuple(grad.shape)}")
    if offsets is None or not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise ValueError(f"{where}: offsets must be a 1-D int32 tensor")
    _check_offsets(where, a, offsets, offsets.shape[0])
    check_offset_values(offsets, a.shape[0], where)


LIST_WHERE = "opforge.grouped_matmul (list form)"


def validate_list(a_list, b_list, biases=None, epi: Epilogue = Epilogue(), *, internal: bool = True) -> None:
    where = LIST_WHERE
    for name, seq in (("a", a_list), ("b", b_list)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"{where}: {name} must be a list of tensors, got {type(seq).__name__}")
    if len(a_list) != len(b_list):
        raise ValueError(f"{where}: a has {len(a_list)} groups but b has {len(b_list)}")
    if not a_list:
        raise ValueError(f"{where}: no groups (empty lists)")
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        _check_operands(f"{where}, group {i}", a, b)
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"{where}, group {i}: a and b must be 2-D [M, K] and [K, N], got "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"{where}, group {i}: a has K={a.shape[1]} but b has K={b.shape[0]}")
        if a.dtype != a_list[0].dtype:
            raise TypeError(f"{where}: group {i} is {a.dtype} but group 0 is {a_list[0].dtype}; "
                            f"all groups must share one dtype")
        if a.device != a_list[0].device:
            raise ValueError(f"{where}: group {i} is on {a.device} but group 0 is on {a_list[0].device}")
    _check_epilogue(where, epi, internal)
    if epi.activation in GRAD_ACTIVATIONS:
        raise ValueError(f"{where}: gradient epilogues are not taken by the list form")
    if biases is not None:
        if not isinstance(biases, (list, tuple)) or len(biases) != len(a_list):
            raise ValueError(f"{where}: bias must be None or a list of {len(a_list)} tensors, one [N_i] per group")
        for i, (bias, b) in enumerate(zip(biases, b_list)):
            _check_bias(where, bias, (b.shape[1],), a_list[i], what=f"bias[{i}]")
            if bias.dtype != biases[0].dtype:
                raise TypeError(f"{where}: bias[{i}] is {bias.dtype} but bias[0] is {biases[0].dtype}")


# ---------------------------------------------------------------------------
# Vendor paths: torch._grouped_mm and a loop of cuBLAS calls
# ---------------------------------------------------------------------------
def _out(a, b, epi):
    return torch.empty((a.shape[0], b.shape[2]), dtype=epi.out_dtype or a.dtype, device=a.device)


def loop_run(a, b, offsets, bias, residual, epi):
    """One torch.matmul (cuBLAS) per non-empty group, torch ops for the epilogue."""
    out = _out(a, b, epi)
    fused = bias is not None or epi.activation is not None
    for g, (s, e) in enumerate(group_bounds(offsets, a.shape[0])):
        if e <= s:
            continue
        x = a[s:e]
        z = torch.matmul(x.float(), b[g].float()) if (fused and a.dtype in (F16, BF16)) else torch.matmul(x, b[g])
        out[s:e] = _torch_epilogue(z, bias[g] if bias is not None else None,
                                   residual[s:e] if residual is not None else None, epi.activation)
    return out


def _grouped_mm_strides_ok(t) -> bool:
    """torch._grouped_mm's layout rule: a unit stride on one of the last two
    dims and a 16-byte multiple on the other."""
    s1, s0 = t.stride(-1), t.stride(-2)
    align = 16 // t.element_size()
    if s0 == 1 and s1 >= max(1, t.shape[-2]):
        return s1 % align == 0
    if s1 == 1 and s0 >= max(1, t.shape[-1]):
        return s0 % align == 0
    return False


def grouped_mm_run(a, b, offsets, bias, residual, epi):
    fused = bias is not None or epi.activation is not None or (epi.out_dtype not in (None, BF16))
    try:
        z = torch._grouped_mm(a, b, offs=offsets, out_dtype=F32 if fused else None)
    except (RuntimeError, TypeError, NotImplementedError):  # a torch build or GPU without the kernel
        return loop_run(a, b, offsets, bias, residual, epi)
    if not fused and residual is None:
        return z.contiguous()
    if bias is not None:
        gid = torch.searchsorted(offsets, torch.arange(a.shape[0], device=a.device, dtype=I32), right=True)
        bias = torch.cat([bias, bias.new_zeros((1, bias.shape[1]))]).index_select(0, gid)
    return _torch_epilogue(z, bias, residual, epi.activation).to(epi.out_dtype or a.dtype).contiguous()


# ---------------------------------------------------------------------------
# Geometry: the shape facts each op's variants decide and run on
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """The packed problem: ``M`` rows of all groups, ``G`` groups, ``[K, N]``
    weights; the element size and dtype, the device's SM count, the operands'
    layouts (``majors``, for the bucket), whether the TMA kernel can load them
    (``tma``) and whether torch._grouped_mm's stride rule holds
    (``grouped_mm``). The memo key holds all of it (alignment included)."""

    M: int
    G: int
    N: int
    K: int
    itemsize: int
    dtype: torch.dtype
    sms: int
    majors: str
    tma: bool
    grouped_mm: bool


def geometry(a, b, *rest) -> Geometry:
    empty = a.numel() == 0 or b.numel() == 0
    return Geometry(a.shape[0], b.shape[0], b.shape[2], a.shape[1], a.element_size(), a.dtype, _sms(a),
                    major(a) + major(b), empty or K.tma_layout(a, b) is not None,
                    _grouped_mm_strides_ok(a) and _grouped_mm_strides_ok(b) and b.shape[2] % 8 == 0)


class WgradGeometry(NamedTuple):
    """``dB [G, K, N]`` from ``a [M, K]`` and ``grad [M, N]``."""

    M: int
    G: int
    K: int
    N: int
    itemsize: int
    sms: int


def wgrad_geometry(a, grad, offsets) -> WgradGeometry:
    return WgradGeometry(a.shape[0], offsets.shape[0], a.shape[1], grad.shape[1], a.element_size(), _sms(a))


class ListGeometry(NamedTuple):
    """Each group's ``(M, N, K)``, the element size and the SM count."""

    shapes: tuple[tuple[int, int, int], ...]
    itemsize: int
    sms: int


def list_geometry(a_list, b_list, *rest) -> ListGeometry:
    shapes = tuple((a.shape[0], b.shape[1], a.shape[1]) for a, b in zip(a_list, b_list))
    return ListGeometry(shapes, a_list[0].element_size(), _sms(a_list[0]))


# ---------------------------------------------------------------------------
# Variants of the packed op
# ---------------------------------------------------------------------------
class Grouped:
    """A Triton variant's run: the output, then the launch (``tma``: the
    Hopper kernel; both take the same arguments)."""

    def __init__(self, tma: bool):
        self.launch = K.launch_tma if tma else K.launch_grouped

    def __call__(self, g: Geometry, cfg, a, b, offsets, bias, residual, epi):
        out = _out(a, b, epi)
        if out.numel():
            self.launch(a, b, offsets, out, bias, residual, _act_code(epi), epi.tf32, cfg, g.sms)
        return out


def grouped_mm_variant(g: Geometry, cfg, *args):
    return grouped_mm_run(*args)


def loop_variant(g: Geometry, cfg, *args):
    return loop_run(*args)


def reference_variant(g, cfg, *args):
    return reference(*args)


def groups_check(g: Geometry) -> str | None:
    if g.G > K.MAX_GROUPS:
        return f"{g.G} groups exceed the {K.MAX_GROUPS} the in-register tile prefix holds"
    return None


def tma_check(g: Geometry) -> str | None:
    reason = groups_check(g)
    if reason:
        return reason
    if g.K == 0:
        return "K = 0: nothing to load"
    if not g.tma:
        return ("TMA needs a with unit stride on K, b with unit stride on N or K, 16-byte aligned "
                "bases and strides that are multiples of 16 bytes")
    return None


def grouped_mm_check(g: Geometry) -> str | None:
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no torch._grouped_mm"
    if g.dtype != BF16:
        return "torch._grouped_mm takes bf16"
    if not g.grouped_mm:
        return "torch._grouped_mm needs 16-byte aligned strides (K and N multiples of 8)"
    return None


def default_config(g: Geometry):
    return K.default_config(g.M, g.G, g.N, g.K, g.itemsize, g.sms)


def configs(g: Geometry):
    return K.configs(g.M, g.G, g.N, g.K, g.itemsize)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.G)}g:{bucket_dims(g.M, g.N, g.K)}:{g.majors}"


SPECS = [
    Spec("triton_persistent", Grouped(tma=True), version=K.TMA_VERSION, dtypes=TENSOR_CORE,
         min_capability=(9, 0), check=tma_check, configs=configs, default_config=default_config, bucket=bucket,
         description="Hopper: one program per SM over the group-major tile schedule (computed in the "
                     "kernel from offsets), A and B through TMA descriptors, wgmma, fused epilogue"),
    Spec("triton_grouped", Grouped(tma=False), version=K.GROUPED_VERSION, dtypes=FLOATS, check=groups_check,
         configs=configs, default_config=default_config, bucket=bucket,
         description="portable: the same persistent schedule with pointer loads, any strides"),
    Spec("torch_grouped_mm", grouped_mm_variant, kind="vendor", devices=("cuda",), dtypes=frozenset({BF16, F32}),
         check=grouped_mm_check, bucket=bucket,
         description="torch._grouped_mm (bf16), then torch ops for the epilogue"),
    Spec("torch_loop", loop_variant, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
         description="one cuBLAS matmul per group (reads the offsets on the host)"),
    Spec("reference", reference_variant, kind="reference", devices=("cpu", "cuda"),
         description="plain torch in float64 (the oracle and the CPU fallback)"),
]


# ---------------------------------------------------------------------------
# Variants of the weight gradient
# ---------------------------------------------------------------------------
def _wgrad_out(a, grad, offsets):
    return torch.empty((offsets.shape[0], a.shape[1], grad.shape[1]), dtype=a.dtype, device=a.device)


def wgrad_triton(g: WgradGeometry, cfg, a, grad, offsets):
    c = _wgrad_out(a, grad, offsets)
    K.launch_wgrad(a, grad, offsets, c, _tf32_now(), cfg)
    return c


def wgrad_loop(g: WgradGeometry, cfg, a, grad, offsets):
    c = _wgrad_out(a, grad, offsets)
    for i, (s, e) in enumerate(group_bounds(offsets, a.shape[0])):
        if e > s:
            torch.matmul(a[s:e].t(), grad[s:e], out=c[i])
        else:
            c[i].zero_()
    return c


def wgrad_reference_variant(g, cfg, *args):
    return wgrad_reference(*args)


def wgrad_configs(g: WgradGeometry):
    return K.wgrad_configs(g.M, g.G, g.K, g.N, g.itemsize)


def wgrad_default(g: WgradGeometry):
    return K.wgrad_default_config(g.M, g.G, g.K, g.N, g.itemsize, g.sms)


def wgrad_bucket(g: WgradGeometry) -> str:
    return f"{bucket_size(g.G)}g:{bucket_dims(g.M, g.K, g.N)}"


WGRAD_SPECS = [
    Spec("triton_grouped", wgrad_triton, version=K.WGRAD_VERSION, dtypes=FLOATS, configs=wgrad_configs,
         default_config=wgrad_default, bucket=wgrad_bucket,
         description="one program per (group, k-tile, n-tile), reducing over the group's rows read from "
                     "offsets on the device"),
    Spec("torch_loop", wgrad_loop, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=wgrad_bucket,
         description="one cuBLAS matmul per group"),
    Spec("reference", wgrad_reference_variant, kind="reference", devices=("cpu", "cuda"),
         description="plain torch in float64"),
]


def _tf32_now() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32)


# ---------------------------------------------------------------------------
# Variants of the list form
# ---------------------------------------------------------------------------
def _list_outs(a_list, b_list, epi):
    od = epi.out_dtype or a_list[0].dtype
    return [torch.empty((a.shape[0], b.shape[1]), dtype=od, device=a.device) for a, b in zip(a_list, b_list)]


def list_triton(g: ListGeometry, cfg, a_list, b_list, biases, epi):
    cs = _list_outs(a_list, b_list, epi)
    K.launch_list(a_list, b_list, cs, biases, _act_code(epi), epi.tf32, cfg, g.sms)
    return cs


def list_loop(g: ListGeometry, cfg, a_list, b_list, biases, epi):
    cs = _list_outs(a_list, b_list, epi)
    fused = biases is not None or epi.activation is not None
    for i, (a, b, c) in enumerate(zip(a_list, b_list, cs)):
        if c.numel():
            z = torch.matmul(a.float(), b.float()) if fused and a.dtype in (F16, BF16) else torch.matmul(a, b)
            c.copy_(_torch_epilogue(z, biases[i] if biases is not None else None, None, epi.activation))
    return cs


def list_reference_variant(g, cfg, *args):
    return list_reference(*args)


def list_groups_check(g: ListGeometry) -> str | None:
    if len(g.shapes) > K.MAX_GROUPS:
        return f"{len(g.shapes)} groups exceed the {K.MAX_GROUPS} the in-register tile prefix holds"
    return None


def list_configs(g: ListGeometry):
    return K.list_configs(list(g.shapes), g.itemsize)


def list_default(g: ListGeometry):
    return K.list_default_config(list(g.shapes), g.itemsize, g.sms)


def list_bucket(g: ListGeometry) -> str:
    M = sum(s[0] for s in g.shapes)
    N = max(s[1] for s in g.shapes)
    KK = max(s[2] for s in g.shapes)
    return f"{bucket_size(len(g.shapes))}g:{bucket_dims(M, N, KK)}"


LIST_SPECS = [
    Spec("triton_grouped", list_triton, version=K.LIST_VERSION, dtypes=FLOATS, check=list_groups_check,
         configs=list_configs, default_config=list_default, bucket=list_bucket,
         description="one persistent launch over all groups' tiles; per-group addresses, sizes and "
                     "strides from an int64 table on the device"),
    Spec("torch_loop", list_loop, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=list_bucket,
         description="one cuBLAS matmul per group"),
    Spec("reference", list_reference_variant, kind="reference", devices=("cpu", "cuda"),
         description="plain torch in float64"),
]


# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------
def _dtype_key(a, b, *rest) -> str:
    return epilogue_dtype_key(a, rest[-1] if rest and isinstance(rest[-1], Epilogue) else Epilogue())


def memo_key(a, b, offsets, bias=None, residual=None, epi=Epilogue()) -> tuple:
    # Alignment decides whether TMA can take the operands; offsets' values do not enter.
    return (a.dtype, a.shape, a.stride(), a.device, a.data_ptr() % 16, b.dtype, b.shape, b.stride(),
            b.data_ptr() % 16, offsets.dtype, offsets.shape, offsets.device, _meta(bias), _meta(residual), epi)


def _tensors(a, b, offsets, bias=None, residual=None, epi=None):
    return tuple(t for t in (a, b, bias, residual) if t is not None)


def wgrad_memo_key(a, grad, offsets) -> tuple:
    return (a.dtype, a.shape, a.stride(), a.device, grad.dtype, grad.shape, grad.stride(), offsets.shape,
            offsets.device, _tf32_now())


def wgrad_dtype_key(a, grad, offsets) -> str:
    return _dtype_name(a.dtype) + ("+tf32" if _tf32_now() and a.dtype == F32 else "")


def _wgrad_tensors(a, grad, offsets):
    return (a, grad)


def _list_meta(ts):
    return None if ts is None else tuple((t.dtype, t.shape, t.stride(), t.device) for t in ts)


def list_memo_key(a_list, b_list, biases=None, epi=Epilogue()) -> tuple:
    return (_list_meta(a_list), _list_meta(b_list), _list_meta(biases), epi)


def list_dtype_key(a_list, b_list, biases=None, epi=Epilogue()) -> str:
    return _dtype_key(a_list[0], b_list[0], epi)


def _list_tensors(a_list, b_list, biases=None, epi=None):
    return tuple(a_list) + tuple(b_list) + tuple(biases or ())


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _rand(g, device, *shape, dtype=F32, scale=1.0):
    return (torch.randn(shape, generator=g, dtype=F64 if dtype == F64 else F32) * scale).to(dtype).to(device)


def _offsets(sizes, device):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(I32).to(device)


def _epi(bias=None, residual=None, activation=None, out_dtype=None, tf32=False):
    return Epilogue(activation, out_dtype, tf32, bias is not None, residual is not None)


def sample_inputs(device: torch.device) -> list[tuple]:
    """Inputs reaching every variant and dtype: TMA-aligned MoE shapes with an
    empty group, transposed weights (K-major, as the backward's B^T), odd K
    and N (pointer path), every epilogue, out_dtype, the gradient epilogue,
    fp64, and a larger MoE shape (8 experts, 2048 tokens, 1024 -> 1536)."""
    g = torch.Generator(device="cpu").manual_seed(4096)

    def r(*shape, dtype=F32, scale=1.0):
        return _rand(g, device, *shape, dtype=dtype, scale=scale)

    out = []
    for dt in (BF16, F16, F32):
        sizes = [40, 0, 130, 7, 79]
        M, G = sum(sizes), len(sizes)
        offs = _offsets(sizes, device)
        bias = r(G, 192, dtype=dt)
        out += [
            (r(M, 128, dtype=dt), r(G, 128, 192, dtype=dt, scale=0.1), offs, None, None, _epi()),
            (r(M, 128, dtype=dt), r(G, 192, 128, dtype=dt, scale=0.1).transpose(1, 2), offs, bias, None,
             _epi(bias, activation="gelu")),
            (r(M, 45, dtype=dt), r(G, 45, 71, dtype=dt, scale=0.1), offs, r(G, 71, dtype=F32), None,
             _epi(True, activation="silu")),
            (r(M, 64, dtype=dt), r(G, 64, 96, dtype=dt, scale=0.1), offs, None, r(M, 96, dtype=dt),
             _epi(residual=True, activation="gelu_tanh_grad")),
        ]
    sizes = [300, 211, 0, 517, 260, 190, 330, 240]
    big_a, big_b, big_offs = r(sum(sizes), 1024, dtype=BF16), r(8, 1024, 1536, dtype=BF16, scale=0.03), \
        _offsets(sizes, device)
    out += [
        (big_a, big_b, big_offs, None, None, _epi()),
        (big_a, big_b, big_offs, r(8, 1536, dtype=BF16), None, _epi(True, activation="relu", out_dtype=F32)),
        (r(100, 96, dtype=F32), r(3, 96, 64, dtype=F32), _offsets([20, 50, 30], device), None, None,
         _epi(tf32=True)),
        (r(37, 29, dtype=F64), r(3, 29, 23, dtype=F64), _offsets([10, 0, 27], device), r(3, 23, dtype=F64), None,
         _epi(True, activation="gelu")),
    ]
    return out


def wgrad_samples(device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(4097)
    out = []
    for dt in (BF16, F16, F32, F64):
        sizes = [40, 0, 130, 7, 79]
        M = sum(sizes)
        out.append((_rand(g, device, M, 96, dtype=dt), _rand(g, device, M, 72, dtype=dt), _offsets(sizes, device)))
    sizes = [300, 211, 0, 517, 260, 190, 330, 240]
    out.append((_rand(g, device, sum(sizes), 512, dtype=BF16), _rand(g, device, sum(sizes), 768, dtype=BF16),
                _offsets(sizes, device)))
    return out


def list_samples(device: torch.device) -> list[tuple]:
    g = torch.Generator(device="cpu").manual_seed(4098)
    out = []
    for dt in (BF16, F16, F32, F64):
        shapes = [(33, 64, 48), (0, 16, 16), (130, 40, 72), (5, 128, 256)]
        a = tuple(_rand(g, device, m, k, dtype=dt) for m, k, n in shapes)
        b = tuple(_rand(g, device, k, n, dtype=dt, scale=0.1) for m, k, n in shapes)
        out.append((a, b, None, _epi()))
        biases = tuple(_rand(g, device, n, dtype=dt) for m, k, n in shapes)
        bt = tuple(_rand(g, device, n, k, dtype=dt, scale=0.1).t() for m, k, n in shapes)
        out.append((a, bt, biases, _epi(True, activation="silu")))
    shapes = [(1024, 1024, 2048), (512, 2048, 1024), (2048, 512, 512), (256, 4096, 1024)]
    a = tuple(_rand(g, device, m, k, dtype=BF16) for m, k, n in shapes)
    b = tuple(_rand(g, device, k, n, dtype=BF16, scale=0.03) for m, k, n in shapes)
    out.append((a, b, None, _epi()))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
PACKED, WGRAD, LIST = "grouped_matmul", "grouped_matmul_wgrad", "grouped_matmul_list"


def _per_op(packed, wgrad, list_form):
    """A ``register_family`` field: the value for each of the three ops."""
    return {PACKED: packed, WGRAD: wgrad, LIST: list_form}.__getitem__


OPS = registry.register_family(
    (PACKED, WGRAD, LIST), _per_op(SPECS, WGRAD_SPECS, LIST_SPECS),
    geometry=_per_op(geometry, wgrad_geometry, list_geometry),
    reference=_per_op(reference, wgrad_reference, list_reference),
    tensors=_per_op(_tensors, _wgrad_tensors, _list_tensors),
    memo_key=_per_op(memo_key, wgrad_memo_key, list_memo_key),
    dtype_key=_per_op(_dtype_key, wgrad_dtype_key, list_dtype_key),
    validate=_per_op(validate, validate_wgrad, validate_list),
    samples=_per_op(sample_inputs, wgrad_samples, list_samples),
    doc=_per_op("grouped GEMM (MoE, packed rows + int32 end offsets) with fused bias and activation",
                "the grouped GEMM's weight gradient: dB[g] = A_g^T dY_g",
                "grouped GEMM over lists of differently shaped problems, one launch"),
)
OP, WGRAD_OP, LIST_OP = OPS[PACKED], OPS[WGRAD], OPS[LIST]

SCHEMA = ("grouped_matmul(Tensor a, Tensor b, Tensor offsets, Tensor? bias=None, Tensor? residual=None, "
          "str? activation=None, ScalarType? out_dtype=None) -> Tensor")
WGRAD_SCHEMA = "grouped_matmul_wgrad(Tensor a, Tensor grad, Tensor offsets) -> Tensor"
LIST_SCHEMA = ("grouped_matmul_list(Tensor[] a, Tensor[] b, Tensor[]? bias=None, str? activation=None, "
               "ScalarType? out_dtype=None) -> Tensor[]")


def _impl(a, b, offsets, bias=None, residual=None, activation=None, out_dtype=None):
    return dispatch.call(OP, a, b, offsets, bias, residual, make_epilogue(a, bias, residual, activation, out_dtype))


def _fake(a, b, offsets, bias=None, residual=None, activation=None, out_dtype=None):
    validate(a, b, offsets, bias, residual, Epilogue(activation, out_dtype, False, bias is not None,
                                                     residual is not None))
    return torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype or a.dtype, device=a.device)


def _setup(ctx, inputs, output):
    # torch.library drops trailing arguments left at their schema defaults.
    a, b, offsets, bias, residual, activation, out_dtype = tuple(inputs) + (None,) * (7 - len(inputs))
    ctx.save_for_backward(a, b, offsets, bias if activation is not None else None)
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None


def segment_sum(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``[G, N]``: the sum of each group's rows of ``x`` (fp32, fp64 for fp64),
    found on the device (a row's group is a searchsorted of the offsets)."""
    G = offsets.shape[0]
    acc = F64 if x.dtype == F64 else F32
    gid = torch.searchsorted(offsets, torch.arange(x.shape[0], device=x.device, dtype=I32), right=True)
    out = torch.zeros((G + 1, x.shape[1]), dtype=acc, device=x.device)
    return out.index_add_(0, gid, x.to(acc))[:G]


def _backward(ctx, gy):
    a, b, offsets, bias = ctx.saved_tensors
    act = ctx.activation
    need = tuple(ctx.needs_input_grad) + (False,) * 7
    need_a, need_b, need_bias = need[0], need[1], need[3]
    if act in GRAD_ACTIVATIONS:
        raise NotImplementedError(f"{WHERE}: no second derivative through a gradient epilogue")
    if act is not None and (need_a or need_b or need_bias):
        gz = torch.ops.opforge.grouped_matmul.default(a, b, offsets, bias, gy, f"{act}_grad", a.dtype)
    else:
        gz = gy if gy.dtype == a.dtype else gy.to(a.dtype)
    da = db = dbias = None
    if need_a:
        da = torch.ops.opforge.grouped_matmul.default(gz, b.transpose(1, 2), offsets, None, None, None, None)
    if need_b:
        db = torch.ops.opforge.grouped_matmul_wgrad.default(a, gz, offsets)
    if need_bias and ctx.has_bias:
        # Without an activation dZ = dY: sum dY itself (not its cast to the input dtype).
        dbias = segment_sum(gz if act is not None else gy, offsets).to(ctx.bias_dtype)
    return (da, db, None, dbias, None, None, None)[: len(ctx.needs_input_grad)]


define(SCHEMA, _impl, _fake, _backward, _setup)


def _wgrad_impl(a, grad, offsets):
    return dispatch.call(WGRAD_OP, a, grad, offsets)


def _wgrad_fake(a, grad, offsets):
    validate_wgrad(a, grad, offsets)
    return torch.empty((offsets.shape[0], a.shape[1], grad.shape[1]), dtype=a.dtype, device=a.device)


define(WGRAD_SCHEMA, _wgrad_impl, _wgrad_fake)


def _list_epi(a_list, bias, activation, out_dtype):
    return make_epilogue(a_list[0] if a_list else None, bias, None, activation, out_dtype)


def _list_impl(a, b, bias=None, activation=None, out_dtype=None):
    return dispatch.call(LIST_OP, tuple(a), tuple(b), tuple(bias) if bias is not None else None,
                         _list_epi(a, bias, activation, out_dtype))


def _list_fake(a, b, bias=None, activation=None, out_dtype=None):
    validate_list(a, b, bias, Epilogue(activation, out_dtype, False, bias is not None, False))
    return [torch.empty((x.shape[0], y.shape[1]), dtype=out_dtype or x.dtype, device=x.device) for x, y in zip(a, b)]


def _list_setup(ctx, inputs, output):
    a, b, bias, activation, out_dtype = tuple(inputs) + (None,) * (5 - len(inputs))
    ctx.save_for_backward(*a, *b, *(bias or ()))
    ctx.groups = len(a)
    ctx.has_bias = bias is not None
    ctx.activation = activation


def _list_backward(ctx, gys):
    G = ctx.groups
    saved = ctx.saved_tensors
    a, b = list(saved[:G]), list(saved[G:2 * G])
    bias = list(saved[2 * G:]) if ctx.has_bias else None
    act = ctx.activation
    gys = [torch.zeros((x.shape[0], y.shape[1]), dtype=x.dtype, device=x.device) if gy is None else gy
           for gy, x, y in zip(gys, a, b)]
    if act is not None:
        # dZ = dY * act'(Z), Z recomputed by one list launch (fp32 for 16-bit inputs).
        zs = torch.ops.opforge.grouped_matmul_list.default(a, b, bias, None, F32 if a[0].dtype != F64 else None)
        gz = [_act_grad(gy.to(z.dtype), z, act) for gy, z in zip(gys, zs)]
    else:
        gz = gys
    gz_in = [t.to(x.dtype) for t, x in zip(gz, a)]
    need = tuple(ctx.needs_input_grad) + (False,) * 5
    da = torch.ops.opforge.grouped_matmul_list.default(gz_in, [y.t() for y in b]) if need[0] else None
    db = torch.ops.opforge.grouped_matmul_list.default([x.t() for x in a], gz_in) if need[1] else None
    dbias = None
    if need[2] and bias is not None:
        dbias = [t.sum(0, dtype=F64 if t.dtype == F64 else F32).to(bb.dtype) for t, bb in zip(gz, bias)]
    return (da, db, dbias, None, None)[: len(ctx.needs_input_grad)]


define(LIST_SCHEMA, _list_impl, _list_fake, _list_backward, _list_setup)


# ---------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------
_packet = torch.ops.opforge.grouped_matmul.default
_list_packet = torch.ops.opforge.grouped_matmul_list.default
_call = dispatch.call
_Tensor = torch.Tensor


def grouped_matmul(a, b, offsets=None, *, bias=None, activation: str | None = None,
                   out_dtype: torch.dtype | None = None):
    """Grouped GEMM with a fused epilogue: per group ``act(a_g @ b_g + bias_g)``
    cast to ``out_dtype`` (default: the input dtype), fp32 accumulation.

    Packed form: ``a [M_total, K]`` (rows sorted by group), ``b [G, K, N]``,
    ``offsets`` int32 ``[G]`` cumulative end rows (``torch._grouped_mm``'s
    ``offs``; groups may be empty; ``offsets[-1] == M_total``), ``bias
    [G, N]``; returns ``[M_total, N]``.

    List form: ``a`` and ``b`` lists of ``[M_i, K_i]`` and ``[K_i, N_i]``
    tensors, ``bias`` None or a list of ``[N_i]``, no offsets; returns the
    list of ``[M_i, N_i]``.

    ``activation``: None, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"silu"`` or
    ``"relu"``. Differentiable in ``a``, ``b`` and ``bias`` (both forms).
    """
    if isinstance(a, (list, tuple)):
        if offsets is not None:
            raise ValueError(f"{LIST_WHERE}: offsets belong to the packed form; the list form takes each "
                             f"group's size from its tensors")
        if not isinstance(b, (list, tuple)):
            raise TypeError(f"{LIST_WHERE}: a is a list, so b must be a list of tensors too, "
                            f"got {type(b).__name__}")
        if bias is not None and not isinstance(bias, (list, tuple)):
            raise TypeError(f"{LIST_WHERE}: bias must be None or a list of [N_i] tensors, got {type(bias).__name__}")
        tensors = list(a) + list(b) + list(bias or ())
        if (a and direct_ok(a[0]) and all(type(t) is _Tensor and _plain(t) for t in tensors)
                and (activation is None or activation in ACTIVATIONS)
                and (out_dtype is None or type(out_dtype) is torch.dtype)):
            biases = tuple(bias) if bias is not None else None
            return _call(LIST_OP, tuple(a), tuple(b), biases, _list_epi(a, bias, activation, out_dtype))
        validate_list(a, b, bias, Epilogue(activation, out_dtype, False, bias is not None, False), internal=False)
        return list(_list_packet(list(a), list(b), list(bias) if bias is not None else None, activation,
                                 out_dtype))
    if offsets is None:
        raise ValueError(f"{WHERE}: offsets is required for the packed form (a [M_total, K], b [G, K, N], "
                         f"offsets int32 [G] of cumulative end rows); pass lists for the list form")
    if (type(b) is _Tensor and type(offsets) is _Tensor and direct_ok(a, b) and _plain(bias)
            and (activation is None or activation in ACTIVATIONS)
            and (out_dtype is None or type(out_dtype) is torch.dtype)):
        if offsets.device.type == "cpu" and offsets.dtype == I32 and isinstance(a, _Tensor) and a.dim() == 2:
            check_offset_values(offsets, a.shape[0])  # free on the CPU; dispatch validates once per key
        return _call(OP, a, b, offsets, bias, None, make_epilogue(a, bias, None, activation, out_dtype))
    validate(a, b, offsets, bias, None, Epilogue(activation, out_dtype, False, bias is not None, False),
             internal=False)
    return _packet(a, b, offsets, bias, None, activation, out_dtype)


__all__ = ["grouped_matmul"]
