"""SQL-level prepared statements: ``PREPARE p AS <statement with ? / $n>``, ``EXECUTE p(args)``,
``DEALLOCATE [PREPARE] p``. The statement's text is kept and run with the arguments as its
parameters (``sql/parameters.py``: values bound as typed literals, never spliced into the text)."""
from __future__ import annotations

import re

from opforge.sql.errors import SqlError

_PREPARE = re.compile(r"^\s*PREPARE\s+(\w+)\s+AS\s+(.*?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_EXECUTE = re.compile(r"^\s*EXECUTE\s+(\w+)\s*(?:\((.*)\))?\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_DEALLOCATE = re.compile(r"^\s*DEALLOCATE\s+(?:PREPARE\s+)?(\w+)\s*;?\s*$", re.IGNORECASE)


def run(con, text: str):
    """The Relation of a PREPARE / EXECUTE / DEALLOCATE statement, None for any other text."""
    from opforge.sql.connection import Relation

    m = _PREPARE.match(text)
    if m:
        name, body = m.group(1).lower(), m.group(2)
        if body.lstrip()[:6].upper() == "SELECT" and "?" not in body and "$" not in body:
            con.sql(f"EXPLAIN {body}")  # a query without parameters is checked now: DuckDB binds it at PREPARE
        con.prepared[name] = body
        return Relation(con, None, f"prepared {name}")
    m = _EXECUTE.match(text)
    if m:
        name = m.group(1).lower()
        if name not in con.prepared:
            raise SqlError(f"EXECUTE: no prepared statement named {name!r}")
        args = m.group(2)
        params = list(con.sql(f"SELECT {args}").fetchall()[0]) if args and args.strip() else None
        return con.sql(con.prepared[name], params)
    m = _DEALLOCATE.match(text)
    if m:
        if con.prepared.pop(m.group(1).lower(), None) is None:
            raise SqlError(f"DEALLOCATE: no prepared statement named {m.group(1)!r}")
        return Relation(con, None, "deallocated")
    return None
