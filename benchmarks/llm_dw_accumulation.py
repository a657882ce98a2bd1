"""How to accumulate the LM head's weight gradient over row chunks (issue 30:
fused_linear_cross_entropy's fp32 d weight buffer is the known memory gap to
Liger-Kernel). Runs on the CPU in a few seconds:

    python benchmarks/llm_dw_accumulation.py [--vocab 4096 --hidden 256 --rows 8192 --chunk 512]

Each chunk's product ``dlogits[chunk].T @ hidden[chunk]`` is exact in fp32 (a
GEMM accumulates in fp32); the schemes differ in how the running sum over
chunks is held between chunks:

* ``fp32``: an fp32 accumulator, rounded to bf16 at the end (opforge today):
  4 bytes an element, plus the 2-byte bf16 output allocated while the
  accumulator is alive at the end (6 bytes an element at that moment).
* ``bf16``: the bf16 gradient itself, rounded after every chunk (Liger-Kernel):
  2 bytes an element.
* ``split``: a bf16 pair ``hi + lo`` (``s = hi + lo + P`` in fp32, ``hi =
  bf16(s)``, ``lo = bf16(s - hi)``; ``hi`` is the output): 4 bytes an element,
  no end-of-loop copy, about 16 significant bits between chunks.

Prints each scheme's relative error (Frobenius) against the float64 product,
the share of elements that differ from the correctly rounded bf16 result,
and the bytes held per element at the loop's peak.
"""
from __future__ import annotations

import argparse

import torch


def accumulate(scheme: str, g: torch.Tensor, h: torch.Tensor, chunk: int) -> torch.Tensor:
    V, H = g.shape[1], h.shape[1]
    acc = torch.zeros(V, H)
    hi, lo = torch.zeros(V, H, dtype=torch.bfloat16), torch.zeros(V, H, dtype=torch.bfloat16)
    for s in range(0, g.shape[0], chunk):
        product = g[s:s + chunk].float().t() @ h[s:s + chunk].float()
        if scheme == "fp32":
            acc += product
        elif scheme == "bf16":
            hi = (hi.float() + product).bfloat16()
        else:
            total = hi.float() + lo.float() + product
            hi = total.bfloat16()
            lo = (total - hi.float()).bfloat16()
    return acc.bfloat16() if scheme == "fp32" else hi


PEAK_BYTES = {"fp32": 6, "bf16": 2, "split": 4}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=512)
    args = p.parse_args()
    torch.manual_seed(0)
    h = torch.randn(args.rows, args.hidden).bfloat16()
    g = (torch.randn(args.rows, args.vocab) / 100).bfloat16()  # dlogits-like: softmax - one-hot, scaled
    exact = g.double().t() @ h.double()
    rounded = exact.bfloat16()
    print(f"{args.rows // args.chunk} chunks of {args.chunk} rows, d weight {args.vocab} x {args.hidden}")
    print(f"{'correctly rounded':18s} rel err {((rounded.double() - exact).norm() / exact.norm()).item():.6e}")
    for scheme in ("fp32", "bf16", "split"):
        dw = accumulate(scheme, g, h, args.chunk)
        err = ((dw.double() - exact).norm() / exact.norm()).item()
        off = (dw != rounded).float().mean().item()
        print(f"{scheme:18s} rel err {err:.6e}  differs from correctly rounded in {off:7.3%} of elements  "
              f"peak {PEAK_BYTES[scheme]} bytes/element")


if __name__ == "__main__":
    main()
