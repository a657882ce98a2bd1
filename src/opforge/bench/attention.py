"""Bench cases for FlashAttention: the issue's grid (B=4, H=16, D=128, bf16,
S = 2048 ... 16384, causal and not), each as forward, backward alone and
forward+backward, against SDPA's flash and cuDNN backends; plus the peak
memory of forward+backward (``peak_memory_table``).

FLOPs: ``4 * B * H * Sq * Sk * D`` for the forward (two GEMMs), halved for
causal; the backward is 2.5x the forward (five GEMMs, the scores recomputed);
forward+backward 3.5x. Bytes are the fewest the op must move: q, k, v read and
o written once (forward); q, k, v, o, dO read and dq, dk, dv written once
(backward). Attention at these sizes is compute-bound: the roofline is the
tensor-core ceiling.

The backward alone is timed on a retained autograd graph: each side (ours,
each peer) builds its own forward once, on the same inputs, then every timed
call is ``torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)``. The
backward cases check dq against a float64 reference computed in query
chunks (the full float64 score matrix of S = 16384 would not fit).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase
from opforge.ops import attention as A

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
SEQS = (2048, 4096, 8192, 16384)


# ---------------------------------------------------------------------------
# A float64 reference that fits in memory at S = 16384
# ---------------------------------------------------------------------------
def chunked_reference(q, k, v, do, causal: bool, scale: float, want: str, chunk: int = 1024):
    """``want`` = "out" or "dq", in float64, a query chunk of one head at a time.
    Causal is aligned bottom-right (as the op); k/v heads are shared by GQA groups."""
    B, H, Sq, D = q.shape
    G = H // k.shape[1]
    Sk = k.shape[2]
    result = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    with torch.no_grad():
        for b in range(B):
            for h in range(H):
                kh, vh = k[b, h // G].double(), v[b, h // G].double()
                for i0 in range(0, Sq, chunk):
                    qi = q[b, h, i0:i0 + chunk].double()
                    s = (qi @ kh.T) * scale
                    if causal:
                        i = torch.arange(i0, i0 + qi.shape[0], device=q.device)[:, None]
                        j = torch.arange(Sk, device=q.device)[None, :]
                        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
                    p = torch.softmax(s, -1).nan_to_num(0.0)
                    if want == "out":
                        result[b, h, i0:i0 + chunk] = p @ vh
                    else:
                        doi = do[b, h, i0:i0 + chunk].double()
                        dp = doi @ vh.T
                        delta = (p * dp).sum(-1, keepdim=True)
                        result[b, h, i0:i0 + chunk] = ((p * (dp - delta)) @ kh) * scale
    return result


# ---------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------
def _sdpa(backend):
    """SDPA under one backend (None: the math reference)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ctx = (lambda: sdpa_kernel(getattr(SDPBackend, backend))) if backend else contextlib.nullcontext

    def fn(q, k, v, causal):
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=k.shape[1] != q.shape[1])
    return fn


def _ours(q, k, v, causal):
    return A.attention(q, k, v, causal=causal)


def _forward_fn(attn, causal):
    return lambda q, k, v: attn(q, k, v, causal)


def _fwd_bwd_fn(attn, causal):
    def run(q, k, v, do):
        out = attn(q, k, v, causal)
        return torch.autograd.grad(out, (q, k, v), do)[0]
    return run


def _bwd_fn(attn, causal):
    """The backward alone: the forward graph is built on the first call for
    these inputs and kept; each call then runs only the backward."""
    state: dict = {}

    def run(q, k, v, do):
        if state.get("inputs") != (id(q), id(k), id(v)):
            state["out"] = attn(q, k, v, causal)
            state["inputs"] = (id(q), id(k), id(v))
        return torch.autograd.grad(state["out"], (q, k, v), do, retain_graph=True)[0]
    return run


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------
def attention_case(B: int, H: int, S: int, D: int, dtype, *, causal: bool, mode: str = "fwd", Hk: int | None = None,
                   graph: bool = False, peers: bool = True, math_peer: bool = False, variant: str | None = None,
                   label: str | None = None) -> BenchCase:
    """``mode``: "fwd", "bwd" (backward alone) or "fwd+bwd"; ``variant`` forces
    the registry op's variant (crossover sweeps; "fwd" and "bwd" only)."""
    Hk = Hk or H
    es = torch.empty((), dtype=dtype).element_size()
    scale = D ** -0.5
    fwd_flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    qo = B * H * S * D * es
    kv = 2 * B * Hk * S * D * es
    flops, nbytes = {"fwd": (fwd_flops, 2 * qo + kv), "bwd": (2.5 * fwd_flops, 5 * qo + 2 * kv),
                     "fwd+bwd": (3.5 * fwd_flops, 3 * qo + 2 * kv)}[mode]
    grad = mode != "fwd"
    wrap = {"fwd": _forward_fn, "bwd": _bwd_fn, "fwd+bwd": _fwd_bwd_fn}[mode]

    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(S + H + D)

        def r(shape):
            return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(dev)

        q, k, v = r((B, H, S, D)), r((B, Hk, S, D)), r((B, Hk, S, D))
        if not grad:
            return q, k, v
        return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), r((B, H, S, D))

    def reference(q, k, v, do=None):
        return chunked_reference(q, k, v, do, causal, scale, "dq" if grad else "out")

    window = (-1, 0) if causal else (-1, -1)

    def op_args(q, k, v, do=None):
        fwd = (q.detach(), k.detach(), v.detach(), scale, *window, None, None, -1, -1)
        if not grad or mode == "fwd+bwd":
            return fwd
        out, lse = A.OP.reference(*fwd) if q.device.type == "cpu" else torch.ops.opforge.attention(*fwd)
        return (do, *fwd[:3], out, lse, *fwd[3:])

    peer_fns = {}
    if peers:
        cuda = torch.cuda.is_available()
        if cuda:
            peer_fns["sdpa flash"] = wrap(_sdpa("FLASH_ATTENTION"), causal)
            peer_fns["sdpa cudnn"] = wrap(_sdpa("CUDNN_ATTENTION"), causal)
        if math_peer or not cuda:
            peer_fns["torch eager (math)"] = wrap(_sdpa(None), causal)
    op = "attention_backward" if mode == "bwd" else "attention"
    what = f"{B}x{H}x{S}x{D}" + (f" kv{Hk}" if Hk != H else "") + (" causal" if causal else "") + f" {mode}"
    return BenchCase(op=op, label=label or what, dtype=dtype, make_args=make, run=wrap(_ours, causal),
                     reference=reference, flops=flops, nbytes=float(nbytes), peers=peer_fns, graph=graph,
                     op_args=op_args, variant=variant)


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The issue's grid: B=4, H=16, D=128, bf16, S 2048..16384, causal and not,
    forward / backward / forward+backward; one small graph-timed forward."""
    if quick or device.type != "cuda":
        return [
            attention_case(1, 2, 64, 32, F32, causal=False, math_peer=True),
            attention_case(1, 2, 48, 32, F16, causal=True, math_peer=True),
            attention_case(1, 2, 48, 32, F32, causal=True, mode="bwd", math_peer=True),
            attention_case(1, 4, 40, 16, F32, causal=True, mode="fwd+bwd", Hk=2, math_peer=True),
        ]
    out = []
    for S in SEQS:
        for causal in (False, True):
            for mode in ("fwd", "bwd", "fwd+bwd"):
                out.append(attention_case(4, 16, S, 128, BF16, causal=causal, mode=mode))
    out.append(attention_case(4, 16, 4096, 64, BF16, causal=True))
    out.append(attention_case(2, 16, 4096, 256, BF16, causal=True))
    out.append(attention_case(4, 32, 4096, 128, BF16, causal=True, Hk=8))
    out.append(attention_case(1, 16, 512, 128, BF16, causal=True, graph=True, math_peer=True))
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """TMA vs pointer kernels (and SDPA's flash kernel through the registry's
    vendor variant) over sequence length, causal forward and backward."""
    gpu = device.type == "cuda" and not quick
    seqs = (512, 1024, 2048, 4096, 8192, 16384) if gpu else (32,)
    B, H, D, dtype = (4, 16, 128, BF16) if gpu else (1, 2, 16, F32)
    out = []
    for S in seqs:
        for mode in ("fwd", "bwd"):
            variants = ["triton_flash_tma", "triton_flash"]
            if device.type == "cuda" and mode == "fwd" and dtype != F32:  # SDPA's flash kernel is 16-bit only
                variants.append("torch_sdpa")
            for v in variants:
                out.append(attention_case(B, H, S, D, dtype, causal=True, mode=mode, variant=v, peers=False,
                                          label=f"{B}x{H}x{S}x{D} causal {mode}"))
    return out


# ---------------------------------------------------------------------------
# Accuracy against SDPA (the issue: no worse than SDPA's own error by more than 1.5x)
# ---------------------------------------------------------------------------
def accuracy_table(device: torch.device, shapes=((2, 8, 1024, 128), (1, 8, 4096, 64)),
                   logit_scales=(1.0, 8.0)) -> list[dict]:
    """Relative errors (vs float64) of ours and SDPA flash on the same bf16
    inputs: output and dq, dk, dv; ``logit_scales`` > 1 gives large logits.
    Rows: ``{shape, causal, scale, tensor, ours, sdpa_flash, ratio}``."""
    from opforge.bench.case import rel_err

    if device.type != "cuda":
        return []
    flash = _sdpa("FLASH_ATTENTION")
    rows = []
    for B, H, S, D in shapes:
        for mag in logit_scales:
            for causal in (False, True):
                g = torch.Generator(device="cpu").manual_seed(S + D)
                q, k, v, do = (torch.randn((B, H, S, D), generator=g).mul_(mag if i < 2 else 1.0)
                               .to(BF16).to(device) for i in range(4))
                results = {}
                for name, fn in (("ours", _ours), ("sdpa_flash", flash), ("ref", None)):
                    leaves = [t.detach().double() if name == "ref" else t.detach() for t in (q, k, v)]
                    leaves = [t.requires_grad_() for t in leaves]
                    if name == "ref":
                        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    else:
                        out = fn(*leaves, causal)
                    grads = torch.autograd.grad(out, leaves, do.to(out.dtype))
                    results[name] = (out.detach(), *grads)
                for i, what in enumerate(("out", "dq", "dk", "dv")):
                    ours = rel_err(results["ours"][i], results["ref"][i])
                    theirs = rel_err(results["sdpa_flash"][i], results["ref"][i])
                    rows.append({"shape": f"{B}x{H}x{S}x{D}", "causal": causal, "logit_scale": mag, "tensor": what,
                                 "ours": ours, "sdpa_flash": theirs, "ratio": ours / theirs if theirs else None})
    return rows


# ---------------------------------------------------------------------------
# Peak memory of forward + backward
# ---------------------------------------------------------------------------
def _peak_mib(fn, q, k, v, do) -> float:
    """Peak memory above the inputs while ``fn`` runs forward + backward, after one untimed
    forward + backward: a first call may autotune (trial outputs, the timer's cache-flush
    buffer), which is not what a training step holds (the fourth session's table showed ours
    130 MiB over SDPA at S = 2048 only, the first shape measured)."""
    torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out, grads
    return peak / 2**20


def peak_memory_table(device: torch.device, seqs=SEQS, B: int = 4, H: int = 16, D: int = 128) -> list[dict]:
    """Peak memory (MiB above the inputs) of forward+backward: ours vs SDPA flash.

    Both sides keep O(S) state (output, log-sum-exp) and write dq, dk, dv; the
    goal is ours within 10 % of SDPA flash. Rows: ``{shape, causal, ours_mib,
    sdpa_flash_mib, ratio}``.
    """
    if device.type != "cuda":
        return []
    flash = _sdpa("FLASH_ATTENTION")
    rows = []
    for S in seqs:
        for causal in (False, True):
            q, k, v, do = attention_case(B, H, S, D, BF16, causal=causal, mode="fwd+bwd").make_args(device)
            ours = _peak_mib(lambda a, b, c: _ours(a, b, c, causal), q, k, v, do)
            theirs = _peak_mib(lambda a, b, c: flash(a, b, c, causal), q, k, v, do)
            rows.append({"shape": f"{B}x{H}x{S}x{D}", "causal": causal, "ours_mib": round(ours, 1),
                         "sdpa_flash_mib": round(theirs, 1), "ratio": round(ours / theirs, 3) if theirs else None})
            del q, k, v, do
    return rows
