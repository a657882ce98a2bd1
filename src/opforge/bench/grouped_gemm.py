"""Bench cases for the grouped GEMM family: MoE expert layers and a list of
differently shaped GEMMs, bf16.

Packed shapes are named ``G x rows -> K x N`` (``G`` experts, ``rows`` tokens
routed in total, each group ``[M_g, K] @ [K, N]``). Group sizes are uneven and
seeded (gamma-distributed shares, Dirichlet-like) with one empty expert, as a
router produces. FLOPs are ``2 * sum(M_g) * N * K``; bytes are the fewest the
op must move: A, every expert's weight and the output once.

Peers (CUDA): "cuBLAS loop" (one ``torch.matmul`` per expert into the output
rows, group bounds known on the host: the issue's baseline), "cuBLAS one
call" (one ``[sum M_g, K] @ [K, N]`` matmul of the same FLOPs: the issue's
15 % bound; it reads one weight instead of G, so it is the compute bound,
not a peer that computes the same result) and ``torch._grouped_mm`` where the
running torch has it. The list case concatenates its outputs on both sides
(``rel_err`` compares one tensor), so both pay the same copy.
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase
from opforge.ops import grouped_matmul as GM

BF16, F32 = torch.bfloat16, torch.float32


def moe_sizes(rows: int, groups: int, seed: int, *, empty: bool = True) -> list[int]:
    """Uneven group sizes summing to ``rows``: gamma(2) shares, one group empty."""
    g = torch.Generator().manual_seed(seed)
    w = torch._standard_gamma(torch.full((groups,), 2.0, dtype=torch.float64), generator=g)
    if empty and groups > 1:
        w[groups // 2] = 0.0
    sizes = (w / w.sum() * rows).floor().long()
    sizes[int(torch.argmax(w))] += rows - int(sizes.sum())
    return sizes.tolist()


def packed_case(rows: int, groups: int, K: int, N: int, dtype=BF16, *, seed: int = 0, bias: bool = False,
                activation=None, graph: bool = False, variant=None, peers: bool = True,
                label: str | None = None) -> BenchCase:
    sizes = moe_sizes(rows, groups, seed)
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).tolist()
    bounds = list(zip([0] + ends[:-1], ends))
    es = torch.empty((), dtype=dtype).element_size()

    def make(dev):
        a = torch.randn((rows, K), device=dev, dtype=F32).to(dtype)
        b = (torch.randn((groups, K, N), device=dev, dtype=F32) * K ** -0.5).to(dtype)
        offsets = torch.tensor(ends, dtype=torch.int32, device=dev)
        args = [a, b, offsets]
        if bias:
            args.append(torch.randn((groups, N), device=dev, dtype=F32).to(dtype))
        return tuple(args)

    def split(args):
        a, b, offsets, *rest = args
        return a, b, offsets, (rest[0] if bias else None)

    def run(*args):
        a, b, offsets, bias_t = split(args)
        return GM.grouped_matmul(a, b, offsets, bias=bias_t, activation=activation)

    def epi(a, bias_t):
        return GM.make_epilogue(a, bias_t, None, activation, None, False)

    def ref(*args):
        a, b, offsets, bias_t = split(args)
        return GM.reference(a, b, offsets, bias_t, None, epi(a, bias_t))

    def op_args(*args):
        a, b, offsets, bias_t = split(args)
        return (a, b, offsets, bias_t, None, GM.make_epilogue(a, bias_t, None, activation, None))

    def cublas_loop(*args):
        a, b, offsets, bias_t = split(args)
        out = torch.empty((rows, N), device=a.device, dtype=dtype)
        for g, (s, e) in enumerate(bounds):
            if e > s:
                if bias_t is None and activation is None:
                    torch.matmul(a[s:e], b[g], out=out[s:e])
                else:
                    out[s:e] = GM._torch_epilogue(torch.matmul(a[s:e], b[g]), bias_t[g], None, activation)
        return out

    def cublas_one(*args):
        a, b, offsets, bias_t = split(args)
        y = torch.matmul(a, b[0])
        return y if bias_t is None and activation is None else GM._torch_epilogue(y, bias_t[0], None, activation)

    def grouped_mm(*args):
        a, b, offsets, bias_t = split(args)
        return GM.grouped_mm_run(a, b, offsets, bias_t, None, epi(a, bias_t))

    peer_fns = {}
    if peers and variant is None:
        peer_fns["cuBLAS loop"] = cublas_loop
        peer_fns["cuBLAS one call"] = cublas_one
        if hasattr(torch, "_grouped_mm") and dtype == BF16:
            peer_fns["torch._grouped_mm"] = grouped_mm
    what = (["bias"] if bias else []) + ([activation] if activation else [])
    default_label = f"{groups}x{rows}->{K}x{N}" + (" +" + "+".join(what) if what else "")
    return BenchCase(
        op="grouped_matmul", label=label or default_label, dtype=dtype, make_args=make, run=run, reference=ref,
        flops=2.0 * rows * N * K, nbytes=float((rows * K + groups * K * N + rows * N + (groups * N if bias else 0))
                                               * es),
        peers=peer_fns, variant=variant, graph=graph, op_args=op_args,
    )


def list_case(shapes: list[tuple[int, int, int]], dtype=BF16, *, peers: bool = True,
              label: str | None = None) -> BenchCase:
    """``shapes``: (M, N, K) per group."""
    G = len(shapes)
    es = torch.empty((), dtype=dtype).element_size()

    def make(dev):
        a = [torch.randn((m, k), device=dev, dtype=F32).to(dtype) for m, n, k in shapes]
        b = [(torch.randn((k, n), device=dev, dtype=F32) * k ** -0.5).to(dtype) for m, n, k in shapes]
        return tuple(a + b)

    def flat(outs):
        return torch.cat([o.reshape(-1) for o in outs])

    def run(*args):
        return flat(GM.grouped_matmul(list(args[:G]), list(args[G:])))

    def ref(*args):
        return flat(GM.list_reference(args[:G], args[G:], GM.Epilogue()))

    def op_args(*args):
        return (tuple(args[:G]), tuple(args[G:]), None, GM.make_epilogue(args[0]))

    def cublas_loop(*args):
        return flat([torch.matmul(x, y) for x, y in zip(args[:G], args[G:])])

    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    nbytes = sum((m * k + k * n + m * n) * es for m, n, k in shapes)
    default_label = "list " + ",".join(f"{m}x{n}x{k}" for m, n, k in shapes)
    return BenchCase(
        op="grouped_matmul_list", label=label or default_label, dtype=dtype, make_args=make, run=run,
        reference=ref, flops=flops, nbytes=float(nbytes), peers={"cuBLAS loop": cublas_loop} if peers else {},
        op_args=op_args,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """Mixtral 8x7B up- and down-projections (8 experts, 8192 tokens top-2 =
    16384 rows), DeepSeek-like 64 small experts (32768 rows, 2048 -> 1408),
    an up-projection with bias+silu, a list of four GEMMs, and a small MoE
    layer timed as CUDA-graph replays."""
    if quick or device.type != "cuda":
        return [
            packed_case(23, 4, 32, 16, F32, peers=False),
            packed_case(40, 3, 40, 24, F32, bias=True, activation="gelu", peers=False),
            list_case([(9, 16, 24), (0, 8, 8), (17, 24, 40), (5, 8, 16)], F32, peers=False),
        ]
    return [
        packed_case(16384, 8, 4096, 14336, label="Mixtral up 8x16384->4096x14336"),
        packed_case(16384, 8, 14336, 4096, label="Mixtral down 8x16384->14336x4096"),
        packed_case(32768, 64, 2048, 1408, seed=1, label="DeepSeek 64x32768->2048x1408"),
        packed_case(16384, 8, 4096, 14336, bias=True, activation="silu",
                    label="Mixtral up 8x16384->4096x14336 +bias+silu"),
        list_case([(4096, 4096, 4096), (2048, 8192, 2048), (8192, 1024, 4096), (1024, 4096, 14336)]),
        packed_case(512, 8, 1024, 1024, seed=2, graph=True),
    ]


def crossover_cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """The packed variants against each other as the expert count grows (rows
    per expert shrink) at a fixed total: where TMA, the portable kernel and
    the vendor paths cross."""
    gpu = device.type == "cuda" and not quick
    rows, K, N = (16384, 4096, 4096) if gpu else (40, 32, 16)
    groups = (4, 8, 32, 128) if gpu else (2, 4)
    variants = ["triton_persistent", "triton_grouped"]
    if device.type == "cuda":
        variants += ["torch_grouped_mm", "torch_loop"]
    dtype = BF16 if device.type == "cuda" else F32
    return [packed_case(rows, g, K, N, dtype, variant=v, peers=False, label=f"{g}x{rows}->{K}x{N}")
            for g in groups for v in variants]
