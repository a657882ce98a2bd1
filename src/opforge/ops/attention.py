"""Attention op: ``opforge.attention(q, k, v, *, causal=False, scale=None,
window=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
max_seqlen_k=None, deterministic=False)``.

Semantics: ``softmax(scale * q @ k^T + mask) @ v`` per head, ``scale``
defaulting to ``D ** -0.5``.

* Layouts follow the ecosystem: ``(B, H, S, D)`` as SDPA; with
  ``cu_seqlens_*`` the tensors are packed ``(tokens, H, D)`` as in
  FlashAttention's varlen API (``cu_seqlens`` int32/int64, ``[0, ...,
  tokens]``, one more entry than sequences; ``max_seqlen_*`` are computed
  from them when not given, which reads them on the host: pass them under
  ``torch.compile`` or CUDA graphs).
* Masks follow FlashAttention: ``Sq != Sk`` aligns the causal diagonal
  bottom-right (query ``i`` sees keys ``j <= i + Sk - Sq``); ``window=(left,
  right)`` keeps keys ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a
  bound of ``-1`` or ``None`` meaning unbounded; ``causal=True`` sets
  ``right = 0``. A query that sees no key (a window that misses every key,
  ``Sq > Sk`` under causal, an empty key sequence) gets output 0, never NaN.
* GQA/MQA: ``k``/``v`` may have fewer heads; query head ``h`` uses key/value
  head ``h // (H // Hk)``.
* dtypes fp16, bf16, fp32 (the Triton kernels; fp32 accumulation) and fp64
  (the reference). Head dim: 16, 32, 64, 128 or 256 (others are rejected:
  padding would silently cost up to 2x; pad yourself if you mean it).
* Autograd for ``q``, ``k``, ``v``. The backward is deterministic by
  construction (no atomics anywhere, see ``kernels/attention.py``), so
  ``deterministic=True`` is accepted and costs nothing.

The registry ops are ``attention`` (returns the output and the fp32
log-sum-exp, natural log, ``(B, H, Sq)`` or ``(H, tokens)``, ``+inf`` for a
query that sees no key) and ``attention_backward`` (``dq, dk, dv``). Both
take normalized arguments: ``(q, k, v, scale, window_left, window_right,
cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)``, window bounds
``-1`` for unbounded, ``max_seqlen_* = -1`` without varlen.

Variants, in dispatch order: ``gluon_ws`` (the FA3-style warp-specialized
Hopper kernels in Gluon, ``ops/attention_gluon.py``: the forward on by
default, the backward behind ``OPFORGE_GLUON=1``), ``triton_flash_tma`` (the
Triton kernels with the hot loops' tiles read through TMA descriptors;
sm_90+, 16-byte aligned bases and strides), ``triton_flash`` (FlashAttention-2 in Triton, pointer
loads, any strides), ``torch_sdpa`` (forward only: SDPA's flash kernel, CUDA,
fp16/bf16, no window/varlen/GQA, causal only when Sq == Sk because SDPA
aligns causal top-left) and ``reference`` (plain torch; materializes the
scores; fp64; the oracle and the CPU fallback).

The validation helpers (``check_qkv``, ``check_cu_seqlens``,
``normalize_window``, ``default_scale``) are plain functions so that other
attention ops (decode) can share them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opforge.kernels import attention as K
from opforge.ops import attention_gluon
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import dispatch, registry
from opforge.runtime.device import interpret_mode
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
KERNEL_DTYPES = frozenset({F16, BF16, F32})
HEAD_DIMS = (16, 32, 64, 128, 256)
WHERE = "opforge.attention"
MAX_GRID = 65535  # CUDA's limit on the grid's y and z (heads, sequences)


# ---------------------------------------------------------------------------
# Validation helpers (shared with other attention ops)
# ---------------------------------------------------------------------------
def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def normalize_window(where: str, window, causal: bool) -> tuple[int, int]:
    """``(left, right)`` with ``-1`` for an unbounded side; causal sets ``right = 0``."""
    if not isinstance(causal, bool):
        raise TypeError(f"{where}: causal must be a bool, got {type(causal).__name__}")
    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"{where}: window must be a pair (left, right), got {window!r}")
        sides = []
        for name, w in zip(("left", "right"), window):
            if w is None:
                w = -1
            if isinstance(w, bool) or not isinstance(w, int):
                raise TypeError(f"{where}: window {name} must be an int or None, got {type(w).__name__}")
            if w < -1:
                raise ValueError(f"{where}: window {name} must be >= 0, or -1/None for unbounded, got {w}")
            sides.append(w)
        left, right = sides
    if causal:
        right = 0
    return left, right


def check_qkv(where: str, q, k, v, varlen: bool) -> None:
    """Shapes, dtypes and devices of q/k/v in the (B, H, S, D) or packed (T, H, D) layout."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(where, name, t)
    dims = 3 if varlen else 4
    layout = "(tokens, heads, head_dim) with cu_seqlens" if varlen else "(batch, heads, seq, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != dims:
            raise ValueError(f"{where}: {name} must be {dims}-D {layout}, got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{where}: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{where}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    D = q.shape[-1]
    if k.shape[-1] != D:
        raise ValueError(f"{where}: head dim mismatch: q has {D}, k and v have {k.shape[-1]}")
    if D not in HEAD_DIMS:
        raise ValueError(f"{where}: head dim {D} is not supported; use one of {HEAD_DIMS}")
    hq, hk = (q.shape[1], k.shape[1])
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"{where}: q has batch {q.shape[0]} but k has {k.shape[0]}")
    if hk == 0 and hq != 0 or hk and hq % hk:
        raise ValueError(f"{where}: q heads ({hq}) must be a multiple of k/v heads ({hk}) (GQA/MQA)")


def check_cu_seqlens(where: str, q, k, cu_q, cu_k, max_q, max_k) -> None:
    """Types and shapes of the varlen arguments (values: ``check_cu_values``)."""
    if (cu_q is None) != (cu_k is None):
        raise ValueError(f"{where}: pass both cu_seqlens_q and cu_seqlens_k, or neither")
    if cu_q is None:
        return
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{where}: {name} must be int32 or int64, got {cu.dtype}")
        if cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"{where}: {name} must be 1-D with (sequences + 1) entries, got shape "
                             f"{tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{where}: {name} is on {cu.device} but q is on {q.device}")
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"{where}: cu_seqlens_q has {cu_q.numel()} entries but cu_seqlens_k has {cu_k.numel()}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"{where}: {name} must be an int >= 0 with cu_seqlens, got {m!r}")


def check_cu_values(where: str, cu, name: str, tokens: int) -> int:
    """The longest sequence of ``cu``, after checking ``0 = cu[0] <= ... <= cu[-1] = tokens``."""
    vals = cu.tolist()
    if vals[0] != 0 or vals[-1] != tokens or any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{where}: {name} must rise from 0 to the {tokens} packed tokens, got {vals[:8]}"
                         f"{'...' if len(vals) > 8 else ''}")
    return max((b - a for a, b in zip(vals, vals[1:])), default=0)


def validate(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k) -> None:
    """The registry op's arguments (already normalized by the public function)."""
    varlen = cu_q is not None or cu_k is not None
    check_qkv(WHERE, q, k, v, varlen)
    check_cu_seqlens(WHERE, q, k, cu_q, cu_k, max_q, max_k)
    seqs = cu_q.numel() - 1 if cu_q is not None else q.shape[0]
    if seqs > MAX_GRID or q.shape[1] > MAX_GRID:
        raise ValueError(f"{WHERE}: at most {MAX_GRID} sequences and {MAX_GRID} heads (the launch grid's limit), "
                         f"got {seqs} and {q.shape[1]}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"{WHERE}: scale must be a finite float, got {scale!r}")
    for name, w in (("window left", left), ("window right", right)):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"{WHERE}: {name} must be an int >= -1, got {w!r}")


def validate_backward(do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k) -> None:
    validate(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k)
    check_tensor(WHERE + "_backward", "grad_out", do)
    if do.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"{WHERE}_backward: grad_out {tuple(do.shape)} and out {tuple(out.shape)} must have "
                         f"q's shape {tuple(q.shape)}")
    if do.dtype != q.dtype or out.dtype != q.dtype:
        raise TypeError(f"{WHERE}_backward: grad_out ({do.dtype}) and out ({out.dtype}) must be {q.dtype}")
    if lse.dtype != F32:
        raise TypeError(f"{WHERE}_backward: lse must be float32 (the forward's log-sum-exp), got {lse.dtype}")
    if tuple(lse.shape) != _lse_shape(q, cu_q is not None):
        raise ValueError(f"{WHERE}_backward: lse has shape {tuple(lse.shape)}, expected "
                         f"{_lse_shape(q, cu_q is not None)}")


# ---------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------
def _lse_shape(q, varlen: bool) -> tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if varlen else tuple(q.shape[:3])


def alloc_forward(q, varlen: bool):
    """The output (contiguous, q's shape) and the fp32 log-sum-exp."""
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device))


def _unit(t):
    """The kernels need a unit head-dim stride; anything else is copied once."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def _dense_reference(q, k, v, scale, left, right):
    """(B, H, Sq, D) attention with materialized scores, in q's dtype (fp32 for 16-bit)."""
    compute = F64 if q.dtype == F64 else F32
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    H, Hk = q.shape[1], k.shape[1]
    if Hk != H:
        k = k.repeat_interleave(H // Hk, dim=1)
        v = v.repeat_interleave(H // Hk, dim=1)
    Sq, Sk = q.shape[2], k.shape[2]
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    allowed = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        allowed &= j >= i + (Sk - Sq) - left
    if right >= 0:
        allowed &= j <= i + (Sk - Sq) + right
    empty = ~allowed.any(-1)  # queries that see no key
    s = s.masked_fill(~allowed, float("-inf"))
    # Rows with no key: a finite stand-in for the log-sum-exp, so that neither
    # the value (exp(-inf - x) = 0) nor the gradient is NaN.
    lse = torch.logsumexp(s.masked_fill(empty[:, None], 0.0), dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.matmul(p, v)
    return out, lse.masked_fill(empty, float("inf"))


def attention_reference(q, k, v, scale, left, right, cu_q=None, cu_k=None, max_q=-1, max_k=-1):
    """``(out, lse)``: out in q's dtype, lse fp32 (whatever the input dtype, as the kernels)."""
    lse_dtype = F32
    if cu_q is None:
        if q.numel() == 0 or k.shape[2] == 0:
            out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
            return out, torch.full(q.shape[:3], float("inf"), dtype=lse_dtype, device=q.device)
        out, lse = _dense_reference(q, k, v, scale, left, right)
        return out.to(q.dtype), lse.to(lse_dtype)
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), dtype=lse_dtype, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        (q0, q1), (k0, k1) = (cq[b], cq[b + 1]), (ck[b], ck[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        o, l = _dense_reference(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None],
                                v[k0:k1].transpose(0, 1)[None], scale, left, right)
        out[q0:q1] = o[0].transpose(0, 1).to(q.dtype)
        lse[:, q0:q1] = l[0].to(lse_dtype)
    return out, lse


def attention_backward_reference(do, q, k, v, out, lse, scale, left, right, cu_q=None, cu_k=None,
                                 max_q=-1, max_k=-1):
    """``(dq, dk, dv)`` by autograd through the reference (``out``/``lse`` unused)."""
    compute = F64 if q.dtype == F64 else F32
    with torch.enable_grad():
        qq, kk, vv = (t.detach().to(compute).requires_grad_() for t in (q, k, v))
        o, _ = attention_reference(qq, kk, vv, scale, left, right, cu_q, cu_k, max_q, max_k)
        grads = torch.autograd.grad(o, (qq, kk, vv), do.to(compute), allow_unused=True)
    return tuple((g if g is not None else torch.zeros_like(t)).to(q.dtype).contiguous()
                 for g, t in zip(grads, (qq, kk, vv)))


def _with_optionals(args, n_before: int, total: int):
    """Arguments with the two optional cu_seqlens back in place (selftest drops Nones)."""
    args = list(args)
    if len(args) == total - 2:
        args[n_before:n_before] = [None, None]
    return args


def reference(*args):
    return attention_reference(*_with_optionals(args, 6, 10))


def backward_reference(*args):
    return attention_backward_reference(*_with_optionals(args, 9, 13))


# ---------------------------------------------------------------------------
# Geometry: the shape facts the variants decide on
# ---------------------------------------------------------------------------
def _mask_kind(left, right) -> str:
    if left < 0 and right < 0:
        return "full"
    if left < 0 and right == 0:
        return "causal"
    return "window"


@dataclass(frozen=True, slots=True)
class Geometry:
    """One call's shape facts: ``seqs`` sequences (the batch, or varlen's),
    ``H`` query and ``Hk`` key/value heads, the (max) lengths ``Sq`` and
    ``Sk``, head dim ``D``, the dtype, the mask kind, ``empty`` (no query or
    no key), and why the TMA kernels cannot load the tensors (``tma``, None
    when they can). The memo key holds all of it (alignment included)."""

    seqs: int
    H: int
    Hk: int
    Sq: int
    Sk: int
    D: int
    itemsize: int
    dtype: torch.dtype
    mask: str
    varlen: bool
    empty: bool
    tma: str | None


def _geometry(q, k, left, right, cu_q, max_q, max_k, tma_tensors) -> Geometry:
    varlen = cu_q is not None
    Sq, Sk = (max_q, max_k) if varlen else (q.shape[2], k.shape[2])
    return Geometry(cu_q.numel() - 1 if varlen else q.shape[0], q.shape[1], k.shape[1], Sq, Sk, q.shape[-1],
                    q.element_size(), q.dtype, _mask_kind(left, right), varlen,
                    q.numel() == 0 or (not varlen and k.shape[2] == 0), _tma_reason(varlen, *tma_tensors))


def forward_geometry(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k) -> Geometry:
    return _geometry(q, k, left, right, cu_q, max_q, max_k, (k, v))


def backward_geometry(do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k) -> Geometry:
    return _geometry(q, k, left, right, cu_q, max_q, max_k, (q, k, v, do))


def _tma_reason(varlen: bool, *tensors) -> str | None:
    if any(t.numel() == 0 for t in tensors):
        return "empty tensors (nothing to load)"
    if not K.tma_ok(*(_unit(t) for t in tensors), varlen=varlen):
        return "TMA needs 16-byte aligned bases and sequence / head / batch strides that are multiples of 16 bytes"
    return None


def _launch_shape(q, k, cu_q, cu_k, max_q, max_k):
    """The kernels' ``geom``: ``(B, H, HK, Sq, Sk, cu_q, cu_k)`` of this call's tensors."""
    if cu_q is not None:
        return (cu_q.numel() - 1, q.shape[1], k.shape[1], max_q, max_k, cu_q.contiguous(), cu_k.contiguous())
    return (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], None, None)


# ---------------------------------------------------------------------------
# Variants: runners, checks and configs of the geometry, then the specs
# ---------------------------------------------------------------------------
class Forward:
    """The forward kernel (``tma``: K/V tiles through TMA descriptors)."""

    def __init__(self, tma: bool):
        self.tma = tma

    def __call__(self, g: Geometry, cfg, q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
        q, k, v = _unit(q), _unit(k), _unit(v)
        out, lse = alloc_forward(q, cu_q is not None)
        if out.numel():
            K.launch_forward(q, k, v, out, lse, _launch_shape(q, k, cu_q, cu_k, max_q, max_k), float(scale), left,
                             right, cfg, tma=self.tma)
        return out, lse


class Backward:
    """The backward kernels (``tma``: the hot loops' tiles through TMA descriptors)."""

    def __init__(self, tma: bool):
        self.tma = tma

    def __call__(self, g: Geometry, cfg, do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k):
        do, q, k, v, out = (_unit(t) for t in (do, q, k, v, out))
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        if dk.numel() and not dq.numel():
            dk.zero_()
            dv.zero_()
        elif dq.numel():
            K.launch_backward(do, q, k, v, out, lse.contiguous(), dq, dk, dv,
                              _launch_shape(q, k, cu_q, cu_k, max_q, max_k), float(scale), left, right, cfg,
                              tma=self.tma)
        return dq, dk, dv


def sdpa_run(g: Geometry, cfg, q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, right == 0, False, scale=float(scale))
    out, lse = res[0], res[1]
    return out.contiguous(), lse[..., :q.shape[2]].float().contiguous()


def reference_run(g: Geometry, cfg, *args):
    return reference(*args)


def backward_reference_run(g: Geometry, cfg, *args):
    return backward_reference(*args)


def flash_check(g: Geometry) -> str | None:
    if interpret_mode() and g.dtype == BF16:
        return "the Triton interpreter computes bf16 tl.dot wrongly"
    return None


def tma_check(g: Geometry) -> str | None:
    return flash_check(g) or g.tma


def sdpa_check(g: Geometry) -> str | None:
    if g.dtype not in (F16, BF16):
        return "SDPA's flash kernel takes fp16/bf16"
    if g.varlen:
        return "varlen (cu_seqlens) is not an SDPA argument"
    if g.mask == "window":
        return "sliding windows are not an SDPA argument"
    if g.mask == "causal" and g.Sq != g.Sk:
        return "SDPA aligns causal masks top-left; FlashAttention's bottom-right differs when Sq != Sk"
    if g.H != g.Hk:
        return "GQA/MQA through SDPA's flash kernel would need k/v expanded"
    if g.empty:
        return "empty sequences"
    return None


def forward_default(g: Geometry):
    return K.forward_default_config(g.D, g.Sq, g.Sk, g.itemsize)


def forward_configs(g: Geometry):
    return K.forward_configs(g.D, g.Sq, g.Sk, g.itemsize)


def backward_default(g: Geometry):
    return K.backward_default_config(g.D, g.Sq, g.Sk, g.itemsize)


def backward_configs(g: Geometry):
    return K.backward_configs(g.D, g.Sq, g.Sk, g.itemsize)


def bucket(g: Geometry) -> str:
    return (f"{bucket_size(g.seqs * g.H)}h:{bucket_size(g.Sq)}x{bucket_size(g.Sk)}:d{g.D}:g{g.H // max(g.Hk, 1)}"
            f":{g.mask}{':varlen' if g.varlen else ''}")


def _flash_specs(runner, version: str, configs, default, tma_description: str, description: str) -> list[Spec]:
    """``triton_flash_tma`` and ``triton_flash``: one kernel set, TMA on or off,
    so they share configs, default and bucket (a tuned entry means the same)."""
    common = dict(version=version, dtypes=KERNEL_DTYPES, configs=configs, default_config=default, bucket=bucket)
    return [Spec("triton_flash_tma", runner(True), min_capability=(9, 0), check=tma_check,
                 description=tma_description, **common),
            Spec("triton_flash", runner(False), check=flash_check, description=description, **common)]


FORWARD_SPECS = [  # first; gated in ops/attention_gluon.py
    attention_gluon.make_spec(lambda g, *args: Forward(True)(g, forward_default(g), *args)),
] + _flash_specs(
    Forward, K.FWD_VERSION, forward_configs, forward_default,
    "triton_flash with K/V tiles through device-side TMA descriptors (Hopper)",
    "FlashAttention-2: a query tile per program, online softmax over key blocks "
    "(unmasked hot loop; masked edge blocks), GQA, windows, varlen",
) + [
    Spec("torch_sdpa", sdpa_run, kind="vendor", devices=("cuda",), dtypes=frozenset({F16, BF16}), check=sdpa_check,
         bucket=bucket, description="SDPA's flash-attention kernel (aten)"),
    Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
         description="plain torch with materialized scores (the oracle and the CPU fallback)"),
]

BACKWARD_SPECS = [  # first; gated (off) in ops/attention_gluon.py
    attention_gluon.make_backward_spec(lambda g, *args: Backward(True)(g, backward_default(g), *args)),
] + _flash_specs(
    Backward, K.BWD_VERSION, backward_configs, backward_default,
    "triton_flash with the hot loops' Q/dO and K/V tiles through TMA descriptors (Hopper)",
    "delta, then dK/dV per key block (GQA group summed in order) and dQ per query "
    "block; scores recomputed from the saved log-sum-exp; no atomics (deterministic)",
) + [
    Spec("reference", backward_reference_run, kind="reference", devices=("cpu", "cuda"),
         description="autograd through the plain-torch reference"),
]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def _forward_samples(device: torch.device, large_logits: bool = True) -> list[tuple]:
    """Causal / full / window, Sq != Sk, GQA and MQA, varlen with empty and
    odd sequences, non-contiguous (B, S, H, D) views, large logits, every
    kernel dtype; a few GPU-sized shapes on CUDA."""
    g = torch.Generator(device="cpu").manual_seed(5)
    gpu = device.type == "cuda"

    def rand(shape, dtype, scale=1.0):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    def dense(B, H, Hk, Sq, Sk, D, dtype, left=-1, right=-1, bshd=False, mag=1.0):
        if bshd:  # (B, S, H, D) storage seen as (B, H, S, D), as models hold it
            q = rand((B, Sq, H, D), dtype, mag).transpose(1, 2)
            k, v = (rand((B, Sk, Hk, D), dtype, mag).transpose(1, 2) for _ in range(2))
        else:
            q = rand((B, H, Sq, D), dtype, mag)
            k, v = rand((B, Hk, Sk, D), dtype, mag), rand((B, Hk, Sk, D), dtype)
        return (q, k, v, default_scale(D), left, right, None, None, -1, -1)

    def varlen(lens_q, lens_k, H, Hk, D, dtype, left=-1, right=-1):
        cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=device)
        ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=device)
        q = rand((sum(lens_q), H, D), dtype)
        k, v = rand((sum(lens_k), Hk, D), dtype), rand((sum(lens_k), Hk, D), dtype)
        return (q, k, v, default_scale(D), left, right, cq, ck, max(lens_q), max(lens_k))

    out = []
    for dt in (F32, F16, BF16):
        out += [dense(2, 4, 4, 37, 37, 64, dt), dense(2, 4, 4, 37, 37, 64, dt, right=0),
                dense(1, 4, 2, 19, 45, 32, dt, right=0), dense(1, 4, 1, 45, 19, 16, dt, right=0),
                dense(1, 2, 2, 50, 50, 64, dt, left=7, right=3), dense(2, 2, 2, 33, 33, 128, dt, bshd=True),
                varlen([17, 1, 0, 30], [20, 5, 3, 30], 4, 2, 64, dt, right=0)]
    if large_logits:
        out.append(dense(1, 2, 2, 40, 40, 64, F32, mag=30.0))
    out.append(dense(1, 2, 2, 24, 24, 256, F16, right=0))
    if gpu:
        out += [dense(2, 8, 8, 1000, 1000, 128, BF16, right=0), dense(1, 8, 2, 777, 1531, 128, F16),
                dense(2, 4, 4, 512, 512, 256, BF16), dense(1, 8, 8, 1024, 1024, 64, BF16, left=128, right=0),
                varlen([1000, 3, 513], [1000, 700, 513], 8, 8, 128, BF16, right=0)]
    return out


def _backward_samples(device: torch.device) -> list[tuple]:
    """The forward's samples but the large-logit one: its softmax is one-hot,
    so dq and dk are ~0 and any relative error measures fp32 cancellation."""
    g = torch.Generator(device="cpu").manual_seed(6)
    out = []
    for q, k, v, scale, left, right, cq, ck, mq, mk in _forward_samples(device, large_logits=False):
        o, lse = attention_reference(q, k, v, scale, left, right, cq, ck, mq, mk)
        do = torch.randn(q.shape, generator=g, dtype=torch.float64).to(q.dtype).to(device)
        out.append((do, q, k, v, o, lse.float(), scale, left, right, cq, ck, mq, mk))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _align(*tensors) -> tuple:
    return tuple(t.data_ptr() % 16 for t in tensors)


def _memo_key(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
    # Alignment decides whether TMA can take the tensors; varlen's sequence count enters the bucket.
    return (q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.device, left, right,
            None if cu_q is None else cu_q.shape, max_q, max_k, _align(q, k, v))


def _backward_memo_key(do, q, k, v, out, lse, *rest):
    return (_memo_key(q, k, v, *rest), do.stride(), out.stride(), _align(do, out))


def _dtype_key(q, *rest):
    return str(q.dtype).replace("torch.", "")


def _backward_dtype_key(do, q, *rest):
    return _dtype_key(q)


def _tensors(q, k, v, *rest):
    return (q, k, v)


def _backward_tensors(do, q, k, v, out, lse, *rest):
    return (do, q, k, v, out)


def _pick(forward, backward):
    """A ``register_family`` field: its value for ``attention`` and ``attention_backward``."""
    return {"attention": forward, "attention_backward": backward}.__getitem__


OPS = registry.register_family(
    ("attention", "attention_backward"), _pick(FORWARD_SPECS, BACKWARD_SPECS),
    geometry=_pick(forward_geometry, backward_geometry),
    reference=_pick(reference, backward_reference),
    tensors=_pick(_tensors, _backward_tensors),
    memo_key=_pick(_memo_key, _backward_memo_key),
    dtype_key=_pick(_dtype_key, _backward_dtype_key),
    validate=_pick(validate, validate_backward),
    samples=_pick(_forward_samples, _backward_samples),
    doc=_pick("scaled dot-product attention (FlashAttention): causal, windows, GQA, varlen; returns (out, lse)",
              "gradients of attention with respect to q, k, v (scores recomputed from the log-sum-exp)"),
)
OP, BACKWARD_OP = OPS["attention"], OPS["attention_backward"]

_ARGS = ("float scale, int window_left, int window_right, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
         "int max_seqlen_q, int max_seqlen_k")


def _define() -> None:
    def bwd_impl(do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k):
        return dispatch.call(BACKWARD_OP, do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k)

    def bwd_fake(do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k):
        validate_backward(do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k)
        return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))

    define(f"attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_ARGS}) "
           f"-> (Tensor, Tensor, Tensor)", bwd_impl, bwd_fake)

    def impl(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
        return dispatch.call(OP, q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k)

    def fake(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
        validate(q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k)
        return alloc_forward(q, cu_q is not None)

    def setup(ctx, inputs, output):
        q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (scale, left, right, max_q, max_k)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        scale, left, right, max_q, max_k = ctx.args
        if grad_out is None:
            return (None,) * 10
        dq, dk, dv = torch.ops.opforge.attention_backward(grad_out, q, k, v, out, lse, scale, left, right,
                                                          cu_q, cu_k, max_q, max_k)
        return dq, dk, dv, None, None, None, None, None, None, None

    define(f"attention(Tensor q, Tensor k, Tensor v, {_ARGS}) -> (Tensor, Tensor)", impl, fake, backward, setup)


_define()
_PACKET = torch.ops.opforge.attention.default
_is_compiling = torch.compiler.is_compiling


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, window: tuple[int | None, int | None] | None = None,
              cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
              deterministic: bool = False) -> torch.Tensor:
    """FlashAttention: ``softmax(scale * q k^T + mask) v`` without the score matrix.

    ``q, k, v``: ``(B, H, S, D)`` (SDPA) or, with ``cu_seqlens_*``, packed
    ``(tokens, H, D)`` (FlashAttention varlen). ``window=(left, right)`` and
    ``causal`` as in FlashAttention (bottom-right aligned when Sq != Sk);
    ``k``/``v`` may have fewer heads (GQA). ``deterministic`` is accepted
    for FlashAttention compatibility: the backward is always deterministic.
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"{WHERE}: deterministic must be a bool, got {type(deterministic).__name__}")
    left, right = normalize_window(WHERE, window, causal)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    check_qkv(WHERE, q, k, v, varlen)
    if scale is None:
        scale = default_scale(q.shape[-1])
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{WHERE}: scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if varlen:
        check_cu_seqlens(WHERE, q, k, cu_seqlens_q, cu_seqlens_k, 0, 0)
        if _is_compiling():
            if max_seqlen_q is None or max_seqlen_k is None:
                raise ValueError(f"{WHERE}: pass max_seqlen_q and max_seqlen_k with cu_seqlens under torch.compile")
        else:
            longest_q = check_cu_values(WHERE, cu_seqlens_q, "cu_seqlens_q", q.shape[0])
            longest_k = check_cu_values(WHERE, cu_seqlens_k, "cu_seqlens_k", k.shape[0])
            for name, given, need in (("max_seqlen_q", max_seqlen_q, longest_q),
                                      ("max_seqlen_k", max_seqlen_k, longest_k)):
                if given is not None and (not isinstance(given, int) or given < need):
                    raise ValueError(f"{WHERE}: {name}={given!r} is below the longest sequence ({need})")
            max_seqlen_q = longest_q if max_seqlen_q is None else max_seqlen_q
            max_seqlen_k = longest_k if max_seqlen_k is None else max_seqlen_k
    else:
        max_seqlen_q = max_seqlen_k = -1
    args = (q, k, v, scale, left, right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if direct_ok(q, k) and type(v) is torch.Tensor and not (torch.is_grad_enabled() and v.requires_grad):
        return dispatch.call(OP, *args)[0]
    validate(*args)
    return _PACKET(*args)[0]


__all__ = ["attention"]
