"""Bench cases for the scaled 8-bit GEMM family: FP8 (e4m3) per-tensor and
rowwise, INT8 rowwise, block-scaled FP8, and the W8A8 ``QuantLinear``.

Shapes are named ``MxNxK`` (``C[M, N] = A[M, K] @ B[K, N]``) as in
``bench/gemm.py``; B is always held as a Linear weight ``W[N, K]`` and passed
as ``W.t()`` (K-major: what the 8-bit tensor cores and torch._scaled_mm
want). Operands are pre-quantized: the quantize cost is excluded, except in
the "W8A8 linear" cases, which time ``QuantLinear`` end to end (activation
quantization included) against the bf16 cuBLAS Linear.

FLOPs are ``2 * M * N * K``; bytes are the fewest the op must move: A and B
once (1 byte an element), their scales, the bias and the bf16 output. Peers,
with the same scaling granularity: ``torch._scaled_mm`` for fp8 and
``torch._int_mm`` followed by a separate dequantize for int8 (plus the
torch.compile of that pair, which may fuse the dequantize). Decode shapes are
weight-streaming and timed as CUDA-graph replays.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import scaled_matmul as SM

BF16, F32 = torch.bfloat16, torch.float32
E4M3, I8 = torch.float8_e4m3fn, torch.int8


def _scales(kind: str, M: int, N: int, K: int, dev):
    if kind == "tensor":
        return (torch.rand((), device=dev) * 0.01 + 0.005, torch.rand((), device=dev) * 0.01 + 0.005)
    if kind == "row":
        return (torch.rand((M, 1), device=dev) * 0.01 + 0.005, torch.rand((1, N), device=dev) * 0.01 + 0.005)
    kb, nb = -(-K // 128), -(-N // 128)
    return (torch.rand((M, kb), device=dev) * 0.01 + 0.005, torch.rand((kb, nb), device=dev) * 0.01 + 0.005)


def _quantized(dtype, shape, dev):
    x = torch.randn(shape, device=dev, dtype=F32)
    if dtype == I8:
        return (x * 40).round().clamp(-127, 127).to(I8)
    return (x * 8).clamp(-448, 448).to(dtype)


def scaled_case(M: int, N: int, K: int, dtype=E4M3, scales: str = "row", *, bias: bool = False,
                activation=None, graph: bool = False, variant=None, peers: bool = True,
                label: str | None = None) -> BenchCase:
    def make(dev):
        a = _quantized(dtype, (M, K), dev)
        b = _quantized(dtype, (N, K), dev).t()
        sa, sb = _scales(scales, M, N, K, dev)
        args = [a, b, sa, sb]
        if bias:
            args.append(torch.randn(N, device=dev, dtype=F32).to(BF16))
        return tuple(args)

    def split(args):
        a, b, sa, sb, *rest = args
        return a, b, sa, sb, (rest[0] if rest else None)

    def run(*args):
        a, b, sa, sb, bias_t = split(args)
        return SM.scaled_matmul(a, b, sa, sb, bias=bias_t, activation=activation)

    def ref(*args):
        a, b, sa, sb, bias_t = split(args)
        return SM.reference(a, b, sa.float(), sb.float(), bias_t, SM.ScaledEpilogue(BF16, activation))

    def op_args(*args):
        a, b, sa, sb, bias_t = split(args)
        return (a, b, sa, sb, bias_t, SM.ScaledEpilogue(BF16, activation, False, bias_t is not None))

    def scaled_mm(*args):
        a, b, sa, sb, bias_t = split(args)
        y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16,
                             bias=bias_t if activation is None and scales == "tensor" else None)
        if bias_t is not None and not (activation is None and scales == "tensor"):
            y = y + bias_t
        return SM._act(y, activation)

    def int_mm(*args):
        a, b, sa, sb, bias_t = split(args)
        y = torch._int_mm(a, b).to(F32) * sa * sb
        if bias_t is not None:
            y = y + bias_t
        return SM._act(y, activation).to(BF16)

    peer_fns = {}
    if peers and scales != "block":
        if dtype == I8:
            peer_fns["torch._int_mm+dequant"] = int_mm
            peer_fns["torch.compile"] = compiled_peer(int_mm)
        else:
            peer_fns["torch._scaled_mm"] = scaled_mm
    sa_n = {"tensor": 1, "row": M, "block": M * -(-K // 128)}[scales]
    sb_n = {"tensor": 1, "row": N, "block": -(-K // 128) * -(-N // 128)}[scales]
    nbytes = M * K + K * N + 2 * M * N + 4 * (sa_n + sb_n) + (2 * N if bias else 0)
    what = [scales] + (["bias"] if bias else []) + ([activation] if activation else [])
    return BenchCase(
        op="scaled_matmul", label=label or f"{M}x{N}x{K} {str(dtype).replace('torch.', '')} {'+'.join(what)}",
        dtype=dtype, make_args=make, run=run, reference=ref, flops=2.0 * M * N * K, nbytes=float(nbytes),
        peers=peer_fns, variant=variant, graph=graph, op_args=op_args,
    )


def w8a8_linear_case(M: int, N: int, K: int, dtype=I8, *, graph: bool = False, peers: bool = True) -> BenchCase:
    """QuantLinear end to end (dynamic per-token activation quantization + the
    scaled GEMM with bias in the epilogue) against the bf16 cuBLAS Linear."""
    from opforge.nn.quant_linear import QuantLinear
    from opforge.ops.quant import quantize_reference

    def make(dev):
        lin = torch.nn.Linear(K, N, device=dev, dtype=BF16)
        x = torch.randn((M, K), device=dev, dtype=F32).to(BF16)
        q = QuantLinear.from_linear(lin, dtype)
        return (x, lin.weight.detach(), lin.bias.detach(), q)

    def run(x, w, bias, q):
        return q(x)

    def ref(x, w, bias, q):
        # The op's own semantics: the float64 product of the quantized operands.
        data, sx, _ = quantize_reference(x.float(), dtype, "token")
        return SM.reference(data, q.weight.t(), sx, q.weight_scale, q.bias, SM.ScaledEpilogue(BF16))

    def op_args(x, w, bias, q):
        from opforge.ops.quant import quantize

        qx = quantize(x, dtype, "token")
        return (qx.data, q.weight.t(), qx.scale, q.weight_scale, q.bias, SM.ScaledEpilogue(BF16, None, False, True))

    def linear(x, w, bias, q):
        return F.linear(x, w, bias)

    peer_fns = {"torch eager (bf16 linear)": linear, "torch.compile (bf16 linear)": compiled_peer(linear)} \
        if peers else {}
    nbytes = 2 * M * K + N * K + 4 * N + 4 * M + 2 * M * N
    return BenchCase(
        op="scaled_matmul", label=f"{M}x{N}x{K} W8A8 linear {str(dtype).replace('torch.', '')}", dtype=dtype,
        make_args=make, run=run, reference=ref, flops=2.0 * M * N * K, nbytes=float(nbytes), peers=peer_fns,
        graph=graph, op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The issue's grid (MxNxK): fp8 e4m3 per-tensor and rowwise and int8
    rowwise at 4096^3, 8192^3, 4096x4096x11008 and 8192x8192x28672; decode
    M = 16 / 64 at N = K = 4096; fp8 block scales at 8192^3; W8A8 linears."""
    cuda = device.type == "cuda"
    if quick or not cuda:
        return [
            scaled_case(64, 48, 40, E4M3, "row", peers=cuda),
            scaled_case(33, 40, 64, I8, "tensor", bias=True, activation="gelu", peers=cuda),
            scaled_case(16, 32, 200, E4M3, "block", peers=cuda),
            w8a8_linear_case(8, 32, 48, I8, peers=cuda),
        ]
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 11008), (8192, 8192, 28672)]
    out = []
    for M, N, K in shapes:
        out += [scaled_case(M, N, K, E4M3, "tensor"), scaled_case(M, N, K, E4M3, "row"),
                scaled_case(M, N, K, I8, "row")]
    out += [scaled_case(8192, 8192, 8192, E4M3, "block")]
    out += [scaled_case(8192, 8192, 8192, E4M3, "row", bias=True, activation="silu")]
    for m in (16, 64):
        out += [scaled_case(m, 4096, 4096, E4M3, kind, graph=True) for kind in ("tensor", "row")]
    out += [scaled_case(64, 4096, 4096, I8, "row", graph=True)]  # torch._int_mm needs M > 16
    out += [w8a8_linear_case(M, N, K, dt) for dt in (I8, E4M3) for M, N, K in ((4096, 4096, 4096), (8192, 8192, 8192))]
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Split-K vs TMA vs tiled over decode M at N = K = 4096, fp8 rowwise."""
    from opforge.kernels.gemm_scaled import SPLITK_MAX_M

    gpu = device.type == "cuda" and not quick
    n, k = (4096, 4096) if gpu else (64, 2048)
    ms = (1, 16, 32, 64, 128, 256) if gpu else (1, 16)
    variants = ["triton_splitk", "triton_tiled"]
    if device.type == "cuda":
        variants += ["triton_tma_persistent", "torch_scaled_mm"]
    out = []
    for m in ms:
        for v in variants:
            if v == "triton_splitk" and m > SPLITK_MAX_M:
                continue
            out.append(scaled_case(m, n, k, E4M3, "tensor", variant=v, peers=False, graph=device.type == "cuda",
                                   label=f"{m}x{n}x{k} float8_e4m3fn tensor"))
    return out


def fp8_error_report(device: torch.device, shapes=((4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 11008)),
                     granularities=("tensor", "row")) -> list[dict]:
    """The issue's accuracy criterion: ``‖out − ref‖ / ‖ref‖`` of opforge's fp8
    GEMM and of torch._scaled_mm on the same inputs (bf16 output, the same
    scaling granularity, default accumulation), against float64 on the
    dequantized operands; ``ratio`` = ours / torch's, to stay <= 1.2."""
    from opforge.bench.case import rel_err

    out = []
    for M, N, K in shapes:
        for kind in granularities:
            a = _quantized(E4M3, (M, K), device)
            b = _quantized(E4M3, (N, K), device).t()
            sa, sb = _scales(kind, M, N, K, device)
            ref = SM.reference(a, b, sa, sb, None, SM.ScaledEpilogue(F32)).double()
            ours = rel_err(SM.scaled_matmul(a, b, sa, sb), ref)
            peer = rel_err(torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16), ref)
            out.append({"shape": f"{M}x{N}x{K}", "scales": kind, "opforge": ours, "torch._scaled_mm": peer,
                        "ratio": ours / peer if peer else float("inf")})
            del a, b, ref
    return out
