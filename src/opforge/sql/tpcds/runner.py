"""Run the 99 TPC-DS queries on an opforge.sql connection and on DuckDB, and compare the answers.

The TPC-H runner's pieces do the work (``tpch/runner.py``: warm timing, records, totals;
``tpch/compare.py``: the comparison); only the data, the queries and the reference answers'
cache are TPC-DS's own. A query opforge refuses or fails is recorded with its error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from opforge.sql.tpch import compare as cmp
from opforge.sql.tpch import reference
from opforge.sql.tpch.runner import QueryRecord, measure, register_tables, result
from opforge.sql.tpcds import data

NUMBERS = tuple(range(1, 100))


@dataclass
class DsQueryRecord(QueryRecord):
    """A TPC-H record plus the output names that differ from DuckDB's while the answer is equal:
    DuckDB names an unaliased expression by its own printer (``round((a / b), 2)``), opforge by
    sqlglot's (``ROUND(a / b, 2)``); ``match`` compares values, types and order."""

    name_diffs: list[str] = field(default_factory=list)


def run_tpcds(
    con,
    sf: float = 0.01,
    *,
    root=None,
    numbers=NUMBERS,
    repeats: int = 3,
    warmup: int = 1,
    duckdb_threads: int | None = None,
    on_query: Callable[[QueryRecord], None] | None = None,
) -> dict:
    """Benchmark ``con`` (an unregistered ``opforge.sql.connect(...)``) against DuckDB on TPC-DS.

    Returns ``{"scale_factor", "load": {"opforge_s", "duckdb_s"}, "queries": [QueryRecord...], "total"}``.
    """
    paths = data.generate(sf, root)
    texts = data.queries(sf, root)
    opforge_load = register_tables(con, paths)
    duck, duck_load = reference.connect(paths, threads=duckdb_threads, materialize=True)
    records = []
    for n in numbers:
        record = check_query(con, duck, n, texts[n], repeats=repeats, warmup=warmup)
        records.append(record)
        if on_query is not None:
            on_query(record)
    return result(sf, opforge_load, duck_load, records)


def check_query(con, duck, n: int, text: str, *, repeats: int = 1, warmup: int = 0) -> QueryRecord:
    """One query on both engines: times, DuckDB's row count, and whether opforge's answer equals DuckDB's."""
    record = DsQueryRecord(data.name(n))
    ours, ref = measure(con, duck, text, record, repeats, warmup)
    if ours is None:
        return record
    positions = cmp.order_positions(text)  # by position: an unaliased output's name is each engine's own
    keys = None if positions is None else [ref.column_names[i] for i in positions]
    if ours.num_columns == ref.num_columns:
        record.name_diffs = [f"{a!r}, DuckDB {b!r}" for a, b in zip(ours.column_names, ref.column_names)
                             if a.lower().replace(" ", "") != b.lower().replace(" ", "")]
        ours = ours.rename_columns(ref.column_names)
    record.diffs = cmp.compare(ours, ref, ordered=keys is not None, order_by=keys)
    record.match = not record.diffs
    return record
