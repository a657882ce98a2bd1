"""TPC-H harness for opforge's SQL engine: data, the 22 queries, DuckDB answers, comparison, benchmark.

    from opforge.sql.tpch import compare, data, queries, reference, runner
    paths = data.generate(0.01)                        # {table: parquet path}, cached
    ref = reference.answer(1, 0.01)                    # DuckDB's answer to Q1, cached as Parquet
    diffs = compare.compare(ours, ref, ordered=True)   # [] when equal

The module names are kept free (no function re-exported under a module's name).
"""

from opforge.sql.tpch.data import SCHEMAS, TABLES, generate, load
from opforge.sql.tpch.queries import NUMBERS, query

__all__ = ["SCHEMAS", "TABLES", "NUMBERS", "generate", "load", "query"]
