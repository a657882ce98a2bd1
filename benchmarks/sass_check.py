"""Which Hopper instructions the compiled Triton kernels use: wgmma (HGMMA for
16-bit, QGMMA for fp8, IGMMA for int8) and TMA (UTMALDG / UTMASTG).

Reads the cubins in Triton's on-disk cache (run it after a bench or selftest
filled the cache), disassembles each with ``cuobjdump -sass`` and counts the
instructions per kernel. Usage::

    python benchmarks/sass_check.py [--cache DIR] [--match attention|gemm] [--json OUT]
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

INSTRUCTIONS = ("HGMMA", "QGMMA", "IGMMA", "HMMA", "UTMALDG", "UTMASTG", "UBLKCP")


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")))
    p.add_argument("--match", default="", help="regex on the kernel name")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args()
    tool = cuobjdump()
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
