"""A Mixtral-style MoE block, forward + backward, four ways (issue 30's second goal).

    python benchmarks/llm_moe_block.py                       # Mixtral-8x7B's block: hidden 4096, 14336, 8 experts, top-2
    python benchmarks/llm_moe_block.py --hidden 1024 --intermediate 2048 --tokens 4096
    python benchmarks/llm_moe_block.py --out json            # also write benchmarks/results/<gpu>-<date>-llm-moe-block.json

``MixtralSparseMoeBlock`` built from a config (random weights, bf16), on
``--tokens`` tokens (default 2 x 4096). Modes, each in this process on a fresh
copy of the same block: ``eager`` (transformers' loop over experts),
``compile`` (the block under ``torch.compile``), ``opforge``
(``opforge.nn.patch(block)``: ``moe_route`` + ``moe_experts`` on two
grouped GEMMs) and ``opforge_compile``. Timed with CUDA events, median of
``--steps`` after ``--warmup``; the output and the gradient of the input
are checked against eager's (relative error printed). The goal is
``opforge`` >= 1.2x ``compile``.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from llm_train_step import versions  # noqa: E402

MODES = ("eager", "compile", "opforge", "opforge_compile")


def main() -> None:
    import torch
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    import opforge

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", choices=("json",), default=None)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    cfg = MixtralConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                        num_local_experts=args.experts, num_experts_per_tok=args.top_k)
    torch.manual_seed(0)
    base = MixtralSparseMoeBlock(cfg)
    for prm in base.parameters():
        torch.nn.init.normal_(prm, std=0.02)
    base = base.to(device=device, dtype=torch.bfloat16)
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn((1, args.tokens, args.hidden), generator=g).to(device=device, dtype=torch.bfloat16)
    dy = torch.randn(x.shape, generator=g).to(device=device, dtype=torch.bfloat16)

    def step(block):
        xx = x.detach().requires_grad_()
        y = block(xx)
        y.backward(dy)
        return y.detach(), xx.grad

    entries, ref = [], None
    for mode in args.modes.split(","):
        block = copy.deepcopy(base)
        if mode.startswith("opforge"):
            print(opforge.nn.patch(block).report, file=sys.stderr)
        if mode.endswith("compile"):
            block = torch.compile(block)
        times = []
        for i in range(args.warmup + args.steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            y, dx = step(block)
            if cuda:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
            block.zero_grad(set_to_none=True)
        if ref is None:
            ref = (y.float(), dx.float())
        err = max(((a.float() - b).norm() / b.norm()).item() for a, b in zip((y, dx), ref))
        entry = {"mode": mode, "ms": statistics.median(times), "rel_err_vs_first": err}
        entries.append(entry)
        print(f"{mode:16s} {entry['ms']:9.2f} ms fwd+bwd   rel err vs {entries[0]['mode']}: {err:.2e}", flush=True)
    peer = next((e for e in entries if e["mode"] == "compile"), None)
    for e in entries:
        if peer:
            e["speedup_vs_compile"] = peer["ms"] / e["ms"]
            print(f"  {e['mode']:16s} {e['speedup_vs_compile']:.3f}x torch.compile")
    report = {"schema_version": 1, "date": dt.date.today().isoformat(), **versions(),
              "config": vars(args), "entries": entries}
    if args.out == "json":
        gpu = "h200" if "H200" in (report["gpu"] or "") else ("gpu" if report["gpu"] else "cpu")
        path = HERE / "results" / f"{gpu}-{report['date']}-llm-moe-block.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
