"""The peak bytes of live tensors a TPC-H query makes under a memory limit, on the CPU: what the
out-of-core path holds at once, measured without a GPU.

    python benchmarks/sql_memory_peak.py --sf 1 --budget 256MiB [--queries 1,18,21]

Every tensor an aten op returns is counted by its storage until the last tensor on that storage
is gone (a ``TorchDispatchMode``); host memory that never passes through an op (NumPy arrays,
Arrow buffers, the host cache) is not counted, and neither are a GPU kernel's workspaces. Each
query runs twice in one connection, both runs measured, as ``sql_out_of_core.py`` measures the
device: the first run plans with statistics computed on first use (per table and column, kept
for later queries), the second finds the caches warm. Why: the device's peaks passed the limit
(1.3-1.8x at SF100 under 24 GiB, 2026-12-03), and which tensors make a peak is cheaper to find
here; the first runs' statistics were one cause (q01 at SF1 under 256 MiB: 1.27x here, 1.28x
on the H200)."""
from __future__ import annotations

import argparse
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from opforge import sql  # noqa: E402
from opforge.sql.outofcore.sizes import format_size, parse_size  # noqa: E402
from opforge.sql.tpch import data, queries  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that tensors made by aten ops hold right now, and their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # storage address -> [bytes, tensors alive on it]
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._count(t)
        return out

    def _count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0:
            return
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [storage.nbytes(), 0]
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def reset(self) -> None:
        self.peak = self.now


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--queries", default="", help="e.g. 1,18,21 (default: all 22)")
    ap.add_argument("--root", default=None, help="where the TPC-H Parquet files are cached")
    args = ap.parse_args(argv)
    budget = parse_size(args.budget)
    numbers = [int(q) for q in args.queries.split(",") if q] or list(queries.NUMBERS)
    con = sql.connect("cpu", memory_limit=budget)
    for name, path in data.generate(args.sf, args.root).items():
        con.register(name, str(path))
    print(f"TPC-H SF{args.sf:g}, memory_limit {format_size(budget)}, live tensor bytes on the CPU")
    print(f"{'query':>5} {'peak':>10} {'/limit':>7} {'held before':>12}")
    worst = 0.0
    for n in numbers:
        text = queries.query(n)
        with LiveBytes() as live:
            held = live.now
            for _ in range(2):  # the first run and a warm one, as the device benchmark's peak covers
                con.sql(text).to_arrow()
        worst = max(worst, live.peak / budget)
        print(f"{'q%02d' % n:>5} {format_size(live.peak):>10} {live.peak / budget:>7.2f} {format_size(held):>12}",
              flush=True)
    print(f"worst: {worst:.2f} x the limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
