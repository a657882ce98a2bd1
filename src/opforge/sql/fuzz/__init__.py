"""The differential fuzzer: random queries over (a NULL-bearing slice of) TPC-H, each answered by
opforge.sql and by DuckDB and compared. ``python -m opforge.sql.fuzz --queries N --seed S``."""
from opforge.sql.fuzz.differ import Differ, Outcome, Summary, run

__all__ = ["Differ", "Outcome", "Summary", "run"]
