"""Run generated queries on opforge.sql and on DuckDB over the same tables and classify each answer.

Outcomes: ``match``; ``mismatch`` (both ran, the answers differ: the query and both answers are
kept); ``refused`` (opforge raised a ``SqlError``, e.g. ``NotSupportedError``: a clear refusal,
counted but not a failure); ``crash`` (opforge raised anything else: a failure, like a mismatch);
``invalid`` (DuckDB rejected the query: a grammar slip, counted apart). Answers are compared with
the TPC-H comparison (``tpch/compare.py``): types by class, floats to 1e-9 relative, NULL = NULL,
row order only when ORDER BY covers every output column.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from opforge.sql.errors import SqlError
from opforge.sql.fuzz import grammar, tables
from opforge.sql.tpch import compare

SHOWN_ROWS = 8


@dataclass
class Outcome:
    index: int
    sql: str
    kind: str  # match, mismatch, refused, crash, invalid
    detail: str = ""
    ours: pa.Table | None = None
    reference: pa.Table | None = None

    def report(self) -> str:
        """The query, what went wrong and, for a mismatch, both answers (first rows)."""
        lines = [f"[{self.index}] {self.kind.upper()}: {self.sql}", self.detail]
        for label, t in (("opforge", self.ours), ("duckdb", self.reference)):
            if t is not None:
                lines.append(f"  {label} ({t.num_rows} rows): {_preview(t)}")
        return "\n".join(lines)


def _preview(t: pa.Table) -> str:
    rows = t.slice(0, SHOWN_ROWS).to_pylist()
    return ", ".join(str(tuple(r.values())) for r in rows) + (" ..." if t.num_rows > SHOWN_ROWS else "")


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(o.kind for o in self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind in ("mismatch", "crash")]

    def refusal_reasons(self, width: int = 90) -> Counter:
        return Counter(o.detail[:width] for o in self.outcomes if o.kind == "refused")


class Differ:
    """opforge and DuckDB connections holding the same fuzz tables."""

    def __init__(self, fuzz_tables: tables.FuzzTables, device: str = "cpu"):
        import duckdb

        import opforge.sql as sql

        self.tables = fuzz_tables
        self.con = sql.connect(device)
        self.duck = duckdb.connect()
        self.duck.execute("SET threads = 1")  # tiny tables: threads only add start-up cost
        for name, t in fuzz_tables.tables.items():
            self.con.register(name, t)
            self.duck.register(f"{name}_arrow", t)
            self.duck.execute(f"CREATE TABLE {name} AS SELECT * FROM {name}_arrow")

    def check(self, index: int, query: grammar.Query) -> Outcome:
        try:
            ref = self.duck.sql(query.sql).to_arrow_table()
        except Exception as exc:  # noqa: BLE001 - DuckDB's refusal means the generated text is invalid
            return Outcome(index, query.sql, "invalid", f"DuckDB: {exc}")
        try:
            ours = self.con.sql(query.sql).to_arrow()
        except SqlError as exc:
            return Outcome(index, query.sql, "refused", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - any other error is a failure, reported with its origin
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return Outcome(index, query.sql, "crash",
                           f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})", None, ref)
        keys = query.columns if query.ordered else None
        diffs = compare.compare(ours, ref, ordered=query.ordered, order_by=keys)
        if diffs:
            return Outcome(index, query.sql, "mismatch", "\n".join("  " + d for d in diffs), ours, ref)
        return Outcome(index, query.sql, "match")


    def run(self, count: int, seed: int = 0, on_outcome: Callable[[Outcome], None] | None = None) -> Summary:
        """Check ``count`` queries made from ``seed``."""
        summary = Summary()
        for index, query in grammar.queries(self.tables, count, seed):
            outcome = self.check(index, query)
            summary.outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
        return summary


def run(paths: dict, count: int, seed: int = 0, *, device: str = "cpu",
        on_outcome: Callable[[Outcome], None] | None = None) -> Summary:
    """Generate ``count`` queries from ``seed`` over the fuzz tables made from TPC-H files ``paths``."""
    return Differ(tables.build(paths), device).run(count, seed, on_outcome)
