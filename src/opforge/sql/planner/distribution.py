"""How a join spreads over several GPUs (Trino's ``join_distribution_type``): broadcast the build
side to every worker, or partition both sides by a hash of the key (all-to-all shuffle), chosen by
each method's estimated time on one worker.

With both inputs (B and P bytes) spread evenly over ``w`` workers to begin with:
* broadcast: every worker receives the build side's other (w - 1)/w parts (B (w - 1) bytes in all)
  and builds a table over the whole build side; its probe rows stay where they are. The whole
  build side must fit one worker's memory;
* partitioned: every worker hashes and scatters its rows of both sides by destination, sends the
  (w - 1)/w that belong elsewhere ((B + P)(w - 1)/w bytes in all), then builds over B/w and
  probes P/w; inputs already partitioned on the join key (co-partitioned) move nothing.

Counting bytes alone (broadcast while B < P / (w - 1)) is the rule for clusters whose network is
the bottleneck. Over NVLink the bytes are cheap and the work is not: on two H200s the shuffle's
hash + scatter of the probe side costs more than building the whole build side, and broadcast won
at every measured size up to B = 2P (``benchmarks/dist_join.py``; results in
``benchmarks/results/h200x2-2026-11-30-dist-join.json``). So the rule compares times: bytes over
the link plus per-byte build, shuffle and probe costs (:class:`Interconnect`, fitted to that run).
With more workers the partitioned method's 1/w share of the work wins for large build sides.
"""
from __future__ import annotations

from dataclasses import dataclass

DISTRIBUTIONS = ("auto", "broadcast", "partitioned")


@dataclass(frozen=True)
class DistributionChoice:
    method: str  # local | broadcast | partitioned
    bytes_moved: float
    reason: str


@dataclass(frozen=True)
class Interconnect:
    """Seconds per byte of each step on one worker, and the link's bytes per second. Defaults:
    2 H200s over NVLink, 16-byte rows (key + row id), measured 2026-11-30: an all-gather moved
    ~206 GB/s; the broadcast join's time grew 0.42 ns per build row (gather + build) over 0.13 ns
    per probe row; the partitioned join's shuffle of the probe side cost 0.36 ns a row."""

    link_bytes_per_s: float = 200e9
    build_s_per_byte: float = 0.39e-9 / 16
    shuffle_s_per_byte: float = 0.36e-9 / 16
    probe_s_per_byte: float = 0.13e-9 / 16


NVLINK_H200 = Interconnect()


def network_bytes(method: str, build_bytes: float, probe_bytes: float, workers: int) -> float:
    """Bytes the method moves between ``workers`` (the module docstring's formulas)."""
    if method == "broadcast":
        return build_bytes * (workers - 1)
    if method == "partitioned":
        return (build_bytes + probe_bytes) * (workers - 1) / workers
    raise ValueError(f"join distribution: method must be 'broadcast' or 'partitioned', got {method!r}")


def worker_seconds(method: str, build_bytes: float, probe_bytes: float, workers: int,
                   link: Interconnect = NVLINK_H200) -> float:
    """Estimated seconds of one worker's share of the join (the module docstring's steps)."""
    moved = network_bytes(method, build_bytes, probe_bytes, workers) / workers / link.link_bytes_per_s
    probe = probe_bytes / workers * link.probe_s_per_byte
    if method == "broadcast":
        return moved + build_bytes * link.build_s_per_byte + probe
    return (moved + (build_bytes + probe_bytes) / workers * link.shuffle_s_per_byte
            + build_bytes / workers * link.build_s_per_byte + probe)


def choose_distribution(build_bytes: float, probe_bytes: float, workers: int, setting: str = "auto",
                        copartitioned: bool = False, worker_memory: float | None = None,
                        link: Interconnect = NVLINK_H200) -> DistributionChoice:
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
    t_b = worker_seconds("broadcast", build_bytes, probe_bytes, workers, link)
    t_p = worker_seconds("partitioned", build_bytes, probe_bytes, workers, link)
    times = f"est. {t_b * 1e3:.3g} ms broadcast vs {t_p * 1e3:.3g} ms partitioned a worker"
    if t_b <= t_p:
        return DistributionChoice("broadcast", broadcast, f"{times}; build {build_bytes:.3g} B fits a worker")
    return DistributionChoice("partitioned", partitioned, times)
