"""The Gluon warp-specialized FP8 GEMM as a variant of ``opforge.scaled_matmul``.

Dispatch rule, from the two H200 runs of benchmarks/gluon_fp8_gemm.py
(4096^3 to 16384^3 and two LLM shapes, bf16 out):

* block scales (1x128 / 128x128, either side): on by default
  (``BLOCK_SCALES_BY_DEFAULT``, the one line): 890-973 TFLOP/s, 1.37-1.62x the
  fastest other path (opforge's Triton kernel, 590-650; torch 2.11 has no
  blockwise torch._scaled_mm on sm_90, dequantize + bf16 matmul is slower);
* per-tensor / row scales: 0.92-1.06x torch._scaled_mm precise, 0.95-1.02x
  with fast accumulation, within the runs' noise of it: opt-in,
  ``OPFORGE_GLUON=1`` or forced (``dispatch.force_variant("scaled_matmul",
  "gluon_ws")``); ``ENABLED_BY_DEFAULT`` turns it on for every mode.

It takes fp8 operands (e4m3 / e5m2 either side, checked on the device),
K-major with 16-byte aligned rows (the TMA path's layout), an output whose
rows are 16-byte aligned, M > 64 (decode shapes belong to the split-K
kernel), and every scale mode; an activation runs as a torch op on the fp32
product (one rounding, as the reference). Anything else falls back to the
next variant with the reason in ``opforge.explain``.
"""

from __future__ import annotations

import os

import torch

from opforge.kernels import gemm_fp8_gluon as G
from opforge.runtime import device as devmod
from opforge.runtime import dispatch
from opforge.runtime.registry import Spec

NAME = "gluon_ws"
OP_NAME = "scaled_matmul"
ENABLED_BY_DEFAULT = False  # every scale mode (see the module docstring)
BLOCK_SCALES_BY_DEFAULT = True  # passed and measured on the H200 (device run 1)
MIN_M = 65
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)  # e5m2 x e5m2 never gets here (validate rejects it)


def enabled(g) -> bool:
    """OPFORGE_GLUON=1, this variant forced, block scales (BLOCK_SCALES_BY_DEFAULT), or ENABLED_BY_DEFAULT."""
    env = os.environ.get("OPFORGE_GLUON", "0").strip().lower() not in ("", "0", "false", "off")
    by_default = ENABLED_BY_DEFAULT or (BLOCK_SCALES_BY_DEFAULT and G.BLOCK in g.modes)
    return by_default or env or dispatch._forced.get(OP_NAME) == NAME


def check(g) -> str | None:
    if devmod.interpret_mode():
        return "Gluon kernels do not run under the Triton interpreter"
    if not enabled(g):
        return ("per-tensor / row scales: torch._scaled_mm is as fast on the H200; opt in with OPFORGE_GLUON=1 "
                "or force gluon_ws")
    if g.a_dtype not in _FP8 or g.b_dtype not in _FP8:
        return "fp8 operands only (int8 runs the Triton kernels)"
    if not g.tma:
        return "TMA needs both operands K-major with 16-byte aligned bases and rows (K a multiple of 16)"
    if (g.N * g.out_dtype.itemsize) % 16:
        return f"the output's rows must be 16-byte aligned for the TMA store (N={g.N})"
    if g.M < MIN_M:
        return f"M={g.M} < {MIN_M}: decode shapes run the split-K kernel"
    if g.fast_accum and G.BLOCK in g.modes:
        return "block scales are applied per K chunk: there is no fast-accumulation form"
    return None


def default_config(g) -> dict:
    return G.default_config(g.M, g.N, g.K, "ws", g.fast_accum, g.out_dtype.itemsize, G.BLOCK in g.modes, g.sms)


def configs(g) -> list[dict]:
    base = default_config(g)
    widths = (128,) if G.BLOCK in g.modes else (128, 256)
    return [{**base, "BLOCK_N": bn, "STAGES": st, "GROUP_M": gm}
            for bn in widths for st in range(3, G.max_stages(bn, g.out_dtype.itemsize) + 1) for gm in (8, 16)]


def run(g, cfg, a, b, scale_a, scale_b, bias, epi):
    """The kernel writes the scaled product (+ bias); an activation follows on its fp32 copy."""
    from opforge.ops import scaled_matmul as S

    M, N, K = g.M, g.N, g.K
    C = torch.empty((M, N), dtype=torch.float32 if epi.activation else epi.out_dtype, device=a.device)
    if C.numel() == 0 or K == 0:
        return S.reference(a, b, scale_a, scale_b, bias, epi).contiguous()
    SA, SB = S.scales_2d(a, scale_a, scale_b, g.modes)
    G.launch(a.reshape(M, K), b.t(), C, SA, SB, *g.modes, bias, epi.fast_accum, cfg, g.sms, "ws")
    if epi.activation:
        C = S._act(C, epi.activation).to(epi.out_dtype)
    return C.view(S.out_shape(a, b))


def spec() -> Spec:
    """Called by ``scaled_matmul.specs`` (its shape buckets are this variant's)."""
    from opforge.ops.scaled_matmul import shape_bucket

    return Spec(NAME, run, version=G.VERSION, min_capability=(9, 0), check=check, configs=configs,
                default_config=default_config, bucket=shape_bucket,
                description="Hopper, Gluon: persistent, warp-specialized (TMA producer warp, two consumer "
                            "warpgroups), fp32 promotion every 128 of K (block scales applied there), scales "
                            "and bias in the epilogue, TMA store")
