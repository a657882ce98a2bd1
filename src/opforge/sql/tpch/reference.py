"""DuckDB's answers to the TPC-H queries: the reference every engine result is compared with.

DuckDB runs in memory on the very Parquet files our engine reads. Answers are
cached as Parquet next to the data, keyed by the query text and DuckDB's
version, so a changed text or a new DuckDB never serves a stale answer.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.sql.tpch import data, queries


def connect(paths: dict[str, str | os.PathLike], *, threads: int | None = None, materialize: bool = True):
    """An in-memory DuckDB with the TPC-H tables registered from ``paths`` ({table: parquet}).

    ``materialize`` loads each table into DuckDB's memory (as in the benchmark:
    both engines hold their tables in memory); otherwise tables are views over
    the files. Returns ``(connection, load_seconds)``.
    """
    import duckdb

    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    started = time.perf_counter()
    for name, path in paths.items():
        kind = "TABLE" if materialize else "VIEW"
        files = Path(path) / "*.parquet" if Path(path).is_dir() else Path(path)  # a table in parts: its folder
        literal = str(files).replace("'", "''")
        con.execute(f'CREATE {kind} "{name}" AS SELECT * FROM read_parquet(\'{literal}\')')
    return con, time.perf_counter() - started


def run(con, sql: str) -> pa.Table:
    """Run ``sql`` on a DuckDB connection and return the result as a pyarrow table."""
    return con.sql(sql).to_arrow_table()


def _answer_path(n: int, sf: float, root) -> Path:
    import duckdb

    digest = hashlib.sha256(f"{duckdb.__version__}\n{queries.query(n)}".encode()).hexdigest()[:12]
    return data.data_dir(sf, root) / "answers" / f"{queries.name(n)}-{digest}.parquet"


def cached_answer(n: int, sf: float, root: str | os.PathLike | None = None) -> pa.Table | None:
    """DuckDB's cached answer to query ``n`` (None when it was never computed by this DuckDB)."""
    path = _answer_path(n, sf, root)
    return pq.read_table(path) if path.is_file() else None


def save_answer(n: int, sf: float, root: str | os.PathLike | None, table: pa.Table) -> None:
    """Caches DuckDB's answer to query ``n`` (written aside, then renamed: never half a file)."""
    path = _answer_path(n, sf, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def answer(n: int, sf: float = 0.01, root: str | os.PathLike | None = None, *, con=None) -> pa.Table:
    """DuckDB's answer to TPC-H query ``n`` at scale factor ``sf``, cached as Parquet.

    ``con``: an open connection from :func:`connect` to reuse across queries.
    """
    cached = cached_answer(n, sf, root)
    if cached is not None:
        return cached
    if con is None:
        con, _ = connect(data.generate(sf, root), materialize=False)
    table = run(con, queries.query(n))
    save_answer(n, sf, root, table)
    return table


def answers(sf: float = 0.01, root: str | os.PathLike | None = None, numbers=queries.NUMBERS) -> dict[int, pa.Table]:
    """Answers to several queries over one DuckDB connection."""
    missing = [n for n in numbers if not _answer_path(n, sf, root).is_file()]
    con = connect(data.generate(sf, root), materialize=False)[0] if missing else None
    return {n: answer(n, sf, root, con=con) for n in numbers}
