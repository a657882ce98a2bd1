"""``*`` and ``t.*`` with DuckDB's modifiers: EXCLUDE (EXCEPT), REPLACE and RENAME.

An unknown or duplicate entry is an error as in DuckDB: ignoring a modifier would silently return
the wrong columns."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr import Ref
from opforge.sql.frontend.scope import ScopeCol


def _entry(e: exp.Expression) -> tuple[str | None, str]:
    """(relation or None, column name), lowercased, of one EXCLUDE / RENAME entry."""
    if isinstance(e, exp.Literal) and e.is_string:
        return None, e.this.lower()
    if isinstance(e, exp.Column) and not isinstance(e.this, exp.Star):
        db = e.args.get("db")
        if db is not None:  # schema.table.column
            return f"{db.name.lower()}.{e.table.lower()}", e.name.lower()
        return (e.table.lower() or None), e.name.lower()
    raise SqlError(f"unexpected entry {e.sql()} in a * modifier")


def _check_duplicates(entries: list[tuple[str | None, str]], clause: str) -> None:
    seen: dict[str, set[str | None]] = {}
    for rel, name in entries:
        rels = seen.setdefault(name, set())
        if rel in rels or (rels and (rel is None or None in rels)):
            raise SqlError(f"Duplicate entry {name!r} in {clause} list")
        rels.add(rel)


def expand_star(star: exp.Star, cols: list[ScopeCol], where: str,
                known: list[ScopeCol] | None = None) -> list[tuple[str, exp.Expression | Ref]]:
    """The select items of one star over ``cols`` (all of the FROM clause, or one table's);
    ``where`` names them in errors ("FROM clause" or the table). ``known``: the columns a modifier
    may name (default ``cols``; also the columns a JOIN ... USING merged away: ``EXCLUDE (t2.a)``)."""
    if star.args.get("ilike") is not None:
        raise NotSupportedError("* ILIKE")
    exclude = [_entry(e) for e in star.args.get("except_") or []]
    replace = {e.alias.lower(): e for e in star.args.get("replace") or []}
    renames = [(_entry(e.this), e.alias) for e in star.args.get("rename") or []]
    _check_duplicates(exclude, "EXCLUDE")
    _check_duplicates([(None, a.alias.lower()) for a in star.args.get("replace") or []], "REPLACE")
    _check_duplicates([r for r, _ in renames], "RENAME")
    for rel, name in exclude:
        if name in replace:
            raise SqlError(f"column {name!r} cannot occur in both EXCLUDE and REPLACE list")

    def matches(c: ScopeCol, entry) -> bool:
        rel, name = entry
        if rel is not None and "." in rel:
            return c.name_key == name and f"{c.schema}.{c.relation_key}" == rel
        return c.name_key == name and (rel is None or c.relation_key == rel)

    for rel, name in exclude + [r for r, _ in renames] + [(None, n) for n in replace]:
        if not any(matches(c, (rel, name)) for c in (known if known is not None else cols)):
            full = f"{rel}.{name}" if rel else name
            raise SqlError(f"column {full!r} in the * modifier not found in {where}")
    items: list[tuple[str, exp.Expression | Ref]] = []
    for c in cols:
        if any(matches(c, e) for e in exclude):
            continue
        if c.name_key in replace:
            items.append((replace[c.name_key].alias, replace[c.name_key].this))
            continue
        name = next((alias for e, alias in renames if matches(c, e)), c.name)
        items.append((name, Ref(c.cid, c.type, name)))
    return items
