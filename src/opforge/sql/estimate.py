"""Default selectivities for predicates that column statistics cannot price (an expression over
several columns, a function call...): ``planner/cardinality.py`` falls back to these.

Selectivity of a conjunct: ``=`` 0.1, ``<>`` 0.9, a range comparison 1/3, IS NULL 0.05, anything
else 0.5; conjuncts multiply."""
from __future__ import annotations

from opforge.sql.expr import Func, conjuncts

_SEL = {"=": 0.1, "<>": 0.9, "<": 1 / 3, "<=": 1 / 3, ">": 1 / 3, ">=": 1 / 3, "is_null": 0.05}


def selectivity(pred) -> float:
    s = 1.0
    for c in conjuncts(pred):
        if isinstance(c, Func) and c.name == "cmp":
            s *= _SEL.get(c.extra, 0.5)
        elif isinstance(c, Func):
            s *= _SEL.get(c.name, 0.5)
        else:
            s *= 0.5
    return s
