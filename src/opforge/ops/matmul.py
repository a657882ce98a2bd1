"""GEMM op: ``opforge.matmul(a, b, *, bias=None, activation=None, residual=None, out_dtype=None)``.

Semantics. ``torch.matmul(a, b)`` for 1-D, 2-D and batched operands (``a``
with any number of leading dims against a 2-D ``b``; or 3-D against 3-D /
2-D with a batch of 1 broadcast), followed by a fused epilogue applied to the
accumulator before the single rounding:

    y = act(a @ b + bias) + residual,  cast to out_dtype

``activation`` is one of ``"gelu"`` (exact, erf), ``"gelu_tanh"``, ``"silu"``,
``"relu"``; ``bias`` is ``[N]`` in the input dtype or fp32; ``residual`` is
any float tensor broadcastable to the output; ``out_dtype`` defaults to the
input dtype. ``a`` and ``b`` must have the same dtype (fp16, bf16, fp32,
fp64). Accumulation is fp32 (fp64 for fp64). fp32 inputs are exact fp32
unless ``torch.backends.cuda.matmul.allow_tf32`` is on (the torch switch;
read on every call and part of the dispatch key).

Layout. Every call is one batched problem ``[Bt, M, K] @ [Bt, K, N]``: the
leading dims of ``a`` against a 2-D ``b`` collapse into M when they can be
viewed so (the Linear case is one GEMM, whatever the batch), a broadcast
operand gets batch stride 0, and nothing is copied except an ``a`` whose
leading dims neither collapse nor form one batch dim. The output is a fresh
contiguous tensor of ``torch.matmul``'s shape.

Variants, in dispatch order:
``triton_splitk`` (decode shapes: M <= 64 after collapsing and K long enough
to cut; deterministic two-pass reduction), ``triton_tma_persistent`` (Hopper
TMA + wgmma, persistent grouped tiles; 2-D problems whose operands have a unit
stride and 16-byte alignment; fp16/bf16/fp32), ``triton_tiled`` (portable
pointer-based tiles, any strides, batched, also fp64), ``torch_eager``
(cuBLAS plus separate torch epilogue ops) and ``reference`` (plain torch).

Autograd. ``dA = dZ @ B^T``, ``dB = A^T @ dZ``, ``dbias = sum_rows(dZ)``,
``dresidual = dY``, where ``dZ = dY * act'(Z)``. The pre-activation ``Z`` is
not saved: with an activation the backward reruns the forward GEMM with a
*gradient epilogue* (``dY * act'(acc + bias)`` computed in registers), so the
forward keeps nothing beyond its inputs (no ``M x N`` buffer per layer) at the
cost of one more GEMM in the backward. All three backward GEMMs go through
this op on transposed views (no copies where strides allow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from opforge.kernels import gemm as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, launch, registry
from opforge.runtime import device as devmod
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_dims, major

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
FLOATS = frozenset({F16, BF16, F32, F64})
TENSOR_CORE = frozenset({F16, BF16, F32})
ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu")
# Internal: the backward's gradient epilogues (residual * act'(z)).
GRAD_ACTIVATIONS = tuple(f"{a}_grad" for a in ACTIVATIONS)
WHERE = "opforge.matmul"


class Epilogue(NamedTuple):
    """What follows the GEMM, as the registry op and the dispatch key see it."""

    activation: str | None = None
    out_dtype: torch.dtype | None = None  # None: the input dtype
    tf32: bool = False
    bias: bool = False
    residual: bool = False


def _tf32_switch() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32)


# ``torch.backends.cuda.matmul.allow_tf32`` is a module ``__getattr__`` reached
# after a failed attribute lookup (about 3 us a call); its C getter is what it returns.
_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None) or _tf32_switch
# The epilogue of a plain product, one per TF32 setting: the common call builds nothing.
_PLAIN = (Epilogue(tf32=False), Epilogue(tf32=True))


def make_epilogue(a, bias=None, residual=None, activation=None, out_dtype=None, tf32=None) -> Epilogue:
    if out_dtype is not None and isinstance(a, torch.Tensor) and out_dtype == a.dtype:
        out_dtype = None
    tf32 = bool(_tf32()) if tf32 is None else tf32
    if bias is None and residual is None and activation is None and out_dtype is None and type(tf32) is bool:
        return _PLAIN[tf32]
    return Epilogue(activation, out_dtype, tf32, bias is not None, residual is not None)


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _act(z, name):
    if name == "relu":
        return torch.relu(z)
    if name == "gelu":
        return F.gelu(z)
    if name == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if name == "silu":
        return F.silu(z)
    return z


def _act_grad(g, z, name):
    """g * act'(z)."""
    if name == "relu":
        return torch.where(z > 0, g, torch.zeros((), dtype=g.dtype, device=g.device))
    if name == "gelu":
        return torch.ops.aten.gelu_backward(g, z, approximate="none")
    if name == "gelu_tanh":
        return torch.ops.aten.gelu_backward(g, z, approximate="tanh")
    return torch.ops.aten.silu_backward(g, z)


def _split_rest(rest):
    """(bias, residual, epi) from ``(bias, residual, epi)``, with or without the Nones."""
    epi = rest[-1]
    ts = [t for t in rest[:-1] if t is not None]
    bias = ts.pop(0) if epi.bias else None
    residual = ts.pop(0) if epi.residual else None
    return bias, residual, epi


def reference(a, b, *rest):
    """``act(a @ b + bias) + residual`` (or ``residual * act'(a @ b + bias)`` for
    a gradient epilogue) in fp32, fp64 for fp64 inputs; cast to out_dtype."""
    bias, residual, epi = _split_rest(rest)
    cd = F64 if a.dtype == F64 else F32
    z = torch.matmul(a.to(cd), b.to(cd))
    if bias is not None:
        z = z + bias.to(cd)
    act = epi.activation
    if act in GRAD_ACTIVATIONS:
        y = _act_grad(residual.to(cd).expand(z.shape), z, act[: -len("_grad")])
    else:
        y = _act(z, act)
        if residual is not None:
            y = y + residual.to(cd)
    return y.to(epi.out_dtype or a.dtype)


def _eager(a, b, bias, residual, epi):
    """cuBLAS for the product, then torch's own ops for the epilogue."""
    out_dtype = epi.out_dtype or a.dtype
    if a.dtype in (F16, BF16) and out_dtype in (F32, F64):
        z = torch.matmul(a.float(), b.float())  # keep the fp32 accumulator's precision
    else:
        z = torch.matmul(a, b)
    if bias is not None:
        z = z + bias
    act = epi.activation
    if act in GRAD_ACTIVATIONS:
        y = _act_grad(residual.to(z.dtype).expand(z.shape), z, act[: -len("_grad")])
    else:
        y = _act(z, act)
        if residual is not None:
            y = y + residual
    return y.to(out_dtype).contiguous()


# ---------------------------------------------------------------------------
# Validation and geometry
# ---------------------------------------------------------------------------
def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _check_shapes(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 0:
            raise ValueError(f"{WHERE}: {name} is 0-dim; both arguments need at least 1 dim (as torch.matmul)")
    if b.dim() > 3:
        raise ValueError(f"{WHERE}: b has {b.dim()} dims; supported are a [..., M, K] @ b [K, N] "
                         f"and batched a [B, M, K] @ b [B, K, N]")
    ka = a.shape[-1]
    kb = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(f"{WHERE}: a has K={ka} (its last dim) but b has K={kb}; shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)} cannot be multiplied")
    if b.dim() == 3:
        if a.dim() > 3:
            raise ValueError(f"{WHERE}: a has {a.dim()} dims against a 3-D b; batched matmul takes "
                             f"a [B, M, K] or [M, K] with b [B, K, N]")
        ba = a.shape[0] if a.dim() == 3 else 1
        if ba != b.shape[0] and 1 not in (ba, b.shape[0]):
            raise ValueError(f"{WHERE}: batch sizes {ba} (a) and {b.shape[0]} (b) differ and neither is 1")


def out_shape(a, b) -> tuple[int, ...]:
    """torch.matmul's output shape for the supported cases."""
    M = 1 if a.dim() == 1 else a.shape[-2]
    N = 1 if b.dim() == 1 else b.shape[-1]
    if b.dim() == 3:
        batch = (max(a.shape[0] if a.dim() == 3 else 1, b.shape[0]),)
    else:
        batch = tuple(a.shape[:-2])
    shape = batch + (M, N)
    if b.dim() == 1:
        shape = shape[:-1]
    if a.dim() == 1:
        shape = shape[:-2] + shape[-1:] if b.dim() != 1 else shape[:-1]
    return shape


def _check_operands(where, a, b) -> None:
    """a and b: tensors of one float dtype on one device (shared with the grouped GEMM)."""
    check_tensor(where, "a", a)
    check_tensor(where, "b", b)
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in FLOATS:
            raise TypeError(f"{where}: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"{where}: a is {a.dtype} but b is {b.dtype}; they must match (cast one of them)")
    if a.device != b.device:
        raise ValueError(f"{where}: a is on {a.device} but b is on {b.device}")


def _check_epilogue(where, epi: Epilogue, internal: bool) -> None:
    """The activation name (gradient epilogues only when ``internal``) and out_dtype."""
    names = ACTIVATIONS + (GRAD_ACTIVATIONS if internal else ())
    act = epi.activation
    if act is not None and (not isinstance(act, str) or act not in names):
        raise ValueError(f"{where}: activation must be None or one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {act!r}")
    od = epi.out_dtype
    if od is not None and (not isinstance(od, torch.dtype) or od not in FLOATS):
        raise TypeError(f"{where}: out_dtype must be None, float16, bfloat16, float32 or float64, got {od!r}")


def validate(a, b, bias=None, residual=None, epi: Epilogue = Epilogue(), *, internal: bool = True) -> None:
    _check_operands(WHERE, a, b)
    _check_shapes(a, b)
    _check_epilogue(WHERE, epi, internal)
    act = epi.activation
    N = 1 if b.dim() == 1 else b.shape[-1]
    if bias is not None:
        check_tensor(WHERE, "bias", bias)
        if b.dim() == 1:
            raise ValueError(f"{WHERE}: bias needs a b with an N dim (b is 1-D)")
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"{WHERE}: bias must have shape ({N},) (N = b.shape[-1]), got {tuple(bias.shape)}")
        if bias.dtype not in (a.dtype, F32):
            raise TypeError(f"{WHERE}: bias is {bias.dtype}; expected {a.dtype} (the input dtype) or float32")
        if bias.device != a.device:
            raise ValueError(f"{WHERE}: bias is on {bias.device} but a is on {a.device}")
    if residual is not None:
        check_tensor(WHERE, "residual", residual)
        shape = out_shape(a, b)
        try:
            ok = torch.broadcast_shapes(residual.shape, shape) == torch.Size(shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"{WHERE}: residual of shape {tuple(residual.shape)} does not broadcast to the "
                             f"output shape {tuple(shape)}")
        if residual.device != a.device:
            raise ValueError(f"{WHERE}: residual is on {residual.device} but a is on {a.device}")
    if act in GRAD_ACTIVATIONS and residual is None:
        raise ValueError(f"{WHERE}: activation {act!r} (a gradient epilogue) needs the gradient as residual")


def validate_public(a, b, bias, residual, activation, out_dtype) -> None:
    validate(a, b, bias, residual, Epilogue(activation, out_dtype, False, bias is not None, residual is not None),
             internal=False)


class Problem(NamedTuple):
    A: torch.Tensor  # [Bt, M, K]
    B: torch.Tensor  # [Bt, K, N] (batch stride 0 when broadcast)
    shape: tuple  # the output's shape


def problem(a, b) -> Problem:
    """The one batched GEMM of ``a @ b``, as views wherever the strides allow."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(1) if b.dim() == 1 else b
    M, K = a2.shape[-2], a2.shape[-1]
    N = b2.shape[-1]
    if b2.dim() == 2:
        if a2.dim() == 2:
            A = a2.unsqueeze(0)
        else:
            rows = a2.numel() // K if K else a2.shape[:-1].numel()
            try:
                A = a2.view(1, rows, K)
            except RuntimeError:
                A = a2 if a2.dim() == 3 else a2.reshape(1, rows, K)
        B = b2.unsqueeze(0).expand(A.shape[0], K, N)
    else:
        Bt = max(a2.shape[0] if a2.dim() == 3 else 1, b2.shape[0])
        A = (a2 if a2.dim() == 3 else a2.unsqueeze(0)).expand(Bt, M, K)
        B = b2.expand(Bt, K, N)
    return Problem(A, B, out_shape(a, b))


@dataclass(frozen=True, slots=True)
class Geometry:
    """The batched problem ``[Bt, M, K] @ [Bt, K, N]``, the element size, the
    device's SM count, the operands' layouts (``majors``, for the bucket) and
    why the Hopper kernel cannot load them through TMA (``tma``, None when it
    can). The memo key holds all of it: dtypes, shapes, strides, device and
    the operands' 16-byte alignment."""

    Bt: int
    M: int
    N: int
    K: int
    itemsize: int
    sms: int
    majors: str
    tma: str | None


def geometry(a, b, *rest) -> Geometry:
    A, B, _ = problem(a, b)
    Bt, M, KK = A.shape
    return Geometry(Bt, M, B.shape[2], KK, a.element_size(), _sms(a), major(a) + major(b), _tma_reason(A, B))


def _tma_reason(A, B) -> str | None:
    if A.shape[0] != 1:
        return f"batched problem (batch {A.shape[0]} after collapsing): the TMA kernel takes 2-D problems"
    if A.numel() and B.numel() and K.tma_layout(A[0], B[0]) is None:  # empty: nothing to load
        return ("TMA needs each operand with a unit stride on one dim, a 16-byte aligned base "
                "and a leading stride that is a multiple of 16 bytes")
    return None


def _residual_3d(residual, shape, Bt, M, N):
    """The residual (or incoming gradient) as [Bt, M, N]: a view when it can be."""
    if residual is None:
        return None
    return residual.expand(shape).reshape(Bt, M, N)


def _act_code(epi) -> int:
    act = epi.activation
    return K.GRAD_ACTIVATIONS[act] if act in GRAD_ACTIVATIONS else K.ACTIVATIONS[act]


def _sms(t) -> int:
    return devmod.device_info(t.device).sm_count if t.device.type == "cuda" else K.H200_SMS


# ---------------------------------------------------------------------------
# Variants: the runner, checks and configs of the geometry, then the specs
# ---------------------------------------------------------------------------
class Gemm:
    """A Triton variant's run: the problem's views, the output, the empty and
    K = 0 cases, then the launch (``tma``: the Hopper kernel on the 2-D problem)."""

    def __init__(self, tma: bool):
        self.tma = tma

    def __call__(self, g: Geometry, cfg, a, b, bias, residual, epi):
        A, B, shape = problem(a, b)
        Bt, M, KK = A.shape
        N = B.shape[2]
        C = torch.empty((Bt, M, N), dtype=epi.out_dtype or a.dtype, device=a.device)
        if C.numel() == 0:
            return C.view(shape)
        R = _residual_3d(residual, shape, Bt, M, N)
        if KK == 0:
            return C.copy_(reference(A, B, bias, R, epi)).view(shape)
        if self.tma:
            K.launch_tma(A[0], B[0], C[0], bias, R[0] if R is not None else None, _act_code(epi), epi.tf32, cfg,
                         g.sms)
        else:
            K.launch_tiled(A, B, C, bias, R, _act_code(epi), epi.tf32, cfg)
        return C.view(shape)

    def bind(self, g: Geometry, cfg, args):
        """The run for one decision: the problem's views, the plan of the
        launches (``K.tiled_plan`` / ``K.tma_plan``: grids, scalars,
        constexprs) and pre-bound launchers computed once from the first
        call. A call allocates the output (and split-K's workspace) and
        launches with ``a``, ``b``, ``bias`` and ``residual`` themselves: the
        views only move no pointer, and their strides are in the plan. None
        (the plain run) for an empty problem, K = 0, or an operand the
        problem must copy."""
        a, b, bias, residual, epi = args
        A, B, shape = problem(a, b)
        Bt, M, KK = A.shape
        N = B.shape[2]
        R = _residual_3d(residual, shape, Bt, M, N)
        if (Bt * M * N == 0 or KK == 0 or A.data_ptr() != a.data_ptr()
                or (R is not None and R.data_ptr() != residual.data_ptr())):
            return None
        dtype, device = epi.out_dtype or a.dtype, a.device
        C = torch.empty((Bt, M, N), dtype=dtype, device=device)
        has_bias, has_res, empty = bias is not None, residual is not None, torch.empty
        if self.tma:
            plan = K.tma_plan(A[0], B[0], C[0], bias, R[0] if has_res else None, _act_code(epi), epi.tf32, cfg,
                              g.sms)
            go, set_allocator = launch.prepare(plan.kernel, plan.main_grid, plan.main_scalars, **plan.main_kw), \
                K.set_allocator

            def run(a, b, bias, residual, epi):
                out = empty(shape, dtype=dtype, device=device)
                set_allocator(device)
                go(a, b, out, bias if has_bias else out, residual if has_res else out)
                return out
            return run
        plan = K.tiled_plan(A, B, C, bias, R, _act_code(epi), epi.tf32, cfg)
        go = launch.prepare(plan.kernel, plan.main_grid, plan.main_scalars, **plan.main_kw)
        if plan.workspace is None:
            def run(a, b, bias, residual, epi):
                out = empty(shape, dtype=dtype, device=device)
                go(a, b, out, bias if has_bias else out, residual if has_res else out, out)
                return out
            return run
        reduce = launch.prepare(K.splitk_reduce_kernel, plan.reduce_grid, plan.reduce_scalars, **plan.reduce_kw)
        workspace, ws_dtype = plan.workspace, plan.ws_dtype

        def run(a, b, bias, residual, epi):
            out = empty(shape, dtype=dtype, device=device)
            ws = empty(workspace, dtype=ws_dtype, device=device)
            bias_t, res_t = (bias if has_bias else out), (residual if has_res else out)
            go(a, b, out, bias_t, res_t, ws)
            reduce(ws, out, bias_t, res_t)
            return out
        return run


def eager_run(g: Geometry, cfg, a, b, bias, residual, epi):
    return _eager(a, b, bias, residual, epi)


def _bind_eager(g: Geometry, cfg, args):
    """A plain product (no epilogue, the input dtype out) is ``torch.matmul``
    itself, as ``_eager`` runs it (its cast and ``contiguous`` are no-ops then)."""
    epi = args[4]
    if epi.activation is not None or epi.out_dtype is not None or epi.bias or epi.residual:
        return None
    mm = torch.matmul

    def run(a, b, bias, residual, epi):
        z = mm(a, b)
        return z if z.is_contiguous() else z.contiguous()
    return run


eager_run.bind = _bind_eager


def reference_run(g: Geometry, cfg, a, b, bias, residual, epi):
    return reference(a, b, bias, residual, epi).contiguous()


def batch_check(g: Geometry) -> str | None:
    if g.Bt > K.MAX_GRID_YZ:
        return f"a batch of {g.Bt} exceeds the {K.MAX_GRID_YZ} programs of a grid dim"
    return None


def tma_check(g: Geometry) -> str | None:
    return g.tma


def splitk_check(g: Geometry) -> str | None:
    if g.M > K.SPLITK_MAX_M:
        return f"M={g.M} > {K.SPLITK_MAX_M}: enough output tiles without cutting K"
    reason = batch_check(g)
    if reason:
        return reason
    if splitk_default(g)["SPLIT_K"] < 2:
        return f"K={g.K} is too short to cut, or the output tiles already fill the GPU"
    return None


def tile_default(g: Geometry):
    return K.tile_default_config(g.Bt, g.M, g.N, g.K, g.itemsize, g.sms)


def tile_configs(g: Geometry):
    return K.tile_configs(g.Bt, g.M, g.N, g.K, g.itemsize)


def tma_default(g: Geometry):
    return K.tma_default_config(g.M, g.N, g.K, g.itemsize, g.sms)


def tma_configs(g: Geometry):
    return K.tma_configs(g.M, g.N, g.K, g.itemsize)


def splitk_default(g: Geometry):
    return K.splitk_default_config(g.Bt, g.M, g.N, g.K, g.itemsize, g.sms)


def splitk_configs(g: Geometry):
    return K.splitk_configs(g.Bt, g.M, g.N, g.K, g.itemsize, g.sms)


def bucket(g: Geometry) -> str:
    return f"{bucket_dims(g.Bt, g.M, g.N, g.K)}:{g.majors}"


def specs(name: str) -> list[Spec]:
    """The variants of ``matmul``, in dispatch order."""
    return [
        Spec("triton_splitk", Gemm(tma=False), version=K.SPLITK_VERSION, dtypes=FLOATS, check=splitk_check,
             configs=splitk_configs, default_config=splitk_default, bucket=bucket,
             description="decode shapes (M <= 64): K cut across programs to fill the GPU, fp32 partials "
                         "summed in a fixed order by a second kernel that runs the epilogue"),
        Spec("triton_tma_persistent", Gemm(tma=True), version=K.TMA_VERSION, dtypes=TENSOR_CORE,
             min_capability=(9, 0), check=tma_check, configs=tma_configs, default_config=tma_default,
             bucket=bucket,
             description="Hopper: TMA descriptor loads, wgmma via tl.dot, one program per SM over grouped "
                         "output tiles, num_stages pipelining; 2-D problems"),
        Spec("triton_tiled", Gemm(tma=False), version=K.TILED_VERSION, dtypes=FLOATS, check=batch_check,
             configs=tile_configs, default_config=tile_default, bucket=bucket,
             description="portable: pointer-based block loads with any strides, grouped tiles, batched"),
        Spec("torch_eager", eager_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
             description="cuBLAS for the product, then separate torch ops for the epilogue"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


def _dtype_key(a, b, bias=None, residual=None, epi=Epilogue()) -> str:
    return epilogue_dtype_key(a, epi)


def epilogue_dtype_key(a, epi: Epilogue) -> str:
    """The dispatch key's dtype part: input dtype, out_dtype, TF32 (shared with the grouped GEMM)."""
    key = _dtype_name(a.dtype)
    if epi.out_dtype is not None:
        key += "->" + _dtype_name(epi.out_dtype)
    if epi.tf32 and a.dtype == F32:
        key += "+tf32"
    return key


def _meta(t):
    # The device too: a memo hit skips validation, which is what rejects a bias on another device.
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _tensors(a, b, bias=None, residual=None, epi=None):
    return tuple(t for t in (a, b, bias, residual) if t is not None)


def memo_key(a, b, bias=None, residual=None, epi=Epilogue()) -> tuple:
    # Alignment decides whether TMA can take the operands. A CUDA device as its
    # index (a torch.device costs more to build and hash), and the plain call
    # (no bias, no residual) skips the two ``_meta`` calls.
    da = a.get_device() if a.is_cuda else a.device
    db = b.get_device() if b.is_cuda else b.device
    if bias is None and residual is None:
        return (a.dtype, a.shape, a.stride(), da, a.data_ptr() & 15, b.dtype, b.shape, b.stride(), db,
                b.data_ptr() & 15, epi)
    return (a.dtype, a.shape, a.stride(), da, a.data_ptr() & 15, b.dtype, b.shape, b.stride(), db,
            b.data_ptr() & 15, _meta(bias), _meta(residual), epi)


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(device: torch.device) -> list[tuple]:
    """Random inputs reaching every variant and dtype: TMA-aligned 2-D and
    Linear-shaped problems, transposed operands, unaligned sizes (tiled),
    batched, decode shapes (split-K), every epilogue, out_dtype, TF32 and the
    backward's gradient epilogues; a few larger shapes."""
    g = torch.Generator(device="cpu").manual_seed(2024)

    def rand(*shape, dtype=F32, scale=1.0):
        return (torch.randn(shape, generator=g, dtype=F64) * scale).to(dtype).to(device)

    def epi(bias=None, residual=None, activation=None, out_dtype=None, tf32=False):
        return Epilogue(activation, out_dtype, tf32, bias is not None, residual is not None)

    out = []
    for dt in (BF16, F16, F32):
        bias = rand(512, dtype=dt)
        x = rand(3, 40, 384, dtype=dt)
        w = rand(512, 384, dtype=dt, scale=0.05)
        out += [
            (rand(256, 384, dtype=dt), rand(384, 512, dtype=dt, scale=0.05), None, None, epi()),
            (x, w.t(), bias, None, epi(bias, activation="gelu")),
            (x, w.t(), bias, rand(3, 40, 512, dtype=dt), epi(bias, True, "silu")),
            (rand(384, 256, dtype=dt).t(), rand(384, 512, dtype=dt, scale=0.05), None, None, epi(activation="relu")),
            (rand(197, 301, dtype=dt), rand(301, 259, dtype=dt, scale=0.05), rand(259, dtype=F32), None,
             epi(True, activation="gelu_tanh")),
            (rand(4, 33, 70, dtype=dt), rand(4, 70, 45, dtype=dt), None, rand(45, dtype=dt), epi(residual=True)),
            (rand(8, 4096, dtype=dt), rand(2048, 4096, dtype=dt, scale=0.02).t(), rand(2048, dtype=dt), None,
             epi(True, activation="silu")),
            (rand(1, 8192, dtype=dt), rand(8192, 1024, dtype=dt, scale=0.02), None, None, epi()),
        ]
    out += [
        (rand(1024, 1024, dtype=BF16), rand(1024, 1024, dtype=BF16, scale=0.05), None, None, epi()),
        (rand(512, 2048, dtype=BF16), rand(1536, 2048, dtype=BF16, scale=0.03).t(), None, None,
         epi(out_dtype=F32)),
        (rand(256, 512, dtype=F32), rand(512, 256, dtype=F32), None, None, epi(tf32=True)),
        (rand(37, 45, dtype=F64), rand(45, 29, dtype=F64), rand(29, dtype=F64), None,
         epi(True, activation="gelu_tanh")),
        (rand(4, 2048, dtype=F64), rand(2048, 512, dtype=F64), None, None, epi()),
        (rand(64, 96, dtype=F32), rand(96, 80, dtype=F32), rand(80, dtype=F32), rand(64, 80, dtype=F32),
         epi(True, True, "gelu_grad")),
        (rand(64, 96, dtype=BF16), rand(96, 128, dtype=BF16), None, rand(64, 128, dtype=BF16),
         epi(residual=True, activation="silu_grad")),
    ]
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op + autograd
# ---------------------------------------------------------------------------
OP = registry.register_op(
    "matmul", specs("matmul"), geometry=geometry,
    reference=reference,
    tensors=_tensors,
    memo_key=memo_key,
    dtype_key=_dtype_key,
    validate=validate,
    samples=sample_inputs,
    doc="GEMM with fused bias, activation, residual and output cast",
)

SCHEMA = ("matmul(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None, str? activation=None, "
          "ScalarType? out_dtype=None) -> Tensor")


def _impl(a, b, bias=None, residual=None, activation=None, out_dtype=None):
    return dispatch.call(OP, a, b, bias, residual, make_epilogue(a, bias, residual, activation, out_dtype))


def _fake(a, b, bias=None, residual=None, activation=None, out_dtype=None):
    validate(a, b, bias, residual, Epilogue(activation, out_dtype, False, bias is not None, residual is not None))
    return torch.empty(out_shape(a, b), dtype=out_dtype or a.dtype, device=a.device)


def _setup(ctx, inputs, output):
    # torch.library drops trailing arguments left at their schema defaults.
    a, b, bias, residual, activation, out_dtype = tuple(inputs) + (None,) * (6 - len(inputs))
    ctx.save_for_backward(a, b, bias if activation is not None else None)
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.res_shape = tuple(residual.shape) if residual is not None else None
    ctx.res_dtype = residual.dtype if residual is not None else None


def _mm(x, y):
    return torch.ops.opforge.matmul.default(x, y, None, None, None, None)


def _backward(ctx, gy):
    a, b, bias = ctx.saved_tensors
    act = ctx.activation
    need_a, need_b, need_bias, need_res = (tuple(ctx.needs_input_grad) + (False,) * 4)[:4]
    if act in GRAD_ACTIVATIONS:
        raise NotImplementedError(f"{WHERE}: no second derivative through a gradient epilogue")
    if act is not None and (need_a or need_b or need_bias):
        # dZ = dY * act'(a @ b + bias): the forward GEMM again, its epilogue
        # multiplying by the incoming gradient in registers.
        gz = torch.ops.opforge.matmul.default(a, b, bias, gy, f"{act}_grad", a.dtype)
    else:
        gz = gy if gy.dtype == a.dtype else gy.to(a.dtype)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(1) if b.dim() == 1 else b
    K, N = a2.shape[-1], b2.shape[-1]
    gz_full = gz.reshape(out_shape(a2, b2))
    da = db = dbias = dres = None
    if need_a:
        da = _mm(gz_full, b2.transpose(-1, -2))
        if da.shape != a2.shape:
            da = da.sum_to_size(a2.shape)
        da = da.reshape(a.shape)
    if need_b:
        if b2.dim() == 2:
            db = _mm(a2.reshape(-1, K).t(), gz_full.reshape(-1, N))
        else:
            db = _mm(a2.transpose(-1, -2), gz_full)
            if db.shape != b2.shape:
                db = db.sum_to_size(b2.shape)
        db = db.reshape(b.shape)
    if need_bias and ctx.has_bias:
        # Without an activation dZ = dY: sum dY itself (not its cast to the input dtype).
        src = gz_full if act is not None else gy.reshape(gz_full.shape)
        acc = F64 if src.dtype == F64 else F32
        dbias = src.reshape(-1, N).sum(0, dtype=acc).to(ctx.bias_dtype)
    if need_res and ctx.res_shape is not None:
        dres = gy.sum_to_size(ctx.res_shape) if tuple(gy.shape) != ctx.res_shape else gy
        dres = dres.to(ctx.res_dtype)
    return (da, db, dbias, dres, None, None)[: len(ctx.needs_input_grad)]


define(SCHEMA, _impl, _fake, _backward, _setup)

_packet = torch.ops.opforge.matmul.default
_call = dispatch.call
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled


def _plain(t) -> bool:
    return t is None or (type(t) is _Tensor and not (t.requires_grad and _grad_enabled()))


# Plain products (no epilogue): their memo key less the epilogue, plus TF32 -> the memoized decision,
# or ``_VENDOR`` when that decision runs ``torch.matmul`` itself (small GEMMs, where cuBLAS wins).
# Such a call then costs torch.matmul and the key, not the epilogue, the dispatcher and the bound
# runner around it (3-8 us of host time on a 13-25 us GEMM). Learned after ``dispatch.call``
# memoized the decision; emptied by dispatch whenever the memo forgets one (``dispatch.shortcuts``).
_products: dict[tuple, object] = {}
dispatch.shortcuts.append(_products)
_VENDOR = object()
_mm_vendor = torch.matmul
_shortcuts_allowed = dispatch.shortcuts_allowed
_HOOKS = dispatch._hooks.HOOKS


def _product_key(a, b) -> tuple:
    return (a.dtype, a.shape, a.stride(), a.get_device() if a.is_cuda else a.device, a.data_ptr() & 15,
            b.dtype, b.shape, b.stride(), b.get_device() if b.is_cuda else b.device, b.data_ptr() & 15,
            bool(_tf32()))


def _learn_product(key: tuple, a, b) -> None:
    """Remember the memo's decision for this plain product (``_VENDOR`` for ``torch.matmul`` itself)."""
    if not _shortcuts_allowed():
        return
    d = dispatch._memo.get((OP.name, memo_key(a, b, None, None, _PLAIN[key[-1]]), None))
    if d is not None:
        _products[key] = _VENDOR if d.variant.spec is not None and d.variant.spec.run is eager_run else d


def _plain_product(a, b) -> torch.Tensor:
    key = _product_key(a, b)
    d = _products.get(key)
    if d is not None and not _HOOKS:
        if d is _VENDOR:
            z = _mm_vendor(a, b)
            return z if z.is_contiguous() else z.contiguous()
        try:
            return d.fast(a, b, None, None, _PLAIN[key[-1]])
        except Exception:  # a launch that fails: the dispatcher's own handling (rerun_with_default)
            pass
    out = _call(OP, a, b, None, None, _PLAIN[key[-1]])
    if d is None:
        _learn_product(key, a, b)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
           residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``act(a @ b + bias) + residual`` cast to ``out_dtype`` (default: the input
    dtype), fused into one GEMM; ``torch.matmul`` semantics for the product.

    ``activation``: None, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"silu"`` or
    ``"relu"``. Differentiable in ``a``, ``b``, ``bias`` and ``residual``.
    """
    if bias is None and residual is None and activation is None and out_dtype is None:
        if type(b) is _Tensor and direct_ok(a, b):
            return _plain_product(a, b)
    elif (type(b) is _Tensor and direct_ok(a, b) and _plain(bias) and _plain(residual)
            and (activation is None or activation in ACTIVATIONS)
            and (out_dtype is None or type(out_dtype) is torch.dtype)):
        return _call(OP, a, b, bias, residual, make_epilogue(a, bias, residual, activation, out_dtype))
    validate_public(a, b, bias, residual, activation, out_dtype)
    return _packet(a, b, bias, residual, activation, out_dtype)


__all__ = ["matmul"]
