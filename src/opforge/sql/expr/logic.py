"""Three-valued logic (AND OR NOT IS NULL) and the conditionals CASE, COALESCE, NULLIF."""
from __future__ import annotations

import torch

from opforge.sql import types as T
from opforge.sql.column import Column, unify_strings
from opforge.sql.expr.casts import coerce
from opforge.sql.expr.compare import compare
from opforge.sql.expr.evaluation import FUNCS, OWN_ARGUMENTS, evaluate, only_rows
from opforge.sql.expr.tree import Func


def _and(e, args, batch):
    a, b = args
    if a.valid is None and b.valid is None:
        return Column(a.values & b.values, None, T.BOOL)
    av, bv = a.values & a.valid_mask(), b.values & b.valid_mask()
    a_false = a.valid_mask() & ~a.values
    b_false = b.valid_mask() & ~b.values
    valid = (a.valid_mask() & b.valid_mask()) | a_false | b_false
    return Column(av & bv, valid, T.BOOL)


def _or(e, args, batch):
    a, b = args
    if a.valid is None and b.valid is None:
        return Column(a.values | b.values, None, T.BOOL)
    a_true = a.valid_mask() & a.values
    b_true = b.valid_mask() & b.values
    valid = (a.valid_mask() & b.valid_mask()) | a_true | b_true
    return Column(a_true | b_true, valid, T.BOOL)


def _not(e, args, batch):
    (a,) = args
    return Column(~a.values, a.valid, T.BOOL)


def _is_null(e, args, batch):
    (a,) = args
    return Column(a.null_mask(), None, T.BOOL)


def _choose(conds: list[torch.Tensor], vals: list[Column], default: Column, t: T.SqlType) -> Column:
    """CASE core: first true condition wins, else default."""
    cols = [coerce(c, t) for c in vals] + [coerce(default, t)]
    if T.is_coded(t):
        cols = unify_strings(cols)
    out_v, out_ok = cols[-1].values, cols[-1].valid_mask()
    for cond, c in reversed(list(zip(conds, cols[:-1]))):
        out_v = torch.where(cond[:, None] if out_v.dim() == 2 else cond, c.values, out_v)  # 2-D: 128-bit rows
        out_ok = torch.where(cond, c.valid_mask(), out_ok)
    if all(c.valid is None for c in cols):  # no branch holds a NULL: no host read to learn it
        return Column(out_v, None, t, cols[-1].dictionary)
    return Column(out_v, None if bool(out_ok.all()) else out_ok, t, cols[-1].dictionary)


def _case_taken_rows(e, batch):
    """CASE evaluating each condition on the rows no earlier condition took, each value on the rows
    that take it and ELSE on the rest, for its range checks: a branch's overflow on rows that do not
    take it raises nothing (``CASE WHEN x < 1e9 THEN x * 1000000000 END``, as DuckDB)."""
    args = e.args
    taken = torch.zeros(batch.n, dtype=torch.bool, device=batch.device)
    conds, vals = [], []
    for i in range(len(args) // 2):
        with only_rows(~taken):
            c = evaluate(args[2 * i], batch)
        hit = c.values & c.valid_mask()
        with only_rows(hit & ~taken):
            vals.append(evaluate(args[2 * i + 1], batch))
        conds.append(hit)
        taken = taken | hit
    with only_rows(~taken):
        default = evaluate(args[-1], batch)
    return _choose(conds, vals, default, e.type)


def _coalesce(e, args, batch):
    conds = [a.valid_mask() for a in args[:-1]]
    return _choose(conds, args[:-1], args[-1], e.type)


def _nullif(e, args, batch):
    a, b = args
    eq = compare(Func("=", e.args, T.BOOL, "="), [a, b], batch)
    kill = eq.values & eq.valid_mask()
    return Column(a.values, a.valid_mask() & ~kill, a.type, a.dictionary)


FUNCS.update({"and": _and, "or": _or, "not": _not, "is_null": _is_null, "coalesce": _coalesce,
              "nullif": _nullif})
OWN_ARGUMENTS["case"] = _case_taken_rows
