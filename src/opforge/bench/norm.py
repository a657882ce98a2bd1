"""Bench cases for the normalization family (layer_norm, rms_norm).

Bytes: x read once + y written once + weight (and bias) read once. FLOPs:
about 8 per element (mean, deviation, square, sum, scale, weight, bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import norm as N

FLOPS_PER_ELEMENT = 8


def _ln_eager(x, w=None, b=None):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _rms_eager(x, w=None):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def norm_case(name: str, shape, dtype, *, params: bool = True, graph: bool = False, variant=None,
              peers: bool = True, compile_peer: bool = True) -> BenchCase:
    rows, cols = shape
    es = torch.empty((), dtype=dtype).element_size()
    is_rms = name == "rms_norm"
    n_params = (1 if is_rms else 2) if params else 0

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).to(dtype)
        ps = [(torch.rand(cols, device=dev) + 0.5).to(dtype)]
        if not is_rms:
            ps.append((torch.randn(cols, device=dev) * 0.1).to(dtype))
        return (x, *ps[:n_params])

    if is_rms:
        def run(x, w=None):
            return N.rms_norm(x, (cols,), w, 1e-6)
        reference = _rms_eager
    else:
        def run(x, w=None, b=None):
            return N.layer_norm(x, (cols,), w, b, 1e-5)
        reference = _ln_eager
    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = reference
        if compile_peer:
            ref = N.rms_norm_reference if is_rms else N.layer_norm_reference
            eps = 1e-6 if is_rms else 1e-5
            peer_fns["torch.compile"] = compiled_peer(lambda x, *p: ref(x, (cols,), eps, *p))
    return BenchCase(
        op=name, label=f"{rows}x{cols}" + ("" if params else " (no affine)"), dtype=dtype,
        make_args=make, run=run, reference=reference,
        op_args=lambda x, *p: (x, (cols,), 1e-6 if is_rms else 1e-5, *p),
        flops=FLOPS_PER_ELEMENT * rows * cols,
        nbytes=(2 * rows * cols + n_params * cols) * es,
        peers=peer_fns, variant=variant, graph=graph,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Large rows at the bandwidth limit, and one small graph-timed shape."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            norm_case("layer_norm", (64, 256), f32, compile_peer=compile_peer),
            norm_case("rms_norm", (64, 256), bf16, compile_peer=compile_peer),
            norm_case("layer_norm", (16, 96), bf16, params=False, compile_peer=compile_peer),
        ]
    return [
        norm_case("layer_norm", (32768, 8192), bf16),
        norm_case("rms_norm", (32768, 8192), bf16),
        norm_case("layer_norm", (8192, 8192), f32),
        norm_case("rms_norm", (8192, 8192), f32),
        norm_case("layer_norm", (256, 65536), bf16, variant="triton_looped"),
        norm_case("layer_norm", (64, 1024), bf16, graph=True),
        norm_case("rms_norm", (64, 1024), bf16, graph=True),
    ]
