"""Vectorized evaluation of an expression over a Batch with SQL NULL semantics: dispatch by function
name to the evaluators that the sibling modules register in ``FUNCS`` (and ``LITERAL_PATHS`` for
an operand kept a Python literal).

Range checks (overflow of integer and DECIMAL arithmetic, out-of-range casts) do not synchronize
with the host per operation: each evaluator records a device flag with :func:`check_range`, and the
flags of one expression evaluation are read back together, once, when its root has been evaluated
(:func:`evaluate`); the first failed check, in evaluation order, raises its error."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import torch

from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.batch import Batch
from opforge.sql.expr.tree import Expr, Lit, Ref


_PENDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("opforge_sql_range_checks", default=None)
# the rows whose values are used (CASE: a branch's value only on the rows that take it); None: all
_ROWS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("opforge_sql_rows_used", default=None)


@contextlib.contextmanager
def only_rows(rows: torch.Tensor):
    """Range checks recorded inside see only ``rows`` (and the rows of any enclosing ``only_rows``):
    a value that SQL does not use (a CASE branch not taken) raises nothing, as in DuckDB."""
    outer = _ROWS.get()
    token = _ROWS.set(rows if outer is None else outer & rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


def evaluate(e: Expr, batch: Batch) -> Column:
    """The column of ``e``'s values over ``batch``; raises the first failed range check of the evaluation."""
    if _PENDING.get() is not None:  # inside an evaluation: its root reads the checks back
        return _evaluate(e, batch)
    checks: list = []
    token = _PENDING.set(checks)
    try:
        out = _evaluate(e, batch)
    finally:
        _PENDING.reset(token)
    raise_failed(checks)
    return out


def check_range(bad: torch.Tensor, valid: torch.Tensor | None, error: Callable[..., Exception], *operands) -> None:
    """Record a range check: ``bad`` marks the rows whose result does not fit (rows that are NULL in
    ``valid`` never fail). ``error(*values)`` builds the exception from the ``operands`` (tensors
    over the rows, or Python scalars) at the first failing row. Inside an evaluation this costs no
    host synchronization (the flag and that row's operands stay on the device until the root
    evaluation reads every flag back at once); outside one it is checked at once."""
    if bad.numel() == 0:
        return
    if valid is not None:
        bad = bad & valid
    rows = _ROWS.get()
    if rows is not None:
        bad = bad & rows
    row = torch.argmax(bad.contiguous().view(torch.uint8))  # the first failing row when there is one (no copy)
    flag = bad[row]
    values = [x[row] if isinstance(x, torch.Tensor) and x.dim() else x for x in operands]
    pending = _PENDING.get()
    if pending is None:
        raise_failed([(flag, values, error)])
    else:
        pending.append((flag, values, error))


def raise_failed(checks: list) -> None:
    """One host read of every recorded flag; raise the first failed check's error."""
    if not checks:
        return
    flags = torch.stack([flag for flag, _, _ in checks]).tolist()
    for ok_flag, (_, values, error) in zip(flags, checks):
        if ok_flag:
            raise error(*[_host(x) for x in values])


def _host(x):
    """A failing row's operand as a Python number (a 128-bit DECIMAL's row: its two words as one int)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.numel() == 2:
        low, high = x.tolist()
        return (high << 64) | (low & (2 ** 64 - 1))
    return x.item()


def _evaluate(e: Expr, batch: Batch) -> Column:
    if isinstance(e, Ref):
        col = batch.cols.get(e.cid)
        if col is None:
            raise SqlError(f"internal: column {e} is not available here")
        return col
    if isinstance(e, Lit):
        return Column.constant(e.value, e.type, batch.n, batch.device)
    if e.name in OWN_ARGUMENTS:
        return OWN_ARGUMENTS[e.name](e, batch)
    if e.name in LITERAL_PATHS:  # an operand that is a literal stays a Python value
        out = LITERAL_PATHS[e.name](e, batch)
        if out is not None:
            return out
    fn = FUNCS.get(e.name)
    if fn is None:
        raise NotSupportedError(f"function {e.name}")
    return fn(e, [_evaluate(a, batch) for a in e.args], batch)


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
# function name -> evaluator(e, batch) that evaluates its own arguments (CASE: under ``only_rows``)
OWN_ARGUMENTS: dict = {}
