"""Row values compared. ``(a, b) = (c, d)`` / ``<>`` as DuckDB compares them (as STRUCTs: field by
field with NULL equal to NULL, never unknown); ``(a, b) op ANY / ALL (SELECT x, y ...)`` over an
uncorrelated subquery of constant rows with SQL's three-valued logic (a NULL field makes that
field's comparison unknown), as DuckDB's quantified comparison does."""
from __future__ import annotations

import torch
from sqlglot import exp

from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.rewrites import fold_constants
from opforge.sql.expr.tree import Expr, Func, Lit, and_, is_const


def row_compare(binder, left: exp.Tuple, right: exp.Expression, op: str) -> Expr:
    if op not in ("=", "<>"):
        raise NotSupportedError(f"row comparison {op} (only = and <>)")
    a = [binder.bind(e) for e in left.expressions]
    if isinstance(right, (exp.Any, exp.All)):
        return _quantified(binder, a, right, op)
    if not isinstance(right, exp.Tuple):
        raise SqlError(f"a row of {len(a)} values compared with a single value: {right.sql(dialect='duckdb')}")
    b = [binder.bind(e) for e in right.expressions]
    if len(a) != len(b):
        raise SqlError(f"row comparison: {len(a)} values against {len(b)}")
    for x, y in zip(a, b):
        binder._compare(op, x, y)  # the types must be comparable
    same = and_([binder._not_distinct(x, y) for x, y in zip(a, b)])
    return same if op == "=" else Func("not", [same], T.BOOL)


def _truth(op: str, x, y):
    if x is None or y is None:
        return None
    return (x == y) if op == "=" else (x != y)


def _row_truth(op: str, xs, ys):
    """= : every field equal (false wins over unknown); <>: some field different (true wins)."""
    vals = [_truth(op, x, y) for x, y in zip(xs, ys)]
    if op == "=":
        return False if False in vals else (None if None in vals else True)
    return True if True in vals else (None if None in vals else False)


def _quantified(binder, a: list[Expr], node: exp.Expression, op: str) -> Expr:
    every = isinstance(node, exp.All)
    q = node.this.this if isinstance(node.this, exp.Subquery) else node.this
    if not isinstance(q, (exp.Select, exp.SetOperation)):
        raise NotSupportedError(f"row {op} ANY / ALL of {type(q).__name__}")
    a = [fold_constants(x, torch.device("cpu")) if is_const(x) else x for x in a]
    if not all(isinstance(x, Lit) for x in a):
        raise NotSupportedError("a row of columns compared with ANY / ALL (subquery)")
    sub, sscope = binder.qb.probe(q, binder.scope)
    if sscope.outer_refs:
        raise NotSupportedError("a row compared with ANY / ALL of a correlated subquery")
    if len(sub.outputs) != len(a):
        raise SqlError(f"row comparison: {len(a)} values against a subquery of {len(sub.outputs)} columns")
    for x, o in zip(a, sub.outputs):
        if x.value is not None:
            binder._compare(op, x, Lit(None, o.type))  # the types must be comparable
    if binder.qb.probing:  # a placeholder, counted: the probe binds again for real
        binder.qb.placeholders += 1
        return Lit(None, T.BOOL)
    rows = binder.qb.catalog.run_table(sub).to_pylist()
    left = [x.value for x in a]
    results = [_row_truth(op, left, list(r.values())) for r in rows]
    if every:
        value = False if False in results else (None if None in results else True)
    else:
        value = True if True in results else (None if None in results else False)
    return Lit(value, T.BOOL)
