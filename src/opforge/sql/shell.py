"""``opforge sql``: run one query, or an interactive shell in the habits of
DuckDB's and SQLite's: statements end with ``;`` (multi-line input),
``.tables``, ``.schema [name]``, ``.timer on|off``, ``.explain QUERY``,
``.quit``; history through readline when the platform has it."""

from __future__ import annotations

import time
from typing import Callable, Iterable

import pyarrow as pa
from rich.console import Console
from rich.table import Table as RichTable

from opforge.sql.connection import Connection, connect
from opforge.sql.errors import SqlError

MAX_ROWS = 40


def open_connection(tables: Iterable[str], device: str | None) -> Connection:
    """A connection with ``name=path`` tables registered."""
    con = connect(device)
    for spec in tables:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"opforge sql: --table expects name=path, got {spec!r}")
        con.register(name, path)
    return con


def render(result: pa.Table, console: Console, max_rows: int = MAX_ROWS) -> None:
    table = RichTable(*result.column_names)
    for row in result.slice(0, max_rows).to_pylist():
        table.add_row(*["NULL" if v is None else str(v) for v in row.values()])
    console.print(table)
    more = f" (first {max_rows} shown)" if result.num_rows > max_rows else ""
    console.print(f"{result.num_rows} row{'s' if result.num_rows != 1 else ''}{more}")


def run_statement(con: Connection, text: str, console: Console, *, timer: bool = True) -> None:
    start = time.perf_counter()
    rel = con.sql(text)
    if rel.plan is None:
        console.print(rel.explain(), markup=False)
        return
    result = rel.to_arrow()
    elapsed = time.perf_counter() - start
    render(result, console)
    if timer:
        console.print(f"[dim]{elapsed * 1e3:.1f} ms (parse, plan, run, result to host) on {con.device}[/dim]")


def schema(con: Connection, name: str | None) -> str:
    names = [name] if name else con.tables()
    lines = []
    for n in names:
        if n in con._tables:
            t = con._tables[n]
            cols = ", ".join(f"{c} {typ}" for c, typ in zip(t.names, t.types))
            lines.append(f"{n}({cols})  -- {t.num_rows} rows")
        elif n.lower() in con.views:
            lines.append(f"VIEW {n} AS {con.views[n.lower()].sql(dialect='duckdb')}")
        else:
            lines.append(f"no table or view named {n!r}")
    return "\n".join(lines)


def shell(con: Connection, console: Console, read: Callable[[str], str] = input) -> int:
    """The read-eval-print loop; ``read`` is ``input`` (with readline history) or a test's feed."""
    try:
        import readline  # noqa: F401  (history and line editing for input())
    except ImportError:
        pass
    console.print(f"opforge sql on {con.device}: end statements with ';', .help for commands")
    timer, buffer = True, []
    while True:
        try:
            line = read("... " if buffer else "sql> ")
        except EOFError:
            return 0
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            cmd, _, arg = stripped.partition(" ")
            if cmd in (".quit", ".exit"):
                return 0
            if cmd == ".tables":
                console.print("  ".join(con.tables()) or "(no tables)")
            elif cmd == ".schema":
                console.print(schema(con, arg.strip() or None))
            elif cmd == ".timer":
                timer = arg.strip().lower() != "off"
            elif cmd == ".explain":
                _guard(console, lambda: console.print(con.sql(arg.rstrip(";")).explain(), markup=False))
            else:
                console.print(".tables  .schema [name]  .timer on|off  .explain QUERY  .quit")
            continue
        buffer.append(line)
        if stripped.endswith(";"):
            text = "\n".join(buffer).strip().rstrip(";")
            buffer = []
            _guard(console, lambda: run_statement(con, text, console, timer=timer))


def _guard(console: Console, fn: Callable[[], None]) -> None:
    try:
        fn()
    except (SqlError, ValueError, TypeError) as e:  # SqlError and NotSupportedError are ValueErrors
        console.print(f"{type(e).__name__}: {e}", style="red", markup=False)
