"""Bench cases for the LM head + loss (``opforge.fused_linear_cross_entropy``):
the loss *and* its gradients for hidden and weight (what a training step
needs), at the Llama-3 vocabulary (128256) with hidden 2048 and 4096.

FLOPs: the three GEMMs (logits, d hidden, d weight), ``6 N H V``. Bytes: the
fewest such a fused op moves, hidden and weight read, their gradients
written (the logits never reach HBM in full).

Peers: torch eager (logits, fp32 ``F.cross_entropy``, autograd for both
gradients: the unfused model's head) and, when installed, Liger-Kernel's
``LigerFusedLinearCrossEntropyFunction``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase
from opforge.ops import fused_linear_cross_entropy as FL  # noqa: F401  (registers the op)


def _run(h, w, t):
    return torch.ops.opforge.fused_linear_cross_entropy(h, w, t, None, -100, 0.0, "mean", True, 0)[0]


def _eager(h, w, t):
    with torch.enable_grad():
        hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss = F.cross_entropy((hh @ ww.t()).float(), t)
        torch.autograd.grad(loss, (hh, ww))
    return loss.detach()


def _liger():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    except ImportError:
        return None

    def run(h, w, t):
        with torch.enable_grad():
            hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
            return LigerFusedLinearCrossEntropyFunction.apply(hh, ww, t)[0].detach()
    return run


def _reference(h, w, t):
    return F.cross_entropy(h @ w.t(), t)


def flce_case(rows: int, hidden: int, vocab: int, dtype) -> BenchCase:
    def make(dev):
        g = torch.Generator(device="cpu").manual_seed(5)
        h = torch.randn((rows, hidden), generator=g).to(dtype).to(dev)
        w = (torch.randn((vocab, hidden), generator=g) / hidden ** 0.5).to(dtype).to(dev)
        return h, w, torch.randint(0, vocab, (rows,), generator=g).to(dev)

    es = torch.empty((), dtype=dtype).element_size()
    peers = {"torch eager": _eager}
    liger = _liger()
    if liger is not None:
        peers["liger"] = liger
    return BenchCase(
        op="fused_linear_cross_entropy", label=f"{rows}x{hidden} V{vocab}", dtype=dtype, make_args=make, run=_run,
        reference=_reference, flops=6 * rows * hidden * vocab, nbytes=2 * (rows + vocab) * hidden * es, peers=peers,
        op_args=lambda h, w, t: (h, w, t, -100, 0.0, "mean", True, 0),
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The training step's head (2 x 4096 tokens, hidden 2048, vocab 128256), hidden 4096, a small one."""
    if quick or device.type != "cuda":
        return [flce_case(8, 16, 20, torch.float32)]
    bf16 = torch.bfloat16
    return [flce_case(8192, 2048, 128256, bf16), flce_case(8192, 4096, 128256, bf16)]
