"""sqlglot expression -> bound Expr with SQL typing (literals, arithmetic, dates, strings, CASE, casts)."""
from __future__ import annotations

import datetime
import decimal
from decimal import Decimal

from sqlglot import exp

from opforge.sql import types as T
from opforge.sql.column import timestamp_value
from opforge.sql.errors import ConversionError, NotSupportedError, SqlError
from opforge.sql.expr import Expr, Func, Lit, Ref, and_, arith_type, cmp
from opforge.sql.frontend.nested_calls import bind_nested_call, cast_nested, column_field, concat_lists, quantified_list, length as list_length
from opforge.sql.frontend.string_calls import bind_like, bind_string_call
from opforge.sql.frontend.intervals import add_interval
from opforge.sql.frontend.scope import Scope

_ARITH = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%", exp.IntDiv: "//"}
_CMPS = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
AGG_FUNCS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Variance, exp.VariancePop, exp.Stddev,
             exp.StddevSamp, exp.StddevPop, exp.LogicalAnd, exp.LogicalOr, exp.ArrayAgg, exp.AnonymousAggFunc,
             exp.First)
# sqlglot's aggregate class (lower-case name) -> the engine's function, where they differ
AGG_NAMES = {"variance": "var_samp", "variancepop": "var_pop", "stddev": "stddev_samp", "stddevsamp": "stddev_samp",
             "stddevpop": "stddev_pop", "logicaland": "bool_and", "logicalor": "bool_or", "arrayagg": "list",
             "decimal_average": "decimal_avg"}


def sql_type(dt: exp.DataType) -> T.SqlType:
    t = dt.this
    D = exp.DataType.Type
    simple = {D.INT: T.INT32, D.SMALLINT: T.INT32, D.TINYINT: T.INT32, D.BIGINT: T.INT64, D.DOUBLE: T.FLOAT64,
              D.FLOAT: T.FLOAT32, D.BOOLEAN: T.BOOL, D.DATE: T.DATE, D.VARCHAR: T.STRING, D.TEXT: T.STRING,
              D.CHAR: T.STRING}
    if t in simple:
        return simple[t]
    if t in (D.TIMESTAMP, D.TIMESTAMPNTZ, D.DATETIME):
        return T.timestamp(6)
    if t == D.TIMESTAMPTZ:
        return T.timestamp(6, "UTC")
    if t in (D.ARRAY, D.LIST) and dt.expressions:
        return T.list_of(sql_type(dt.expressions[0]))
    if t == D.STRUCT and dt.expressions:
        return T.struct_of((f.name, sql_type(f.args["kind"])) for f in dt.expressions)
    if t == D.DECIMAL:
        params = [int(p.this.this) if isinstance(p.this, exp.Literal) else int(p.name) for p in dt.expressions]
        p = params[0] if params else 18
        s = params[1] if len(params) > 1 else (3 if not params else 0)
        return T.declared_decimal(p, s)
    if t == D.INT128:  # HUGEINT: 128-bit DECIMAL(38, 0) storage (values to +-(10^38 - 1))
        return T.wide_decimal(38, 0)
    raise NotSupportedError(f"type {dt.sql(dialect='duckdb')}")


def number_literal(text: str) -> Lit:
    if "e" in text.lower():
        return Lit(float(text), T.FLOAT64)
    if "." in text:
        d = Decimal(text)
        digits = text.lstrip("-").replace(".", "")  # DuckDB counts leading zeros: 0.06 is DECIMAL(3,2)
        scale = len(text.split(".")[1])
        if max(len(digits), scale) > 38:  # DuckDB: beyond DECIMAL(38) a literal is a DOUBLE
            return Lit(float(d), T.FLOAT64)
        return Lit(d, T.declared_decimal(max(len(digits), scale, 1), scale))
    v = int(text)
    if not -2**63 <= v < 2**63:  # DuckDB: HUGEINT, here 128-bit DECIMAL(38, 0)
        if abs(v) >= 10 ** 38:
            return Lit(float(v), T.FLOAT64)
        return Lit(v, T.wide_decimal(38, 0))
    return Lit(v, T.INT32 if -2**31 <= v < 2**31 else T.INT64)


_DECIMAL_MAX_EXPONENT = 32768
_WIDE_CONTEXT = decimal.Context(prec=100)
_FLOAT_WORDS = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


def _string_number(text: str, to: T.SqlType) -> Lit:
    """The literal of a string CAST to a number: a numeric literal, or NaN / inf / infinity (any
    case, DuckDB's spellings) as a DOUBLE; anything else is DuckDB's conversion error."""
    word = text.strip()
    if word.lower() in _FLOAT_WORDS:
        return Lit(float(word), T.FLOAT64)
    try:
        if to.kind == "DECIMAL" and "e" in word.lower() and "inf" not in word.lower():
            d = Decimal(word)  # exactly, as DuckDB's decimal parser ('1e37' is 10^37, not a DOUBLE's)
            if not d.is_finite() or abs(d.as_tuple().exponent) > _DECIMAL_MAX_EXPONENT:
                raise ValueError(word)
            if d == d.to_integral_value():
                d = d.quantize(Decimal(1), context=_WIDE_CONTEXT)
            digits = len(d.as_tuple().digits)
            scale = max(-d.as_tuple().exponent, 0)
            if max(digits, scale) <= 38:
                return Lit(d, T.declared_decimal(max(digits, scale, 1), scale))
        lit = number_literal(word)
        # DuckDB's decimal parser refuses an exponent beyond +-32768 (1e-99999 is no DECIMAL 0)
        if to.kind == "DECIMAL" and "e" in word.lower() and abs(int(word.lower().split("e")[1])) > _DECIMAL_MAX_EXPONENT:
            raise ValueError(word)
        return lit
    except (ValueError, ArithmeticError):
        raise ConversionError(f"Could not convert string '{text}' to {to}") from None


def _common(types: list[T.SqlType], where: str) -> T.SqlType:
    types = [t for t in types if t is not None]
    if not types:
        return T.INT32
    if any(t.kind in T.NESTED for t in types):
        from opforge.sql.frontend.nested_calls import common_type
        return common_type(types, where)
    out = types[0]
    for t in types[1:]:
        if out.kind in ("STRING", "DATE", "TIMESTAMP") or t.kind in ("STRING", "DATE", "TIMESTAMP"):
            if out.kind != t.kind:
                raise SqlError(f"{where}: incompatible types {out} and {t}")
            continue
        out = T.common_numeric(out, t)
    return out


def _not_nested(e: Expr, what: str) -> None:
    if e.type.kind in T.NESTED:
        raise SqlError(f"{what}: expected a number, got {e.type}")


def string_literals_as(rows: list[list[Expr]]) -> list[list[Expr]]:
    """VALUES rows with each string literal of a column whose other values are numbers or dates
    read as that type ('42' beside 3 is 42; 'hello' there is DuckDB's conversion error)."""
    width = len(rows[0]) if rows else 0
    for i in range(width):
        items = [r[i] for r in rows if not _is_null_lit(r[i])]
        others = [e.type for e in items if e.type.kind != "STRING"]
        strings = [e for e in items if e.type.kind == "STRING"]
        if not strings or not others or not all(isinstance(e, Lit) for e in strings):
            continue
        if any(t.kind in T.NESTED for t in others):
            continue
        target = _common(others, "VALUES")
        for r in rows:
            e = r[i]
            if isinstance(e, Lit) and e.type.kind == "STRING" and e.value is not None:
                if target.kind == "DATE":
                    r[i] = Lit(_parse_date(e.value), T.DATE)
                elif target.kind == "TIMESTAMP":
                    r[i] = _timestamp_literal(e, target)
                elif target.is_numeric and target.kind != "BOOL":
                    r[i] = _string_number(e.value, target)
    return rows


def _is_null_lit(e: Expr) -> bool:
    return isinstance(e, Lit) and e.value is None


class ExprBinder:
    """Binds one expression tree. `replace` maps sqlglot SQL text -> Ref (aggregates / group keys);
    `key_cids` maps input cid -> group-key Ref; `agg_mode` rejects columns that are not group keys."""

    def __init__(self, query_binder, scope: Scope, replace: dict[str, Ref] | None = None,
                 key_cids: dict[int, Ref] | None = None, agg_mode: bool = False, correlated_hook=None,
                 windows=None, exists_hook=None, quantified_hook=None):
        self.qb, self.scope = query_binder, scope
        self.windows = windows  # frontend.windows.WindowCollector where OVER is allowed (SELECT, QUALIFY, ORDER BY)
        self.replace = replace or {}
        self.key_cids = key_cids or {}
        self.agg_mode = agg_mode
        self.correlated_hook = correlated_hook
        self.exists_hook = exists_hook  # EXISTS (subquery) -> its boolean, where subqueries can be joined in
        self.quantified_hook = quantified_hook  # (x, subquery, op, all) -> x op ANY / ALL (subquery)

    def bind(self, node: exp.Expression) -> Expr:
        if self.replace:
            hit = self.replace.get(self.qb.sql_text(node))
            if hit is not None:
                return hit
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            for cls, op in _ARITH.items():
                if isinstance(node, cls):
                    return self._arith(node, op)
            for cls, op in _CMPS.items():
                if isinstance(node, cls) and isinstance(node.this, exp.Tuple):  # (a, b) = (c, d)
                    from opforge.sql.frontend.row_compare import row_compare
                    return row_compare(self, node.this, node.expression, op)
                if isinstance(node, cls):
                    if isinstance(node.expression, (exp.Any, exp.All)) and self.quantified_hook is not None \
                            and isinstance(node.expression.this, (exp.Subquery, exp.Select)):
                        return self.quantified_hook(self.bind(node.this), node.expression.this, op,
                                                    isinstance(node.expression, exp.All))
                    if isinstance(node.expression, (exp.Any, exp.All)):  # x op ANY (list)
                        return quantified_list(self.bind(node.this), self.bind(node.expression.this), op,
                                               isinstance(node.expression, exp.All))
                    return self._compare(op, self.bind(node.this), self.bind(node.expression))
            if isinstance(node, AGG_FUNCS):
                raise SqlError(f"aggregate {node.sql(dialect='duckdb')} is not allowed here")
            call = bind_string_call(self, node)
            if call is None:
                call = bind_nested_call(self, node)
            if call is not None:
                return call
            raise NotSupportedError(f"{type(node).__name__}: {node.sql(dialect='duckdb')}")
        return method(node)

    def _Window(self, node):
        if self.windows is None:
            raise SqlError(f"window functions are not allowed here (only in SELECT, QUALIFY and ORDER BY): "
                           f"{node.sql(dialect='duckdb')}")
        return self.windows.bind(node, self)

    # -- leaves ------------------------------------------------------------------------------------------
    def _Column(self, node):
        if isinstance(node.this, exp.Star):
            raise SqlError(f"{node.sql()} is only allowed in the select list")
        db, catalog = node.args.get("db"), node.args.get("catalog")
        try:
            if catalog is not None and catalog.name.lower() not in ("memory", "main", "temp"):
                raise SqlError(f"unknown catalog {catalog.name!r} in column {node.sql()}")
            ref = self.scope.resolve(node.name, node.table or None, db.name if db is not None else None)
        except SqlError:
            hit = column_field(self, node) if node.table else None  # s.a: a STRUCT's field
            if hit is None:
                raise
            return hit
        if self.agg_mode:
            if ref.cid in self.key_cids:
                return self.key_cids[ref.cid]
            if ref.cid in self.scope.cids():
                raise SqlError(f"column {node.sql()!r} must appear in the GROUP BY clause or be used in an aggregate")
        return ref

    def _PositionalColumn(self, node):
        """``#n``: the n-th column of the FROM clause (DuckDB's positional reference)."""
        cols = [c for c in self.scope.cols if not c.hidden]
        n = int(node.this.this) if isinstance(node.this, exp.Literal) and not node.this.is_string else 0
        if not 1 <= n <= len(cols):
            raise SqlError(f"Binder Error: positional reference {node.sql()} out of range (the FROM clause has "
                           f"{len(cols)} columns)")
        c = cols[n - 1]
        ref = Ref(c.cid, c.type, c.name)
        if self.agg_mode:
            if ref.cid in self.key_cids:
                return self.key_cids[ref.cid]
            raise SqlError(f"column {node.sql()!r} must appear in the GROUP BY clause or be used in an aggregate")
        return ref

    def _Literal(self, node):
        if node.is_string:
            return Lit(node.this, T.STRING)
        return number_literal(node.this)

    def _Boolean(self, node):
        return Lit(bool(node.this), T.BOOL)

    def _Null(self, node):
        return Lit(None, T.INT32)

    def _Paren(self, node):
        return self.bind(node.this)

    def _Typeof(self, node):
        """typeof(x) as DuckDB names the type, for the types whose SQL name this engine keeps
        (TINYINT / SMALLINT are held as INTEGER, HUGEINT as DECIMAL(38,0): those are refused)."""
        t = self.bind(node.this).type
        name = {"INT64": "BIGINT", "FLOAT32": "FLOAT", "FLOAT64": "DOUBLE", "BOOL": "BOOLEAN", "STRING": "VARCHAR",
                "DATE": "DATE"}.get(t.kind)
        if t.kind == "DECIMAL" and (t.precision, t.scale) != (38, 0):
            name = str(t)
        if name is None:
            raise NotSupportedError(f"typeof of a {t} value (its exact SQL type is not kept)")
        return Lit(name, T.STRING)

    # -- operators ---------------------------------------------------------------------------------------
    def _arith(self, node, op):
        if isinstance(node.expression, exp.Interval) and op in "+-":
            return add_interval(self._interval_base(node.this), node.expression, 1 if op == "+" else -1, self.bind)
        if isinstance(node.this, exp.Interval) and op == "+":  # INTERVAL ... + x
            return add_interval(self._interval_base(node.expression), node.this, 1, self.bind)
        a, b = self.bind(node.this), self.bind(node.expression)
        a, b = self._date_literal_pair(a, b)
        if _is_null_lit(a) or _is_null_lit(b):
            t = arith_type(op, b if _is_null_lit(a) else a, b if _is_null_lit(a) else a) if not (_is_null_lit(a) and _is_null_lit(b)) else T.INT32
            return Lit(None, t)
        return Func("arith", [a, b], arith_type(op, a, b), op)

    def _Neg(self, node):
        a = self.bind(node.this)
        _not_nested(a, "unary -")
        if isinstance(a, Lit) and a.value is not None:
            return Lit(-a.value, a.type)
        return Func("neg", [a], a.type)

    def _interval_base(self, node) -> Expr:
        """The date / timestamp an interval is added to ('1992-01-01' as a string literal: a DATE)."""
        base = self.bind(node)
        if isinstance(base, Lit) and base.type.kind == "STRING" and base.value is not None:
            return Lit(_parse_date(base.value), T.DATE)
        return base

    def _date_literal_pair(self, a: Expr, b: Expr) -> tuple[Expr, Expr]:
        """'1998-01-01' compared with a DATE becomes a DATE literal."""
        if a.type.kind == "DATE" and isinstance(b, Lit) and b.type.kind == "STRING":
            return a, Lit(_parse_date(b.value), T.DATE)
        if b.type.kind == "DATE" and isinstance(a, Lit) and a.type.kind == "STRING":
            return Lit(_parse_date(a.value), T.DATE), b
        if a.type.kind == "TIMESTAMP" and isinstance(b, Lit) and b.type.kind in ("STRING", "TIMESTAMP"):
            return a, _timestamp_literal(b, a.type)
        if b.type.kind == "TIMESTAMP" and isinstance(a, Lit) and a.type.kind in ("STRING", "TIMESTAMP"):
            return _timestamp_literal(a, b.type), b
        return a, b

    def _compare(self, op, a, b):
        a, b = self._date_literal_pair(a, b)
        if not _is_null_lit(a) and not _is_null_lit(b):
            _common([a.type, b.type], f"comparison {op}")
        return cmp(op, a, b)

    def _And(self, node):
        return Func("and", [self._bool(node.this), self._bool(node.expression)], T.BOOL)

    def _Or(self, node):
        return Func("or", [self._bool(node.this), self._bool(node.expression)], T.BOOL)

    def _Not(self, node):
        return Func("not", [self._bool(node.this)], T.BOOL)

    def _bool(self, node) -> Expr:
        e = self.bind(node)
        if e.type.kind != "BOOL" and not _is_null_lit(e):
            raise SqlError(f"expected a boolean expression, got {e.type}: {node.sql(dialect='duckdb')}")
        return e

    def _Is(self, node):
        if not isinstance(node.expression, exp.Null):
            raise NotSupportedError(f"IS {node.expression.sql()}")
        return Func("is_null", [self.bind(node.this)], T.BOOL)

    def _NullSafeEQ(self, node):
        return self._not_distinct(self.bind(node.this), self.bind(node.expression))

    def _NullSafeNEQ(self, node):
        return Func("not", [self._not_distinct(self.bind(node.this), self.bind(node.expression))], T.BOOL)

    def _not_distinct(self, a: Expr, b: Expr) -> Expr:
        """a IS NOT DISTINCT FROM b: never NULL; two NULLs are equal, a NULL and a value are not."""
        if _is_null_lit(a) and _is_null_lit(b):
            return Lit(True, T.BOOL)
        if _is_null_lit(a) or _is_null_lit(b):
            return Func("is_null", [b if _is_null_lit(a) else a], T.BOOL)
        a_null, b_null = Func("is_null", [a], T.BOOL), Func("is_null", [b], T.BOOL)
        return Func("case", [a_null, b_null, b_null, Lit(False, T.BOOL), self._compare("=", a, b)], T.BOOL)

    def _Between(self, node):
        x = self.bind(node.this)
        return and_([self._compare(">=", x, self.bind(node.args["low"])), self._compare("<=", x, self.bind(node.args["high"]))])

    def _In(self, node):
        if node.args.get("query") is not None:
            if self.quantified_hook is None:
                raise NotSupportedError("IN (subquery) inside an expression (supported as a WHERE conjunct)")
            return self.quantified_hook(self.bind(node.this), node.args["query"], "=", False)
        x = self.bind(node.this)
        if _is_null_lit(x) and node.expressions:  # NULL IN (...): unknown, whatever the list holds
            return Lit(None, T.BOOL)
        items = []
        for it in node.expressions:
            b = self.bind(it)
            x2, b = self._date_literal_pair(x, b)
            items.append(b)
        return Func("in", [x] + items, T.BOOL, False)

    def _Like(self, node):
        pat = node.expression
        if not (isinstance(pat, exp.Literal) and pat.is_string):  # a pattern from a column: per distinct pair
            return bind_like(self, node, None)
        x = self.bind(node.this)
        if x.type.kind != "STRING":
            raise SqlError(f"LIKE: expected a string, got {x.type}")
        return Func("like", [x], T.BOOL, (pat.this, bool(node.args.get("negate"))))

    def _ILike(self, node):
        return bind_like(self, node, None)

    def _Escape(self, node):
        if not isinstance(node.this, (exp.Like, exp.ILike)):
            raise NotSupportedError(f"ESCAPE after {type(node.this).__name__}")
        return bind_like(self, node.this, node.expression)

    def _Case(self, node):
        operand = self.bind(node.this) if node.this is not None else None
        args, vals = [], []
        for branch in node.args.get("ifs") or []:
            cond = self.bind(branch.this)
            if operand is not None:
                cond = self._compare("=", operand, cond)
            elif cond.type.is_integer:  # CASE WHEN 1: DuckDB casts the integer to a boolean (non-zero)
                cond = Lit(None if cond.value is None else cond.value != 0, T.BOOL) if isinstance(cond, Lit) \
                    else cmp("<>", cond, Lit(0, cond.type))
            v = self.bind(branch.args["true"])
            args += [cond, v]
            vals.append(v)
        default = self.bind(node.args["default"]) if node.args.get("default") is not None else Lit(None, T.INT32)
        vals.append(default)
        t = _common([v.type for v in vals if not _is_null_lit(v)], "CASE")
        # a NULL value takes the result type; a NULL condition is a NULL boolean (never taken)
        args = [Lit(None, t if i % 2 else T.BOOL) if _is_null_lit(a) else a for i, a in enumerate(args)]
        default = Lit(None, t) if _is_null_lit(default) else default
        return Func("case", args + [default], t)

    def _If(self, node):
        return self._Case(exp.Case(ifs=[exp.If(this=node.this, true=node.args["true"])], default=node.args.get("false")))

    def _Coalesce(self, node):
        args = [self.bind(node.this)] + [self.bind(e) for e in node.expressions]
        t = _common([a.type for a in args if not _is_null_lit(a)], "COALESCE")
        return Func("coalesce", [Lit(None, t) if _is_null_lit(a) else a for a in args], t)

    def _Nullif(self, node):
        a, b = self.bind(node.this), self.bind(node.expression)
        return Func("nullif", [a, b], a.type)

    def _Cast(self, node):
        to = sql_type(node.to)
        x = self.bind(node.this)
        if isinstance(x, Lit) and x.type.kind == "STRING":
            if to.kind == "DATE":
                return Lit(_parse_date(x.value), T.DATE)
            if to.kind == "TIMESTAMP":
                return _timestamp_literal(x, to)
            if to.kind == "STRING":
                return x
            if to.is_numeric:
                return Func("cast", [_string_number(x.value, to)], to)
        if to.kind == "STRING":
            return x if x.type.kind == "STRING" else Func("to_string", [x], T.STRING)
        if x.type.kind in T.NESTED or to.kind in T.NESTED:
            if x.type == to or _is_null_lit(x):
                return x if x.type == to else Lit(None, to)
            return cast_nested(x, to)
        if x.type.kind == "STRING":
            if to.kind == "DATE" or to.is_integer or to.is_float:  # per distinct string (expr/string_casts.py)
                return Func("string_cast", [x], to)
            raise NotSupportedError(f"CAST of a string column to {to}")
        if _is_null_lit(x):
            return Lit(None, to)
        return Func("cast", [x], to)

    def _TryCast(self, node):
        raise NotSupportedError("TRY_CAST")

    def _Substring(self, node):
        x = self.bind(node.this)
        start = self._int_lit(node.args.get("start"), "SUBSTRING start")
        length = node.args.get("length")
        return Func("substring", [x], T.STRING, (start, None if length is None else self._int_lit(length, "SUBSTRING length")))

    def _int_lit(self, node, what) -> int:
        e = self.bind(node)
        if not isinstance(e, Lit) or not isinstance(e.value, int):
            raise NotSupportedError(f"{what} must be an integer literal")
        return e.value

    def _string_unary(self, node, name, out):
        x = self.bind(node.this)
        if x.type.kind != "STRING":
            raise SqlError(f"{name.upper()}: expected a string, got {x.type}")
        return Func(name, [x], out)

    def _Upper(self, node):
        return self._string_unary(node, "upper", T.STRING)

    def _Lower(self, node):
        return self._string_unary(node, "lower", T.STRING)

    def _Length(self, node):
        x = self.bind(node.this)
        if x.type.kind == "LIST":
            return list_length(x)
        return self._string_unary(node, "length", T.INT64)

    def _Trim(self, node):
        """TRIM / LTRIM / RTRIM: DuckDB strips spaces only (not tabs or newlines), or the characters
        of a constant second argument; a NULL argument makes the result NULL."""
        side = str(node.args.get("position") or "BOTH").upper()
        chars = " "
        if node.args.get("expression") is not None:
            c = self.bind(node.args["expression"])
            if not isinstance(c, Lit):  # characters from a column: per distinct (string, characters) pair
                x = self.bind(node.this)
                for e in (x, c):
                    if e.type.kind != "STRING" and not _is_null_lit(e):
                        raise SqlError(f"TRIM: expected strings, got {e.type}")
                if _is_null_lit(x):
                    return Lit(None, T.STRING)
                return Func("string_call", [x, c], T.STRING, f"trim_{side.lower()}")
            if c.value is None:
                return Lit(None, T.STRING)
            if c.type.kind != "STRING":
                raise SqlError(f"TRIM: expected string characters to strip, got {c.type}")
            chars = c.value
        x = self.bind(node.this)
        if isinstance(x, Lit) and x.value is None:
            return Lit(None, T.STRING)
        if x.type.kind != "STRING":
            raise SqlError(f"TRIM: expected a string, got {x.type}")
        return Func("trim", [x], T.STRING, (side, chars))

    def _DPipe(self, node):
        a, b = self.bind(node.this), self.bind(node.expression)
        if a.type.kind in T.NESTED or b.type.kind in T.NESTED:
            return concat_lists([a, b], strict=True)
        return Func("concat", [a, b], T.STRING)

    def _Concat(self, node):
        """CONCAT(...) skips NULL arguments (DuckDB), unlike ``||`` whose NULL operand makes NULL."""
        args = [a for a in (self.bind(e) for e in node.expressions) if not (isinstance(a, Lit) and a.value is None)]
        if any(a.type.kind in T.NESTED for a in args):
            raise SqlError("Binder Error: CONCAT of a LIST or STRUCT (use || or list_concat for lists): "
                           f"{node.sql(dialect='duckdb')}")
        if not args:
            return Lit("", T.STRING)
        return Func("concat", args, T.STRING, "skip_nulls")

    def _Extract(self, node):
        part = node.this.name.lower()
        x = self.bind(node.expression)
        if x.type.kind != "DATE":
            raise SqlError(f"EXTRACT: expected a DATE, got {x.type}")
        if part not in ("year", "month", "day", "quarter"):
            raise NotSupportedError(f"EXTRACT({part})")
        return Func("extract", [x], T.INT64, part)

    def _Year(self, node):
        return Func("extract", [self.bind(node.this)], T.INT64, "year")

    def _Abs(self, node):
        x = self.bind(node.this)
        _not_nested(x, "abs")
        return Func("abs", [x], x.type)

    def _Round(self, node):
        x = self.bind(node.this)
        digits = self._int_lit(node.args["decimals"], "ROUND digits") if node.args.get("decimals") is not None else 0
        t = T.decimal(x.type.precision, min(x.type.scale, max(digits, 0))) if x.type.kind == "DECIMAL" else x.type
        return Func("round", [x], t, digits)

    def _Subquery(self, node):
        return self.qb.scalar_subquery(node.this, self.scope, self.correlated_hook)

    def _Select(self, node):
        return self.qb.scalar_subquery(node, self.scope, self.correlated_hook)

    def _Exists(self, node):
        if self.exists_hook is None:
            raise NotSupportedError("EXISTS inside an expression (supported as a WHERE conjunct)")
        return self.exists_hook(node.this)


def _timestamp_literal(lit: Lit, to: T.SqlType) -> Lit:
    """A string or TIMESTAMP literal as a literal of the TIMESTAMP type ``to`` (its unit and zone),
    when the value is exact in that unit; else the literal as it is (compared in the finer unit)."""
    if lit.value is None:
        return Lit(None, to)
    if lit.type.kind == "TIMESTAMP":
        if lit.type.scale > to.scale and lit.value % 10 ** (lit.type.scale - to.scale):
            return lit
        return Lit(lit.value * 10 ** to.scale // 10 ** lit.type.scale, to)
    try:
        value = datetime.datetime.fromisoformat(lit.value.strip())
    except ValueError:
        raise SqlError(f"invalid TIMESTAMP literal {lit.value!r}") from None
    if value.tzinfo is not None and to.tz is None:  # DuckDB: the wall time in the session zone (UTC here)
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return Lit(timestamp_value(value, to), to)


def _parse_date(text: str) -> int:
    try:
        d = datetime.date.fromisoformat(text.strip())
    except ValueError:
        raise SqlError(f"invalid DATE literal {text!r}") from None
    return (d - datetime.date(1970, 1, 1)).days
