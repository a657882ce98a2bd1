"""Name resolution: the columns visible in a query block, with a parent scope for correlated references."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from opforge.sql import types as T
from opforge.sql.errors import SqlError
from opforge.sql.expr import Ref


@dataclass
class ScopeCol:
    relation: str  # table alias ("" for unnamed)
    name: str
    cid: int
    type: T.SqlType
    # merged into another column by JOIN ... USING / NATURAL JOIN: found by its qualified name and
    # by rel.*, not by its bare name or by *
    hidden: bool = field(default=False, compare=False)
    # the schema of a table read under its own name (``s.t.c`` finds it); "" under an alias
    schema: str = field(default="", compare=False)
    # lowercased relation and name, the keys of case-insensitive lookups (every column reference
    # scans the scope's columns)
    relation_key: str = field(init=False, repr=False, compare=False)
    name_key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.relation_key, self.name_key = self.relation.lower(), self.name.lower()


@dataclass
class Scope:
    cols: list[ScopeCol] = field(default_factory=list)
    parent: "Scope | None" = None
    outer_refs: list[int] = field(default_factory=list)  # cids resolved in an enclosing scope

    def cids(self) -> set[int]:
        return {c.cid for c in self.cols}

    def _find(self, name: str, relation: str | None, schema: str | None = None) -> list[ScopeCol]:
        name = name.lower()
        if relation is None:
            return [c for c in self.cols if c.name_key == name and not c.hidden]
        relation = relation.lower()
        return [c for c in self.cols if c.name_key == name and c.relation_key == relation
                and (schema is None or c.schema == schema.lower())]

    def resolve(self, name: str, relation: str | None = None, schema: str | None = None) -> Ref:
        hits = self._find(name, relation, schema)
        if len({h.cid for h in hits}) > 1:  # two names of one column (a set operation's output) are one
            tables = sorted({h.relation for h in hits})
            raise SqlError(f"column reference {name!r} is ambiguous: it exists in {', '.join(tables)}")
        if hits:
            return Ref(hits[0].cid, hits[0].type, hits[0].name)
        scope, chain = self.parent, [self]
        while scope is not None:
            hits = scope._find(name, relation, schema)
            if len(hits) == 1:
                for s in chain:
                    s.outer_refs.append(hits[0].cid)
                return Ref(hits[0].cid, hits[0].type, hits[0].name)
            chain.append(scope)
            scope = scope.parent
        if relation is not None and not any(c.relation_key == relation.lower() and (schema is None or c.schema == schema.lower())
                                            for c in self._all()):
            rels = sorted({c.relation for c in self._all() if c.relation})
            raise SqlError(f"unknown table {relation!r} in column {relation}.{name}; "
                           f"tables in scope: {', '.join(rels)}" + _close(relation, rels))
        names = sorted({c.name for c in self._all()})
        full = f"{relation}.{name}" if relation else name
        raise SqlError(f"unknown column {full!r}" + _close(name, names))

    def _all(self) -> list[ScopeCol]:
        out, s = [], self
        while s is not None:
            out += s.cols
            s = s.parent
        return out


def _close(word: str, candidates: list[str]) -> str:
    near = difflib.get_close_matches(word, candidates, n=3, cutoff=0.5)
    return f"; did you mean: {', '.join(near)}?" if near else ""


def close_names(word: str, candidates: list[str]) -> str:
    return _close(word, candidates)
