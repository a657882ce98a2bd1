"""EXPLAIN ANALYZE: run a plan with per-operator measurement and render it.

For each physical operator (the executor computes its inputs first, so the figures are the
operator's own, children excluded): estimated and actual rows with the estimate's q-error, wall time between two device synchronizations (CUDA events
on cuda, ``perf_counter`` on the CPU; the synchronizations happen only in this mode), actual rows,
bytes in (each input column read once: the table columns a scan reads, the input batches of every
other operator) and bytes out (the output batch), achieved GB/s = (in + out) / time and, on cuda,
that figure as a percentage of the device's measured copy bandwidth (``runtime.roofline``);
plus the registry ops that dispatch ran under the operator (op, variant, version, kind: a
``triton`` kind is a Triton kernel) and the operator's own notes: which rule chose the join
algorithm and build side (planner, user override, executor rule), partitions, skew handling,
distribution, and for scans the rows read, partitions skipped and rows dropped by runtime filters
(also as numbers in ``OperatorStats.metrics``).

``record_dispatch`` listens on ``opforge.runtime.hooks.HOOKS`` (dispatch calls each hook with
("enter", decision) before a variant runs).
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import torch

from opforge.runtime import hooks
from opforge.sql.planner.cardinality import q_error

SCHEMA = pa.schema([
    ("operator", pa.string()), ("est_rows", pa.int64()), ("actual_rows", pa.int64()), ("time_ms", pa.float64()),
    ("bytes_in", pa.int64()), ("bytes_out", pa.int64()), ("gbps", pa.float64()), ("pct_copy_bw", pa.float64()),
    ("kernels", pa.string()), ("notes", pa.string()),
])


def batch_bytes(batch) -> int:
    """Bytes of a batch's columns: values plus validity masks."""
    total = 0
    for c in batch.cols.values():
        total += c.values.numel() * c.values.element_size()
        if c.valid is not None:
            total += c.valid.numel()
    return total


@dataclass
class OperatorStats:
    depth: int
    describe: str
    est_rows: int
    actual_rows: int = 0
    time_ms: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    kernels: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)  # rows read, partitions skipped, heavy keys, ...

    @property
    def gbps(self) -> float:
        return (self.bytes_in + self.bytes_out) / (self.time_ms * 1e-3) / 1e9 if self.time_ms > 0 else 0.0

    def kernel_text(self) -> str:
        return "; ".join(f"{k} x{n}" for k, n in self.kernels.items())


@contextlib.contextmanager
def record_dispatch(sink: Counter):
    """Count ``"opforge::op -> variant (vN, kind)"`` for every registry op run inside the block
    (nested ones included: a hash join's scans and compactions are listed too)."""
    def hook(event, d) -> None:
        if event == "enter":
            sink[f"{d.op.qualname} -> {d.variant.name} (v{d.variant.version}, {d.variant.kind})"] += 1

    hooks.HOOKS.append(hook)
    try:
        yield
    finally:
        hooks.HOOKS.remove(hook)


class Profiler:
    """Measures each operator the executor runs; ``stats`` ends in plan order (pre-order)."""

    def __init__(self, device: torch.device, estimate):
        self.device = torch.device(device)
        self.estimate = estimate
        self._depth: dict[int, int] = {}
        self._order: dict[int, int] = {}
        self._stats: dict[int, OperatorStats] = {}

    def plan_order(self, node, depth: int = 0) -> None:
        """Number the nodes in pre-order (as EXPLAIN prints them) before the run."""
        self._order[id(node)] = len(self._order)
        self._depth[id(node)] = depth
        for c in node.inputs():
            self.plan_order(c, depth + 1)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measure(self, node, fn, bytes_in: int, ctx):
        st = OperatorStats(self._depth.get(id(node), 0), node.describe(), self.estimate(node))
        ctx.notes, ctx.metrics = [], {}
        with record_dispatch(st.kernels):
            self._sync()
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn()
                end.record()
                end.synchronize()
                st.time_ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                out = fn()
                st.time_ms = (time.perf_counter() - t0) * 1e3
        st.time_ms = max(st.time_ms, 1e-6)  # a clock tick can read 0 for a trivial operator
        st.actual_rows, st.bytes_in, st.bytes_out = out.n, bytes_in, batch_bytes(out)
        st.notes, st.metrics = list(ctx.notes), dict(ctx.metrics)
        self._stats[id(node)] = st
        return out

    def record(self, node, time_ms: float, rows: int, bytes_out: int, notes: list, metrics: dict) -> None:
        """Figures of an operator that ran in pieces inside another's measurement (an out-of-core
        stream, ``sql/outofcore/streaming.py``)."""
        st = OperatorStats(self._depth.get(id(node), 0), node.describe(), self.estimate(node), rows,
                           max(time_ms, 1e-6), 0, bytes_out, Counter(), list(notes), dict(metrics))
        self._stats[id(node)] = st

    def exclude(self, node, ms: float) -> None:
        """Take ``ms`` (its inputs' time, measured inside it) off ``node``'s time."""
        st = self._stats.get(id(node))
        if st is not None:
            st.time_ms = max(st.time_ms - ms, 1e-6)

    @property
    def stats(self) -> list[OperatorStats]:
        return [self._stats[k] for k in sorted(self._stats, key=lambda k: self._order.get(k, 1 << 30))]

    def copy_gbps(self) -> float | None:
        """The device's measured copy bandwidth in GB/s (cuda only; measured once, then cached)."""
        if self.device.type != "cuda":
            return None
        from opforge.runtime import roofline

        return roofline.ceilings(self.device).copy_tbps * 1e3

    def to_arrow(self) -> pa.Table:
        bw = self.copy_gbps()
        rows = []
        for s in self.stats:
            rows.append({
                "operator": "  " * s.depth + s.describe, "est_rows": s.est_rows, "actual_rows": s.actual_rows,
                "time_ms": s.time_ms, "bytes_in": s.bytes_in, "bytes_out": s.bytes_out, "gbps": s.gbps,
                "pct_copy_bw": None if bw is None else 100.0 * s.gbps / bw,
                "kernels": s.kernel_text(), "notes": "; ".join(s.notes),
            })
        return pa.Table.from_pylist(rows, schema=SCHEMA)

    def render(self, total_ms: float) -> str:
        bw = self.copy_gbps()
        head = f"EXPLAIN ANALYZE on {self.device}: total {total_ms:.3f} ms"
        head += f", device copy bandwidth {bw:.0f} GB/s" if bw is not None else " (CPU: GB/s only, no roofline)"
        lines = [head]
        for s in self.stats:
            pad = "  " * s.depth
            pct = "" if bw is None else f", {100.0 * s.gbps / bw:.1f}% of copy bw"
            lines.append(f"{pad}{s.describe}  (est. rows={s.est_rows}, actual rows={s.actual_rows}, "
                         f"q-error {q_error(s.est_rows, s.actual_rows):.2f}, "
                         f"{s.time_ms:.3f} ms, in {_size(s.bytes_in)}, out {_size(s.bytes_out)}, "
                         f"{s.gbps:.2f} GB/s{pct})")
            for note in s.notes:
                lines.append(f"{pad}  | {note}")
            for k, n in s.kernels.items():
                lines.append(f"{pad}  | ran {k} x{n}")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
