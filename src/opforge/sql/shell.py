"""``opforge sql``: run one query, or an interactive shell in the habits of
DuckDB's and SQLite's: statements end with ``;`` (multi-line input),
``.tables``, ``.schema [name]``, ``.register NAME PATH``, ``.timer on|off``,
``.explain QUERY``, ``.quit``; history through readline when the platform has it.

The shell survives everything but EOF (and ``.quit``): an error in a statement
or a command is one line (its traceback too with ``debug``), Ctrl-C at the
prompt drops the statement being typed, and Ctrl-C during a statement stops it;
the session (tables, views, settings) stays."""

from __future__ import annotations

import time
import traceback
from typing import Callable, Iterable

import pyarrow as pa
from rich.console import Console
from rich.table import Table as RichTable

from opforge.sql.connection import Connection, connect
from opforge.sql.errors import SqlError

MAX_ROWS = 40


def open_connection(tables: Iterable[str], device: str | None,
                    on_error: Callable[[str, Exception], None] | None = None) -> Connection:
    """A connection with ``name=path`` tables registered. A table that cannot be
    loaded raises, or with ``on_error`` is reported as ``on_error(spec, error)``
    and left out (the interactive shell still opens)."""
    con = connect(device)
    for spec in tables:
        try:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"opforge sql: --table expects name=path, got {spec!r}")
            _register(con, name, path)
        except Exception as e:
            if on_error is None:
                raise
            on_error(spec, e)
    return con


def _register(con: Connection, name: str, path: str) -> None:
    try:
        con.register(name, path)
    except Exception as e:  # pyarrow's errors for a corrupt or unreadable file do not name it
        if path in str(e):
            raise
        raise ValueError(f"cannot load table {name!r} from {path}: {type(e).__name__}: {e}") from e


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


HELP = ".tables  .schema [name]  .register NAME PATH  .timer on|off  .explain QUERY  .quit"


def shell(con: Connection, console: Console, read: Callable[[str], str] = input, *, debug: bool = False) -> int:
    """The read-eval-print loop; ``read`` is ``input`` (with readline history) or a test's feed.
    Returns 0 at EOF or ``.quit``; nothing else ends it."""
    try:
        import readline  # noqa: F401  (history and line editing for input())
    except ImportError:
        pass
    console.print(f"opforge sql on {con.device}: end statements with ';', .help for commands")
    state = {"timer": True}
    buffer: list[str] = []
    while True:
        try:
            line = read("... " if buffer else "sql> ")
        except EOFError:
            return 0
        except KeyboardInterrupt:  # as in DuckDB and SQLite: drop what was typed, keep the session
            console.print("^C", markup=False, highlight=False)
            buffer = []
            continue
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            if _guard(console, lambda: _command(con, console, stripped, state), debug) == "quit":
                return 0
            continue
        buffer.append(line)
        if stripped.endswith(";"):
            text = "\n".join(buffer).strip().rstrip(";")
            buffer = []
            _guard(console, lambda: run_statement(con, text, console, timer=state["timer"]), debug)


def _command(con: Connection, console: Console, line: str, state: dict) -> str | None:
    """One dot command; ``"quit"`` ends the shell."""
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    if cmd in (".quit", ".exit"):
        return "quit"
    if cmd == ".tables":
        console.print("  ".join(con.tables()) or "(no tables)", markup=False)
    elif cmd == ".schema":
        console.print(schema(con, arg or None), markup=False)
    elif cmd == ".timer":
        state["timer"] = arg.lower() != "off"
    elif cmd == ".explain":
        console.print(con.sql(arg.rstrip(";")).explain(), markup=False)
    elif cmd == ".register":
        name, _, path = arg.partition(" ")
        if not name or not path.strip():
            raise ValueError("usage: .register NAME PATH (a .parquet or .csv file)")
        _register(con, name, path.strip())
        console.print(f"registered {name}", markup=False)
    else:
        console.print(HELP, markup=False)
    return None


def describe_error(e: BaseException) -> str:
    """One line for a user: the error's type and message (a RecursionError says what it means)."""
    if isinstance(e, RecursionError):
        return "RecursionError: expression too deeply nested for the parser (maximum recursion depth exceeded)"
    text = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {text}"


def _guard(console: Console, fn: Callable[[], object], debug: bool = False):
    """Run ``fn``; any error is one line (with its traceback under ``debug``), Ctrl-C stops it."""
    try:
        return fn()
    except KeyboardInterrupt:
        console.print("interrupted", style="yellow", markup=False, highlight=False)
    except Exception as e:  # noqa: BLE001 - the shell survives everything but EOF
        if debug:
            console.print("".join(traceback.format_exception(e)), markup=False, highlight=False)
        console.print(describe_error(e), style="red", markup=False, highlight=False)
    return None
