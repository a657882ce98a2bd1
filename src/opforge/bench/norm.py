"""Bench cases for the normalization family: layer_norm, rms_norm and the fused
residual-add + norm ops (add_layer_norm, add_rms_norm).

Bytes are the fewest each op must move: plain norms read x once and write y
once; the fused ops read x and the residual and write out and new_residual
(2 reads + 2 writes); weight (and bias) are read once. The split kernels
re-read long rows and the looped ones read them two or three times: the
roofline counts what the op needs, not what a kernel does. FLOPs: about 8 per
element (mean, deviation, square, sum, scale, weight, bias), plus 1 for the
residual add.

The grid: row lengths 128 ... 262144 in bf16 and fp32, rows chosen so each
case moves 256 MiB (2^26 bf16 or 2^25 fp32 elements in, as many out), the
transformer shapes 32768x8192 bf16 and 8192x8192 fp32, and one small
launch-bound shape timed through CUDA graphs. ``crossover_cases`` sweeps the
row-resident, split and looped kernels over row lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import norm as N
from opforge.ops import residual_norm as R

FLOPS_PER_ELEMENT = 8
RMS_EPS, LN_EPS = 1e-6, 1e-5
GRID_COLS = (128, 1024, 8192, 32768, 65536, 262144)


def _ln_eager(x, w=None, b=None):
    return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def _rms_eager(x, w=None):
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def _add_ln_eager(x, r, w=None, b=None):
    s = x + r
    return F.layer_norm(s, (s.shape[-1],), w, b, LN_EPS), s


def _add_rms_eager(x, r, w=None):
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), w, RMS_EPS), s


def _params(dev, cols, dtype, is_rms, n_params):
    ps = [(torch.rand(cols, device=dev) + 0.5).to(dtype)]
    if not is_rms:
        ps.append((torch.randn(cols, device=dev) * 0.1).to(dtype))
    return ps[:n_params]


def norm_case(name: str, shape, dtype, *, params: bool = True, graph: bool = False, variant=None,
              peers: bool = True, compile_peer: bool = True, label: str | None = None) -> BenchCase:
    rows, cols = shape
    es = torch.empty((), dtype=dtype).element_size()
    is_rms = name == "rms_norm"
    n_params = (1 if is_rms else 2) if params else 0
    eps = RMS_EPS if is_rms else LN_EPS

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).to(dtype)
        return (x, *_params(dev, cols, dtype, is_rms, n_params))

    if is_rms:
        def run(x, w=None):
            return N.rms_norm(x, (cols,), w, eps)
        reference = _rms_eager
    else:
        def run(x, w=None, b=None):
            return N.layer_norm(x, (cols,), w, b, eps)
        reference = _ln_eager
    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = reference
        if compile_peer:
            ref = N.rms_norm_reference if is_rms else N.layer_norm_reference
            peer_fns["torch.compile"] = compiled_peer(lambda x, *p: ref(x, (cols,), eps, *p))
    return BenchCase(
        op=name, label=label or (f"{rows}x{cols}" + ("" if params else " (no affine)")), dtype=dtype,
        make_args=make, run=run, reference=reference,
        op_args=lambda x, *p: (x, (cols,), eps, *p),
        flops=FLOPS_PER_ELEMENT * rows * cols,
        nbytes=(2 * rows * cols + n_params * cols) * es,
        peers=peer_fns, variant=variant, graph=graph,
    )


def add_norm_case(name: str, shape, dtype, *, graph: bool = False, compile_peer: bool = True) -> BenchCase:
    """The fused op against eager ``x + r`` then the norm, and torch.compile of the same."""
    rows, cols = shape
    es = torch.empty((), dtype=dtype).element_size()
    is_rms = name == "add_rms_norm"
    n_params = 1 if is_rms else 2
    eps = RMS_EPS if is_rms else LN_EPS
    eager = _add_rms_eager if is_rms else _add_ln_eager

    def make(dev):
        x = torch.randn(shape, device=dev, dtype=torch.float32).to(dtype)
        r = torch.randn(shape, device=dev, dtype=torch.float32).to(dtype)
        return (x, r, *_params(dev, cols, dtype, is_rms, n_params))

    if is_rms:
        def run(x, r, w=None):
            return R.add_rms_norm(x, r, (cols,), w, eps)[0]
    else:
        def run(x, r, w=None, b=None):
            return R.add_layer_norm(x, r, (cols,), w, b, eps)[0]

    def reference(x, r, *p):
        return eager(x, r, *p)[0]  # new_residual is checked by the tests; out depends on it

    peer_fns = {"torch eager": eager}
    if compile_peer:
        peer_fns["torch.compile"] = compiled_peer(eager)
    return BenchCase(
        op=name, label=f"{rows}x{cols}", dtype=dtype, make_args=make, run=run, reference=reference,
        op_args=lambda x, r, *p: (x, r, (cols,), eps, *p),
        flops=(FLOPS_PER_ELEMENT + 1) * rows * cols,
        nbytes=(4 * rows * cols + n_params * cols) * es,
        peers=peer_fns, graph=graph,
    )


def grid_rows(cols: int, dtype: torch.dtype) -> int:
    """Rows so that one case reads 2^26 bf16 / 2^25 fp32 elements: 256 MiB moved."""
    elems = (1 << 28) // torch.empty((), dtype=dtype).element_size() // 2
    return max(1, elems // cols)


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The family's grid (see the module docstring); tiny shapes on CPU or quick."""
    bf16, f32 = torch.bfloat16, torch.float32
    compile_peer = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            norm_case("layer_norm", (64, 256), f32, compile_peer=compile_peer),
            norm_case("rms_norm", (64, 256), bf16, compile_peer=compile_peer),
            norm_case("layer_norm", (16, 96), bf16, params=False, compile_peer=compile_peer),
            add_norm_case("add_rms_norm", (32, 128), bf16, compile_peer=compile_peer),
            add_norm_case("add_layer_norm", (16, 200), f32, compile_peer=compile_peer),
        ]
    out = [
        norm_case("layer_norm", (32768, 8192), bf16),
        norm_case("rms_norm", (32768, 8192), bf16),
        norm_case("layer_norm", (8192, 8192), f32),
        norm_case("rms_norm", (8192, 8192), f32),
        norm_case("layer_norm", (256, 65536), bf16),  # few long rows: the split kernel's case
    ]
    for dtype in (bf16, f32):
        for cols in GRID_COLS:
            for name in ("layer_norm", "rms_norm"):
                out.append(norm_case(name, (grid_rows(cols, dtype), cols), dtype))
    out += [
        norm_case("layer_norm", (64, 1024), bf16, graph=True),
        norm_case("rms_norm", (64, 1024), bf16, graph=True),
        add_norm_case("add_rms_norm", (32768, 8192), bf16),
        add_norm_case("add_layer_norm", (32768, 8192), bf16),
        add_norm_case("add_rms_norm", (8192, 8192), f32),
        add_norm_case("add_layer_norm", (8192, 8192), f32),
        add_norm_case("add_rms_norm", (1024, 65536), bf16),
        add_norm_case("add_rms_norm", (64, 1024), bf16, graph=True),
        add_norm_case("add_layer_norm", (64, 1024), bf16, graph=True),
    ]
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Row-resident vs split vs looped layer_norm over row lengths (bf16, 32 MiB in)."""
    from opforge.kernels.norm import ROW_MAX

    small = quick or device.type != "cuda"
    exps = (12, 13) if small else (12, 13, 14, 15, 16, 17, 18)
    elems = 1 << (11 if small else 24)
    out = []
    for e in exps:
        cols = 1 << e
        rows = max(1, elems // cols)
        variants = (("triton_row",) if cols <= ROW_MAX else ()) + ("triton_split", "triton_looped")
        if device.type == "cuda":
            variants += ("torch_eager",)
        for v in variants:
            out.append(norm_case("layer_norm", (rows, cols), torch.bfloat16, variant=v, peers=False,
                                 label=f"{rows}x{cols}"))
    return out
