"""Which Hopper instructions the compiled Triton kernels use: wgmma (HGMMA for
16-bit, QGMMA for fp8, IGMMA for int8), TMA (UTMALDG / UTMASTG) and, for the
warp-specialized Gluon kernels, register rebalancing (USETMAXREG).

Reads the cubins in Triton's on-disk cache (run it after a bench or selftest
filled the cache), disassembles each with ``cuobjdump -sass`` and counts the
instructions per kernel. With ``--compile`` it first compiles the Hopper
variants (attention, its Gluon forward, matmul, FP8/INT8 scaled and grouped GEMM) at bench shapes
for sm_90 into that cache, on any machine: Triton's bundled ptxas is the one
the GPU machine uses. Usage::

    python benchmarks/sass_check.py [--compile] [--cache DIR] [--match attention|gemm] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INSTRUCTIONS = ("HGMMA", "QGMMA", "IGMMA", "HMMA", "UTMALDG", "UTMASTG", "UBLKCP", "USETMAXREG")


def cuobjdump() -> str:
    for cand in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if cand and Path(cand).exists():
            return cand
    try:  # triton ships one next to its ptxas
        import triton.backends.nvidia as nv

        cand = Path(nv.__file__).parent / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    sys.exit("sass_check: cuobjdump not found (CUDA toolkit or triton's bundled copy)")


def count(cubin: Path, tool: str) -> dict[str, int]:
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return {ins: len(re.findall(rf"\b{ins}\b", sass)) for ins in INSTRUCTIONS}


def compile_hopper_variants(cache: str) -> None:
    """Compile (not run) what dispatch takes on an H200 at bench shapes, into ``cache``."""
    os.environ["TRITON_CACHE_DIR"] = cache  # the compile child inherits it
    import torch

    from opforge import profile
    from opforge.ops.attention import default_scale
    from opforge.ops.matmul import Epilogue
    from opforge.ops.scaled_matmul import ScaledEpilogue

    bf = torch.bfloat16
    q, lse = torch.empty(4, 16, 2048, 128, dtype=bf, device="meta"), torch.empty(4, 16, 2048, device="meta")
    a = torch.empty(4096, 4096, dtype=bf, device="meta")
    f8, i8 = (torch.empty(4096, 4096, dtype=dt, device="meta") for dt in (torch.float8_e4m3fn, torch.int8))
    sa, sb = torch.ones(4096, 1), torch.ones(1, 4096)
    se = ScaledEpilogue(out_dtype=bf, activation=None, fast_accum=False, bias=False)
    attn = (default_scale(128), -1, 0, None, None, -1, -1)
    jobs = [
        ("attention", (q, q, q, *attn), "triton_flash_tma"),
        ("attention_backward", (q, q, q, q, q, lse, *attn), "triton_flash_tma"),
        ("matmul", (a, a, None, None, Epilogue()), "triton_tma_persistent"),
        ("scaled_matmul", (f8, f8.t(), sa, sb, None, se), "triton_tma_persistent"),
        ("scaled_matmul", (i8, i8.t(), sa, sb, None, se), "triton_tma_persistent"),
        ("grouped_matmul", (torch.empty(16384, 4096, dtype=bf, device="meta"),
                            torch.empty(8, 4096, 4096, dtype=bf, device="meta"),
                            torch.arange(1, 9, dtype=torch.int32) * 2048, None, None, Epilogue()), "triton_persistent"),
    ]
    for op, args, variant in jobs:
        _, res = profile.op_resources(op, *args, variant=variant)
        for r in res:
            print(f"compiled {op} [{variant}]: {r}")
    from opforge.kernels import attention_gluon  # Gluon: compiled directly (dispatch takes it only when enabled)

    for cfg in attention_gluon.forward_configs(128, 2048, 2048):
        attention_gluon.compile_sm90(128, True, bf, cfg)
        print(f"compiled attention [gluon_ws {cfg}]")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")))
    p.add_argument("--match", default="", help="regex on the kernel name")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--compile", action="store_true", help="compile the Hopper variants for sm_90 first")
    args = p.parse_args()
    tool = cuobjdump()
    if args.compile:
        compile_hopper_variants(args.cache)
    rows = []
    for cubin in sorted(Path(args.cache).rglob("*.cubin")):
        name = cubin.stem
        if args.match and not re.search(args.match, name):
            continue
        rows.append({"kernel": name, **count(cubin, tool)})
    merged: dict[str, dict] = {}
    for r in rows:  # one line per kernel name: the most of each instruction over its compiled configs
        m = merged.setdefault(r["kernel"], {"kernel": r["kernel"], "configs": 0})
        m["configs"] += 1
        for ins in INSTRUCTIONS:
            m[ins] = max(m.get(ins, 0), r[ins])
    print(f"{'kernel':48s} {'cfgs':>4s} " + " ".join(f"{i:>8s}" for i in INSTRUCTIONS))
    for m in merged.values():
        print(f"{m['kernel'][:48]:48s} {m['configs']:4d} " + " ".join(f"{m[i]:8d}" for i in INSTRUCTIONS))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(list(merged.values()), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
