"""Schemas: ``CREATE SCHEMA s``, ``s.t`` and ``main.t``. Why a name prefix and not a catalog per
schema: every other part of the engine (scans, statistics, persistence) already keys tables by one
name, so a table of schema ``s`` is kept as ``s.t`` and one of ``main`` (DuckDB's default schema)
as plain ``t``."""
from __future__ import annotations

from typing import TYPE_CHECKING

from opforge.sql.errors import SqlError

if TYPE_CHECKING:  # connect() imports this module and must not load the parser (tests/sql/test_lazy_connect.py)
    from sqlglot import exp

MAIN = "main"
_CATALOGS = ("memory", "main", "temp")  # DuckDB's name of the in-memory database (and its aliases)


def qualified_name(table: "exp.Table") -> str:
    """The catalog key of a table reference: ``t`` for ``t`` / ``main.t`` / ``memory.main.t``,
    ``s.t`` for ``s.t`` (names lower-case: DuckDB matches them case-insensitively)."""
    name = table.name.lower()
    db = table.args.get("db")
    catalog = table.args.get("catalog")
    if catalog is not None and catalog.name.lower() not in _CATALOGS:
        raise SqlError(f"Catalog Error: catalog {catalog.name!r} does not exist")
    if db is None or db.name.lower() == MAIN:
        return name
    return f"{db.name.lower()}.{name}"


def schema_of(name: str) -> str:
    return name.split(".", 1)[0] if "." in name else MAIN


def create(schemas: set[str], tree: "exp.Create") -> str:
    """CREATE SCHEMA [IF NOT EXISTS] s."""
    name = _schema_name(tree.this)
    if name in schemas:
        if tree.args.get("exists"):
            return f"schema {name} exists"
        raise SqlError(f"Catalog Error: schema {name!r} already exists")
    schemas.add(name)
    return f"created schema {name}"


def drop(con, tree: "exp.Drop") -> str:
    """DROP SCHEMA [IF EXISTS] s [CASCADE]: without CASCADE a schema that holds tables or views is
    refused (DuckDB's Dependency Error); with it they are dropped too."""
    targets = [tree.this] if tree.this is not None else list(tree.args.get("tables") or [])
    for target in targets:
        name = _schema_name(target)
        if name == MAIN:
            raise SqlError("Catalog Error: cannot drop the schema main")
        if name not in con.schemas:
            if tree.args.get("exists"):
                continue
            raise SqlError(f"Catalog Error: schema {name!r} does not exist")
        members = [t for t in list(con._tables) + list(con.views) if schema_of(t.lower()) == name]
        if members and not tree.args.get("cascade"):
            raise SqlError(f"Dependency Error: schema {name!r} holds {', '.join(members)}: use DROP SCHEMA ... CASCADE")
        for t in members:
            con._memory.drop_name(t.lower())
        con.schemas.discard(name)
    return "dropped schema"


def check_schema(schemas: set[str], name: str, verb: str) -> None:
    """A table created in a schema that does not exist is DuckDB's Catalog Error."""
    s = schema_of(name)
    if s not in schemas:
        raise SqlError(f"{verb}: Catalog Error: schema {s!r} does not exist")


def _schema_name(target: "exp.Expression") -> str:
    from sqlglot import exp

    if isinstance(target, exp.Table):
        ident = target.args.get("db") or target.this
        return ident.name.lower()
    return target.name.lower()
