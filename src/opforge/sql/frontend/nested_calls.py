"""Binding of LIST and STRUCT expressions (``sql/nested.py`` has the columns): list literals
``[1, 2]`` / ``list_value``, struct literals ``{'a': 1}`` / ``struct_pack``, ``l[i]``, ``s.a`` /
``s['a']``, ``len`` / ``array_length``, ``regexp_extract_all`` and ``regexp_extract`` with group
names. A constant stays a literal (folded here: DuckDB's tests are full of them); the others are
functions evaluated in ``expr/nested_functions.py``."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import nested
from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr.tree import Expr, Func, Lit


def _is_null(e: Expr) -> bool:
    return isinstance(e, Lit) and e.value is None


def element_type(items: list[Expr], where: str) -> T.SqlType:
    return common_type([e.type for e in items if not _is_null(e)], where)


def common_type(types: list[T.SqlType], where: str) -> T.SqlType:
    """The type values of ``types`` meet as: numbers widened; lists by their elements' common type;
    structs of the same field names field by field."""
    from opforge.sql.frontend.expressions import _common

    if not types:
        return T.INT32
    if any(t.kind in T.NESTED for t in types):
        first = types[0]
        if all(t == first for t in types):
            return first
        if all(t.kind == "LIST" for t in types):
            return T.list_of(common_type([t.fields[0][1] for t in types], where))
        if all(t.kind == "STRUCT" for t in types):  # DuckDB: the fields of all, by name; a missing one NULL
            names: dict[str, str] = {}
            for t in types:
                for n, _ in t.fields:
                    names.setdefault(n.lower(), n)
            return T.struct_of((n, common_type([ft for t in types for fn, ft in t.fields if fn.lower() == key], where))
                               for key, n in names.items())
        raise SqlError(f"{where}: elements of different types {', '.join(sorted({str(t) for t in types}))}")
    return _common(types, where)


def _cast(e: Expr, to: T.SqlType) -> Expr:
    if _is_null(e):
        return Lit(None, to)
    if e.type == to:
        return e
    if isinstance(e, Lit):
        return Lit(nested.coerce(nested.python_literal(e.value, e.type), to), to)
    if to.kind in T.NESTED or e.type.kind in T.NESTED or to.kind == "STRING" or e.type.kind == "STRING":
        raise SqlError(f"cannot convert {e.type} to {to}")
    return Func("cast", [e], to)


def list_value(items: list[Expr]) -> Expr:
    t = element_type(items, "list")
    if t.kind == "DECIMAL" and t.precision > 18:
        raise NotSupportedError(f"a list of {t}: DECIMAL wider than 18 digits")
    items = [e if e.type == t else _cast_list(e, t) if e.type.kind in T.NESTED else _cast(e, t) for e in items]
    out = T.list_of(t)
    if all(isinstance(e, Lit) for e in items):
        return Lit([nested.python_literal(e.value, e.type) for e in items], out)
    return Func("list_value", items, out)


def struct_pack(names: list[str], items: list[Expr]) -> Expr:
    if len({n.lower() for n in names}) != len(names):
        raise SqlError(f"struct: duplicate field names {names}")
    out = T.struct_of(zip(names, [T.INT32 if _is_null(e) else e.type for e in items]))
    if all(isinstance(e, Lit) for e in items):
        return Lit({n: nested.python_literal(e.value, e.type) for n, e in zip(names, items)}, out)
    return Func("struct_pack", items, out, tuple(names))


def field(x: Expr, name: str) -> Expr:
    """``s.name`` / ``s['name']``: the field of a STRUCT (names match case-insensitively)."""
    if x.type.kind != "STRUCT":
        raise SqlError(f"cannot extract field {name!r} from a value of type {x.type}")
    for n, t in x.type.fields:
        if n.lower() == name.lower():
            if isinstance(x, Lit):
                return Lit(None if x.value is None else _storage(x.value.get(n), t), t)
            return Func("struct_extract", [x], t, n)
    raise SqlError(f"Binder Error: could not find key {name!r} in struct {x.type}")


def _storage(value, typ: T.SqlType):
    """A Python value inside a nested literal as a scalar literal's value (DATE: days)."""
    if value is None:
        return None
    if typ.kind == "DATE":
        return (value - __import__("datetime").date(1970, 1, 1)).days
    if typ.kind == "TIMESTAMP":
        from opforge.sql.column import timestamp_value
        return timestamp_value(value, typ)
    return value


def element(x: Expr, index: Expr) -> Expr:
    """``l[i]``: 1-based; a negative index counts from the end; 0 or out of range is NULL (DuckDB)."""
    if x.type.kind == "STRUCT":
        if not (isinstance(index, Lit) and index.type.kind == "STRING"):
            raise SqlError("a STRUCT is indexed by a constant field name: s['a']")
        return field(x, index.value)
    if x.type.kind == "STRING":
        raise NotSupportedError("indexing a string: s[i] (use substring)")
    if x.type.kind != "LIST":
        raise SqlError(f"cannot index a value of type {x.type}")
    if not index.type.is_integer and not _is_null(index):
        raise SqlError(f"a list index must be an integer, got {index.type}")
    t = x.type.fields[0][1]
    if isinstance(x, Lit) and isinstance(index, Lit):
        return Lit(_storage(nested.list_element(x.value, index.value), t), t)
    return Func("list_extract", [x, index], t)


def bind_nested_call(binder, node: exp.Expression) -> Expr | None:
    """The bound expression when ``node`` is a nested-type expression, else None."""
    if isinstance(node, exp.Array):
        if node.expressions and isinstance(node.expressions[0], (exp.Select, exp.Subquery, exp.SetOperation)):
            return array_subquery(binder, node.expressions[0])
        return list_value([binder.bind(e) for e in node.expressions])
    if isinstance(node, exp.Struct):
        names, items = [], []
        for i, e in enumerate(node.expressions):
            if isinstance(e, (exp.PropertyEQ, exp.Slice)) and e.this is not None:
                key = e.this
                names.append(key.this if isinstance(key, exp.Literal) else key.name)
                items.append(binder.bind(e.expression))
            elif isinstance(e, exp.Alias):
                names.append(e.alias)
                items.append(binder.bind(e.this))
            elif isinstance(e, exp.Column):
                names.append(e.name)
                items.append(binder.bind(e))
            else:
                names.append(f"v{i + 1}")
                items.append(binder.bind(e))
        return struct_pack(names, items)
    if isinstance(node, exp.Bracket):
        if len(node.expressions) != 1:
            raise NotSupportedError(f"indexing with several subscripts: {node.sql(dialect='duckdb')}")
        sub = node.expressions[0]
        if isinstance(sub, exp.Placeholder) and sub.name:  # l[:loc]: sqlglot reads ':loc' as a named parameter
            sub = exp.Slice(expression=exp.column(sub.name))
        if isinstance(sub, exp.Slice):
            return list_slice(binder.bind(node.this), *(None if s is None else binder.bind(s)
                                                        for s in (sub.this, sub.expression)))
        x = binder.bind(node.this)
        idx = binder.bind(node.expressions[0])
        raw = node.expressions[0]
        literal = isinstance(raw, exp.Literal) or (isinstance(raw, exp.Neg) and isinstance(raw.this, exp.Literal))
        if x.type.kind == "LIST" and literal and isinstance(idx, Lit) and idx.value is not None:
            idx = Lit(idx.value + 1, idx.type)  # sqlglot keeps a literal index 0-based (DuckDB's l[1] reads l[0])
        return element(x, idx)
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        return field(binder.bind(node.this), node.expression.name)
    if isinstance(node, exp.ArrayConcat):
        return concat_lists([binder.bind(node.this)] + [binder.bind(e) for e in node.expressions], strict=False)
    if isinstance(node, (exp.ArraySize,)):
        return length(binder.bind(node.this))
    if isinstance(node, exp.RegexpExtractAll):
        return regexp_extract_all(binder, node)
    if isinstance(node, exp.Explode):
        raise NotSupportedError(f"UNNEST of a list that is not a constant: {node.sql(dialect='duckdb')}")
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
        args = node.expressions
        if name in ("list_value", "list_pack"):
            return list_value([binder.bind(a) for a in args])
        if name in ("list_extract", "list_element", "array_extract") and len(args) == 2:
            return element(binder.bind(args[0]), binder.bind(args[1]))
        if name == "struct_extract" and len(args) == 2:
            key = binder.bind(args[1])
            if not (isinstance(key, Lit) and key.type.kind == "STRING"):
                raise SqlError("struct_extract: the field name must be a constant string")
            return field(binder.bind(args[0]), key.value)
        if name in ("len", "array_length", "list_length") and len(args) == 1:
            return length(binder.bind(args[0]))
    return None


def concat_lists(items: list[Expr], strict: bool) -> Expr:
    """``a || b`` (``strict``: a NULL operand makes NULL) or ``list_concat(a, b, ...)`` (NULL
    operands are skipped): the lists one after another, of the common element type."""
    lists = [e for e in items if not _is_null(e)]
    if any(e.type.kind != "LIST" for e in lists):
        raise SqlError("Binder Error: cannot concatenate types " + " and ".join(str(e.type) for e in items))
    if not lists:
        return Lit(None, T.list_of(T.INT32))
    out = T.list_of(common_type([e.type.fields[0][1] for e in lists], "list_concat"))
    if strict and len(lists) < len(items):
        return Lit(None, out)
    args = [_cast_list(e, out) for e in lists]
    if all(isinstance(e, Lit) for e in args):
        values = [e.value for e in args if e.value is not None]
        if strict and len(values) < len(args):
            return Lit(None, out)
        return Lit([x for v in values for x in v], out)
    return Func("list_concat", args, out, strict)


def _cast_list(e: Expr, to: T.SqlType) -> Expr:
    if e.type == to:
        return e
    if isinstance(e, Lit):
        return Lit(nested.coerce(e.value, to), to)
    return cast_nested(e, to)


def cast_nested(e: Expr, to: T.SqlType) -> Expr:
    """A LIST / STRUCT to one of wider types (INTEGER[] to BIGINT[] / DECIMAL / DOUBLE; a STRUCT to
    one with more fields, NULL in them): per distinct value."""
    if not widens(e.type, to):
        raise NotSupportedError(f"CAST of {e.type} to {to}")
    return Func("nested_cast", [e], to)


def widens(fr: T.SqlType, to: T.SqlType) -> bool:
    """Every value of ``fr`` is a value of ``to`` (numbers widened, struct fields added)."""
    if fr == to:
        return True
    if fr.kind == to.kind == "LIST":
        return widens(fr.fields[0][1], to.fields[0][1])
    if fr.kind == to.kind == "STRUCT":
        target = {n.lower(): t for n, t in to.fields}
        return all(n.lower() in target and widens(t, target[n.lower()]) for n, t in fr.fields)
    if fr.is_numeric and to.is_numeric and fr.kind != "BOOL" and to.kind != "BOOL":
        return common_type([fr, to], "CAST") == to
    return False


def array_subquery(binder, q: exp.Expression) -> Expr:
    """``ARRAY(SELECT ...)``: the subquery's one column, in its order, as a list. An uncorrelated
    subquery runs once while binding (as a scalar subquery does); a correlated one is refused."""
    if isinstance(q, exp.Subquery):
        q = q.this
    qb = binder.qb
    sub, sscope = qb.probe(q, binder.scope)
    if len(sub.outputs) != 1:
        raise SqlError(f"ARRAY(subquery): the subquery returns {len(sub.outputs)} columns, expected 1")
    out = T.list_of(sub.outputs[0].type)
    if sscope.outer_refs:
        raise NotSupportedError("a correlated ARRAY(subquery)")
    if qb.probing:  # inside a probe only the references count: counted, so the probe binds again for real
        qb.placeholders += 1
        return Lit([], out)
    return Lit(qb.catalog.run_table(sub).column(0).to_pylist(), out)


def quantified_list(x: Expr, lst: Expr, op: str, every: bool) -> Expr:
    """``x op ANY (list)`` / ``x op ALL (list)`` with SQL's three values: ANY is true when some
    element compares true, else NULL when some comparison is NULL, else false (ALL the dual); a
    NULL or empty list gives false (ALL: true), as DuckDB."""
    if _is_null(lst):  # DuckDB: a NULL list has no elements to compare
        return Lit(every, T.BOOL)
    if lst.type.kind != "LIST":
        raise SqlError(f"{'ALL' if every else 'ANY'}: expected a list or a subquery, got {lst.type}")
    elem = lst.type.fields[0][1]
    if not _is_null(x):
        common_type([x.type, elem], f"comparison {op}")
    if x.type.kind in T.NESTED or elem.kind in T.NESTED:
        raise NotSupportedError(f"{op} ANY / ALL over a list of {elem}")
    if x.type != elem and not _is_null(x) and not (_plain_number(x.type) and _plain_number(elem)):
        raise NotSupportedError(f"{op} ANY / ALL of a {x.type} over a list of {elem} (cast one side)")
    return Func("list_quantified", [x, lst], T.BOOL, (op, every))


def list_slice(x: Expr, begin: Expr | None, end: Expr | None) -> Expr:
    """``l[b:e]``: elements b..e, 1-based and inclusive, a negative bound counting from the end, the
    bounds clamped to the list (DuckDB's list_slice); a NULL bound gives NULL."""
    if x.type.kind != "LIST":
        raise NotSupportedError(f"slicing a value of type {x.type} (lists only)")
    bounds = [Lit(1, T.INT64) if begin is None else begin, Lit(-1, T.INT64) if end is None else end]
    for b in bounds:
        if not (b.type.is_integer or _is_null(b)):
            raise SqlError(f"a list slice bound must be an integer, got {b.type}")
    if any(_is_null(b) for b in bounds):
        return Lit(None, x.type)
    if isinstance(x, Lit) and all(isinstance(b, Lit) for b in bounds):
        return Lit(nested.slice_values(x.value, bounds[0].value, bounds[1].value), x.type)
    return Func("list_slice", [x] + bounds, x.type)


def _plain_number(t: T.SqlType) -> bool:
    """Compared as Python numbers (int, Decimal, float compare by value)."""
    return t.is_numeric and t.kind != "BOOL"


def length(x: Expr) -> Expr:
    if x.type.kind != "LIST":
        raise SqlError(f"len / array_length: expected a list, got {x.type}")
    if isinstance(x, Lit):
        return Lit(None if x.value is None else len(x.value), T.INT64)
    return Func("list_len", [x], T.INT64)


def _names(e: Expr, where: str) -> tuple[str, ...]:
    if not (isinstance(e, Lit) and e.type.kind == "LIST" and e.value is not None
            and e.type.fields[0][1].kind in ("STRING", "INT32")):
        raise SqlError(f"{where}: the group names must be a constant list of strings")
    names = tuple(e.value)
    if not names:
        raise SqlError(f"{where}: the group name list must be non-empty")
    if any(not isinstance(n, str) for n in names):
        raise SqlError(f"{where}: NULL group name (the group names must be strings)")
    if len({n.lower() for n in names}) != len(names):
        raise SqlError(f"{where}: duplicate group names {list(names)}")
    return names


def regexp_extract_all(binder, node: exp.RegexpExtractAll) -> Expr:
    """regexp_extract_all(s, pattern [, group | [names]] [, options]): every match's group as a
    list of strings, or with a list of group names a list of STRUCTs (one field per name)."""
    s, pattern = binder.bind(node.this), binder.bind(node.expression)
    group = binder.bind(node.args["group"]) if node.args.get("group") is not None else Lit(0, T.INT32)
    options = binder.bind(node.args["parameters"]) if node.args.get("parameters") is not None else Lit("", T.STRING)
    if _is_null(pattern):
        raise SqlError("regexp_extract_all: the pattern must not be NULL")
    for e, what in ((s, "string"), (pattern, "pattern")):
        if e.type.kind != "STRING" and not _is_null(e):
            raise SqlError(f"regexp_extract_all: expected a string {what}, got {e.type}")
    if not isinstance(options, Lit) or options.type.kind != "STRING":
        raise SqlError("regexp_extract_all: the options must be a constant string")
    if group.type.kind == "LIST":
        names = _names(group, "regexp_extract_all")
        out = T.list_of(T.struct_of((n, T.STRING) for n in names))
        extra = ("names", names, options.value or "")
    else:
        if not (isinstance(group, Lit) and group.type.is_integer):
            raise SqlError("regexp_extract_all: the group must be a constant integer")
        out = T.list_of(T.STRING)
        extra = ("group", group.value, options.value or "")
    if _is_null(s):
        return Lit(None, out)
    return Func("regexp_extract_all", [s, pattern], out, extra)


def regexp_extract_struct(binder, node: exp.RegexpExtract) -> Expr:
    """regexp_extract(s, pattern, [names] [, options]): the first match's groups as a STRUCT."""
    s, pattern = binder.bind(node.this), binder.bind(node.expression)
    if not (isinstance(pattern, Lit) and pattern.value is not None):
        raise SqlError("regexp_extract with group names needs a constant pattern")
    names = _names(binder.bind(node.args["group"]), "regexp_extract")
    options = binder.bind(node.args["parameters"]) if node.args.get("parameters") is not None else Lit("", T.STRING)
    if not isinstance(options, Lit) or options.type.kind != "STRING":
        raise SqlError("regexp_extract: the options must be a constant string")
    out = T.struct_of((n, T.STRING) for n in names)
    if _is_null(s):
        return Lit(None, out)
    return Func("regexp_extract_struct", [s, pattern], out, (names, options.value or ""))


def column_field(binder, node: exp.Column) -> Expr | None:
    """``s.a`` / ``t.s.a`` / ``sch.t.s.a`` written as a column reference: the column named by the
    qualifier with the field after it (DuckDB tries the table qualification first: the caller
    calls this only when that failed). None when no prefix names a column."""
    parts = [p.name for p in node.parts]  # catalog, db, table, column: the ones given
    for split in range(len(parts) - 1, 0, -1):
        head, fields = parts[:split], parts[split:]
        name, qualifiers = head[-1], head[:-1]
        relation = qualifiers[-1] if qualifiers else None
        schema = qualifiers[-2] if len(qualifiers) > 1 else None
        try:
            x = binder.scope.resolve(name, relation, schema)
        except SqlError:
            continue
        if binder.agg_mode and x.cid in binder.key_cids:
            x = binder.key_cids[x.cid]
        for f in fields:
            x = field(x, f)
        return x
    return None
