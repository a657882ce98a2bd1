"""Rewrites of expression trees used by the optimizer: substitution, constant folding, factoring ORs."""
from __future__ import annotations

import torch

from opforge.sql import decimal128
from opforge.sql import types as T
from opforge.sql.expr.batch import Batch
from opforge.sql.expr.evaluation import evaluate
from opforge.sql.expr.tree import Expr, Func, Lit, Ref, and_, conjuncts, disjuncts, is_const


def substitute(e: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace column references by expressions (used when pushing predicates below projections)."""
    if isinstance(e, Ref):
        return mapping.get(e.cid, e)
    if isinstance(e, Func):
        return Func(e.name, [substitute(a, mapping) for a in e.args], e.type, e.extra)
    return e


def fold_constants(e: Expr, device) -> Expr:
    """Evaluate constant sub-expressions once, on one row."""
    if isinstance(e, Func):
        args = [fold_constants(a, device) for a in e.args]
        e = Func(e.name, args, e.type, e.extra)
        if all(isinstance(a, Lit) for a in args) and e.type.kind != "STRING":
            col = evaluate(e, Batch({}, 1, device))
            if col.valid is not None and not bool(col.valid[0]):
                return Lit(None, e.type)
            if e.type.kind in T.NESTED:
                return Lit(col.to_arrow()[0].as_py(), e.type)
            if e.type.kind == "DECIMAL":
                import decimal
                v = decimal128.to_ints(col.values[:1])[0] if e.type.wide else col.values[0].item()
                with decimal.localcontext(prec=100):  # 38 digits: beyond the default context's 28
                    return Lit(decimal.Decimal(v).scaleb(-e.type.scale), e.type)
            v = col.values[0].item()
            return Lit(v, e.type) if e.type.kind != "DATE" else Lit(int(v), e.type)
    return e


def value_with(e: Expr, values: dict[int, Lit]) -> Lit | None:
    """The constant ``e`` takes when its columns hold ``values`` (cid -> literal; a column not in
    ``values`` is NULL), folded on the CPU; None when it does not fold to a literal (a string
    function). The planner asks what an expression gives on a row an outer join pads with NULLs,
    or on the one row an aggregate without keys returns for no input."""
    mapping = {r.cid: values.get(r.cid, Lit(None, r.type)) for r in _refs(e)}
    try:
        out = fold_constants(substitute(e, mapping), torch.device("cpu"))
        if isinstance(out, Func) and out.type.kind == "STRING" and is_const(out):  # not folded: run it
            col = evaluate(out, Batch({}, 1, torch.device("cpu")))
            out = Lit(col.to_arrow().to_pylist()[0], out.type)
    except Exception:  # noqa: BLE001 -- a function that cannot run on a constant: not known
        return None
    return out if isinstance(out, Lit) else None


def _refs(e: Expr) -> list[Ref]:
    if isinstance(e, Ref):
        return [e]
    return [r for a in (e.args if isinstance(e, Func) else []) for r in _refs(a)]


def factor_or(e: Expr) -> list[Expr]:
    """(a AND b) OR (a AND c) -> [a, b OR c]: exposes join keys written inside every branch of an OR
    (TPC-H Q19), so the join is an equi-join instead of a filtered cross product."""
    branches = [conjuncts(d) for d in disjuncts(e)]
    if len(branches) < 2:
        return [e]
    texts = [{str(c) for c in b} for b in branches]
    common_text = set.intersection(*texts)
    if not common_text:
        return [e]
    common = [c for c in branches[0] if str(c) in common_text]
    rest = [[c for c in b if str(c) not in common_text] for b in branches]
    if any(not r for r in rest):
        return common
    ors = and_(rest[0])
    for r in rest[1:]:
        ors = Func("or", [ors, and_(r)], T.BOOL)
    return common + [ors]
