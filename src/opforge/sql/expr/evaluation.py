"""Vectorized evaluation of an expression over a Batch with SQL NULL semantics: dispatch by function
name to the evaluators that the sibling modules register in ``FUNCS`` (and ``LITERAL_PATHS`` for
an operand kept a Python literal)."""
from __future__ import annotations

import torch

from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.batch import Batch
from opforge.sql.expr.tree import Expr, Lit, Ref


def evaluate(e: Expr, batch: Batch) -> Column:
    """The column of ``e``'s values over ``batch``."""
    if isinstance(e, Ref):
        col = batch.cols.get(e.cid)
        if col is None:
            raise SqlError(f"internal: column {e} is not available here")
        return col
    if isinstance(e, Lit):
        return Column.constant(e.value, e.type, batch.n, batch.device)
    if e.name in LITERAL_PATHS:  # an operand that is a literal stays a Python value
        out = LITERAL_PATHS[e.name](e, batch)
        if out is not None:
            return out
    fn = FUNCS.get(e.name)
    if fn is None:
        raise NotSupportedError(f"function {e.name}")
    return fn(e, [evaluate(a, batch) for a in e.args], batch)


def and_valid(*cols: Column) -> torch.Tensor | None:
    """The validity of a strict function of ``cols``: NULL where any input is NULL (None: no NULLs)."""
    masks = [c.valid for c in cols if c.valid is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = out & m
    return out


# function name -> evaluator(e, argument columns, batch); filled by the sibling modules on import
FUNCS: dict = {}
# function name -> evaluator(e, batch) for operands kept Python literals; None falls back to FUNCS
LITERAL_PATHS: dict = {}
