"""The ``gluon_ws`` variants of ``opforge.attention`` and its backward: the
warp-specialized FA3-style Hopper kernels of ``kernels/attention_gluon.py``
and ``kernels/attention_gluon_backward.py``.

Gate (``OPFORGE_GLUON=1`` / ``0`` overrides both flags): the forward is on
(``ENABLED_BY_DEFAULT``): on the H200 (device run 2, bf16, B 4, H 16, D 128)
it ran 1.11-1.28x our Triton forward at S 2048-16384 causal and full and GQA
32/8, 0.92-1.08x cuDNN; its measured entries ship in
``runtime/tuned/h200-attention-gluon.jsonl``, so dispatch compares them with
the other variants' per bucket (a bucket where it has none keeps the
variant that has one). The backward is on too (``BACKWARD_ENABLED_BY_DEFAULT``)
since its delta runs in one Triton kernel (2026-12-02, third session): 1.09-1.18x
our Triton backward at S 4096 full / causal and S 8192 causal, 0.81-0.85x cuDNN
(benchmarks/results/h200-2026-12-02c-gluon-bwd.txt).

Everything the kernels do not handle falls back, by the reason ``check``
gives, to the next variant in dispatch order (``triton_flash_tma``): varlen,
windows, fp32/fp64, head dims other than 64/128, ``Sq > Sk`` under causal
(keyless queries), empty sequences, tensors TMA cannot read, GPUs other than
sm_9x (wgmma is Hopper-only); a non-positive scale runs the Triton kernel
per call. The kernel modules (and Gluon) are imported on first use.
"""

from __future__ import annotations

import os

import torch

from opforge.runtime.device import interpret_mode
from opforge.runtime.registry import Spec
from opforge.runtime.shapes import bucket_size

NAME = "gluon_ws"
HEAD_DIMS = (64, 128)  # kernels/attention_gluon.HEAD_DIMS, without importing Gluon here
# The one-line gates (see the module docstring for the measurements behind them).
ENABLED_BY_DEFAULT = True  # the forward: faster than triton_flash_tma at every measured D 128 shape (run 2)
BACKWARD_ENABLED_BY_DEFAULT = True  # faster than triton_flash at every measured shape (run 3)


def enabled(by_default: bool) -> bool:
    flag = os.environ.get("OPFORGE_GLUON")
    return by_default if flag is None else flag == "1"


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def check(g) -> str | None:
    """Why the Gluon forward cannot take geometry ``g`` (None when it can)."""
    return _reason(g) or _guard(ENABLED_BY_DEFAULT)


def backward_check(g) -> str | None:
    """Why the Gluon backward cannot take geometry ``g`` (None when it can)."""
    return _reason(g) or _guard(BACKWARD_ENABLED_BY_DEFAULT)


def _guard(by_default: bool) -> str | None:
    if not enabled(by_default):
        return "not yet measured on the device: set OPFORGE_GLUON=1 (or force the variant)"
    return None


def _reason(g) -> str | None:
    if interpret_mode():
        return "Gluon kernels do not run under the Triton interpreter"
    if g.dtype not in (torch.float16, torch.bfloat16):
        return "the Gluon kernel takes fp16/bf16"
    if g.D not in HEAD_DIMS:
        return f"the Gluon kernel takes head dims {HEAD_DIMS}"
    if g.varlen:
        return "varlen (cu_seqlens) is not in the Gluon kernel"
    if g.mask == "window":
        return "sliding windows are not in the Gluon kernel"
    if g.mask == "causal" and g.Sq > g.Sk:
        return "causal with Sq > Sk (queries that see no key) is not in the Gluon kernel"
    if g.empty:
        return "empty sequences"
    if g.tma:
        return g.tma
    if not _hopper():
        return "wgmma and setmaxnreg are sm_90 (Hopper) instructions"
    return None


def default_config(g) -> dict:
    from opforge.kernels import attention_gluon as KG

    return KG.forward_default_config(g.D, g.Sq, g.Sk, g.mask == "causal", g.H // max(g.Hk, 1))


def configs(g) -> list[dict]:
    from opforge.kernels import attention_gluon as KG

    return KG.forward_configs(g.D, g.Sq, g.Sk, g.mask == "causal", g.H // max(g.Hk, 1))


def bucket(g) -> str:
    return (f"{bucket_size(g.seqs * g.H)}h:{bucket_size(g.Sq)}x{bucket_size(g.Sk)}:d{g.D}:g{g.H // max(g.Hk, 1)}"
            f":{g.mask}")


def make_spec(fallback) -> Spec:
    """The variant's ``Spec``; ``fallback(g, *args)`` runs the forward the
    kernel does not take per call: a non-positive ``scale`` (the kernel folds
    the scale into the row max, which only commutes with a positive one)."""
    from opforge.kernels.attention import tma_ok

    def run(g, cfg, q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k):
        if scale <= 0:
            return fallback(g, q, k, v, scale, left, right, cu_q, cu_k, max_q, max_k)
        from opforge.kernels import attention_gluon as KG

        if not tma_ok(q, varlen=False):  # k, v are checked by the geometry; a misaligned q is copied once
            q = q.contiguous()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        KG.launch_forward(q, k, v, out, lse, float(scale), right == 0, cfg)
        return out, lse

    return Spec(NAME, run, version="1", dtypes=frozenset({torch.float16, torch.bfloat16}), min_capability=(9, 0),
                check=check, configs=configs, default_config=default_config, bucket=bucket,
                description="FA3-style Hopper forward in Gluon: a TMA loader warp, two consumer warpgroups on "
                            "async wgmma, QK of the next block overlapping PV (fp16/bf16, D 64/128, GQA)")


def make_backward_spec(fallback) -> Spec:
    """The backward's ``Spec`` (``kernels/attention_gluon_backward.py``: dK/dV
    and dQ kernels, deterministic); ``fallback(g, *args)`` as in ``make_spec``."""

    def run(g, cfg, do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k):
        if scale <= 0:
            return fallback(g, do, q, k, v, out, lse, scale, left, right, cu_q, cu_k, max_q, max_k)
        from opforge.kernels import attention_gluon_backward as KB

        do, q, k, v, out = (t if t.stride(-1) == 1 else t.contiguous() for t in (do, q, k, v, out))
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        KB.launch_backward(do, q, k, v, out, lse, dq, dk, dv, float(scale), right == 0)
        return dq, dk, dv

    return Spec(NAME, run, version="1", dtypes=frozenset({torch.float16, torch.bfloat16}), min_capability=(9, 0),
                check=backward_check, bucket=bucket,
                description="Hopper backward in Gluon: dK/dV and dQ kernels, each a TMA loader warp and two "
                            "consumer warpgroups on wgmma; GQA summed in order (deterministic)")
