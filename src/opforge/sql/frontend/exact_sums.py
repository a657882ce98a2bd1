"""DuckDB's exactly rounded float aggregates: ``fsum`` (``sumKahan``, ``kahan_sum``) and ``favg``.
sqlglot reads them as anonymous functions; right after parsing each becomes ``SUM`` / ``AVG`` of a
marker call (``SUM(__FSUM(x))``), so every part of the binder that finds aggregates (GROUP BY,
HAVING, windows) sees an aggregate, and its text differs from a plain ``SUM(x)`` of the same
query. The binder turns the marked call into the ``fsum`` / ``favg`` aggregate
(``physical/aggregate.py``: ``math.fsum`` per group)."""
from __future__ import annotations

from sqlglot import exp

MARKS = {"__fsum": "fsum", "__favg": "favg"}
_NAMES = {"fsum": (exp.Sum, "__fsum"), "sumkahan": (exp.Sum, "__fsum"), "kahan_sum": (exp.Sum, "__fsum"),
          "favg": (exp.Avg, "__favg")}


def exact_sums(tree: exp.Expression) -> exp.Expression:
    """``tree`` with each FSUM / SUMKAHAN / KAHAN_SUM / FAVG call of one argument marked."""
    for node in list(tree.find_all(exp.Anonymous)):
        hit = _NAMES.get(node.name.lower())
        if hit is not None and len(node.expressions) == 1:
            cls, mark = hit
            node.replace(cls(this=exp.Anonymous(this=mark, expressions=[node.expressions[0]])))
    return tree


def marked(arg: exp.Expression) -> tuple[str, exp.Expression] | None:
    """(aggregate, its real argument) when ``arg`` is a marker call."""
    if isinstance(arg, exp.Anonymous) and arg.name.lower() in MARKS and len(arg.expressions) == 1:
        return MARKS[arg.name.lower()], arg.expressions[0]
    return None
