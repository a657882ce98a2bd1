"""The output name of an unaliased select item, printed as DuckDB prints it, so that a result's
column names (and the columns a view or a subquery exposes) are the ones a DuckDB user expects:
``round((a / b), 2)``, ``CAST(x AS DECIMAL(15, 4))``, ``"substring"(s, 1, 3)``,
``CASE  WHEN ((a > 1)) THEN (1) ELSE 0 END``. Operators, NOT, CASE and function names follow
DuckDB's printer; any other node is sqlglot's DuckDB text with its operands printed this way."""
from __future__ import annotations

from sqlglot import exp

_BINARY = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%", exp.EQ: "=", exp.NEQ: "!=",
           exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.And: "AND", exp.Or: "OR",
           exp.DPipe: "||", exp.Like: "~~", exp.ILike: "~~*", exp.Is: "IS",
           exp.NullSafeNEQ: "IS DISTINCT FROM", exp.NullSafeEQ: "IS NOT DISTINCT FROM"}
# function names DuckDB's printer quotes (SQL keywords)
_QUOTED = {"substring", "left", "right", "trim", "ltrim", "rtrim", "position", "nullif", "year", "month",
           "day", "hour", "minute", "second", "overlay", "replace"}
_UPPER = {"coalesce"}
_TYPES = {"TEXT": "VARCHAR", "INT": "INTEGER"}  # sqlglot's DuckDB type names that DuckDB prints otherwise  # printed as an operator, upper-case
# operand kinds printed by this module inside a node left to sqlglot
_VALUES = (exp.Column, exp.Literal, exp.Func, exp.Binary, exp.Unary, exp.Paren, exp.Case, exp.Cast, exp.Null,
           exp.Boolean, exp.Window, exp.Between, exp.In)


def output_name(e: exp.Expression, generate) -> str:
    """DuckDB's name for the unaliased select item ``e``; ``generate(node)`` is sqlglot's DuckDB text."""
    def name(n: exp.Expression) -> str:
        if isinstance(n, exp.Paren):
            return name(n.this)
        if isinstance(n, exp.Column):
            return ".".join(p.name for p in n.parts)
        for cls, op in _BINARY.items():
            if type(n) is cls:
                return f"({name(n.this)} {op} {name(n.expression)})"
        if isinstance(n, exp.Not):
            inner = n.this.this if isinstance(n.this, exp.Paren) else n.this
            if isinstance(inner, exp.Is):
                return f"({name(inner.this)} IS NOT {name(inner.expression)})"
            return f"(NOT {name(n.this)})"
        if isinstance(n, exp.Neg):
            if isinstance(n.this, exp.Literal) and not n.this.is_string:
                return f"-{n.this.this}"  # DuckDB folds a negative constant
            return f"(-({name(n.this)}))"
        if isinstance(n, exp.Between):
            return f"({name(n.this)} BETWEEN {name(n.args['low'])} AND {name(n.args['high'])})"
        if isinstance(n, exp.In) and n.expressions and not n.args.get("query"):
            return f"({name(n.this)} IN ({', '.join(name(x) for x in n.expressions)}))"
        if isinstance(n, exp.Case):
            operand = n.this
            whens = []
            for w in n.args.get("ifs") or []:
                cond = f"({name(operand)} = {name(w.this)})" if operand is not None else name(w.this)
                whens.append(f" WHEN ({cond}) THEN ({name(w.args['true'])})")
            default = n.args.get("default")
            return f"CASE {''.join(whens)} ELSE {'NULL' if default is None else name(default)} END"
        if isinstance(n, exp.Cast):
            to = generate(n.args["to"])
            return f"CAST({name(n.this)} AS {_TYPES.get(to, to)})"
        if isinstance(n, exp.Extract):
            return f"date_part('{n.this.name.upper()}', {name(n.expression)})"
        return _with_operands(n)

    def _with_operands(n: exp.Expression) -> str:
        """sqlglot's text of ``n`` with each operand printed by ``name`` (through placeholders)."""
        shell = n.copy()
        operands = {}
        for i, child in enumerate([c for c in shell.iter_expressions() if isinstance(c, _VALUES)]):
            key = f"__operand{i}__"
            operands[key] = name(_original(n, shell, child))
            child.replace(exp.var(key))
        text = generate(shell)
        if isinstance(n, exp.Func) and "(" in text:
            fn, rest = text.split("(", 1)
            fn = fn.lower()
            if fn in _UPPER:
                fn = fn.upper()
            elif fn in _QUOTED:
                fn = f'"{fn}"'
            text = f"{fn}({rest}"
        for key, value in operands.items():
            text = text.replace(key, value, 1)
        return text

    return name(e)


def _original(n: exp.Expression, shell: exp.Expression, child: exp.Expression) -> exp.Expression:
    """The node of ``n`` that ``child`` (a direct operand of ``shell``, n's copy) was copied from."""
    key, index = child.arg_key, child.index
    value = n.args[key]
    return value[index] if isinstance(value, list) else value
