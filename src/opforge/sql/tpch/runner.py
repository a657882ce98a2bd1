"""Run the 22 TPC-H queries on an opforge.sql connection and on DuckDB, warm, and record both.

Each query is timed end to end (parse + plan + execute + result to host as an
Arrow table) after ``warmup`` untimed runs; within each timed run, opforge's
parse + plan (``con.sql``) is noted as well, the host-only share of the time.
Loading the tables is timed separately. Every opforge answer is compared with DuckDB's, so a benchmark
record always says whether the timed result was right.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import pyarrow as pa

from opforge.sql.tpch import compare as cmp
from opforge.sql.tpch import data, queries, reference


@dataclass
class QueryRecord:
    """One query on both engines: times in milliseconds, ``None`` where the engine failed."""

    query: str
    rows: int | None = None
    opforge_ms: list[float] = field(default_factory=list)
    opforge_plan_ms: list[float] = field(default_factory=list)  # parse + plan within each timed run
    duckdb_ms: list[float] = field(default_factory=list)
    match: bool | None = None
    diffs: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def opforge_median_ms(self) -> float | None:
        return statistics.median(self.opforge_ms) if self.opforge_ms else None

    @property
    def duckdb_median_ms(self) -> float | None:
        return statistics.median(self.duckdb_ms) if self.duckdb_ms else None

    @property
    def speedup(self) -> float | None:
        """DuckDB time / opforge time (> 1: opforge is faster)."""
        ours, theirs = self.opforge_median_ms, self.duckdb_median_ms
        return theirs / ours if ours and theirs else None

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(opforge_median_ms=self.opforge_median_ms, duckdb_median_ms=self.duckdb_median_ms, speedup=self.speedup)
        return out


def _result_table(result) -> pa.Table:
    """opforge's ``.to_arrow()``; DuckDB-style ``.to_arrow_table()`` for stand-in engines."""
    if hasattr(result, "to_arrow"):
        return result.to_arrow()
    return result.to_arrow_table()


def time_query(run: Callable[[], pa.Table], repeats: int, warmup: int) -> tuple[list[float], pa.Table]:
    """Median-ready wall times (ms) of ``repeats`` runs after ``warmup`` untimed ones, and the last result."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"tpch.runner: repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    result = None
    for _ in range(warmup):
        result = run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - started) * 1e3)
    return times, result


def register_tables(con, paths: dict) -> float:
    """Register every table on an opforge connection; returns the seconds it took."""
    started = time.perf_counter()
    for name, path in paths.items():
        con.register(name, str(path))
    return time.perf_counter() - started


def run_tpch(
    con,
    sf: float = 0.01,
    *,
    root=None,
    numbers=queries.NUMBERS,
    repeats: int = 3,
    warmup: int = 1,
    duckdb_threads: int | None = None,
    on_query: Callable[[QueryRecord], None] | None = None,
) -> dict:
    """Benchmark ``con`` (an unregistered ``opforge.sql.connect(...)``) against DuckDB.

    Returns ``{"scale_factor", "load": {"opforge_s", "duckdb_s"}, "queries": [QueryRecord...],
    "total": {...}}``. A query the engine rejects (``NotSupportedError`` or any
    other error) is recorded with its error and DuckDB's time; the run goes on.
    """
    paths = data.generate(sf, root)
    opforge_load = register_tables(con, paths)
    duck, duck_load = reference.connect(paths, threads=duckdb_threads, materialize=True)
    records = []
    for n in numbers:
        text = queries.query(n)
        record = QueryRecord(queries.name(n))
        ours, ref = measure(con, duck, text, record, repeats, warmup)
        if ours is not None:
            keys = cmp.order_keys(text)
            record.diffs = cmp.compare(ours, ref, ordered=keys is not None, order_by=keys)
            record.match = not record.diffs
        records.append(record)
        if on_query is not None:
            on_query(record)
    return result(sf, opforge_load, duck_load, records)


def result(sf: float, opforge_load: float, duck_load: float, records: list[QueryRecord]) -> dict:
    """A run's summary: what ``run_tpch`` (and the TPC-DS runner) return."""
    return {
        "scale_factor": float(sf),
        "load": {"opforge_s": opforge_load, "duckdb_s": duck_load},
        "queries": records,
        "total": totals(records),
    }


def measure(con, duck, text: str, record: QueryRecord, repeats: int, warmup: int) -> tuple[pa.Table | None, pa.Table]:
    """Time ``text`` on DuckDB and on ``con`` into ``record``; returns (opforge's answer, DuckDB's).
    An opforge error is recorded in ``record.error`` and its answer is None."""
    record.duckdb_ms, ref = time_query(lambda: reference.run(duck, text), repeats, warmup)
    record.rows = ref.num_rows
    plan_ms = []

    def ours_once():
        started = time.perf_counter()
        planned = con.sql(text)
        plan_ms.append((time.perf_counter() - started) * 1e3)
        return _result_table(planned)

    try:
        record.opforge_ms, ours = time_query(ours_once, repeats, warmup)
    except Exception as exc:  # noqa: BLE001 - recorded, the benchmark covers every query
        record.error = f"{type(exc).__name__}: {exc}"
        return None, ref
    record.opforge_plan_ms = plan_ms[warmup:]
    return ours, ref


def totals(records: list[QueryRecord]) -> dict:
    """Sums of the per-query medians over the queries both engines ran."""
    both = [r for r in records if r.opforge_ms and r.duckdb_ms]
    ours = sum(r.opforge_median_ms for r in both)
    theirs = sum(r.duckdb_median_ms for r in both)
    return {
        "queries_run": len(both),
        "queries_matching": sum(1 for r in records if r.match),
        "opforge_ms": ours,
        "opforge_plan_ms": sum(statistics.median(r.opforge_plan_ms) for r in both if r.opforge_plan_ms),
        "duckdb_ms": theirs,
        "speedup": theirs / ours if ours else None,
        "slower_than_duckdb": [r.query for r in both if r.speedup is not None and r.speedup < 1],
    }
