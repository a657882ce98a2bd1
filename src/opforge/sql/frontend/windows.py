"""Window functions of one query block: ``f(...) OVER (...)`` / ``OVER w`` (the WINDOW clause) bound
to ``plan.WindowCall``s, one ``plan.WindowFunctions`` node per distinct (PARTITION BY, ORDER BY).

They are bound after GROUP BY / HAVING (their arguments may be aggregates: ``rank() OVER (ORDER
BY sum(x))``) and run before QUALIFY, DISTINCT, ORDER BY and LIMIT, as in DuckDB. The default frame
is DuckDB's: RANGE UNBOUNDED PRECEDING to CURRENT ROW with an ORDER BY, else the whole partition.
What is refused (EXCLUDE, count(DISTINCT) over a frame bounded on both sides, RANGE offsets on
non-numeric keys other than an INTERVAL of days or less over a DATE / TIMESTAMP key, DuckDB's ORDER BY inside a function's arguments, other functions) raises
``NotSupportedError`` naming the construct; what DuckDB rejects raises ``SqlError``."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr import Func, Lit, Ref
from opforge.sql.frontend.expressions import AGG_FUNCS, ExprBinder, _common
from opforge.sql.frontend.intervals import MICROS, interval_parts
from opforge.sql.physical.aggregate import SPREAD_FUNCS

RANKING = {exp.RowNumber: "row_number", exp.Rank: "rank", exp.DenseRank: "dense_rank",
           exp.PercentRank: "percent_rank", exp.CumeDist: "cume_dist", exp.Ntile: "ntile"}
VALUES = {exp.Lag: "lag", exp.Lead: "lead", exp.FirstValue: "first_value", exp.LastValue: "last_value",
          exp.NthValue: "nth_value"}
WHOLE = P.Frame("rows", P.FrameBound("unbounded_preceding"), P.FrameBound("unbounded_following"))
RUNNING = P.Frame("range", P.FrameBound("unbounded_preceding"), P.FrameBound("current"))
DAY_MICROS = 86400 * MICROS


def is_window_function(node: exp.Expression) -> bool:
    """True for the function of an OVER clause (``sum`` in ``sum(x) OVER ()``, also under FILTER):
    not a group aggregate."""
    p = node.parent
    if isinstance(p, exp.Filter) and p.this is node:
        node, p = p, p.parent
    return isinstance(p, exp.Window) and p.this is node


class WindowCollector:
    """Binds the windows an ``ExprBinder`` meets (``bind``) and stacks their nodes (``plan``)."""

    def __init__(self, query_binder, named: list[exp.Window] | None = None, expand=None):
        """``expand``: rewrites a PARTITION BY / ORDER BY expression's select-list aliases (DuckDB
        binds an alias there when no input column has its name)."""
        self.qb = query_binder
        self.expand = expand or (lambda e: e)
        self.named: dict[str, exp.Window] = {}
        for w in named or []:
            name = w.this.name.lower()
            if name in self.named:
                raise SqlError(f"window {w.this.name!r} is defined twice")
            self.named[name] = w
        self.seen: dict[str, Ref] = {}
        self.specs: dict[str, tuple[list, list, list]] = {}
        self.binding = False

    def __bool__(self):
        return bool(self.specs)

    def plan(self, node: P.Node) -> P.Node:
        for partition, order, calls in self.specs.values():
            node = P.WindowFunctions(node, partition, order, calls)
        return node

    def bind(self, node: exp.Window, binder: ExprBinder) -> Ref:
        text = self.qb.sql_text(node)
        if text in self.seen:
            return self.seen[text]
        if self.binding:
            raise SqlError(f"window functions cannot be nested: {text}")
        self.binding = True
        try:
            partition, order, spec = self._definition(node)
            part = [binder.bind(self.expand(e)) for e in partition]
            keys = [(binder.bind(self.expand(o.this)), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
                    for o in order]
            call = self._call(node.this, binder, keys, spec)
        finally:
            self.binding = False
        out = self.qb.new_col(text, call.type)
        key = repr(([str(e) for e in part], [(str(e), d, nf) for e, d, nf in keys]))
        self.specs.setdefault(key, (part, keys, []))[2].append((out, call))
        ref = self.seen[text] = Ref(out.cid, out.type, out.name)
        return ref

    def _definition(self, node: exp.Window):
        """(PARTITION BY exprs, ORDER BY terms, frame spec) with a named window's parts filled in."""
        partition = node.args.get("partition_by") or []
        order = node.args.get("order")
        spec = node.args.get("spec")
        alias = node.args.get("alias")
        if alias is not None:
            base = self.named.get(alias.name.lower())
            if base is None:
                raise SqlError(f"window {alias.name!r} is not defined (no WINDOW {alias.name} AS (...))")
            if partition:
                raise SqlError(f"OVER ({alias.name} PARTITION BY ...): a named window's partitioning cannot be changed")
            partition = base.args.get("partition_by") or []
            if order is None:
                order = base.args.get("order")
            elif base.args.get("order") is not None:
                raise SqlError(f"OVER ({alias.name} ORDER BY ...): window {alias.name!r} has an ORDER BY already")
            spec = spec if spec is not None else base.args.get("spec")
        return partition, (order.expressions if order is not None else []), spec

    def _call(self, fn: exp.Expression, binder: ExprBinder, keys, spec) -> P.WindowCall:
        ignore_nulls = isinstance(fn, exp.IgnoreNulls)
        if ignore_nulls and not isinstance(fn.this, tuple(VALUES)):
            raise SqlError(f"IGNORE NULLS in window function {fn.this.sql(dialect='duckdb')}: "
                           "only lag, lead, first_value, last_value and nth_value take it")
        if isinstance(fn, (exp.IgnoreNulls, exp.RespectNulls)):
            fn = fn.this
        where = None
        if isinstance(fn, exp.Filter):
            fn, where = fn.this, fn.expression.this
            if not isinstance(fn, AGG_FUNCS):
                raise SqlError(f"FILTER (WHERE ...) on window function {fn.sql(dialect='duckdb')}: only on aggregates")
        frame = self._frame(spec, keys, binder)
        for cls, name in RANKING.items():
            if isinstance(fn, cls):
                given = [k for k, v in fn.args.items() if v]
                if name != "ntile":
                    if given:  # DuckDB's rank(ORDER BY ...): an order of its own, not the window's
                        raise NotSupportedError(f"arguments to window function {name}: {fn.sql(dialect='duckdb')}")
                    return P.WindowCall(name, [], T.FLOAT64 if name in ("percent_rank", "cume_dist") else T.INT64)
                if given != ["this"]:
                    raise SqlError(f"ntile: expected one argument (the number of buckets): {fn.sql(dialect='duckdb')}")
                k = binder.bind(fn.this)
                if not k.type.is_integer:
                    raise SqlError(f"ntile: expected an integer argument, got {k.type}")
                return P.WindowCall(name, [k], T.INT64)
        for cls, name in VALUES.items():
            if isinstance(fn, cls):
                call = self._value_call(name, fn, binder, frame)
                call.ignore_nulls = ignore_nulls
                return call
        if isinstance(fn, AGG_FUNCS):
            agg = self.qb._agg_call(fn, binder)
            if agg.func in SPREAD_FUNCS or agg.func in ("list", "fsum", "favg", "decimal_avg", "first"):
                raise NotSupportedError(f"window function {agg.func}: {fn.sql(dialect='duckdb')}")
            if agg.func == "count_distinct" and frame.start.kind != "unbounded_preceding" \
                    and frame.end.kind != "unbounded_following":
                raise NotSupportedError("count(DISTINCT ...) OVER a frame bounded on both sides "
                                        "(only frames from the partition's first row or to its last)")
            func, arg = agg.func, agg.arg
            if where is not None:  # agg(x) FILTER (WHERE c) is agg(CASE WHEN c THEN x END)
                if func == "count_star":
                    func, arg = "count", Lit(1, T.INT64)
                cond = binder.bind(where)
                if cond.type.kind != "BOOL":
                    raise SqlError(f"FILTER: expected a boolean, got {cond.type}")
                arg = Func("case", [cond, arg, Lit(None, arg.type)], arg.type)
            return P.WindowCall(func, [] if arg is None else [arg], agg.type, frame)
        if isinstance(fn, (exp.LogicalAnd, exp.LogicalOr)):  # bool_and / bool_or: min / max of booleans
            x = binder.bind(fn.this)
            if x.type.kind != "BOOL":
                raise SqlError(f"{fn.sql(dialect='duckdb')}: expected a boolean argument, got {x.type}")
            return P.WindowCall("min" if isinstance(fn, exp.LogicalAnd) else "max", [x], T.BOOL, frame)
        if isinstance(fn, exp.Anonymous) and fn.name.lower() == "fill":
            return _fill_call(fn, binder, keys)
        name = fn.sql_name() if hasattr(fn, "sql_name") else type(fn).__name__
        raise NotSupportedError(f"window function {name.lower()}: {fn.sql(dialect='duckdb')}")

    def _value_call(self, name: str, fn: exp.Expression, binder: ExprBinder, frame) -> P.WindowCall:
        if isinstance(fn.this, exp.Order):
            raise NotSupportedError(f"ORDER BY in the arguments of window function {name}: {fn.sql(dialect='duckdb')}")
        extra = [k for k, v in fn.args.items() if v and k not in ("this", "offset", "default")]
        if extra or fn.this is None or (name == "nth_value" and fn.args.get("offset") is None):
            raise SqlError(f"{name}: unexpected arguments: {fn.sql(dialect='duckdb')}")
        x = binder.bind(fn.this)
        if name in ("first_value", "last_value"):
            return P.WindowCall(name, [x], x.type, frame)
        if name == "nth_value":
            k = binder.bind(fn.args["offset"])
            if not k.type.is_integer:
                raise SqlError(f"nth_value: expected an integer row number, got {k.type}")
            return P.WindowCall(name, [x, k], x.type, frame)
        off = binder.bind(fn.args["offset"]) if fn.args.get("offset") is not None else Lit(1, T.INT64)
        if not (off.type.is_integer or (isinstance(off, Lit) and off.value is None)):
            raise SqlError(f"{name}: expected an integer offset, got {off.type}")
        default = binder.bind(fn.args["default"]) if fn.args.get("default") is not None else Lit(None, x.type)
        if isinstance(default, Lit) and default.value is None:
            default = Lit(None, x.type)
        typ = _common([x.type, default.type], name)
        x, default = (e if e.type == typ else Func("cast", [e], typ) for e in (x, default))
        return P.WindowCall(name, [x, off, default], typ)

    def _frame(self, spec, keys, binder: ExprBinder) -> P.Frame:
        if spec is None:
            return RUNNING if keys else WHOLE
        if spec.args.get("exclude") is not None:
            raise NotSupportedError(f"EXCLUDE {spec.args['exclude'].name} in a window frame")
        unit = str(spec.args.get("kind") or "").lower()
        if unit not in ("rows", "range", "groups"):
            raise NotSupportedError(f"window frame unit {unit.upper()}")
        start = self._bound(spec.args.get("start"), spec.args.get("start_side"), unit, keys, binder)
        end = self._bound(spec.args.get("end") or "CURRENT ROW", spec.args.get("end_side"), unit, keys, binder)
        if start.kind == "unbounded_following":
            raise SqlError("window frame cannot start at UNBOUNDED FOLLOWING")
        if end.kind == "unbounded_preceding":
            raise SqlError("window frame cannot end at UNBOUNDED PRECEDING")
        if start.kind in ("current", "following") and end.kind == "preceding" or \
                start.kind == "following" and end.kind == "current":
            where = "current row" if start.kind == "current" else "following row"
            raise SqlError(f"window frame starting from the {where} cannot have preceding rows")
        if start.kind == "unbounded_preceding" and end.kind == "unbounded_following":
            return WHOLE
        return P.Frame(unit, start, end)

    def _bound(self, value, side, unit: str, keys, binder: ExprBinder) -> P.FrameBound:
        if isinstance(value, str):
            if value.upper() == "CURRENT ROW":
                return P.FrameBound("current")
            if value.upper() == "UNBOUNDED":
                return P.FrameBound(f"unbounded_{(side or 'preceding').lower()}")
            raise NotSupportedError(f"window frame bound {value}")
        if unit == "range" and isinstance(value, exp.Interval):
            return P.FrameBound(str(side).lower(), _interval_offset(value, keys, binder))
        offset = binder.bind(value)  # per row: it may read the row's columns
        if unit in ("rows", "groups") and not offset.type.is_integer:
            raise SqlError(f"{unit.upper()} frame offset must be an integer, got {offset.type}")
        if unit == "range":
            if len(keys) != 1:
                raise SqlError("RANGE with an offset PRECEDING / FOLLOWING needs exactly one ORDER BY column")
            key_type = keys[0][0].type
            if not key_type.is_numeric or key_type.kind == "BOOL" or not offset.type.is_numeric:
                raise NotSupportedError(f"RANGE frame offset over an ORDER BY key of type {key_type} "
                                        "(numeric keys only)")
        return P.FrameBound(str(side).lower(), offset)


def _interval_offset(node: exp.Interval, keys, binder: ExprBinder) -> Lit:
    """``RANGE BETWEEN INTERVAL 3 DAY PRECEDING ...`` over a DATE / TIMESTAMP key: the interval as a
    constant offset in the key's storage units (days; 10^-digits s), so its frames are searched as
    over numbers. Months and years (their length varies from row to row) and amounts read from the
    row are refused; so is part of a day over a DATE key (DuckDB compares those as timestamps)."""
    if len(keys) != 1:
        raise SqlError("RANGE with an offset PRECEDING / FOLLOWING needs exactly one ORDER BY column")
    key_type, text = keys[0][0].type, node.sql(dialect="duckdb")
    if key_type.kind not in ("DATE", "TIMESTAMP"):
        raise SqlError(f"RANGE frame offset {text}: an INTERVAL needs a DATE or TIMESTAMP ORDER BY key, "
                       f"not {key_type}")
    parts = interval_parts(node, binder.bind)
    terms = parts["months"] + parts["days"] + parts["micros"]
    if parts["months"] or not all(isinstance(t, int) and not isinstance(t, bool) for t in terms):
        raise NotSupportedError(f"RANGE frame offset {text}: only a constant interval of weeks, days or "
                                "less (no months or years, no amount read from the row)")
    micros = sum(parts["days"]) * DAY_MICROS + sum(parts["micros"])
    if key_type.kind == "DATE":
        if micros % DAY_MICROS:
            raise NotSupportedError(f"RANGE frame offset {text} over a DATE key: whole days only")
        return Lit(micros // DAY_MICROS, T.INT64)
    units, rest = divmod(micros * 10 ** key_type.scale, MICROS)
    return Lit(units, T.INT64) if rest == 0 else Lit(micros * 10 ** key_type.scale / MICROS, T.FLOAT64)


def _fill_call(fn: exp.Anonymous, binder: ExprBinder, keys) -> P.WindowCall:
    """``fill(x [ORDER BY k])``: physical/window_fill.py; the key defaults to the window's ORDER BY."""
    if len(fn.expressions) != 1:
        raise SqlError(f"fill: expected one argument: {fn.sql(dialect='duckdb')}")
    arg = fn.expressions[0]
    if isinstance(arg, exp.Order):
        if len(arg.expressions) != 1:
            raise SqlError("FILL functions must have only one ORDER BY expression")
        x, k = binder.bind(arg.this), binder.bind(arg.expressions[0].this)
    else:
        if len(keys) != 1:
            raise SqlError("FILL functions must have exactly one ORDER BY expression (in the call or the window)")
        x, k = binder.bind(arg), keys[0][0]
    for e, what in ((x, "argument"), (k, "ordering")):
        if not e.type.is_numeric or e.type.kind == "BOOL":
            if e.type.kind in ("DATE", "TIMESTAMP"):
                raise NotSupportedError(f"fill of {e.type} values / keys")
            raise SqlError(f"FILL {what} must support subtraction, got {e.type}")
    return P.WindowCall("fill", [x, k], x.type)
