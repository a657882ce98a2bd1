"""A per-op timeline of a block of Python code, without a profiler.

``with timeline() as tl:`` adds a hook to ``opforge.runtime.hooks.HOOKS``
(dispatch calls the hooks around every opforge op) that records, for every op
the block runs, a pair of CUDA events on the current stream around the
variant's launch (GPU time) or, for ops on CPU tensors, the host wall clock;
each record says which clock it used, and ``clock`` is ``"cuda"``, ``"wall"``
or ``"mixed"`` for the whole timeline. On a machine without CUDA the timeline
is a wall-clock timeline, flagged so: it times the host (reference or
interpreter), never a GPU. Records made while a CUDA graph is being captured
have no times (``captured``). Events are read once, when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opforge.runtime.hooks import HOOKS, run_hooked  # noqa: F401  (re-exported)


@dataclass
class OpRecord:
    op: str  # "opforge::softmax"
    variant: str
    config: dict
    depth: int  # 0 for an op the block called, 1 for an op that op called, ...
    clock: str  # "cuda" | "wall" | "captured"
    device: str
    start_ms: float | None = None  # since the timeline began (per device for cuda)
    end_ms: float | None = None

    @property
    def ms(self) -> float | None:
        if self.start_ms is None or self.end_ms is None:
            return None
        return self.end_ms - self.start_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ms"] = self.ms
        d["config"] = {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                       for k, v in self.config.items()}
        return d


@dataclass
class Timeline:
    """What ``timeline()`` yields: records, filled in when the block ends."""

    records: list[OpRecord] = field(default_factory=list)
    wall_ms: float | None = None  # the whole block, host wall clock
    _pending: list = field(default_factory=list, repr=False)
    _stack: list = field(default_factory=list, repr=False)
    _origin: dict = field(default_factory=dict, repr=False)  # device index -> start event
    _t0: float = 0.0

    # -- recording (the hook) -------------------------------------------------
    def _cuda_ok(self, decision) -> bool:
        return decision.cuda_index is not None

    def hook(self, phase: str, decision) -> None:
        import torch

        if phase == "enter":
            rec = OpRecord(decision.op.qualname, decision.variant.name, dict(decision.config or {}),
                           len(self._stack), "wall", "cpu")
            if self._cuda_ok(decision):
                idx = decision.cuda_index
                rec.device = f"cuda:{idx}"
                stream = torch.cuda.current_stream(idx)
                if torch.cuda.is_current_stream_capturing():
                    rec.clock = "captured"
                    self._stack.append((rec, None))
                    self.records.append(rec)
                    return
                rec.clock = "cuda"
                if idx not in self._origin:
                    origin = torch.cuda.Event(enable_timing=True)
                    origin.record(stream)
                    self._origin[idx] = origin
                start = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                self._stack.append((rec, start))
            else:
                rec.start_ms = (time.perf_counter() - self._t0) * 1e3
                self._stack.append((rec, None))
            self.records.append(rec)
            return
        if not self._stack:
            return
        rec, start = self._stack.pop()
        if rec.clock == "cuda":
            idx = int(rec.device.split(":")[1])
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(idx))
            self._pending.append((rec, idx, start, end))
        elif rec.clock == "wall":
            rec.end_ms = (time.perf_counter() - self._t0) * 1e3

    def _resolve(self) -> None:
        import torch

        for idx in {p[1] for p in self._pending}:
            torch.cuda.synchronize(idx)
        for rec, idx, start, end in self._pending:
            origin = self._origin[idx]
            rec.start_ms = origin.elapsed_time(start)
            rec.end_ms = origin.elapsed_time(end)
        self._pending.clear()

    # -- reading ----------------------------------------------------------------
    @property
    def clock(self) -> str:
        """``"cuda"``, ``"wall"``, ``"mixed"``, or ``"none"`` when nothing ran."""
        kinds = {r.clock for r in self.records if r.clock != "captured"}
        if not kinds:
            return "none"
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def note(self) -> str:
        return {
            "cuda": "GPU times from CUDA events recorded around each op's launch on its stream",
            "wall": "host wall-clock times: no CUDA tensors ran (reference or interpreter), not GPU times",
            "mixed": "CUDA-event times for ops on CUDA tensors, host wall clock for ops on CPU tensors",
            "none": "no opforge op ran inside the block",
        }[self.clock]

    def summary(self) -> list[dict]:
        """Per op, variant and nesting depth: calls, total, mean, and for ops the
        block called directly (depth 0), their share of all top-level op time."""
        rows: dict[tuple[str, str, int], dict] = {}
        top = sum(r.ms for r in self.records if r.ms is not None and r.depth == 0) or 0.0
        for r in self.records:
            row = rows.setdefault((r.op, r.variant, r.depth), {"op": r.op, "variant": r.variant, "calls": 0,
                                                              "total_ms": 0.0, "timed": 0, "depth": r.depth})
            row["calls"] += 1
            if r.ms is not None:
                row["total_ms"] += r.ms
                row["timed"] += 1
        out = []
        for row in rows.values():
            row["mean_ms"] = row["total_ms"] / row["timed"] if row["timed"] else None
            row["pct"] = 100.0 * row["total_ms"] / top if top and row["depth"] == 0 else None
            out.append(row)
        return sorted(out, key=lambda x: (x["depth"], -x["total_ms"]))

    def table(self):
        """A rich table of ``summary()`` (print it with a rich Console)."""
        from rich.table import Table

        t = Table(title=f"opforge timeline ({self.clock} clock: {self.note})")
        for col in ("op", "variant", "calls", "total µs", "mean µs", "% of top-level"):
            t.add_column(col, justify="left" if col in ("op", "variant") else "right")
        for row in self.summary():
            name = ("  " * row["depth"]) + row["op"].split("::")[-1]
            mean = "-" if row["mean_ms"] is None else f"{row['mean_ms'] * 1e3:.1f}"
            pct = "-" if row["pct"] is None else f"{row['pct']:.0f}"
            t.add_row(name, row["variant"], str(row["calls"]), f"{row['total_ms'] * 1e3:.1f}", mean, pct)
        return t

    def to_json(self) -> dict:
        return {"schema_version": 1, "kind": "opforge-timeline", "clock": self.clock, "note": self.note,
                "wall_ms": self.wall_ms, "records": [r.to_dict() for r in self.records],
                "summary": self.summary()}

    def write_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def plot(self, path: str | Path, title: str | None = None) -> None:
        """A Gantt-like PNG: one lane per op name, a bar per call."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        timed = [r for r in self.records if r.ms is not None]
        lanes = list(dict.fromkeys(f"{r.op.split('::')[-1]} [{r.variant}]" for r in timed))
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * max(1, len(lanes))))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for r in timed:
            lane = lanes.index(f"{r.op.split('::')[-1]} [{r.variant}]")
            ax.barh(lane, max(r.ms, 1e-6) * 1e3, left=r.start_ms * 1e3, height=0.6 - 0.15 * r.depth,
                    color=colors[lane % len(colors)], edgecolor="black", linewidth=0.3)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels(lanes, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("µs since the first op (" + self.clock + " clock)")
        ax.set_title(title or f"opforge timeline: {len(timed)} op calls; {self.note}", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)


@contextlib.contextmanager
def timeline():
    """``with timeline() as tl: ...`` then ``tl.table()``, ``tl.to_json()``, ``tl.plot(path)``."""
    tl = Timeline()
    tl._t0 = time.perf_counter()
    HOOKS.append(tl.hook)
    try:
        yield tl
    finally:
        HOOKS.remove(tl.hook)
        tl._stack.clear()
        tl._resolve()
        tl.wall_ms = (time.perf_counter() - tl._t0) * 1e3
        # wall-clock records are relative to the block start; CUDA ones to the
        # first event on their device: both start near zero


def _nvtx_from_env() -> None:
    if os.environ.get("OPFORGE_NVTX", "0").strip().lower() not in ("", "0", "false", "off"):
        from opforge.profile import nvtx

        nvtx.enable()


_nvtx_from_env()
