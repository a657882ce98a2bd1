"""Rotary position embedding: ``opforge.rope(q, k, cos, sin, position_ids=None,
unsqueeze_dim=1)`` and the in-place ``opforge.rope_``.

The semantics of transformers' ``apply_rotary_pos_emb`` (Llama, Qwen,
Mistral: the ``rotate_half`` convention)::

    q_out = q * cos + rotate_half(q) * sin,   rotate_half([x1, x2]) = [-x2, x1]

and the same for ``k``. ``q`` is ``[B, Hq, S, D]`` and ``k`` ``[B, Hk, S, D]``
(``unsqueeze_dim=1``, transformers' layout) or ``[B, S, H, D]``
(``unsqueeze_dim=2``); any strides. ``cos`` / ``sin`` are the rows of each
position: ``[S, D]`` shared by the batch or ``[B, S, D]`` (what transformers'
rotary module returns); with ``position_ids`` (``[S]`` or ``[B, S]``, int)
they are tables ``[max_positions, D]`` gathered in the kernel, so a decode
step or packed sequences need no gathered copy. Arithmetic in fp32 (fp64 for
fp64), rounded once (transformers rounds after each product in bf16: opforge
is the closer of the two to the float64 result).

Autograd: the gradient of q and k is the transposed rotation (one kernel for
both, out of place). ``cos`` and ``sin`` get no gradient (they are computed
from a frequency buffer, not learned). ``rope_`` writes q and k in place
(prefill and decode, no autograd): no output allocation.

Registry ops: ``rope`` and ``rope_backward``, args ``(q, k, cos, sin,
unsqueeze_dim, inplace, position_ids=None)``; variants ``triton_token`` (one
program per token: the position's table row loaded once for every q and k
head), ``torch_eager`` (CUDA) and ``reference``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from opforge.kernels import rope as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define
from opforge.runtime import dispatch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
POSITION_DTYPES = frozenset({torch.int32, torch.int64})
ACCEPTED = FLOATS | POSITION_DTYPES  # every tensor argument: the floats and the position ids
NAMES = ("rope", "rope_backward")
MAX_HEAD_DIM = 1024


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rotate_half_transposed(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((x2, -x1), -1)


def tables(cos, sin, position_ids, unsqueeze_dim):
    """``cos`` / ``sin`` as ``[B or 1, 1, S, D]`` (or ``[B or 1, S, 1, D]``), gathered by ``position_ids``."""
    if position_ids is not None:
        cos, sin = cos[position_ids.long()], sin[position_ids.long()]
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    return cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)


def _rotate_ref(x, c, s, backward):
    compute = torch.promote_types(x.dtype, torch.float32)
    xc, c, s = x.to(compute), c.to(compute), s.to(compute)
    y = xc * c + _rotate_half_transposed(xc * s) if backward else xc * c + rotate_half(xc) * s
    return y.to(x.dtype)


def _ref(backward, q, k, cos, sin, unsqueeze_dim, inplace, position_ids=None):
    c, s = tables(cos, sin, position_ids, unsqueeze_dim)
    qo, ko = _rotate_ref(q, c, s, backward), _rotate_ref(k, c, s, backward)
    if inplace:
        return q.copy_(qo), k.copy_(ko)
    return qo, ko


REFERENCE = {"rope": functools.partial(_ref, False), "rope_backward": functools.partial(_ref, True)}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate(name, q, k, cos, sin, unsqueeze_dim=1, inplace=False, position_ids=None) -> None:
    where = f"opforge.{name}"
    for arg, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(where, arg, t)
        if t.dtype not in FLOATS:
            raise TypeError(f"{where}: {arg} must be fp16, bf16, fp32 or fp64, got {t.dtype}")
    if unsqueeze_dim not in (1, 2) or isinstance(unsqueeze_dim, bool):
        raise ValueError(f"{where}: unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), got {unsqueeze_dim!r}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{where}: q and k must be 4-D, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if q.dtype != k.dtype:
        raise TypeError(f"{where}: q is {q.dtype} but k is {k.dtype}; they must match")
    for arg, t in (("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise ValueError(f"{where}: {arg} is on {t.device} but q is on {q.device}")
    seq_dim = 3 - unsqueeze_dim
    B, S, D = q.shape[0], q.shape[seq_dim], q.shape[-1]
    if k.shape[0] != B or k.shape[seq_dim] != S or k.shape[-1] != D:
        raise ValueError(f"{where}: k of shape {tuple(k.shape)} does not match q of shape {tuple(q.shape)} "
                         f"in batch, sequence or head dim")
    if D % 2:
        raise ValueError(f"{where}: the head dim must be even (rotate_half splits it in halves), got {D}")
    if cos.shape != sin.shape:
        raise ValueError(f"{where}: cos has shape {tuple(cos.shape)} but sin has {tuple(sin.shape)}")
    if cos.dim() not in (2, 3) or cos.shape[-1] != D:
        raise ValueError(f"{where}: cos and sin must be [S, D] or [B, S, D] (or [positions, D] with "
                         f"position_ids) with D = {D}, got {tuple(cos.shape)}")
    if position_ids is None:
        rows = cos.shape[-2]
        if rows != S or (cos.dim() == 3 and cos.shape[0] not in (1, B)):
            raise ValueError(f"{where}: cos of shape {tuple(cos.shape)} does not give one row per position of "
                             f"{S} positions and batch {B} (pass position_ids to index a table)")
        return
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in POSITION_DTYPES:
        raise TypeError(f"{where}: position_ids must be an int32 or int64 tensor, got "
                        f"{getattr(position_ids, 'dtype', type(position_ids).__name__)}")
    if cos.dim() != 2:
        raise ValueError(f"{where}: with position_ids, cos and sin are tables [positions, D], got {tuple(cos.shape)}")
    ok = (position_ids.dim() == 1 and position_ids.shape[0] == S) or \
        (position_ids.dim() == 2 and position_ids.shape[1] == S and position_ids.shape[0] in (1, B))
    if not ok:
        raise ValueError(f"{where}: position_ids must be [S] or [B, S] with S = {S}, B = {B}, "
                         f"got {tuple(position_ids.shape)}")
    if position_ids.device != q.device:
        raise ValueError(f"{where}: position_ids is on {position_ids.device} but q is on {q.device}")


def check_positions(name, cos, position_ids) -> None:
    """Value check of ``position_ids`` on CPU (a CUDA check would sync every call)."""
    if position_ids is None or position_ids.is_cuda or position_ids.numel() == 0:
        return
    lo, hi = int(position_ids.min()), int(position_ids.max())
    if lo < 0 or hi >= cos.shape[0]:
        raise ValueError(f"opforge.{name}: position_ids must lie in [0, {cos.shape[0]}), got [{lo}, {hi}]")


# ---------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Geometry:
    """Batch, positions, q and k heads and head dim; the layout facts the
    kernel's strides are computed from (all in the memo key)."""

    backward: bool
    batch: int
    seq: int
    heads_q: int
    heads_k: int
    head_dim: int
    unsqueeze_dim: int
    inplace: bool


def geometry(name: str):
    return functools.partial(_geometry, name == "rope_backward")


def _geometry(backward, q, k, cos, sin, unsqueeze_dim=1, inplace=False, position_ids=None) -> Geometry:
    h = unsqueeze_dim
    return Geometry(backward, q.shape[0], q.shape[3 - h], q.shape[h], k.shape[h], q.shape[-1], h, inplace)


def _bhsd(t: torch.Tensor, unsqueeze_dim: int) -> tuple:
    st = t.stride()
    return st if unsqueeze_dim == 1 else (st[0], st[2], st[1], st[3])


def _table_strides(cos: torch.Tensor) -> tuple:
    if cos.dim() == 2:
        return 0, cos.stride(0), cos.stride(1)
    return (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(1), cos.stride(2)


def _position_strides(position_ids) -> tuple:
    if position_ids is None:
        return 0, 0
    if position_ids.dim() == 1:
        return 0, position_ids.stride(0)
    return (position_ids.stride(0) if position_ids.shape[0] > 1 else 0), position_ids.stride(1)


def _outputs(q, k, inplace):
    return (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------
def token_run(g: Geometry, cfg, q, k, cos, sin, unsqueeze_dim=1, inplace=False, position_ids=None):
    qo, ko = _outputs(q, k, inplace)
    h = unsqueeze_dim
    strides = (*_bhsd(q, h), *_bhsd(k, h), *_bhsd(qo, h), *_bhsd(ko, h), *_table_strides(cos),
               *_position_strides(position_ids))
    K.launch_rope(q, k, qo, ko, cos, sin, position_ids, g.batch, g.seq, g.heads_q, g.heads_k, strides,
                  g.backward, cfg)
    return qo, ko


def token_check(g: Geometry) -> str | None:
    if g.head_dim > MAX_HEAD_DIM:
        return f"head dim {g.head_dim} exceeds {MAX_HEAD_DIM} (a half row is held in registers)"
    return None


def token_default(g: Geometry):
    return K.default_config(g.heads_q, g.heads_k, g.head_dim)


def token_configs(g: Geometry):
    return K.configs(g.heads_q, g.heads_k, g.head_dim)


def bucket(g: Geometry) -> str:
    return f"{bucket_size(g.batch * g.seq)}x{g.heads_q}x{g.heads_k}x{g.head_dim}"


def _reference_run(backward):
    def run(g: Geometry, cfg, *args):
        return REFERENCE["rope_backward" if backward else "rope"](*args)
    return run


def specs(name: str) -> list[Spec]:
    backward = name == "rope_backward"
    return [
        Spec("triton_token", token_run, version=K.VERSION, dtypes=ACCEPTED, check=token_check, configs=token_configs,
             default_config=token_default, bucket=bucket,
             description="one program per token: its cos/sin row loaded once (gathered by position_ids) "
                         "for every q and k head; one read and one write of q and k"),
        Spec("torch_eager", _reference_run(backward), kind="vendor", devices=("cuda",), dtypes=ACCEPTED, bucket=bucket,
             description="torch ops: x * cos + rotate_half(x) * sin (cat, mul, add)"),
        Spec("reference", _reference_run(backward), kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def sample_inputs(name: str, device: torch.device) -> list[tuple]:
    """Both layouts, shared and per-batch tables, gathered positions, each float dtype."""
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)))

    def rand(shape, dt):
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dt).to(device)

    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        B, S, D = 2, 7, 16
        angle = torch.rand((B, S, D // 2), generator=g, dtype=torch.float64) * 6
        emb = torch.cat([angle, angle], -1)
        cos, sin = emb.cos().to(dt).to(device), emb.sin().to(dt).to(device)
        out.append((rand((B, 4, S, D), dt), rand((B, 2, S, D), dt), cos, sin, 1, False))
        out.append((rand((B, S, 4, D), dt), rand((B, S, 4, D), dt), cos[0], sin[0], 2, False))
        table_c, table_s = cos.reshape(-1, D), sin.reshape(-1, D)
        pos = torch.randint(0, B * S, (B, S), generator=g).to(device)
        out.append((rand((B, 3, S, D), dt), rand((B, 1, S, D), dt), table_c, table_s, 1, False, pos))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entries + torch.library ops + autograd
# ---------------------------------------------------------------------------
def _key(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _memo_key(q, k, cos, sin, unsqueeze_dim=1, inplace=False, position_ids=None):
    return (_key(q), _key(k), _key(cos), _key(sin), unsqueeze_dim, inplace, _key(position_ids))


def _dtype_key(q, *rest):
    return f"{q.dtype}".replace("torch.", "")


def _tensors(q, k, cos, sin, unsqueeze_dim=1, inplace=False, position_ids=None):
    return tuple(t for t in (q, k, cos, sin, position_ids) if t is not None)


OPS = registry.register_family(
    NAMES, specs, geometry=geometry, reference=REFERENCE.__getitem__,
    tensors=lambda name: _tensors, memo_key=lambda name: _memo_key, dtype_key=lambda name: _dtype_key,
    validate=lambda name: functools.partial(validate, name),
    samples=lambda name: functools.partial(sample_inputs, name),
    doc=lambda name: "gradient of rope in q and k (the transposed rotation)" if name == "rope_backward"
    else "rotary position embedding of q and k (rotate_half convention)")


def _call(name, q, k, cos, sin, position_ids, unsqueeze_dim, inplace=False):
    return dispatch.call(OPS[name], q, k, cos, sin, unsqueeze_dim, inplace, position_ids)


def _fake(name):
    def fake(q, k, cos, sin, position_ids, unsqueeze_dim):
        validate(name, q, k, cos, sin, unsqueeze_dim, False, position_ids)
        return torch.empty_like(q), torch.empty_like(k)
    return fake


def _setup(ctx, inputs, output):
    q, k, cos, sin, position_ids, unsqueeze_dim = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.unsqueeze_dim = unsqueeze_dim


def _backward(ctx, dq, dk):
    cos, sin, position_ids = ctx.saved_tensors
    dq_in, dk_in = torch.ops.opforge.rope_backward(dq, dk, cos, sin, position_ids, ctx.unsqueeze_dim)
    return dq_in, dk_in, None, None, None, None


def _define_all() -> None:
    schema = "(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? position_ids, int unsqueeze_dim) -> (Tensor, Tensor)"
    define("rope_backward" + schema, functools.partial(_call, "rope_backward"), _fake("rope_backward"))
    define("rope" + schema, functools.partial(_call, "rope"), _fake("rope"), _backward, _setup)

    def inplace_impl(q, k, cos, sin, position_ids, unsqueeze_dim):
        _call("rope", q, k, cos, sin, position_ids, unsqueeze_dim, True)

    def inplace_fake(q, k, cos, sin, position_ids, unsqueeze_dim):
        validate("rope_", q, k, cos, sin, unsqueeze_dim, True, position_ids)

    define("rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor? position_ids, int unsqueeze_dim) -> ()",
           inplace_impl, inplace_fake)


_define_all()


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         position_ids: torch.Tensor | None = None, unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)``, as
    transformers' ``apply_rotary_pos_emb``; differentiable in q and k."""
    validate("rope", q, k, cos, sin, unsqueeze_dim, False, position_ids)
    check_positions("rope", cos, position_ids)
    return torch.ops.opforge.rope(q, k, cos, sin, position_ids, unsqueeze_dim)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          position_ids: torch.Tensor | None = None, unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope` written into ``q`` and ``k`` (no autograd: prefill and decode); returns them."""
    validate("rope_", q, k, cos, sin, unsqueeze_dim, True, position_ids)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        raise ValueError("opforge.rope_: q or k requires grad; the in-place rotation is for inference "
                         "(use opforge.rope for training)")
    check_positions("rope_", cos, position_ids)
    torch.ops.opforge.rope_(q, k, cos, sin, position_ids, unsqueeze_dim)
    return q, k


__all__ = ["rope", "rope_"]
