"""How a join spreads over several GPUs (Trino's ``join_distribution_type``): broadcast the build
side to every worker, or partition both sides by a hash of the key (all-to-all shuffle), chosen by
the bytes each method moves over the interconnect.

With both inputs spread evenly over ``w`` workers to begin with:
* broadcast: every worker receives the build side's other (w - 1)/w parts: B (w - 1) bytes in
  all; the probe side stays where it is; every worker then holds the whole build side, so it must
  fit one worker's memory;
* partitioned: every worker keeps 1/w of each side and sends the rest: (B + P)(w - 1)/w bytes;
  inputs already partitioned on the join key (co-partitioned) move nothing.

Broadcast wins exactly when B < P / (w - 1): a small dimension against a large fact table.
"""
from __future__ import annotations

from dataclasses import dataclass

DISTRIBUTIONS = ("auto", "broadcast", "partitioned")


@dataclass(frozen=True)
class DistributionChoice:
    method: str  # local | broadcast | partitioned
    bytes_moved: float
    reason: str


def network_bytes(method: str, build_bytes: float, probe_bytes: float, workers: int) -> float:
    """Bytes the method moves between ``workers`` (the module docstring's formulas)."""
    if method == "broadcast":
        return build_bytes * (workers - 1)
    if method == "partitioned":
        return (build_bytes + probe_bytes) * (workers - 1) / workers
    raise ValueError(f"join distribution: method must be 'broadcast' or 'partitioned', got {method!r}")


def choose_distribution(build_bytes: float, probe_bytes: float, workers: int, setting: str = "auto",
                        copartitioned: bool = False, worker_memory: float | None = None) -> DistributionChoice:
    """The method for one join (``setting``: ``connect(join_distribution=...)``'s values)."""
    if setting not in DISTRIBUTIONS:
        raise ValueError(f"join distribution: setting must be one of {DISTRIBUTIONS}, got {setting!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"join distribution: workers must be an int >= 1, got {workers!r}")
    if workers == 1:
        return DistributionChoice("local", 0.0, "one worker: nothing to distribute")
    if copartitioned and setting != "broadcast":
        return DistributionChoice("partitioned", 0.0, "inputs already partitioned on the key: no shuffle")
    broadcast = network_bytes("broadcast", build_bytes, probe_bytes, workers)
    partitioned = network_bytes("partitioned", build_bytes, probe_bytes, workers)
    if setting != "auto":
        moved = broadcast if setting == "broadcast" else partitioned
        return DistributionChoice(setting, moved, f"join_distribution={setting}")
    if worker_memory is not None and build_bytes > worker_memory:
        return DistributionChoice("partitioned", partitioned,
                                  f"build side {build_bytes:.3g} B exceeds a worker's {worker_memory:.3g} B")
    if broadcast < partitioned:
        return DistributionChoice("broadcast", broadcast, f"build {build_bytes:.3g} B < probe / (workers - 1) "
                                                          f"= {probe_bytes / (workers - 1):.3g} B")
    return DistributionChoice("partitioned", partitioned, f"build {build_bytes:.3g} B >= probe / (workers - 1) "
                                                          f"= {probe_bytes / (workers - 1):.3g} B")
