"""Attention decode: ``opforge.attention_decode(q, k_cache, v_cache, seqlens,
block_table=None, *, scale=None, return_lse=False)``.

A few query tokens (decode, speculative decode) against a long KV cache, in
the conventions of flash_attn's ``flash_attn_with_kvcache``:

* ``q``: ``[B, Sq, Hq, D]``, fp16, bf16, fp32 or fp64 (Triton takes the first
  three; fp64 runs in plain torch). ``Sq`` is small (1 to 16 is the design
  range; any ``Sq >= 0`` works). The ``Sq`` queries are the LAST ``Sq``
  positions of each sequence and attend causally: query ``i`` sees keys
  ``[0, seqlen - Sq + i]``.
* ``k_cache``, ``v_cache`` (same shape and dtype as each other and as q):
  contiguous ``[B, max_ctx, H_kv, D]`` when ``block_table`` is None, else a
  paged cache ``[num_blocks, block_size, H_kv, D]`` with ``block_table``
  int32 ``[B, max_blocks]``: token ``n`` of sequence ``b`` is in physical
  block ``block_table[b, n // block_size]`` at slot ``n % block_size`` (as
  vLLM and FlashAttention). Any block size (powers of two 16...256 are the
  ones tuned); any strides (no copy is made).
* ``seqlens``: int32 ``[B]``, the cached tokens of each sequence including the
  ``Sq`` new ones, ``0 <= seqlens[b] <= capacity`` (``max_ctx``, or
  ``max_blocks * block_size``). A sequence of length 0 (a padding slot) and
  any query that sees no key give output 0 and LSE ``-inf``. Cache slots past
  ``seqlens[b]`` and table entries past its last block are never read, so
  they may hold anything.
* GQA / MQA: ``Hq % H_kv == 0``; query head ``h`` uses KV head
  ``h // (Hq // H_kv)``.
* ``scale``: default ``1 / sqrt(D)``. ``return_lse``: also return the LSE
  ``[B, Hq, Sq]`` (fp32; fp64 for fp64 input) of the scaled scores, natural log.
* Output ``[B, Sq, Hq, D]`` dense, q's dtype. NaN or Inf in a live key or
  value make the rows that see it NaN, as torch's softmax does.

Values are checked for CPU tensors (``seqlens`` within ``[0, capacity]``,
live ``block_table`` entries within ``[0, num_blocks)``). On CUDA a check
would synchronise with the device on every decode step, so they are not:
the kernel clamps them, and bad values give unspecified numbers, never a
memory fault.

Inference only: the op is not differentiable (backward raises a clear error).

Registry op ``attention_decode`` with args ``(q, k_cache, v_cache, seqlens,
scale, return_lse, block_table=None)`` -> ``(out, lse)`` (``lse`` is an empty
tensor when ``return_lse`` is False; the optional tensor comes last because
selftest drops ``None`` arguments). Variants, in dispatch order:
``triton_split_kv`` (split-KV flash decoding over either cache layout; see
``kernels/attention_decode.py``), ``torch_sdpa`` (vendor, CUDA: the live cache
gathered into a dense one, then ``scaled_dot_product_attention`` with
``enable_gqa``; a peer and fallback, not fast for paged caches) and
``reference`` (plain torch, float64-capable).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from opforge.kernels import attention_decode as K
from opforge.ops.checks import check_tensor
from opforge.ops.library import define, direct_ok
from opforge.runtime import device as devmod
from opforge.runtime import dispatch, launch, registry
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

NAME = "attention_decode"
WHERE = f"opforge.{NAME}"
TRITON_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
FLOATS = TRITON_DTYPES | {torch.float64}


# ---------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------
def capacity(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """Tokens a sequence can hold: ``max_ctx``, or ``max_blocks * block_size``."""
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _no_lse(q: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=_lse_dtype(q), device=q.device)


# ---------------------------------------------------------------------------
# Reference semantics (plain torch, float64-capable)
# ---------------------------------------------------------------------------
def dense_cache(cache: torch.Tensor, seqlens: torch.Tensor, block_table: torch.Tensor | None) -> torch.Tensor:
    """The live cache as a dense ``[B, capacity, H_kv, D]`` copy, zero past each
    sequence's length (unused slots and table entries are never looked at)."""
    if block_table is None:
        dense = cache
    else:
        B, max_blocks = block_table.shape
        page = cache.shape[1]
        if cache.shape[0] == 0 or max_blocks == 0:
            dense = cache.new_zeros((B, max_blocks * page) + tuple(cache.shape[2:]))
        else:
            live_blocks = (seqlens.long() + page - 1) // page
            used = torch.arange(max_blocks, device=cache.device)[None, :] < live_blocks[:, None]
            index = torch.where(used, block_table.long(), 0)
            dense = cache[index].reshape((B, max_blocks * page) + tuple(cache.shape[2:]))
    live = torch.arange(dense.shape[1], device=cache.device)[None, :] < seqlens.long()[:, None]
    return dense.masked_fill(~live[:, :, None, None], 0)


def _visible(seqlens: torch.Tensor, Sq: int, cap: int) -> torch.Tensor:
    """``[B, Sq, cap]``: query ``i`` sees key ``n`` when ``n <= seqlen - Sq + i``."""
    i = torch.arange(Sq, device=seqlens.device)
    n = torch.arange(cap, device=seqlens.device)
    last = seqlens.long()[:, None] - Sq + i[None, :]
    return n[None, None, :] <= last[:, :, None]


def _grouped_scores(q, k, seqlens, scale, compute):
    """Masked scaled scores ``[B, H_kv, G, Sq, cap]`` in ``compute`` dtype."""
    B, Sq, Hq, D = q.shape
    H = k.shape[2]
    qg = q.to(compute).permute(0, 2, 1, 3).reshape(B, H, Hq // H * Sq, D)
    s = torch.matmul(qg, k.to(compute).permute(0, 2, 3, 1)) * scale
    s = s.view(B, H, Hq // H, Sq, k.shape[1])
    return s.masked_fill(~_visible(seqlens, Sq, k.shape[1])[:, None, None], float("-inf"))


def _softmax_parts(s):
    """Unnormalised weights, their sum and the LSE; rows with no key: 0, 0, -inf."""
    mx = s.amax(-1, keepdim=True) if s.shape[-1] else torch.full_like(s[..., :1], float("-inf"))
    sub = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
    e = torch.exp(s - sub)
    total = e.sum(-1, keepdim=True)
    lse = torch.where(total == 0, torch.full_like(total, float("-inf")), sub + torch.log(total))
    return e, total, lse.squeeze(-1)


def reference(q, k_cache, v_cache, seqlens, scale, return_lse=False, block_table=None):
    """Plain torch, in fp32 (fp64 for fp64 input): the dense live cache, masked
    scores per KV-head group, softmax with empty rows giving 0 and -inf."""
    B, Sq, Hq, D = q.shape
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    k = dense_cache(k_cache, seqlens, block_table)
    v = dense_cache(v_cache, seqlens, block_table)
    H = k.shape[2]
    e, total, lse = _softmax_parts(_grouped_scores(q, k, seqlens, scale, compute))
    o = torch.matmul(e.flatten(2, 3), v.to(compute).permute(0, 2, 1, 3)).view(e.shape[:-1] + (D,))
    o = o / torch.where(total == 0, torch.ones_like(total), total)
    out = o.reshape(B, Hq, Sq, D).permute(0, 2, 1, 3).to(q.dtype).contiguous()
    if not return_lse:
        return out, _no_lse(q)
    return out, lse.reshape(B, Hq, Sq).to(_lse_dtype(q)).contiguous()


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def validate(q, k_cache, v_cache, seqlens, scale, return_lse=False, block_table=None) -> None:
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(WHERE, arg, t)
        if t.dim() != 4:
            layout = "(batch, seqlen_q, heads, head_dim)" if arg == "q" else (
                "(batch, max_ctx, kv_heads, head_dim) or paged (num_blocks, block_size, kv_heads, head_dim)")
            raise ValueError(f"{WHERE}: {arg} must have 4 dims {layout}, got shape {tuple(t.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"{WHERE}: q, k_cache and v_cache must have one dtype, got "
                        f"{q.dtype}, {k_cache.dtype} and {v_cache.dtype}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"{WHERE}: v_cache has shape {tuple(v_cache.shape)} but k_cache has "
                         f"{tuple(k_cache.shape)}; they must match")
    B, Sq, Hq, D = q.shape
    H_kv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"{WHERE}: head dim of k_cache ({k_cache.shape[3]}) does not match q's ({D})")
    if D == 0:
        raise ValueError(f"{WHERE}: head dim must be at least 1, got q of shape {tuple(q.shape)}")
    if H_kv == 0:
        raise ValueError(f"{WHERE}: k_cache has 0 KV heads (shape {tuple(k_cache.shape)})")
    if Hq % H_kv:
        raise ValueError(f"{WHERE}: q has {Hq} heads, not a multiple of the {H_kv} KV heads of k_cache "
                         f"(GQA needs Hq % H_kv == 0)")
    check_tensor(WHERE, "seqlens", seqlens, floating=False)
    if seqlens.dtype != torch.int32:
        raise TypeError(f"{WHERE}: seqlens must be int32, got {seqlens.dtype}")
    if tuple(seqlens.shape) != (B,):
        raise ValueError(f"{WHERE}: seqlens must have shape ({B},) (one length per sequence of q), "
                         f"got {tuple(seqlens.shape)}")
    tensors = [("k_cache", k_cache), ("v_cache", v_cache), ("seqlens", seqlens)]
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"{WHERE}: k_cache has batch {k_cache.shape[0]} but q has {B} (a contiguous cache "
                             f"is (batch, max_ctx, kv_heads, head_dim); pass block_table for a paged cache)")
    else:
        check_tensor(WHERE, "block_table", block_table, floating=False)
        if block_table.dtype != torch.int32:
            raise TypeError(f"{WHERE}: block_table must be int32, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"{WHERE}: block_table must have shape ({B}, max_blocks), got "
                             f"{tuple(block_table.shape)}")
        if k_cache.shape[1] == 0:
            raise ValueError(f"{WHERE}: a paged cache needs block_size >= 1, got k_cache of shape "
                             f"{tuple(k_cache.shape)}")
        tensors.append(("block_table", block_table))
    for arg, t in tensors:
        if t.device != q.device:
            raise ValueError(f"{WHERE}: {arg} is on {t.device} but q is on {q.device}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{WHERE}: scale must be a float, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"{WHERE}: scale must be finite, got {scale}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"{WHERE}: return_lse must be a bool, got {type(return_lse).__name__}")


def check_values(k_cache, seqlens, block_table) -> None:
    """Lengths and live table entries in range, for CPU tensors (on CUDA this
    would synchronise every call; the kernel clamps instead)."""
    if seqlens.device.type != "cpu" or seqlens.numel() == 0:
        return
    cap = capacity(k_cache, block_table)
    lengths = seqlens.long()
    low, high = int(lengths.argmin()), int(lengths.argmax())
    if int(lengths[low]) < 0:
        raise ValueError(f"{WHERE}: seqlens[{low}] = {int(lengths[low])} is negative")
    if int(lengths[high]) > cap:
        what = ("max_ctx of k_cache" if block_table is None
                else f"{block_table.shape[1]} blocks of block_table x block_size {k_cache.shape[1]}")
        raise ValueError(f"{WHERE}: seqlens[{high}] = {int(lengths[high])} exceeds the cache capacity {cap} "
                         f"({what})")
    if block_table is not None and block_table.numel():
        page = k_cache.shape[1]
        used = torch.arange(block_table.shape[1])[None, :] < ((lengths + page - 1) // page)[:, None]
        bad = used & ((block_table < 0) | (block_table >= k_cache.shape[0]))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"{WHERE}: block_table[{b}, {j}] = {int(block_table[b, j])} is not a block of "
                             f"k_cache (expected 0 <= block < {k_cache.shape[0]})")


# ---------------------------------------------------------------------------
# Variants: geometry, runners, checks and configs, then the specs
# ---------------------------------------------------------------------------
def _empty_result(q, return_lse):
    """Output and LSE of a call with no key anywhere (or no row): 0 and -inf."""
    B, Sq, Hq, _ = q.shape
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = (torch.full((B, Hq, Sq), float("-inf"), dtype=_lse_dtype(q), device=q.device)
           if return_lse else _no_lse(q))
    return out, lse


def _sm_count(q) -> int:
    return devmod.device_info(q.device).sm_count if q.device.type == "cuda" else 132


class Geometry(NamedTuple):
    """The decode problem's sizes (``capacity``: tokens a sequence can hold),
    the element size, the device's SM count and the cache layout (``c``
    contiguous, ``p<block_size>`` paged); the memo key holds all of it."""

    B: int
    Hq: int
    H_kv: int
    Sq: int
    D: int
    capacity: int
    itemsize: int
    sms: int
    layout: str


def geometry(q, k_cache, v_cache, seqlens, scale, return_lse, block_table=None) -> Geometry:
    B, Sq, Hq, D = q.shape
    return Geometry(B, Hq, k_cache.shape[2], Sq, D, capacity(k_cache, block_table), q.element_size(), _sm_count(q),
                    "c" if block_table is None else f"p{k_cache.shape[1]}")


def triton_run(g: Geometry, cfg, q, k_cache, v_cache, seqlens, scale, return_lse, block_table=None):
    check_values(k_cache, seqlens, block_table)
    B, Sq, Hq, _ = q.shape
    if q.numel() == 0 or k_cache.numel() == 0 or capacity(k_cache, block_table) == 0:
        return _empty_result(q, return_lse)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if return_lse else None
    K.launch_decode(q, k_cache, v_cache, seqlens, block_table, out, lse, float(scale), cfg)
    return out, (lse if return_lse else _no_lse(q))


def _bind_triton(g: Geometry, cfg, args):
    """``triton_run`` for one decision: the grids, scalar arguments and
    constexprs of both kernels (``K.decode_plan``) and their pre-bound
    launchers fixed, so a call allocates its outputs and partials and makes
    two launches. The partials stay per call (a buffer kept across calls
    would be shared by calls in flight on other streams or in a CUDA graph)."""
    q, k_cache, v_cache, seqlens, scale, return_lse = args[:6]
    block_table = args[6] if len(args) > 6 else None
    if q.numel() == 0 or k_cache.numel() == 0 or capacity(k_cache, block_table) == 0:
        return None
    plan = K.decode_plan(q, k_cache, v_cache, seqlens, block_table, return_lse, float(scale), cfg)
    split_go = launch.prepare(K.split_kv_kernel, plan.split_grid, plan.split_scalars, **plan.split_kw)
    combine_go = launch.prepare(K.combine_kernel, plan.combine_grid, plan.combine_scalars, **plan.combine_kw)
    shape, dtype, device = q.shape, q.dtype, q.device
    lse_shape = (g.B, g.Hq, g.Sq)
    n_po, n_plse = plan.partials * g.D, plan.partials
    on_cpu, paged, empty, f32 = device.type == "cpu", block_table is not None, torch.empty, torch.float32
    no_lse = empty(0, dtype=f32, device=device)  # return_lse=False: one empty placeholder, not one a call

    def run(q, k_cache, v_cache, seqlens, scale, return_lse, block_table=None):
        if on_cpu:
            check_values(k_cache, seqlens, block_table)
        out = empty(shape, dtype=dtype, device=device)
        lse = empty(lse_shape, dtype=f32, device=device) if return_lse else out
        bt = block_table if paged else seqlens
        if n_plse:
            po, plse = empty(n_po, dtype=f32, device=device), empty(n_plse, dtype=f32, device=device)
            split_go(q, k_cache, v_cache, seqlens, bt, out, lse, po, plse)
            combine_go(po, plse, out, lse)
        else:
            split_go(q, k_cache, v_cache, seqlens, bt, out, lse, out, out)
        return out, (lse if return_lse else no_lse)
    return run


triton_run.bind = _bind_triton


def sdpa_run(g: Geometry, cfg, q, k_cache, v_cache, seqlens, scale, return_lse, block_table=None):
    check_values(k_cache, seqlens, block_table)
    B, Sq, Hq, D = q.shape
    cap = capacity(k_cache, block_table)
    if q.numel() == 0 or cap == 0 or k_cache.numel() == 0:
        return _empty_result(q, return_lse)
    k = dense_cache(k_cache, seqlens, block_table)
    v = dense_cache(v_cache, seqlens, block_table)
    visible = _visible(seqlens, Sq, cap)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=visible[:, None], scale=scale, enable_gqa=Hq != k.shape[2])
    seen = visible.any(-1)  # [B, Sq]: queries that see a key (others: 0, as documented)
    out = torch.where(seen[:, :, None, None], out.transpose(1, 2), 0).contiguous()
    if not return_lse:
        return out, _no_lse(q)
    _, _, lse = _softmax_parts(_grouped_scores(q, k, seqlens, scale, _lse_dtype(q)))
    return out, lse.reshape(B, Hq, Sq).contiguous()


def reference_run(g: Geometry, cfg, *args):
    check_values(args[1], args[3], args[6] if len(args) > 6 else None)
    return reference(*args)


def triton_check(g: Geometry) -> str | None:
    if g.D > K.MAX_HEAD_DIM:
        return f"head dim {g.D} exceeds {K.MAX_HEAD_DIM}"
    return None


def _sizes(g: Geometry) -> tuple:
    return (g.B, g.Hq, g.H_kv, g.Sq, g.D, g.capacity, g.itemsize, g.sms)


def triton_default(g: Geometry):
    return K.default_config(*_sizes(g))


def triton_configs(g: Geometry):
    return K.configs(*_sizes(g))


def bucket(g: Geometry) -> str:
    return (f"b{bucket_size(g.B)}:g{g.Hq // g.H_kv}x{g.Sq}:kv{g.H_kv}:d{g.D}:n{bucket_size(g.capacity)}"
            f":{g.layout}")


def specs(name: str) -> list[Spec]:
    """The variants of ``attention_decode``, in dispatch order."""
    return [
        Spec("triton_split_kv", triton_run, version=K.SPLIT_KV_VERSION, dtypes=TRITON_DTYPES, check=triton_check,
             configs=triton_configs, default_config=triton_default, bucket=bucket,
             description="split-KV flash decoding: one program per (sequence, KV head, split) holds every "
                         "query row of the GQA group, reads each K/V tile once (paged: block-table "
                         "lookup per tile), partials merged by a combine kernel"),
        Spec("torch_sdpa", sdpa_run, kind="vendor", devices=("cuda",), dtypes=FLOATS, bucket=bucket,
             description="the live cache gathered dense, then torch's scaled_dot_product_attention "
                         "(enable_gqa, causal mask over the new tokens)"),
        Spec("reference", reference_run, kind="reference", devices=("cpu", "cuda"),
             description="plain torch (the oracle and the CPU fallback)"),
    ]


# ---------------------------------------------------------------------------
# Selftest inputs
# ---------------------------------------------------------------------------
def make_inputs(B, Sq, Hq, H_kv, D, cap, dtype, device, *, page=None, lengths=None, seed=0):
    """Random decode inputs (registry argument order, ``scale`` ``1/sqrt(D)``,
    ``return_lse`` True). ``page``: a paged cache of that block size with the
    physical blocks shuffled and a spare block; unused slots hold NaN, which
    must never reach the output."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=g).to(dtype)

    if lengths is None:
        lengths = torch.randint(max(Sq, 1), cap + 1, (B,), generator=g).tolist()
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    q = rand(B, Sq, Hq, D)
    max_blocks = cap if page is None else -(-cap // page)
    width = max_blocks * (page or 1)
    k, v = rand(B, width, H_kv, D), rand(B, width, H_kv, D)
    dead = torch.arange(width)[None, :] >= seqlens[:, None]
    k[dead], v[dead] = float("nan"), float("nan")
    table = None
    if page is not None:
        num_blocks = B * max_blocks + 1
        perm = torch.randperm(num_blocks, generator=g)[: B * max_blocks].view(B, max_blocks)
        kp, vp = k.new_empty(num_blocks, page, H_kv, D), v.new_empty(num_blocks, page, H_kv, D)
        spare = torch.ones(num_blocks, dtype=torch.bool)
        spare[perm.flatten()] = False
        kp[spare], vp[spare] = rand(1, page, H_kv, D), rand(1, page, H_kv, D)
        kp[perm] = k.view(B, max_blocks, page, H_kv, D)
        vp[perm] = v.view(B, max_blocks, page, H_kv, D)
        k, v = kp, vp
        # table entries past a sequence's last block: -1 (never read)
        live = torch.arange(max_blocks)[None, :] < ((seqlens.long() + page - 1) // page)[:, None]
        table = torch.where(live, perm, -1).to(torch.int32).to(device)
    return (q.to(device), k.to(device), v.to(device), seqlens.to(device), D ** -0.5, True, table)


def sample_inputs(device: torch.device) -> list[tuple]:
    """Every variant and dtype: contiguous and paged (pages smaller and larger
    than a tile), one split and several, GQA 4 / MHA / MQA, Sq 1 and 4, head
    dims 64, 128 and 256, lengths from 0 to a few thousand."""
    out = []
    for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32, torch.float64)):
        out.append(make_inputs(2, 1, 32, 8, 128, 1200, dt, device, seed=i))
        out.append(make_inputs(3, 1, 32, 8, 128, 1024, dt, device, page=16, lengths=[1024, 1, 777], seed=i))
        out.append(make_inputs(2, 4, 8, 2, 64, 1500, dt, device, page=256, seed=i))
    out.append(make_inputs(1, 1, 32, 8, 128, 8192, torch.bfloat16, device, seed=6))  # many splits
    out.append(make_inputs(40, 1, 32, 8, 128, 300, torch.bfloat16, device, seed=7))  # one split
    out.append(make_inputs(4, 1, 16, 16, 64, 700, torch.float16, device, page=32, seed=8))  # MHA
    out.append(make_inputs(2, 2, 16, 1, 256, 900, torch.bfloat16, device, seed=9))  # MQA, D = 256
    out.append(make_inputs(3, 1, 8, 2, 128, 512, torch.bfloat16, device, page=64, lengths=[0, 512, 3], seed=10))
    q, k, v, sl, scale, _, table = make_inputs(2, 1, 32, 8, 128, 1000, torch.bfloat16, device, seed=11)
    out.append((q, k, v, sl, scale, False, table))
    return out


# ---------------------------------------------------------------------------
# Registration: registry entry + torch.library op (inference only)
# ---------------------------------------------------------------------------
def _memo_key(q, k_cache, v_cache, seqlens, scale, return_lse, block_table=None):
    # A CUDA device as its index: a torch.device costs more to build and hash (inline: a call a tensor shows).
    table = None if block_table is None else (
        block_table.dtype, block_table.shape, block_table.stride(),
        block_table.get_device() if block_table.is_cuda else block_table.device)
    return (q.dtype, q.shape, q.stride(), q.get_device() if q.is_cuda else q.device,
            k_cache.dtype, k_cache.shape, k_cache.stride(), k_cache.get_device() if k_cache.is_cuda else k_cache.device,
            v_cache.dtype, v_cache.shape, v_cache.stride(), v_cache.get_device() if v_cache.is_cuda else v_cache.device,
            seqlens.dtype, seqlens.shape, seqlens.stride(), seqlens.get_device() if seqlens.is_cuda else seqlens.device,
            table, scale, return_lse)


def _tensors(q, k_cache, v_cache, *rest):
    return (q, k_cache, v_cache)


def _dtype_key(q, *rest):
    return f"{q.dtype}".replace("torch.", "")


OP = registry.register_op(
    NAME, specs(NAME), geometry=geometry,
    reference=reference,
    tensors=_tensors,
    memo_key=_memo_key,
    dtype_key=_dtype_key,
    validate=validate,
    samples=sample_inputs,
    doc="decode attention of a few query tokens over a contiguous or paged KV cache (split-KV)",
)


def _impl(q, k_cache, v_cache, seqlens, scale, return_lse, block_table):
    return dispatch.call(OP, q, k_cache, v_cache, seqlens, scale, return_lse, block_table)


def _fake(q, k_cache, v_cache, seqlens, scale, return_lse, block_table):
    validate(q, k_cache, v_cache, seqlens, scale, return_lse, block_table)
    B, Sq, Hq, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((B, Hq, Sq) if return_lse else (0,), dtype=_lse_dtype(q))
    return out, lse


def _setup(ctx, inputs, output):
    pass


def _backward(ctx, grad_out, grad_lse):
    raise RuntimeError(f"{WHERE} is inference only and not differentiable; run it under torch.no_grad() "
                       f"(or detach q and the caches)")


define("attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens, float scale, "
       "bool return_lse, Tensor? block_table) -> (Tensor, Tensor)", _impl, _fake, _backward, _setup)

_PACKET = torch.ops.opforge.attention_decode.default
_Tensor = torch.Tensor


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor,
                     block_table: torch.Tensor | None = None, *, scale: float | None = None,
                     return_lse: bool = False):
    """Decode attention of ``q [B, Sq, Hq, D]`` over a KV cache (contiguous
    ``[B, max_ctx, H_kv, D]``, or paged ``[num_blocks, block_size, H_kv, D]``
    with an int32 ``block_table [B, max_blocks]``); ``seqlens`` int32 ``[B]``
    counts each sequence's tokens including the ``Sq`` new ones, which attend
    causally. Returns ``out [B, Sq, Hq, D]``, and ``lse [B, Hq, Sq]`` (fp32)
    with ``return_lse=True``. See the module docstring for the full contract."""
    if scale is None:
        scale = q.shape[-1] ** -0.5 if isinstance(q, _Tensor) and q.dim() == 4 and q.shape[-1] > 0 else 1.0
    elif type(scale) is int:
        scale = float(scale)
    if (direct_ok(q, k_cache) and type(v_cache) is _Tensor and not v_cache.requires_grad
            and type(seqlens) is _Tensor and (block_table is None or type(block_table) is _Tensor)
            and type(scale) is float and type(return_lse) is bool):
        out, lse = dispatch.call(OP, q, k_cache, v_cache, seqlens, scale, return_lse, block_table)
    else:
        validate(q, k_cache, v_cache, seqlens, scale, return_lse, block_table)
        out, lse = _PACKET(q, k_cache, v_cache, seqlens, scale, return_lse, block_table)
    return (out, lse) if return_lse else out


__all__ = ["attention_decode"]
