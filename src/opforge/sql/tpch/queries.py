"""The 22 TPC-H queries with the specification's validation (qualification) parameters.

Texts follow the TPC-H specification (section 2.4) in DuckDB's dialect: date
literals ``date 'YYYY-MM-DD'``, intervals ``interval 'n' day|month|year``
without the spec's ``(3)`` precision, Q15's view written as a CTE. Each parses
with ``sqlglot.parse_one(text, read="duckdb")``. Q11's FRACTION is the
validation value 0.0001 at every scale factor, as in DuckDB's tpch extension.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

NUMBERS = tuple(range(1, 23))


def name(n: int) -> str:
    """``1 -> 'q01'``: the file stem, the test id and the benchmark key of query ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n not in NUMBERS:
        raise ValueError(f"tpch.query: n must be an integer in 1..22, got {n!r}")
    return f"q{n:02d}"


def query(n: int) -> str:
    """The text of TPC-H query ``n`` (1..22): one SELECT statement, no trailing semicolon."""
    return _read(name(n))  # validate before the cache: 1.0 and True hash like 1


@lru_cache(maxsize=None)
def _read(stem: str) -> str:
    text = resources.files(__package__).joinpath("queries", f"{stem}.sql").read_text(encoding="utf-8")
    return text.strip().rstrip(";")


def queries() -> dict[int, str]:
    """All 22 texts, ``{n: text}``."""
    return {n: query(n) for n in NUMBERS}
