"""Execution options shared by the physical operators, and the notes they leave for EXPLAIN ANALYZE."""
from __future__ import annotations

from dataclasses import dataclass, field

JOIN_ALGORITHMS = ("auto", "hash", "merge", "nested_loop")


@dataclass
class ExecContext:
    """``memory_budget``: bytes one hash table (a join's build side, an aggregation's group table)
    may take before the operator radix-partitions its input; None = unlimited.
    ``join_algorithm``: "auto" (the rule in ``physical/join.py``) or one algorithm forced for
    every equi-join. ``notes``: what each operator chose (algorithm, partitions), read by EXPLAIN."""

    memory_budget: int | None = None
    join_algorithm: str = "auto"
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)


def check_options(memory_budget, join_algorithm) -> None:
    """Clear errors for bad connection options (named as ``opforge.sql.connect`` takes them)."""
    if memory_budget is not None:
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, int):
            raise TypeError(f"opforge.sql.connect: memory_budget must be an int number of bytes or None, "
                            f"got {type(memory_budget).__name__}")
        if memory_budget <= 0:
            raise ValueError(f"opforge.sql.connect: memory_budget must be > 0 bytes, got {memory_budget}")
    if join_algorithm not in JOIN_ALGORITHMS:
        raise ValueError(f"opforge.sql.connect: join_algorithm must be one of {JOIN_ALGORITHMS}, "
                         f"got {join_algorithm!r}")
