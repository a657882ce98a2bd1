"""The bound expression tree: column references by global id (cid), literals, functions; and the
constructors and walkers over it (conjuncts, equi-join pairs)."""
from __future__ import annotations

import datetime
from dataclasses import dataclass

from opforge.sql import types as T


class Expr:
    type: T.SqlType

    def children(self) -> list["Expr"]:
        return []

    def cids(self) -> set[int]:
        out: set[int] = set()
        for c in self.children():
            out |= c.cids()
        return out


@dataclass(eq=False)
class Ref(Expr):
    cid: int
    type: T.SqlType
    name: str = ""

    def cids(self):
        return {self.cid}

    def __str__(self):
        return f"{self.name}#{self.cid}"


@dataclass(eq=False)
class Lit(Expr):
    value: object
    type: T.SqlType

    def __str__(self):
        if self.value is None:
            return "NULL"
        if self.type.kind == "DATE":
            return f"DATE '{datetime.date(1970, 1, 1) + datetime.timedelta(days=int(self.value))}'"
        if self.type.kind == "DECIMAL":
            return str(self.value)
        return repr(self.value)


@dataclass(eq=False)
class Func(Expr):
    name: str
    args: list[Expr]
    type: T.SqlType
    extra: object = None

    def children(self):
        return self.args

    def __str__(self):
        a = self.args
        if self.name in ("arith", "cmp"):
            return f"({a[0]} {self.extra} {a[1]})"
        if self.name in ("and", "or"):
            return f"({a[0]} {self.name.upper()} {a[1]})"
        if self.name == "not":
            return f"NOT {a[0]}"
        if self.name == "is_null":
            return f"{a[0]} IS NULL"
        inner = ", ".join(str(x) for x in a)
        return f"{self.name}({inner}{'' if self.extra is None else ', ' + repr(self.extra)})"


def is_const(e: Expr) -> bool:
    return isinstance(e, Lit) or (isinstance(e, Func) and all(is_const(a) for a in e.args))


def cmp(op: str, a: Expr, b: Expr) -> Func:
    return Func("cmp", [a, b], T.BOOL, op)


def and_(parts: list[Expr]) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = Func("and", [out, p], T.BOOL)
    return out


def conjuncts(e: Expr | None) -> list[Expr]:
    if e is None:
        return []
    if isinstance(e, Func) and e.name == "and":
        return conjuncts(e.args[0]) + conjuncts(e.args[1])
    return [e]


def disjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Func) and e.name == "or":
        return disjuncts(e.args[0]) + disjuncts(e.args[1])
    return [e]


def equi_pair(c: Expr, left: set[int], right: set[int]):
    """(left expr, right expr) when c is `a = b` with a over `left` and b over `right` (either order)."""
    if not (isinstance(c, Func) and c.name == "cmp" and c.extra == "="):
        return None
    a, b = c.args
    ac, bc = a.cids(), b.cids()
    if not ac or not bc:
        return None
    if ac <= left and bc <= right:
        return a, b
    if bc <= left and ac <= right:
        return b, a
    return None


def split_equi(conds: list[Expr], left: set[int], right: set[int]) -> tuple[list[Expr], list[Expr], list[Expr]]:
    """(left keys, right keys, residual): the equalities of ``conds`` between ``left`` and ``right``
    become join keys, in order; every other condition is residual."""
    lk, rk, residual = [], [], []
    for c in conds:
        pair = equi_pair(c, left, right)
        if pair:
            lk.append(pair[0])
            rk.append(pair[1])
        else:
            residual.append(c)
    return lk, rk, residual
