"""Bench cases for cross-entropy: forward, and forward + backward, on LM-head
shapes (32000 and 128256 classes), with and without label smoothing, 10 % of
targets ignored; one small graph-timed shape.

Bytes are the fewest the op must move. Forward: the logits read once, the
targets read once, one scalar written. Forward + backward: the logits read
once by each pass and the gradient written once (``3 * rows * cols``
elements), plus the targets twice. FLOPs: about 4 per element forward (max,
subtract, exp, sum) and 4 more backward (subtract, exp, scale, one-hot).

The fwd+bwd cases time one ``loss -> grad`` step on each side: opforge's
``cross_entropy`` and ``F.cross_entropy`` (eager, and under ``torch.compile``,
whose backward is compiled too), each returning the logits' gradient. On
opforge's side that step is the fused pass (``cross_entropy_fused``: the
gradient written during the forward, the backward hands it back), so its
variant is the one reported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import cross_entropy as CE

FLOPS_FORWARD = 4
FLOPS_BACKWARD = 4
IGNORED_FRACTION = 0.1


def _make(shape, dtype, grad: bool):
    rows, cols = shape

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).mul_(2).to(dtype)
        t = torch.randint(0, cols, (rows,), device=dev)
        t = torch.where(torch.rand(rows, device=dev) < IGNORED_FRACTION, torch.full_like(t, -100), t)
        if grad:
            x.requires_grad_()
        return (x, t)

    return make


def _grad_step(loss_fn):
    """One training step of the loss: forward, then the logits' gradient."""
    def step(x, t):
        return torch.autograd.grad(loss_fn(x, t), x)[0]
    return step


def ce_case(shape, dtype, *, smoothing: float = 0.0, backward: bool = False, graph: bool = False,
            variant=None, peers: bool = True, compile_peer: bool = True, label=None) -> BenchCase:
    rows, cols = shape
    es = torch.empty((), dtype=dtype).element_size()

    def ours(x, t):
        return CE.cross_entropy(x, t, label_smoothing=smoothing)

    def theirs(x, t):
        return F.cross_entropy(x, t, label_smoothing=smoothing)

    peer_fns = {}
    if backward:
        run, reference = _grad_step(ours), _grad_step(theirs)
        if peers:
            peer_fns["torch eager"] = _grad_step(theirs)
            if compile_peer:
                peer_fns["torch.compile"] = _grad_step(compiled_peer(theirs))
        nbytes = 3 * rows * cols * es + 2 * rows * 8
        flops = (FLOPS_FORWARD + FLOPS_BACKWARD) * rows * cols
    else:
        run, reference = ours, theirs
        if peers:
            peer_fns["torch eager"] = theirs
            if compile_peer:
                peer_fns["torch.compile"] = compiled_peer(theirs)
        nbytes = rows * cols * es + rows * 8 + es
        flops = FLOPS_FORWARD * rows * cols
    # fwd+bwd of a mean loss runs as one fused pass (``cross_entropy_fused``).
    name = "cross_entropy_fused" if backward else "cross_entropy_forward"
    tag = (" fwd+bwd" if backward else " fwd") + (f" ls={smoothing}" if smoothing else "")

    if backward:
        def op_args(x, t):
            stats = torch.empty(3, rows, device=x.device, dtype=CE.stats_dtype(x.dtype))
            return (x.detach(), t, stats, torch.ones(1, device=x.device, dtype=stats.dtype), -100, smoothing)
    else:
        def op_args(x, t):
            return (x.detach(), t, -100, smoothing)

    return BenchCase(
        op=name, label=label or f"{rows}x{cols}{tag}", dtype=dtype, make_args=_make(shape, dtype, backward),
        run=run, reference=reference, flops=flops, nbytes=nbytes, peers=peer_fns,
        variant=variant, graph=graph, op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """LM-head shapes at the bandwidth limit, forward and fwd+bwd, and one launch-bound shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            ce_case((64, 256), f32, compile_peer=compile_peer),
            ce_case((16, 1000), bf16, smoothing=0.1, compile_peer=compile_peer),
            ce_case((32, 300), f32, backward=True, compile_peer=compile_peer),
        ]
    out = []
    for shape, dt in (((8192, 32000), bf16), ((8192, 128256), bf16), ((4096, 128256), bf16),
                      ((8192, 32000), f32)):
        out.append(ce_case(shape, dt))
        out.append(ce_case(shape, dt, backward=True))
    out.append(ce_case((8192, 32000), bf16, smoothing=0.1))
    out.append(ce_case((8192, 32000), bf16, smoothing=0.1, backward=True))
    out.append(ce_case((4096, 128256), bf16, smoothing=0.1, backward=True))
    out.append(ce_case((64, 4096), bf16, graph=True))
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Online vs split forward over the number of rows of a long vocabulary
    (where cutting rows stops paying)."""
    small = quick or device.type != "cuda"
    cols = 1000 if small else 128256
    rows_list = (2, 8) if small else (8, 32, 128, 512, 2048)
    variants = ("triton_online", "triton_split") + (("torch_eager",) if device.type == "cuda" else ())
    return [ce_case((rows, cols), torch.bfloat16, variant=v, peers=False, label=f"{rows}x{cols}")
            for rows in rows_list for v in variants]
