"""Correlated subqueries anywhere in an expression (SELECT list, HAVING, ORDER BY, QUALIFY, a WHERE
predicate that is not a plain conjunct): scalar subqueries and EXISTS, by general decorrelation
as in Neumann and Kemper's "Unnesting Arbitrary Queries".

Why this way: the subquery's value depends only on the outer columns it reads, so it is computed
once per distinct combination of them (the domain D = DISTINCT the correlated columns of the outer
plan): the subquery is bound with D joined into its FROM, its outer references reading D's columns,
its aggregation grouped by them too. The result, one row per domain value, is LEFT JOINed back to
the outer rows on those columns (NULL-safe: a NULL correlated value is a domain value of its own).
A domain value the subquery has no row for gets the value over no rows: count 0, other
aggregates NULL, EXISTS false. A scalar subquery that yields more than one row for an outer row is
an error at run time (DuckDB's default)."""
from __future__ import annotations

from sqlglot import exp

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.expr import Expr, Func, Lit, Ref
from opforge.sql.frontend.scope import Scope, ScopeCol


DOMAIN = "__domain"  # the relation name under which a subquery bound over the domain sees its columns


def _domain_columns(n: int) -> list[exp.Column]:
    return [exp.column(f"__d{i}", table=DOMAIN) for i in range(n)]


def _per_domain_value(q: exp.Select, n: int) -> exp.Select:
    """``q`` evaluated once per domain value: its window functions partitioned by the domain
    columns too, and its LIMIT / OFFSET a QUALIFY on the row number within each domain value."""
    limit, offset = q.args.get("limit"), q.args.get("offset")
    windows = [w for w in q.find_all(exp.Window) if _own_block(w, q)]
    if not windows and limit is None and offset is None:
        return q
    q = q.copy()
    for w in (w for w in q.find_all(exp.Window) if _own_block(w, q)):
        w.set("partition_by", list(w.args.get("partition_by") or []) + _domain_columns(n))
    if limit is None and offset is None:
        return q
    if q.args.get("distinct") is not None:
        raise NotSupportedError("SELECT DISTINCT ... LIMIT in a correlated subquery outside a WHERE conjunct")
    count = _literal_int(limit.expression) if limit is not None else None
    skip = _literal_int(offset.expression) if offset is not None else 0
    from opforge.sql.frontend.binder import _group_aggregates
    if q.args.get("group") is None and any(_group_aggregates(e) for e in q.expressions) and skip == 0 \
            and count != 0:  # one row per domain value already: LIMIT n >= 1 keeps it
        q.set("limit", None)
        q.set("offset", None)
        return q
    order = q.args.get("order")
    if order is not None and any(isinstance(o.this, exp.Literal) for o in order.expressions):
        raise NotSupportedError("ORDER BY a position with LIMIT in a correlated subquery outside a WHERE conjunct")
    number = exp.Window(this=exp.RowNumber(), partition_by=_domain_columns(n),
                        order=order.copy() if order is not None else None)
    keep = [exp.GT(this=number, expression=exp.Literal.number(skip))]
    if count is not None:
        keep.append(exp.LTE(this=number.copy(), expression=exp.Literal.number(skip + count)))
    if q.args.get("qualify") is not None:
        keep.append(exp.Paren(this=q.args["qualify"].this))
    q.set("qualify", exp.Qualify(this=exp.and_(*keep)))
    q.set("limit", None)
    q.set("offset", None)
    return q


def _literal_int(e: exp.Expression) -> int:
    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
        return int(e.this)
    raise NotSupportedError(f"LIMIT / OFFSET {e.sql(dialect='duckdb')} in a correlated subquery (only integer literals)")


def _own_block(node: exp.Expression, q: exp.Select) -> bool:
    """Whether ``node`` belongs to the block ``q`` itself, not to a subquery inside it."""
    p = node.parent
    while p is not None and p is not q:
        if isinstance(p, (exp.Select, exp.Subquery)):
            return False
        p = p.parent
    return True


def _zero(t: T.SqlType) -> Lit:
    if t.kind == "STRING":
        return Lit("", t)
    if t.kind == "LIST":
        return Lit([], t)
    if t.kind == "STRUCT":
        return Lit({n: None for n, _ in t.fields}, t)
    return Lit(False, t) if t.kind == "BOOL" else Lit(0, t)


def _null_safe_key(e: Expr) -> list[Expr]:
    """Join keys on which NULL equals NULL: the value with NULL read as a zero, and whether it is NULL."""
    return [Func("coalesce", [e, _zero(e.type)], e.type), Func("is_null", [e], T.BOOL)]


class SubqueryJoiner:
    """Joins the correlated subqueries met while binding expressions over ``node`` (in ``scope``)
    onto it; ``node`` grows by one LEFT JOIN per subquery. ``key_cids``: over a grouped block, the
    group key output that stands for each input column (the subquery's outer references are input
    columns)."""

    def __init__(self, qb, node: P.Node, scope: Scope, key_cids: dict[int, Ref] | None = None):
        self.qb, self.node, self.scope, self.key_cids = qb, node, scope, key_cids or {}

    def scalar(self, q: exp.Expression, _scope=None) -> Expr:
        return self._join(q, "scalar")

    def exists(self, q: exp.Expression) -> Expr:
        return self._join(q, "exists")

    def quantified(self, x: Expr, q: exp.Expression, op: str, every: bool) -> Expr:
        """``x op ANY (q)`` (``every``: ``op ALL``; IN is ``= ANY``), with SQL's three values:
        ANY is true when some comparison is true, else NULL when some is NULL, else false (no
        rows: false); ALL is false when some comparison is false, else NULL when some is NULL,
        else true (no rows: true). ``x`` joins the domain, so one join serves every outer row."""
        return self._join(q, "all" if every else "any", (x, op))

    # ------------------------------------------------------------------------------------------------
    def _outer_value(self, cid: int) -> Ref:
        for o in self.node.outputs:
            if o.cid == cid:
                return Ref(o.cid, o.type, o.name)
        if cid in self.key_cids:
            return self.key_cids[cid]
        raise NotSupportedError("a correlated subquery that reads a column of a query two or more levels out, "
                                "or a column that is neither grouped nor aggregated")

    def _join(self, q: exp.Expression, kind: str, compared: tuple[Expr, str] | None = None) -> Expr:
        qb = self.qb
        if isinstance(q, exp.Subquery):
            q = q.this
        sub, probe = qb.probe(q, self.scope)
        refs = list(dict.fromkeys(probe.outer_refs))
        if not refs and compared is None:
            return self._uncorrelated(sub, kind)
        if qb.probing:  # inside a probe only the references count: its plan is discarded
            qb.placeholders += 1
            return Lit(None, sub.outputs[0].type if kind == "scalar" and sub.outputs else T.BOOL)
        outer = [self._outer_value(r) for r in refs] + ([compared[0]] if compared else [])
        dcols = [qb.new_col(getattr(o, "name", "") or "x", o.type) for o in outer]
        domain = P.Distinct(P.Project(self.node, [(d, o) for d, o in zip(dcols, outer)]))
        dmap = {r: d for r, d in zip(refs, dcols)}  # the compared value's column is the domain's last
        dscope = Scope([ScopeCol(c.relation, c.name, dmap[c.cid].cid, c.type, c.hidden)
                        for c in self.scope._all() if c.cid in dmap]
                       + [ScopeCol(DOMAIN, f"__d{i}", d.cid, d.type, hidden=True) for i, d in enumerate(dcols)])
        proj, nkeys, scalar_aggregate = self._bind_over_domain(q, dscope, domain, dcols)
        keys = proj.outputs[:nkeys]
        items = proj.outputs[nkeys:]
        if kind != "exists" and len(items) != 1:
            raise SqlError(f"subquery returns {len(items)} columns, expected 1")
        rkeys = [Ref(k.cid, k.type, k.name) for k in keys]
        if kind == "scalar" and scalar_aggregate:  # one row per domain value
            from opforge.sql.frontend.binder import _value_over_no_rows
            empty = _value_over_no_rows(proj)
            marker = qb.new_col("matched", T.BOOL)
            right = P.Project(proj, [(o, Ref(o.cid, o.type, o.name)) for o in proj.outputs] + [(marker, Lit(True, T.BOOL))])
            v = items[0]
            value: Expr = Ref(v.cid, v.type, v.name)
            missing = Func("is_null", [Ref(marker.cid, T.BOOL, marker.name)], T.BOOL)
            if empty.value is not None:
                value = Func("case", [missing, empty, value], v.type)
        elif compared is not None:
            right, rkeys, value = self._quantified(proj, keys, rkeys, items[0], compared[1], kind == "all")
        else:
            gkeys = [(qb.new_col(k.name, k.type), r) for k, r in zip(keys, rkeys)]
            count = qb.new_col("rows", T.INT64)
            aggs = [(count, P.AggCall("count_star", None, T.INT64))]
            if kind == "scalar":
                v = items[0]
                first = qb.new_col(v.name, v.type)
                aggs.append((first, P.AggCall("min", Ref(v.cid, v.type, v.name), v.type)))
            right = P.Aggregate(proj, gkeys, aggs)
            rkeys = [Ref(o.cid, o.type, o.name) for o, _ in gkeys]
            counted = Ref(count.cid, T.INT64, count.name)
            if kind == "scalar" and not qb.single_row_check:  # any one of the rows: the least
                value = Ref(first.cid, first.type, first.name)
            elif kind == "scalar":
                value = Func("single_value", [counted, Ref(first.cid, first.type, first.name)], first.type)
            else:
                value = Func("not", [Func("is_null", [counted], T.BOOL)], T.BOOL)
        lk = [k for o in outer for k in _null_safe_key(o)]
        rk = [k for r in rkeys for k in _null_safe_key(r)]
        self.node = P.Join(self.node, right, "left", lk, rk)
        return value

    def _quantified(self, proj, keys, rkeys, item, op: str, every: bool):
        """Per domain value (the compared value last): how many rows, and how many comparisons are
        true and false; then the three-valued ANY / ALL over them (see :meth:`quantified`)."""
        qb = self.qb
        x, y = rkeys[-1], Ref(item.cid, item.type, item.name)
        if x.type.kind != y.type.kind and not (x.type.is_numeric and y.type.is_numeric):
            raise SqlError(f"{op} {'ALL' if every else 'ANY'} / IN: cannot compare {x.type} with {y.type}")
        test = Func("cmp", [x, y], T.BOOL, op)
        one = Lit(1, T.INT32)
        gkeys = [(qb.new_col(k.name, k.type), r) for k, r in zip(keys, rkeys)]
        total, yes, no = (qb.new_col(n, T.INT64) for n in ("rows", "true", "false"))
        aggs = [(total, P.AggCall("count_star", None, T.INT64)),
                (yes, P.AggCall("count", Func("case", [test, one, Lit(None, T.INT32)], T.INT32), T.INT64)),
                (no, P.AggCall("count", Func("case", [Func("not", [test], T.BOOL), one, Lit(None, T.INT32)], T.INT32),
                               T.INT64))]
        right = P.Aggregate(proj, gkeys, aggs)
        n, t, f = (Ref(o.cid, T.INT64, o.name) for o in (total, yes, no))
        zero = Lit(0, T.INT64)
        unknown = Func("cmp", [Func("arith", [Func("arith", [n, t], T.INT64, "-"), f], T.INT64, "-"), zero], T.BOOL, ">")
        decided, verdict = (f, False) if every else (t, True)
        value = Func("case", [Func("is_null", [n], T.BOOL), Lit(every, T.BOOL),
                              Func("cmp", [decided, zero], T.BOOL, ">"), Lit(verdict, T.BOOL),
                              unknown, Lit(None, T.BOOL), Lit(not verdict, T.BOOL)], T.BOOL)
        return right, [Ref(o.cid, o.type, o.name) for o, _ in gkeys], value

    def _bind_over_domain(self, q, dscope: Scope, domain: P.Node, dcols) -> tuple[P.Node, int, bool]:
        """The subquery ``q`` with the domain joined into its FROM: (its plan, whose first outputs
        are the domain columns, their number, whether it is an aggregate without GROUP BY)."""
        qb = self.qb
        if not isinstance(q, exp.Select):
            raise NotSupportedError(f"correlated subquery that is a {type(q).__name__} (outside a WHERE conjunct)")
        for clause in ("with_", "with", "windows"):
            if q.args.get(clause) is not None:
                raise NotSupportedError(f"{clause.rstrip('_').upper()} in a correlated subquery outside a WHERE conjunct")
        q = _per_domain_value(q, len(dcols))
        group = q.args.get("group")
        if group is not None and any(v for k, v in group.args.items() if k not in ("expressions", "all")):
            raise NotSupportedError("GROUPING SETS in a correlated subquery")
        distinct = q.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise NotSupportedError("DISTINCT ON in a correlated subquery")
        scope = Scope(parent=dscope)
        node, rest, correlated = qb._from(q, scope)
        from opforge.sql.frontend.binder import _group_aggregates
        sources = list(q.expressions) + ([q.args["having"].this] if q.args.get("having") is not None else [])
        for a in (a for s in sources for a in _group_aggregates(s)):
            cols = [c for c in a.find_all(exp.Column) if _own_block(c, q)]
            if cols and not any(scope._find(c.name, c.table or None) for c in cols):
                # DuckDB: an aggregate of outer columns only belongs to the outer query
                raise NotSupportedError(f"aggregate of outer columns {a.sql(dialect='duckdb')} in a correlated subquery")
        node = qb._join(node, domain, "inner", correlated, {d.cid for d in dcols})
        for w in rest:
            node = qb._apply_subquery_conjunct(node, w, scope)
        from opforge.sql.frontend.unnest import select_unnests
        q, node = select_unnests(qb, q, node, scope)
        keys = [(qb.new_col(d.name, d.type), Ref(d.cid, d.type, d.name)) for d in dcols]
        aggregated = any(_group_aggregates(s) for s in sources)
        _, proj = qb._aggregate_project(q, node, scope, extra_keys=keys, distinct=distinct is not None,
                                        group_extra=aggregated or group is not None)
        return proj, len(keys), aggregated and group is None

    def _uncorrelated(self, sub: P.Node, kind: str) -> Expr:
        qb = self.qb
        if kind == "scalar":
            if len(sub.outputs) != 1:
                raise SqlError(f"scalar subquery returns {len(sub.outputs)} columns, expected 1")
            return Lit(qb.run_scalar(sub), sub.outputs[0].type)
        n = qb.run_scalar(P.Aggregate(P.Limit(sub, 1), [], [(qb.new_col("n", T.INT64),
                                                              P.AggCall("count_star", None, T.INT64))]))
        return Lit(n > 0, T.BOOL)


class SideJoiner:
    """The subqueries of an outer join's ON clause: each is joined onto the input whose columns
    it reads (the condition then reads its value as a column of that side); one reading both
    sides is refused."""

    def __init__(self, qb, left: P.Node, right: P.Node, scope: Scope):
        self.qb, self.scope = qb, scope
        self.left, self.right = SubqueryJoiner(qb, left, scope), SubqueryJoiner(qb, right, scope)

    def _side(self, q, cids=()) -> SubqueryJoiner:
        _, probe = self.qb.probe(q.this if isinstance(q, exp.Subquery) else q, self.scope)
        reads = set(probe.outer_refs) | set(cids)
        for side in (self.left, self.right):
            if reads <= {o.cid for o in side.node.outputs}:
                return side
        raise NotSupportedError("a subquery in a JOIN's ON clause that reads both sides of the join")

    def scalar(self, q, _scope=None) -> Expr:
        return self._side(q).scalar(q)

    def exists(self, q) -> Expr:
        return self._side(q).exists(q)

    def quantified(self, x: Expr, q, op: str, every: bool) -> Expr:
        return self._side(q, x.cids()).quantified(x, q, op, every)
