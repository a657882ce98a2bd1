"""Prepared parameters: ``con.sql("... WHERE a = ? AND b = ?", [1, "x"])`` or ``$1`` / ``$2``.

Each value becomes a typed literal node of the parsed statement (``literal``): the value is never
spliced into the SQL text, so a string parameter is always one string, whatever quotes it holds.
The only text change made is numbering each ``?`` token (found by sqlglot's tokenizer, so a ``?``
inside a string or comment is left alone) as ``$k``, so both styles bind by position in the tree."""
from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Sequence

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.tokens import TokenType

from opforge.sql.errors import SqlError


PLACEHOLDER_STARTS = "?$@"  # DuckDB's tokenizer: ? a PLACEHOLDER, $ and @ a PARAMETER


def number_placeholders(text: str) -> tuple[str, int]:
    """``text`` with its ``?`` placeholders numbered ``$1, $2, ...`` in order, and how many
    parameters the statement takes (the count of ``?``, or the highest ``$n``). A text without
    ``?``, ``$`` or ``@`` (the tokens a placeholder starts with) has none: it is not tokenized
    here, only once by the parser."""
    if not any(c in text for c in PLACEHOLDER_STARTS):
        return text, 0
    try:
        tokens = DuckDB().tokenize(text)
    except Exception as e:  # the parser reports the syntax error with its position
        raise SqlError(f"syntax error: {e}") from None
    marks = [t for t in tokens if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    numbered = [int(b.text) for a, b in zip(tokens, tokens[1:])
                if a.token_type == TokenType.PARAMETER and b.token_type == TokenType.NUMBER and b.text.isdigit()]
    if marks and numbered:
        raise SqlError("parameters: a statement uses either ? or $n placeholders, not both")
    if not marks:
        return text, max(numbered, default=0)
    out, pos = [], 0
    for k, t in enumerate(marks, 1):
        out += [text[pos:t.start], f"${k}"]
        pos = t.end + 1
    out.append(text[pos:])
    return "".join(out), len(marks)


def literal(value, where: str) -> exp.Expression:
    """The SQL literal of a Python value, typed as DuckDB types a bound parameter."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else str(value)
        return exp.cast(exp.Literal.string(text) if not math.isfinite(value) else exp.Literal.number(text), "DOUBLE")
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise SqlError(f"parameters: {where} is a non-finite Decimal {value}")
        return exp.Literal.number(str(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, datetime.datetime):
        kind = "TIMESTAMPTZ" if value.tzinfo is not None else "TIMESTAMP"
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), kind)
    if isinstance(value, datetime.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    raise TypeError(f"parameters: {where} has type {type(value).__name__}; expected None, bool, int, float, "
                    "Decimal, str, date or datetime")


def bind(trees: list[exp.Expression], count: int, params: Sequence | None) -> list[exp.Expression]:
    """``trees`` with each ``$k`` placeholder replaced by the literal of ``params[k - 1]``."""
    given = 0 if params is None else len(params)
    if isinstance(params, (str, bytes, dict)):
        raise TypeError(f"parameters: expected a list or tuple of values, got {type(params).__name__}")
    if given != count:
        raise SqlError(f"parameters: the statement has {count} placeholder(s), {given} value(s) were given")
    if count == 0:
        return trees
    values = [literal(v, f"parameter {k}") for k, v in enumerate(params, 1)]

    def substitute(node):
        if isinstance(node, exp.Placeholder):
            return values[int(node.name) - 1].copy()
        return node
    return [t.transform(substitute) for t in trees]
