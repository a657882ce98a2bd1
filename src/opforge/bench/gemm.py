"""Bench cases for the GEMM family: square bf16 sizes, LLM projections,
decode shapes, fp16/fp32, and fused epilogues against cuBLAS plus the
separate torch ops.

Shapes are named ``MxNxK`` (``C[M, N] = A[M, K] @ B[K, N]``). "linear"
cases hold B as a Linear weight ``W[N, K]`` seen through ``W.t()`` (how
projections and decode run in a model); the others hold B row-major.
FLOPs are ``2 * M * N * K``; bytes are the fewest the op must move: A, B
and C once (plus the bias and residual when fused). Compute-bound shapes
sit under the bf16 ceiling the harness measures; decode shapes are
weight-streaming and bandwidth-bound (timed as CUDA-graph replays).
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import matmul as MM

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def gemm_case(M: int, N: int, K: int, dtype, *, linear: bool = False, batch: int = 1, bias: bool = False,
              activation=None, residual: bool = False, graph: bool = False, variant=None, peers: bool = True,
              compile_peer: bool = True, label: str | None = None) -> BenchCase:
    es = torch.empty((), dtype=dtype).element_size()

    def make(dev):
        a_shape = (batch, M, K) if batch > 1 else (M, K)
        a = torch.randn(a_shape, device=dev, dtype=torch.float32).to(dtype)
        scale = K ** -0.5
        if linear:
            b = (torch.randn((N, K), device=dev, dtype=torch.float32) * scale).to(dtype).t()
        else:
            b_shape = (batch, K, N) if batch > 1 else (K, N)
            b = (torch.randn(b_shape, device=dev, dtype=torch.float32) * scale).to(dtype)
        args = [a, b]
        if bias:
            args.append(torch.randn(N, device=dev, dtype=torch.float32).to(dtype))
        if residual:
            args.append(torch.randn(a_shape[:-1] + (N,), device=dev, dtype=torch.float32).to(dtype))
        return tuple(args)

    def split(args):
        a, b, *rest = args
        bias_t = rest.pop(0) if bias else None
        res_t = rest.pop(0) if residual else None
        return a, b, bias_t, res_t

    def run(*args):
        a, b, bias_t, res_t = split(args)
        return MM.matmul(a, b, bias=bias_t, activation=activation, residual=res_t)

    def ref(*args):
        a, b, bias_t, res_t = split(args)
        return MM.reference(a, b, bias_t, res_t, MM.make_epilogue(a, bias_t, res_t, activation, None, False))

    def op_args(*args):
        a, b, bias_t, res_t = split(args)
        return (a, b, bias_t, res_t, MM.make_epilogue(a, bias_t, res_t, activation))

    def eager(*args):
        a, b, bias_t, res_t = split(args)
        y = torch.matmul(a, b)
        if bias_t is not None:
            y = y + bias_t
        y = MM._act(y, activation)
        return y + res_t if res_t is not None else y

    peer_fns = {}
    if peers:
        peer_fns["torch eager"] = eager  # cuBLAS, then torch's epilogue ops when there is an epilogue
        if compile_peer:
            peer_fns["torch.compile"] = compiled_peer(eager)
    nbytes = batch * (M * K + (0 if linear else K * N) + M * N * (2 if residual else 1)) * es
    nbytes += (K * N * es if linear else 0) + (N * es if bias else 0)
    what = []
    if bias:
        what.append("bias")
    if activation:
        what.append(activation)
    if residual:
        what.append("residual")
    default_label = (f"{batch}x" if batch > 1 else "") + f"{M}x{N}x{K}" + (" linear" if linear else "")
    if what:
        default_label += " +" + "+".join(what)
    return BenchCase(
        op="matmul", label=label or default_label, dtype=dtype, make_args=make, run=run, reference=ref,
        flops=2.0 * batch * M * N * K, nbytes=float(nbytes), peers=peer_fns, variant=variant, graph=graph,
        op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The issue's grid (MxNxK): square bf16 1024..16384, LLM projections,
    decode M = 1..128 at N = K = 8192, fp16 and fp32 4096^3, fused epilogues
    at 8192^3."""
    cp = device.type == "cuda"
    if quick or device.type != "cuda":
        return [
            gemm_case(64, 48, 40, F32, compile_peer=cp),
            gemm_case(33, 40, 70, BF16, bias=True, activation="gelu", compile_peer=cp),
            gemm_case(2, 64, 256, F32, linear=True, compile_peer=cp),
            gemm_case(16, 24, 32, F32, batch=2, residual=True, compile_peer=cp),
        ]
    out = [gemm_case(n, n, n, BF16) for n in (1024, 2048, 4096, 8192, 16384)]
    out += [gemm_case(4096, 4096, 11008, BF16, linear=True),
            gemm_case(8192, 8192, 28672, BF16, linear=True)]
    out += [gemm_case(m, 8192, 8192, BF16, linear=True, graph=True) for m in (1, 16, 64, 128)]
    out += [gemm_case(4096, 4096, 4096, F16), gemm_case(4096, 4096, 4096, F32, label="4096x4096x4096 (tf32 off)")]
    out += [gemm_case(8192, 8192, 8192, BF16, linear=True, bias=True, activation="gelu"),
            gemm_case(8192, 8192, 8192, BF16, linear=True, residual=True)]
    return out


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Split-K vs TMA vs tiled over decode M at N = K = 8192 (where split-K stops paying)."""
    from opforge.kernels.gemm import SPLITK_MAX_M

    gpu = device.type == "cuda" and not quick
    n = 8192 if gpu else 64
    k = 8192 if gpu else 1024
    ms = (1, 4, 16, 32, 64, 128, 256) if gpu else (1, 16)
    variants = ["triton_splitk", "triton_tiled"]
    if device.type == "cuda":
        variants += ["triton_tma_persistent", "torch_eager"]
    out = []
    for m in ms:
        for v in variants:
            if v == "triton_splitk" and m > SPLITK_MAX_M:
                continue
            out.append(gemm_case(m, n, k, BF16, linear=True, variant=v, peers=False, graph=device.type == "cuda",
                                 label=f"{m}x{n}x{k} linear"))
    return out
