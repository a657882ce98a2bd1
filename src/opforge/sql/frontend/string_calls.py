"""Binding of the string functions evaluated per distinct argument tuple (``expr/string_calls.py``):
which sqlglot node is which function, its arguments in order, their kinds and the result type."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.tree import Expr, Func, Lit

# node class name (or Anonymous function name) -> (function, argument names, kinds, result type).
# kinds: 's' a string, 'i' an integer, '*' any (converted to text by the function)
_S, _I, _B = T.STRING, T.INT64, T.BOOL
_SIGNATURES = {
    "StartsWith": ("starts_with", ("this", "expression"), "ss", _B),
    "EndsWith": ("ends_with", ("this", "expression"), "ss", _B),
    "Contains": ("contains", ("this", "expression"), "ss", _B),
    "StrPosition": ("strpos", ("this", "substr"), "ss", _I),
    "RegexpLike": ("regexp_matches", ("this", "expression", "flag"), "sss", _B),
    "RegexpFullMatch": ("regexp_full_match", ("this", "expression", "options"), "sss", _B),
    "RegexpReplace": ("regexp_replace", ("this", "expression", "replacement", "modifiers"), "ssss", _S),
    "Replace": ("replace", ("this", "expression", "replacement"), "sss", _S),
    "SplitPart": ("split_part", ("this", "delimiter", "part_index"), "ssi", _S),
    "Left": ("left", ("this", "expression"), "si", _S),
    "Right": ("right", ("this", "expression"), "si", _S),
    "Reverse": ("reverse", ("this",), "s", _S),
    "Repeat": ("repeat", ("this", "times"), "si", _S),
    "Ascii": ("ascii", ("this",), "s", T.INT32),
    "Unicode": ("unicode", ("this",), "s", T.INT32),
    "regexp_escape": ("regexp_escape", None, "s", _S),
    "prefix": ("starts_with", None, "ss", _B),
    "suffix": ("ends_with", None, "ss", _B),
    "instr": ("strpos", None, "ss", _I),
}


def bind_string_call(binder, node: exp.Expression) -> Expr | None:
    """The bound call for ``node`` when it is one of the functions here, else None."""
    name = type(node).__name__
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
    if isinstance(node, exp.Pad):
        return _call(binder, "lpad" if node.args.get("is_left") else "rpad",
                     [node.this, node.expression, node.args.get("fill_pattern") or exp.Literal.string(" ")], "sis", _S)
    if isinstance(node, exp.RegexpExtract):
        return _regexp_extract(binder, node)
    if name == "substring_grapheme":
        return _substring_grapheme(binder, node)
    if isinstance(node, exp.Chr):
        return _call(binder, "chr", node.expressions, "i", _S)
    if isinstance(node, exp.ConcatWs):
        args = [binder.bind(a) for a in node.expressions]
        if any(a.type.kind in T.NESTED for a in args):  # DuckDB joins a list's elements: not here
            raise NotSupportedError(f"concat_ws of a LIST or STRUCT: {node.sql(dialect='duckdb')}")
        if len(args) < 2:
            raise SqlError("concat_ws: expected a separator and at least one string")
        return Func("string_call", args, _S, "concat_ws")
    sig = _SIGNATURES.get(name)
    if sig is None:
        return None
    fn, names, kinds, out = sig
    nodes = node.expressions if names is None else [node.args.get(a) for a in names]
    while nodes and nodes[-1] is None:
        nodes = nodes[:-1]
    if len(nodes) > len(kinds) or any(n is None for n in nodes):
        raise SqlError(f"{fn}: unexpected arguments: {node.sql(dialect='duckdb')}")
    return _call(binder, fn, nodes, kinds, out)


def bind_like(binder, node: exp.Expression, escape: exp.Expression | None) -> Expr:
    """[NOT] LIKE / ILIKE with any pattern and an optional ESCAPE character."""
    fold = isinstance(node, exp.ILike)
    fn = ("not_" if node.args.get("negate") else "") + ("ilike" if fold else "like")
    nodes = [node.this, node.expression] + ([escape] if escape is not None else [])
    return _call(binder, fn, nodes, "sss", _B)


def _substring_grapheme(binder, node: exp.Anonymous) -> Expr:
    """substring_grapheme(s, start[, length]) with constant positions (``expr/graphemes.py``)."""
    args = node.expressions
    if len(args) not in (2, 3):
        raise SqlError(f"substring_grapheme: expected 2 or 3 arguments: {node.sql(dialect='duckdb')}")
    x = binder.bind(args[0])
    pos = [binder._int_lit(a, "substring_grapheme position") for a in args[1:]]
    if isinstance(x, Lit) and x.value is None:
        return Lit(None, _S)
    if x.type.kind != "STRING":
        raise SqlError(f"substring_grapheme: expected a string, got {x.type}")
    return Func("substring_grapheme", [x], _S, (pos[0], pos[1] if len(pos) > 1 else None))


def _regexp_extract(binder, node: exp.RegexpExtract) -> Expr:
    group = node.args.get("group")
    if isinstance(group, exp.Array):
        from opforge.sql.frontend.nested_calls import regexp_extract_struct
        return regexp_extract_struct(binder, node)
    nodes = [node.this, node.expression] + ([group] if group is not None else [])
    if node.args.get("parameters") is not None:
        nodes += [node.args["parameters"]] if group is not None else [exp.Literal.number(0), node.args["parameters"]]
    return _call(binder, "regexp_extract", nodes, "ssis", _S)


def _call(binder, fn: str, nodes: list, kinds: str, out: T.SqlType) -> Expr:
    args = []
    for n, kind in zip(nodes, kinds):
        a = binder.bind(n)
        if isinstance(a, Lit) and a.value is None:
            return Lit(None, out)  # every function here is strict
        want = {"s": "STRING", "i": None}[kind]
        if want and a.type.kind != want:
            raise SqlError(f"{fn}: expected a string argument, got {a.type}: {n.sql(dialect='duckdb')}")
        if kind == "i" and not a.type.is_integer:
            raise SqlError(f"{fn}: expected an integer argument, got {a.type}: {n.sql(dialect='duckdb')}")
        args.append(a)
    return Func("string_call", args, out, fn)
