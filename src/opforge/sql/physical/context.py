"""Execution options shared by the physical operators, and the notes they leave for EXPLAIN ANALYZE."""
from __future__ import annotations

from dataclasses import dataclass, field

from opforge.sql.physical import joins

JOIN_DISTRIBUTIONS = ("auto", "broadcast", "partitioned")
DEFAULT_SKEW_THRESHOLD = 0.1


@dataclass
class ExecContext:
    """``memory_budget``: bytes one hash table (a join's build side, an aggregation's group table)
    may take before the operator radix-partitions its input; None = unlimited.
    ``join_algorithm``: "auto" (the planner's choice for the joins it planned, the rule in
    ``physical/join.py`` for the others) or one algorithm forced for every equi-join (a user
    override). ``runtime_filters``: build-side filters pushed into probe-side scans.
    ``skew_threshold``: a probe key value holding more than this share of the probe rows is
    handled apart in partitioned joins (None: no skew handling). ``workers`` /
    ``join_distribution``: the simulated multi-worker mode (``physical/simulated_workers.py``).
    ``memory_limit``: device bytes the query's data may take (None: no limit): above it scans read
    in chunks and joins / aggregations partition and spill (``sql/outofcore``), spilling to host
    memory up to ``spill_host_limit`` bytes, then to files under ``spill_dir`` (None: the system
    temp dir). ``notes``: what each operator chose (algorithm, partitions), read by EXPLAIN; ``metrics``:
    the same as numbers (rows read, partitions skipped, ...), read by EXPLAIN ANALYZE and tests."""

    memory_budget: int | None = None
    join_algorithm: str = "auto"
    runtime_filters: bool = True
    skew_threshold: float | None = DEFAULT_SKEW_THRESHOLD
    workers: int = 1
    join_distribution: str = "auto"
    memory_limit: int | None = None
    spill_host_limit: int | None = None
    spill_dir: str | None = None
    notes: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def count(self, name: str, value) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + value


def check_options(memory_budget, join_algorithm, runtime_filters=True, skew_threshold=DEFAULT_SKEW_THRESHOLD,
                  workers=1, join_distribution="auto") -> None:
    """Clear errors for bad connection options (named as ``opforge.sql.connect`` takes them)."""
    if memory_budget is not None:
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, int):
            raise TypeError(f"opforge.sql.connect: memory_budget must be an int number of bytes or None, "
                            f"got {type(memory_budget).__name__}")
        if memory_budget <= 0:
            raise ValueError(f"opforge.sql.connect: memory_budget must be > 0 bytes, got {memory_budget}")
    allowed = ("auto", *joins.names())  # the planner's choice, or one registered algorithm forced
    if join_algorithm not in allowed:
        raise ValueError(f"opforge.sql.connect: join_algorithm must be one of {allowed}, "
                         f"got {join_algorithm!r}")
    if not isinstance(runtime_filters, bool):
        raise TypeError(f"opforge.sql.connect: runtime_filters must be True or False, got {runtime_filters!r}")
    if skew_threshold is not None:
        if isinstance(skew_threshold, bool) or not isinstance(skew_threshold, (int, float)) \
                or not 0 < skew_threshold <= 1:
            raise ValueError(f"opforge.sql.connect: skew_threshold must be a share in (0, 1] or None, "
                             f"got {skew_threshold!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"opforge.sql.connect: workers must be an int >= 1, got {workers!r}")
    if join_distribution not in JOIN_DISTRIBUTIONS:
        raise ValueError(f"opforge.sql.connect: join_distribution must be one of {JOIN_DISTRIBUTIONS}, "
                         f"got {join_distribution!r}")
