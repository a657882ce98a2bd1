"""Query blocks -> logical plan: FROM/JOIN with a join order that avoids cross products, WHERE with
subqueries (uncorrelated scalar subqueries evaluated first; EXISTS / IN / correlated scalar subqueries
decorrelated into semi/anti/left joins on the correlation keys), GROUP BY (ALL, ROLLUP / CUBE / GROUPING SETS)
/ HAVING, window functions (``windows.py``) and QUALIFY, ORDER BY [ALL], LIMIT, UNION / INTERSECT / EXCEPT
(``set_operations.py``), VALUES in FROM, CTEs."""
from __future__ import annotations

import itertools

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.schemas import qualified_name, schema_of
from opforge.sql.expr import Expr, Func, Lit, Ref, and_, cmp, conjuncts, equi_pair, factor_or, split_equi, value_with
from opforge.sql.frontend.expressions import AGG_FUNCS, AGG_NAMES, ExprBinder, _common, string_literals_as
from opforge.sql.frontend.output_names import output_name
from opforge.sql.frontend.grouping_sets import grouping_sets, grouping_value, over_union, own_nodes, subquery_parts
from opforge.sql.frontend.scope import Scope, ScopeCol, close_names
from opforge.sql.frontend import recursive_cte
from opforge.sql.frontend.correlated import SideJoiner, SubqueryJoiner
from opforge.sql.frontend.set_operations import (align_by_name, as_strings, branch_item_positions, intersect_except,
                                                  output_relations, set_type)
from opforge.sql.frontend.exact_sums import marked
from opforge.sql.frontend.star import expand_star
from opforge.sql.frontend.unnest import from_unnest, select_unnests
from opforge.sql.frontend.windows import WindowCollector, is_window_function
from opforge.sql.physical.aggregate import SPREAD_FUNCS, result_type

VOLATILE = {"random", "rand", "uuid", "gen_random_uuid", "nextval"}  # another value at every call


class Binder:
    def __init__(self, catalog, run_scalar, cid_counter: itertools.count | None = None,
                 order_by_literals: bool = False):
        """catalog: object with .tables (name -> Table) and .views (name -> sqlglot query);
        run_scalar: callable(plan) -> Python value of a one-row, one-column plan (uncorrelated subqueries)."""
        self.catalog, self.run_scalar = catalog, run_scalar
        self.order_by_literals = order_by_literals  # SET order_by_non_integer_literal (DuckDB)
        self.cids = cid_counter or itertools.count()
        self.ctes: list[dict[str, exp.Expression]] = []
        self.probing = 0  # > 0 while a subquery is bound only to learn its outer references (``probe``)
        # subqueries a probe left as placeholders (correlated ones, ARRAY(subquery), row ANY / ALL):
        # a probe that left any binds again for real, and only then may its plan be used
        self.placeholders = 0
        self.single_row_check = True  # SET scalar_subquery_error_on_multiple_rows (false: any one row)
        self._texts: dict[int, tuple[exp.Expression, str]] = {}
        self._scalar_values: dict[tuple, tuple] = {}  # uncorrelated scalar subqueries run once (``_subquery_key``)
        self._duckdb = Dialect.get_or_raise("duckdb").generator()

    def sql_text(self, node: exp.Expression) -> str:
        """``node.sql(dialect="duckdb")``, the key that matches select items, group keys and
        aggregates. Generated once per node, by one generator: sqlglot builds a dialect and a
        generator and deep-copies the subtree for every generation, and binding asks again for
        every node under a grouped select (the trees are not changed meanwhile)."""
        hit = self._texts.get(id(node))
        if hit is None or hit[0] is not node:  # the node is kept: its id cannot be reused meanwhile
            hit = self._texts[id(node)] = (node, self._duckdb.generate(node))
        return hit[1]

    def new_col(self, name: str, typ: T.SqlType) -> P.OutCol:
        return P.OutCol(next(self.cids), name, typ)

    # ---------------------------------------------------------------------------------------- queries
    def bind_query(self, q: exp.Expression, parent: Scope | None = None) -> tuple[P.Node, Scope]:
        """Any query expression -> (plan, scope of the block, whose outer_refs tell if it is correlated)."""
        with_ = q.args.get("with_") or q.args.get("with")
        if with_ is not None:
            recursive = bool(with_.args.get("recursive"))
            frame = {}
            self.ctes.append(frame)
            try:
                for cte in with_.expressions:
                    ta = cte.args.get("alias")
                    cols = [c.name for c in ta.columns] if ta is not None and ta.columns else []
                    name = cte.alias_or_name.lower()
                    if name in frame:
                        raise SqlError(f"Duplicate CTE name {cte.alias_or_name!r}")
                    if recursive and recursive_cte.references(cte.this, name):
                        frame[name] = (recursive_cte.materialize(self, name, cte.this, cols,
                                                                 self.ctes[:-1] + [dict(frame)]), cols)
                        continue
                    frame[name] = (cte.this, cols)
                return self._bind_body(q, parent)
            finally:
                self.ctes.pop()
        return self._bind_body(q, parent)

    def _with_ctes(self, ctes, fn, *args):
        """``fn(*args)`` with only ``ctes`` in view (a CTE's or a view's body)."""
        saved, self.ctes = self.ctes, ctes
        try:
            return fn(*args)
        finally:
            self.ctes = saved

    def _bind_body(self, q: exp.Expression, parent: Scope | None) -> tuple[P.Node, Scope]:
        """``bind_query`` below the WITH clause, whose CTEs are in ``self.ctes``: the query is
        bound in place (no block below reads the clause), not deep-copied without it."""
        if isinstance(q, exp.Subquery):
            return self.bind_query(q.this, parent)
        if isinstance(q, (exp.Union, exp.Intersect, exp.Except)):
            return self._set_operation(q, parent)
        if isinstance(q, exp.Select):
            return self._select(q, parent)
        if isinstance(q, exp.Values):  # a VALUES list as a query of its own
            node, cols = self._values(q, q.alias_or_name or "valueslist")
            return node, Scope(cols, parent)
        raise NotSupportedError(f"statement {type(q).__name__}")

    def _set_operation(self, q: exp.Expression, parent):
        """UNION / INTERSECT / EXCEPT [ALL], then the ORDER BY and LIMIT that follow them."""
        what = type(q).__name__.upper()
        left, ls = self.bind_query(q.this, parent)
        right, rs = self.bind_query(q.expression, parent)
        sides = left.outputs, right.outputs  # each side's own columns, in its select order
        if q.args.get("by_name"):
            left, right = align_by_name(self, left, right)
        if len(left.outputs) != len(right.outputs):
            raise SqlError(f"{what}: the sides have {len(left.outputs)} and {len(right.outputs)} columns")
        types = [set_type(a.type, b.type, what) for a, b in zip(left.outputs, right.outputs)]
        left, right = as_strings(self, left, types), as_strings(self, right, types)
        outs = [self.new_col(a.name, t) for a, t in zip(left.outputs, types)]
        every = not q.args.get("distinct")
        if isinstance(q, exp.Union):
            node: P.Node = P.Union([left, right], outs, all=every)
        else:
            node = intersect_except(self, left, right, outs, isinstance(q, exp.Intersect), every)
        scope = Scope([ScopeCol("", o.name, o.cid, o.type) for o in outs], parent)
        left_names = {o.name.lower() for o in outs}
        # ORDER BY may name a column by the right side's name too (DuckDB), the left's first
        scope.cols += [ScopeCol("", r.name, o.cid, o.type) for o, r in zip(outs, right.outputs)
                       if r.name.lower() not in left_names]
        # ORDER BY t.x: the output of a select item t.x (BY NAME: the output of that name)
        by_name = {o.name.lower(): o for o in outs}
        mapped = [[by_name[c.name.lower()] for c in side] if q.args.get("by_name") else outs for side in sides]
        scope.cols += output_relations(q.this, sides[0], mapped[0], ls) + \
            output_relations(q.expression, sides[1], mapped[1], rs)
        scope.outer_refs = ls.outer_refs + rs.outer_refs
        return self._order_limit(q, node, outs, scope), scope

    def _order_limit(self, q, node: P.Node, outs: list[P.OutCol], scope: Scope) -> P.Node:
        """ORDER BY (output positions or expressions over the outputs) and LIMIT over ``node``."""
        order = q.args.get("order")
        if order is not None:
            keys = []
            for o in _order_terms(order, len(outs)):
                e = o.this
                idx = _order_position(e, len(outs), self.order_by_literals)
                if idx is not None:
                    r = outs[idx]
                    ref = Ref(r.cid, r.type, r.name)
                else:
                    try:
                        ref = ExprBinder(self, scope).bind(e)
                    except SqlError:
                        # after a set operation: an expression written as one of a side's select items
                        idx = branch_item_positions(q, self.sql_text).get(self.sql_text(e))
                        if idx is None or not isinstance(q, exp.SetOperation):
                            raise
                        ref = Ref(outs[idx].cid, outs[idx].type, outs[idx].name)
                keys.append((ref, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
            node = P.Sort(node, keys)
        return self._limit(q, node, scope)

    def _limit(self, q, node, scope):
        lim, off = q.args.get("limit"), q.args.get("offset")
        if lim is None and off is None:
            return node
        o = 0 if off is None else self._const_int(off.expression, "OFFSET", scope)
        options = lim.args.get("limit_options") if lim is not None else None
        if options is not None and options.args.get("with_ties"):
            raise NotSupportedError("FETCH ... WITH TIES")
        if options is not None and options.args.get("percent"):
            return P.Limit(node, self._percent_rows(lim.expression, node, scope), o)
        n = None if lim is None else self._const_int(lim.expression, "LIMIT", scope)
        return P.Limit(node, n, o)

    def _percent_rows(self, e, node, scope) -> int | None:
        """LIMIT p PERCENT keeps floor(p / 100 * rows) rows, counting the rows before OFFSET (DuckDB).
        The rows are counted here, by running the query below once, so that the plan's Limit
        keeps a plain row count."""
        if scope.outer_refs:
            raise NotSupportedError("LIMIT ... PERCENT in a correlated subquery")
        pct = ExprBinder(self, Scope()).bind(e)
        if not isinstance(pct, Lit):
            pct = Lit(self.run_scalar(P.Project(P.OneRow(), [(self.new_col("pct", pct.type), pct)])), pct.type)
        if pct.value is None:
            return None  # LIMIT NULL PERCENT: no limit, as LIMIT NULL
        if not pct.type.is_numeric or pct.type.kind == "BOOL":
            raise SqlError(f"LIMIT PERCENT: expected a number, got {pct}")
        value = float(pct.value)
        if not 0 <= value <= 100:
            raise SqlError(f"LIMIT percent {value} out of range: it must be between 0 and 100")
        count = P.Aggregate(node, [], [(self.new_col("n", T.INT64), P.AggCall("count_star", None, T.INT64))])
        return int(value / 100 * self.run_scalar(count))

    def _const_int(self, e, what, scope=None):
        """LIMIT / OFFSET: an integer literal, or a constant expression (an uncorrelated scalar
        subquery too) computed now; a fraction rounds to the nearest integer, as DuckDB casts."""
        if isinstance(e, exp.Literal) and not e.is_string:
            return int(e.this)
        if scope is None or scope.outer_refs or any(isinstance(c, exp.Column) for c in e.find_all(exp.Column)
                                                    if not any(isinstance(p, (exp.Select, exp.Subquery))
                                                               for p in _ancestors(c, e))):
            raise NotSupportedError(f"{what} must be an integer literal or a constant expression")
        v = ExprBinder(self, Scope()).bind(e)
        if not isinstance(v, Lit):
            v = Lit(self.run_scalar(P.Project(P.OneRow(), [(self.new_col(what.lower(), v.type), v)])), v.type)
        if v.value is None:
            return None if what == "LIMIT" else 0
        if not v.type.is_numeric or v.type.kind == "BOOL":
            raise SqlError(f"{what}: expected a number, got {v.type}")
        value = round(float(v.value))
        if value < 0:
            raise SqlError(f"{what} must not be negative, got {value}")
        return value

    # ------------------------------------------------------------------------------------------ FROM
    def _relation(self, t: exp.Expression, parent: Scope | None) -> tuple[P.Node, list[ScopeCol]]:
        alias = t.alias_or_name
        if isinstance(t, exp.Table):
            name = qualified_name(t)
            for depth in range(len(self.ctes) - 1, -1, -1):
                frame = self.ctes[depth]
                if name in frame:
                    # a CTE sees the WITH clauses around it and the CTEs before it, not those after
                    earlier = dict(itertools.takewhile(lambda kv: kv[0] != name, frame.items()))
                    return self._with_ctes(self.ctes[:depth] + [earlier], self._derived, frame[name][0], alias, t, frame[name][1])
            if name in self.catalog.views:
                return self._with_ctes([], self._derived, self.catalog.views[name], alias, t, [])
            tables = {k.lower(): k for k in self.catalog.tables}
            if name not in tables:
                raise SqlError(f"unknown table {t.name!r}" + close_names(t.name, list(self.catalog.tables) + list(self.catalog.views)))
            table = self.catalog.tables[tables[name]]
            outs = [self.new_col(n, typ) for n, typ in zip(table.names, table.types)]  # loads no column
            schema = schema_of(name) if t.args.get("alias") is None else ""
            return P.Scan(tables[name], outs), [ScopeCol(alias, o.name, o.cid, o.type, schema=schema) for o in outs]
        if isinstance(t, exp.Subquery):
            return self._derived(t.this, alias, t, [])
        if isinstance(t, exp.Values):
            return self._values(t, alias or "valueslist")
        if isinstance(t, exp.Unnest):
            return from_unnest(self, t, alias)
        raise NotSupportedError(f"FROM item {type(t).__name__}: {t.sql(dialect='duckdb')}")

    def _values(self, t: exp.Values, alias: str):
        """``(VALUES (1, 'a'), (2, 'b')) v(x, y)``: one constant row per tuple, UNION ALL'ed; each
        column of the values' common type, named by the alias list else col0, col1, ... (DuckDB)."""
        binder = ExprBinder(self, Scope())
        rows = [[binder.bind(v) for v in (r.expressions if isinstance(r, exp.Tuple) else [r])] for r in t.expressions]
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise SqlError("VALUES lists must all be the same length")
        ta = t.args.get("alias")
        names = [c.name for c in ta.columns] if ta is not None and ta.columns else []
        if len(names) > width:
            raise SqlError(f"{alias}: {len(names)} column names given for {width} columns")
        names += [f"col{i}" for i in range(len(names), width)]
        rows = string_literals_as(rows)
        types = [_common([r[i].type for r in rows if not (isinstance(r[i], Lit) and r[i].value is None)], "VALUES")
                 for i in range(width)]
        children = []
        for r in rows:
            exprs = [Lit(None, typ) if isinstance(e, Lit) and e.value is None else e for e, typ in zip(r, types)]
            children.append(P.Project(P.OneRow(), [(self.new_col(n, e.type), e) for n, e in zip(names, exprs)]))
        outs = [self.new_col(n, typ) for n, typ in zip(names, types)]
        return P.Union(children, outs, all=True), [ScopeCol(alias, o.name, o.cid, o.type) for o in outs]

    def _derived(self, query, alias, t, column_names: list[str]):
        node, _ = self.bind_query(query, None)
        names = [o.name for o in node.outputs]
        names = list(column_names[:len(names)]) + names[len(column_names):]  # a CTE's own column names
        ta = t.args.get("alias")
        cols = [c.name for c in ta.columns] if ta is not None and ta.columns else column_names
        if len(cols) > len(names):
            raise SqlError(f"{alias}: {len(cols)} column names given for {len(names)} columns")
        names = cols + names[len(cols):]
        # fresh names per reference: wrap in a projection so each use has its own cids
        outs = [self.new_col(n, o.type) for n, o in zip(names, node.outputs)]
        proj = P.Project(node, [(oc, Ref(o.cid, o.type, o.name)) for oc, o in zip(outs, node.outputs)])
        return proj, [ScopeCol(alias, o.name, o.cid, o.type) for o in outs]

    def _from(self, q: exp.Select, scope: Scope) -> tuple[P.Node, list[exp.Expression], list[Expr]]:
        """Binds FROM and JOINs into scope. Returns the plan, the WHERE conjuncts with subqueries (applied
        after the joins), and the conjuncts that reference an enclosing query (correlation predicates)."""
        frm = q.args.get("from_") or q.args.get("from")
        where = q.args.get("where")
        where_parts = _split_and(where.this) if where is not None else []
        if frm is None:
            if q.args.get("joins"):
                raise SqlError("JOIN without FROM")
            return P.OneRow(), where_parts, []
        if frm.expressions:
            raise NotSupportedError(f"FROM {frm.sql()}")
        node, cols = self._relation(frm.this, scope.parent)
        scope.cols += cols
        group: list[tuple[P.Node, set[int]]] = [(node, {c.cid for c in cols})]
        pending: list[Expr] = []
        for j in q.args.get("joins") or []:
            side = (j.side or "").lower()
            kind = (j.kind or "").lower()
            if j.args.get("method") and str(j.args["method"]).upper() != "NATURAL":
                raise NotSupportedError(f"{j.args['method']} JOIN")
            if kind in ("semi", "anti") or side in ("left", "right", "full"):
                left = self._plan_group(group, pending, scope)
                pending = []
                rnode, rcols = self._relation(j.this, scope.parent)
                using = _using_pairs(j, scope, rcols)
                scope.cols += rcols
                on = j.args.get("on")
                sides = SideJoiner(self, left, rnode, scope)  # ON's subqueries: joined onto the side they read
                cond = ExprBinder(self, scope, correlated_hook=sides.scalar, exists_hook=sides.exists,
                                  quantified_hook=sides.quantified).bind(on) if on is not None else None
                left, rnode = sides.left.node, sides.right.node
                jk = kind if kind in ("semi", "anti") else side
                conds = conjuncts(cond) + [_equal(lc, rc) for lc, rc in using]
                node = self._join(left, rnode, jk, conds, {c.cid for c in rcols})
                if jk in ("semi", "anti"):
                    scope.cols = [c for c in scope.cols if c not in rcols]
                elif jk in ("right", "full") and using:
                    node = self._merge_using(node, using, scope)
                for _, rc in using:
                    rc.hidden = True
                group = [(node, {c for c in scope.cids()})]
            elif kind in ("", "inner", "cross"):
                rnode, rcols = self._relation(j.this, scope.parent)
                using = _using_pairs(j, scope, rcols)
                scope.cols += rcols
                group.append((rnode, {c.cid for c in rcols}))
                on = j.args.get("on")
                if on is not None:  # an inner join's ON is a WHERE: its subquery conjuncts come later too
                    on_parts = _split_and(on)
                    where_parts = [w for w in on_parts if _has_subquery(w)] + where_parts
                    pending += [c for w in on_parts if not _has_subquery(w)
                                for c in conjuncts(ExprBinder(self, scope).bind(w))]
                pending += [_equal(lc, rc) for lc, rc in using]
                for _, rc in using:  # equal on every row: the left one stands for both
                    rc.hidden = True
            else:
                raise NotSupportedError(f"{kind.upper()} JOIN")
        # plain WHERE conjuncts join the planning of the comma group; subquery conjuncts come later.
        # WHERE may name a select-list alias where no column in scope has that name (DuckDB)
        where_parts = _where_aliases(q, where_parts, scope)
        rest = []
        for w in where_parts:
            if _has_subquery(w):
                rest.append(w)
            else:
                e = ExprBinder(self, scope).bind(w)
                if e.type.kind != "BOOL":
                    raise SqlError(f"WHERE: expected a boolean, got {e.type}")
                pending += factor_or(e)
        local = scope.cids()
        correlated = [e for e in pending if not e.cids() <= local]
        pending = [e for e in pending if e.cids() <= local]
        node = self._plan_group(group, pending, scope)
        return node, rest, correlated

    def _merge_using(self, node: P.Node, using, scope: Scope) -> P.Node:
        """A RIGHT / FULL JOIN ... USING column is COALESCE(left, right) (DuckDB's): a row only the
        right side has keeps its key. It takes the left column's place in * and its bare name."""
        exprs = [(o, Ref(o.cid, o.type, o.name)) for o in node.outputs]
        for lc, rc in using:
            t = _common([lc.type, rc.type], "USING")
            merged = self.new_col(lc.name, t)
            exprs.append((merged, Func("coalesce", [Ref(lc.cid, lc.type, lc.name), Ref(rc.cid, rc.type, rc.name)], t)))
            scope.cols.insert(scope.cols.index(lc), ScopeCol("", lc.name, merged.cid, t))
            lc.hidden = True
        return P.Project(node, exprs)

    def _join(self, left: P.Node, right: P.Node, kind: str, conds: list[Expr], right_cids: set[int]) -> P.Join:
        lk, rk, residual = split_equi(conds, {o.cid for o in left.outputs}, right_cids)
        return P.Join(left, right, kind if (lk or residual or kind != "inner") else "cross", lk, rk,
                      and_(residual) if residual else None)

    def _plan_group(self, group, conds: list[Expr], scope) -> P.Node:
        """Left-deep inner joins in FROM order, but the next relation is always one connected to the
        joined set by an equi predicate when there is one (never a needless cross product)."""
        pending = [(c, c.cids()) for c in conds]  # each condition with the columns it reads
        items = []
        for node, cids in group:
            mine = [c for c, read in pending if read and read <= cids]
            pending = [(c, read) for c, read in pending if not (read and read <= cids)]
            items.append((P.Filter(node, and_(mine)) if mine else node, cids))
        node, joined = items[0]
        remaining = items[1:]
        while remaining:
            pick = next((i for i, (_, cids) in enumerate(remaining)
                         if any(equi_pair(c, joined, cids) for c, _ in pending)), 0)
            rnode, rcids = remaining.pop(pick)
            both = joined | rcids
            use = [c for c, read in pending if read <= both]
            pending = [(c, read) for c, read in pending if not read <= both]
            node = self._join(node, rnode, "inner", use, rcids)
            joined = both
        if pending:
            node = P.Filter(node, and_([c for c, _ in pending]))
        return node

    # ----------------------------------------------------------------------------- WHERE subqueries
    def _apply_subquery_conjunct(self, node: P.Node, w: exp.Expression, scope: Scope) -> P.Node:
        negate = False
        inner = w
        while isinstance(inner, exp.Not):
            negate, inner = not negate, inner.this
        if isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Exists):
            return self._exists(node, inner.this, scope, "anti" if negate else "semi")
        # an uncorrelated IN (subquery): the probe's plan is the subquery bound (``probe`` binds it again
        # for real when it left placeholders), not bound a third time (TPC-H q20's nested IN: 22 binds a plan)
        probed = self.probe(inner.args["query"], scope) if isinstance(inner, exp.In) \
            and inner.args.get("query") is not None else None
        if probed is not None and not probed[1].outer_refs:
            x = ExprBinder(self, scope).bind(inner.this)
            sub, sscope = probed
            if len(sub.outputs) != 1:
                raise SqlError(f"IN (subquery): the subquery returns {len(sub.outputs)} columns, expected 1")
            o = sub.outputs[0]
            return P.Join(node, sub, "anti" if negate else "semi", [x], [Ref(o.cid, o.type, o.name)],
                          None, null_aware=negate)
        # an ordinary predicate with scalar subqueries inside: a single aggregate over equalities
        # becomes a grouped LEFT JOIN, any other correlated subquery is joined over its domain
        joiner = SubqueryJoiner(self, node, scope)

        def hook(subq, sub_scope_parent):
            try:
                joiner.node, ref = self._decorrelate_scalar(joiner.node, subq, scope)
            except NotSupportedError:
                return joiner.scalar(subq)
            return ref
        e = ExprBinder(self, scope, correlated_hook=hook, exists_hook=joiner.exists,
                                quantified_hook=joiner.quantified).bind(w)
        return P.Filter(joiner.node, e)

    def _exists(self, node, q, scope, kind):
        if not isinstance(q, exp.Select) or q.args.get("group") or q.args.get("limit"):
            sub, sscope = self.bind_query(q, scope)
            if sscope.outer_refs:
                raise NotSupportedError("correlated EXISTS over a grouped or limited subquery")
            return self._uncorrelated_exists(node, sub, kind)
        inner, inner_scope, correlated = self._bind_correlated(q, scope)
        if not correlated:
            return self._uncorrelated_exists(node, inner, kind)
        lk, rk, residual = split_equi(correlated, {o.cid for o in node.outputs}, inner_scope.cids())
        return P.Join(node, inner, kind, lk, rk, and_(residual) if residual else None)

    def _bind_correlated(self, q, scope):
        """A subquery's FROM and local WHERE conjuncts in a scope under ``scope``; its conditions on
        outer columns are returned apart, for the caller to join on."""
        inner_scope = Scope(parent=scope)
        inner, rest, correlated = self._from(q, inner_scope)
        for w in rest:
            inner = self._apply_subquery_conjunct(inner, w, inner_scope)
        return inner, inner_scope, correlated

    def _uncorrelated_exists(self, node, sub, kind):
        found = self.run_scalar(P.Aggregate(P.Limit(sub, 1), [], [(self.new_col("n", T.INT64), P.AggCall("count_star", None, T.INT64))])) > 0
        keep = found if kind == "semi" else not found
        return node if keep else P.Filter(node, Lit(False, T.BOOL))

    def scalar_subquery(self, q, scope: Scope, hook):
        sub, sscope = self.probe(q, scope)
        if sscope.outer_refs:
            if hook is None:
                raise NotSupportedError("correlated scalar subquery outside a WHERE conjunct")
            if self.probing:  # inside a probe only the references count: its plan is discarded
                self.placeholders += 1
                return Lit(None, sub.outputs[0].type if sub.outputs else T.INT32)
            return hook(q, scope)
        if len(sub.outputs) != 1:
            raise SqlError(f"scalar subquery returns {len(sub.outputs)} columns, expected 1")
        key = self._subquery_key(q)
        hit = self._scalar_values.get(key) if key is not None else None
        if hit is None:
            kept = tuple(v for frame in self.ctes for v in frame.values())  # the key holds their ids
            hit = (self.run_scalar(sub), kept)
            if key is not None:
                self._scalar_values[key] = hit
        return Lit(hit[0], sub.outputs[0].type)

    def forget_scalar_values(self) -> None:
        """Drop the reused scalar-subquery values: a table they may read changed within the statement
        (a recursive CTE's working table, ``recursive_cte.materialize``)."""
        self._scalar_values.clear()

    def _subquery_key(self, q) -> tuple | None:
        """What decides an uncorrelated subquery's value within one statement: its text and the
        CTE definitions in view (TPC-DS q14 reads ``(SELECT average_sales FROM avg_sales)`` three
        times; it runs once). None where the text could give another value each time it runs."""
        if any((f.name if isinstance(f, exp.Anonymous) else f.sql_name()).lower() in VOLATILE
               for f in q.find_all(exp.Func)):
            return None
        frames = tuple((name, id(value[0])) for frame in self.ctes for name, value in frame.items())
        return self._duckdb.generate(q), frames

    def probe(self, q, scope: Scope) -> tuple[P.Node, Scope]:
        """``bind_query(q, scope)`` to learn whether ``q`` reads outer columns: the correlated
        subqueries inside it are not decorrelated (a subquery nested two levels down may read this
        one's outer columns, which only its decorrelation makes available), they leave NULL
        placeholders; the plan is bound again for real when one was left."""
        before = self.placeholders
        self.probing += 1
        try:
            sub, sscope = self.bind_query(q, scope)
        finally:
            self.probing -= 1
        if self.placeholders != before and not sscope.outer_refs and not self.probing:
            sub, sscope = self.bind_query(q, scope)
        return sub, sscope

    def _decorrelate_scalar(self, node, q, scope):
        """x op (SELECT agg(...) FROM ... WHERE inner.k = outer.k ...) -> LEFT JOIN on k with the
        subquery grouped by k; the subquery's value becomes a column."""
        if not isinstance(q, exp.Select) or q.args.get("group") or len(q.expressions) != 1:
            raise NotSupportedError("correlated scalar subquery that is not a single aggregate")
        inner, inner_scope, correlated = self._bind_correlated(q, scope)
        lk, rk, residual = split_equi(correlated, {o.cid for o in node.outputs}, inner_scope.cids())
        if residual or not lk:
            raise NotSupportedError("correlated scalar subquery with non-equality correlation")
        keys = [(self.new_col(f"k{i}", k.type), k) for i, k in enumerate(rk)]
        agg_node, proj = self._aggregate_project(q, inner, inner_scope, extra_keys=keys)
        value = proj.outputs[-1]
        joined = P.Join(node, proj, "left", lk, [Ref(o.cid, o.type, o.name) for o, _ in keys])
        ref = Ref(value.cid, value.type, value.name)
        empty = _value_over_no_rows(proj)
        if empty.value is None:
            return joined, ref
        # an outer row whose key no subquery row has: the left join pads it with NULL (its key
        # too), the subquery's value is that of no rows (count(*) 0, coalesce(sum(x), 0) 0)
        k0 = keys[0][0]
        return joined, Func("case", [Func("is_null", [Ref(k0.cid, k0.type, k0.name)], T.BOOL), empty, ref], value.type)

    # --------------------------------------------------------------------------------------- SELECT
    _SELECT_ARGS = {"expressions", "from_", "from", "joins", "where", "group", "having", "order", "limit",
                    "offset", "distinct", "kind", "hint", "with_", "with", "qualify", "windows"}

    def _select(self, q: exp.Select, parent):
        for key, value in q.args.items():
            if value not in (None, False, []) and key not in self._SELECT_ARGS:
                raise NotSupportedError(f"SELECT clause {key.rstrip('_').upper()}")
        group = q.args.get("group")
        if group is not None and any(v for k, v in group.args.items() if k not in ("expressions", "all")):
            raise NotSupportedError(f"GROUP BY {', '.join(k.upper() for k, v in group.args.items() if v and k not in ('expressions', 'all'))}")
        scope = Scope(parent=parent)
        node, rest, correlated = self._from(q, scope)
        if correlated:
            # only reached while probing whether a subquery is correlated: the caller sees
            # scope.outer_refs and decorrelates (or raises NotSupportedError); this plan is discarded
            node = P.Filter(node, and_(correlated))
        for w in rest:
            node = self._apply_subquery_conjunct(node, w, scope)
        distinct = q.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise NotSupportedError("DISTINCT ON")
        q, node = select_unnests(self, q, node, scope)
        sets = grouping_sets(group)
        if sets is not None:
            return self._grouping_sets(q, node, scope, sets, distinct is not None), scope
        _, proj = self._aggregate_project(q, node, scope, extra_keys=[], distinct=distinct is not None)
        return self._limit(q, proj, scope), scope

    def _grouping_sets(self, q, node, scope, sets: list[list[exp.Expression]], distinct: bool) -> P.Node:
        """GROUP BY ROLLUP / CUBE / GROUPING SETS: the grouped block (keys, aggregates, GROUPING()
        and HAVING) once per grouping set, the keys outside the set NULL, UNION ALL'ed; then the
        select list, windows, QUALIFY, DISTINCT, ORDER BY and LIMIT once over the union, as DuckDB
        does (a window partitions the rows of every set together)."""
        items = _lateral_aliases(self._select_items(q, scope), scope)
        if not all(isinstance(e, exp.Expression) for _, e in items):
            raise NotSupportedError("SELECT * with GROUP BY ROLLUP / CUBE / GROUPING SETS")
        alias_map = {name.lower(): e for name, e in items}
        names = {c.name_key for c in scope.cols}

        def resolve(t):  # GROUP BY 1 or a select alias: the item's expression
            if isinstance(t, exp.Literal) and not t.is_string:
                return items[int(t.this) - 1][1]
            if isinstance(t, exp.Column) and not t.table and t.name.lower() in alias_map and t.name.lower() not in names:
                return alias_map[t.name.lower()]
            return t
        sets = [[resolve(t) for t in s] for s in sets]
        terms = list({self.sql_text(t): t for s in sets for t in s}.values())
        having, qualify = (None if q.args.get(c) is None else _expand_aliases(q.args[c].this, alias_map, scope)
                           for c in ("having", "qualify"))
        order = _order_terms(q.args.get("order"), len(items))
        sources = [e for _, e in items] + [o.this for o in order] + [e for e in (having, qualify) if e is not None]
        parts = {self.sql_text(t): t for t in terms}
        for s in sources:
            parts.update((self.sql_text(a), a) for a in _group_aggregates(s))
            parts.update((self.sql_text(g), g) for g in own_nodes(s, exp.Grouping))
            parts.update((self.sql_text(g), g) for g in subquery_parts(s))
        columns = {text: f"__grouped{i}" for i, text in enumerate(parts)}

        def local_cid(c):  # the FROM column a column reference names (None: none, or ambiguous)
            hits = scope._find(c.name, c.table or None) if isinstance(c, exp.Column) else []
            return hits[0].cid if len(hits) == 1 else None
        key_columns = {local_cid(t): columns[self.sql_text(t)] for t in terms if local_cid(t) is not None}

        def column_of(n):  # a key is matched by the column it reads too (g for a key written w.g)
            return columns.get(self.sql_text(n)) or key_columns.get(local_cid(n))
        block = q.copy()
        for clause in ("order", "limit", "offset", "distinct", "qualify", "windows"):
            block.set(clause, None)
        block.set("expressions", [exp.Alias(this=e.copy(), alias=exp.to_identifier(columns[t], quoted=True))
                                  for t, e in parts.items()])  # (exp.alias_ names a subquery as a table)
        block.set("having", None if having is None else exp.Having(this=having))
        projs = []
        for s in sets:
            inside = {self.sql_text(t) for t in s}
            nulls = [t for t in terms if self.sql_text(t) not in inside]
            projs.append(self._aggregate_project(block, node, scope, [], group_terms=s, null_terms=nulls)[1])
        outs = [self.new_col(o.name, _common([p.outputs[i].type for p in projs], "GROUPING SETS"))
                for i, o in enumerate(projs[0].outputs)]
        union = P.Union(projs, outs, all=True)
        union_scope = Scope([ScopeCol("", o.name, o.cid, o.type) for o in outs], scope.parent)
        top = exp.Select(expressions=[exp.Alias(this=over_union(e, column_of),
                                                alias=exp.to_identifier(name, quoted=True)) for name, e in items])
        if order:
            def order_term(e):  # a select alias names the output, as in any ORDER BY
                output = isinstance(e, exp.Column) and not e.table and e.name.lower() in alias_map
                return e if output else over_union(e, column_of)
            top.set("order", exp.Order(expressions=[
                exp.Ordered(this=order_term(o.this), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first"))
                for o in order]))
        if qualify is not None:
            top.set("qualify", exp.Qualify(this=over_union(qualify, column_of)))
        for clause in ("limit", "offset", "windows"):
            top.set(clause, q.args.get(clause))
        _, proj = self._aggregate_project(top, union, union_scope, [], distinct=distinct)
        return self._limit(top, proj, union_scope)

    def _select_items(self, q, scope) -> list[tuple[str, exp.Expression | Ref]]:
        items = []
        for e in q.expressions:
            if isinstance(e, exp.Columns) and isinstance(e.this, exp.Star):  # COLUMNS(* ...): the star itself
                e = e.this
            if isinstance(e, exp.Star):
                items += expand_star(e, [c for c in scope.cols if not c.hidden], "FROM clause", scope.cols)
            elif isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
                rel = e.table.lower()
                cols = [c for c in scope.cols if c.relation_key == rel]
                if not cols:
                    raise SqlError(f"unknown table {e.table!r} in {e.sql()}")
                items += expand_star(e.this, cols, e.table)
            elif isinstance(e, exp.Alias):
                items.append((e.alias, e.this))
            elif isinstance(e, exp.Column):
                items.append((e.name, e))
            elif isinstance(e, exp.Count) and isinstance(e.this, exp.Star):
                items.append(("count_star()", e))  # DuckDB's name for an unaliased count(*)
            else:
                items.append((output_name(e, self._duckdb.generate), e))
        if not q.expressions:
            raise SqlError("SELECT clause without selection list")
        if not items:
            raise SqlError("SELECT list is empty: EXCLUDE removed every column")
        return items

    def _aggregate_project(self, q, node, scope, extra_keys, distinct=False, group_terms=None, null_terms=(),
                           group_extra=True):
        """``group_terms``: the GROUP BY terms (default: the query's); ``null_terms``: grouping-set
        keys left out of this set, NULL in its rows; ``group_extra``: the block is grouped by
        ``extra_keys`` (else they are only carried as leading outputs, as in an ungrouped block).
        Correlated subqueries in the select list, HAVING, QUALIFY and ORDER BY are joined onto the
        block's rows (``frontend/correlated.py``)."""
        items = _lateral_aliases(self._select_items(q, scope), scope)
        having = q.args.get("having")
        qualify = q.args.get("qualify")
        order_terms = _order_terms(q.args.get("order"), len(items))
        group = q.args.get("group")
        alias_map = {name.lower(): e for name, e in items if isinstance(e, exp.Expression)}
        sources = [e for _, e in items if isinstance(e, exp.Expression)]
        if having is not None:
            sources.append(_expand_aliases(having.this, alias_map, scope))
        if qualify is not None:
            qualify = _expand_aliases(qualify.this, alias_map, scope)
            sources.append(qualify)
        sources += [o.this for o in order_terms]
        agg_nodes = []
        for s in sources:
            agg_nodes += [a for a in _group_aggregates(s) if not any(a is b for b in agg_nodes)]
        grouped = bool(agg_nodes) or group is not None or bool(extra_keys and group_extra)
        windows = WindowCollector(self, q.args.get("windows"), lambda e: _expand_aliases(e, alias_map, scope))
        joiner = SubqueryJoiner(self, node, scope)
        binder = ExprBinder(self, scope, correlated_hook=joiner.scalar, exists_hook=joiner.exists,
                                quantified_hook=joiner.quantified)  # windows only after GROUP BY and HAVING
        if grouped:
            keys = list(extra_keys) if group_extra else []
            key_cids: dict[int, Ref] = {}
            replace: dict[str, Ref] = {}
            for o, e in keys:
                if isinstance(e, Ref):
                    key_cids[e.cid] = Ref(o.cid, o.type, o.name)
            terms = _group_terms(group, items) if group_terms is None else group_terms
            inside: set[str] = set()
            outside: set[str] = set()
            for g, null in [(g, False) for g in terms] + [(g, True) for g in null_terms]:
                gexpr = g
                if isinstance(g, exp.Literal) and not g.is_string:
                    gexpr = items[int(g.this) - 1][1]
                elif isinstance(g, exp.Column) and not g.table and g.name.lower() in alias_map and \
                        not any(c.name_key == g.name.lower() for c in scope.cols):
                    gexpr = alias_map[g.name.lower()]
                if isinstance(gexpr, Ref):
                    bound = gexpr
                else:
                    bound = binder.bind(gexpr)
                name = gexpr.name if isinstance(gexpr, exp.Column) else (self.sql_text(gexpr) if isinstance(gexpr, exp.Expression) else gexpr.name)
                if null:
                    ref = Lit(None, bound.type)
                else:
                    o = self.new_col(name, bound.type)
                    keys.append((o, bound))
                    ref = Ref(o.cid, o.type, o.name)
                if isinstance(bound, Ref):
                    key_cids[bound.cid] = ref
                if isinstance(gexpr, exp.Expression):
                    replace[self.sql_text(gexpr)] = ref
                    if g is not gexpr:
                        replace[self.sql_text(g)] = ref
                    (outside if null else inside).update({self.sql_text(gexpr), self.sql_text(g)})
            for s in sources:  # GROUPING(key, ...): constant within one grouping set
                for call in own_nodes(s, exp.Grouping):
                    replace[self.sql_text(call)] = Lit(grouping_value(call, inside, outside, self.sql_text), T.INT64)
            aggs = []
            seen: dict[str, Ref] = {}
            for a in agg_nodes:
                text = self.sql_text(a)
                if text in seen:
                    continue
                call = self._agg_call(a, binder)
                o = self.new_col(text, call.type)
                aggs.append((o, call))
                seen[text] = replace[text] = Ref(o.cid, o.type, o.name)
            node = P.Aggregate(joiner.node, keys, aggs)  # over the subqueries the keys and arguments read
            joiner = SubqueryJoiner(self, node, scope, key_cids)
            binder = ExprBinder(self, scope, replace=replace, key_cids=key_cids, agg_mode=True,
                                correlated_hook=joiner.scalar, exists_hook=joiner.exists,
                                quantified_hook=joiner.quantified)
            if having is not None:
                cond = binder.bind(_expand_aliases(having.this, alias_map, scope))
                joiner.node = P.Filter(joiner.node, cond)
        elif having is not None:
            raise SqlError("HAVING without GROUP BY or aggregates")
        binder.windows = windows
        bound_items = [(name, e if isinstance(e, Ref) else binder.bind(e)) for name, e in items]
        if grouped:
            for name, e in bound_items:
                if isinstance(e, Ref) and e.cid in scope.cids():
                    raise SqlError(f"column {name!r} must appear in the GROUP BY clause or be used in an aggregate")
        outs = [self.new_col(name, e.type) for name, e in bound_items]
        # extra keys (decorrelation) are carried as leading outputs
        key_outs = [(o, Ref(o.cid, o.type, o.name) if grouped else e) for o, e in extra_keys]
        qualify = None if qualify is None else binder.bind(qualify)
        sort_keys = []
        if order_terms:
            for o in order_terms:
                e = o.this
                idx = _order_position(e, len(bound_items), self.order_by_literals)
                if idx is not None:
                    k = bound_items[idx][1]
                    pos = idx
                elif isinstance(e, exp.Column) and not e.table and e.name.lower() in [n.lower() for n, _ in items]:
                    pos = [n.lower() for n, _ in items].index(e.name.lower())
                    k = bound_items[pos][1]
                else:
                    pos = None
                    k = binder.bind(e)
                    for i, (_, be) in enumerate(bound_items):
                        if isinstance(be, Ref) and isinstance(k, Ref) and be.cid == k.cid:
                            pos = i
                sort_keys.append((k, pos, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
        proj_exprs = key_outs + list(zip(outs, [e for _, e in bound_items]))
        node = joiner.node
        if qualify is not None and not windows:
            raise SqlError("QUALIFY: at least one window function must appear in the SELECT list or QUALIFY clause")
        node = windows.plan(node)
        if qualify is not None:
            if qualify.type.kind != "BOOL":
                raise SqlError(f"QUALIFY: expected a boolean, got {qualify.type}")
            node = P.Filter(node, qualify)
        if distinct:
            proj = P.Distinct(P.Project(node, proj_exprs))
            if sort_keys:
                keys = []
                for k, pos, d, nf in sort_keys:
                    if pos is None:
                        raise SqlError("ORDER BY of a SELECT DISTINCT must use selected columns")
                    keys.append((Ref(outs[pos].cid, outs[pos].type, outs[pos].name), d, nf))
                proj = P.Sort(proj, keys)
            return node, proj
        if sort_keys:
            node = P.Sort(node, [(k, d, nf) for k, _, d, nf in sort_keys])
        return node, P.Project(node, proj_exprs)

    def _agg_call(self, a, binder) -> P.AggCall:
        name = type(a).__name__.lower()
        arg = a.this
        if isinstance(a, exp.AnonymousAggFunc):  # frontend/parser.py's ANONYMOUS_AGGREGATES
            name = a.name.lower()
            if name not in AGG_NAMES or len(a.expressions) != 1:
                raise NotSupportedError(f"aggregate {a.sql(dialect='duckdb')}")
            arg = a.expressions[0]
        if isinstance(a, exp.Count):
            if isinstance(arg, exp.Star) or arg is None:
                return P.AggCall("count_star", None, T.INT64)
            if isinstance(arg, exp.Distinct):
                if len(arg.expressions) != 1:
                    raise NotSupportedError("COUNT(DISTINCT of several columns)")
                return P.AggCall("count_distinct", binder.bind(arg.expressions[0]), T.INT64)
            return P.AggCall("count", binder.bind(arg), T.INT64)
        if isinstance(arg, exp.Distinct):
            raise NotSupportedError(f"{name.upper()}(DISTINCT ...)")
        if isinstance(arg, exp.Order):
            raise NotSupportedError(f"ORDER BY inside the aggregate {a.sql(dialect='duckdb')}")
        exact = marked(arg)  # fsum / favg (frontend/exact_sums.py)
        if exact is not None:
            name, arg = exact
        e = binder.bind(arg)
        name = AGG_NAMES.get(name, name)
        if name in ("bool_and", "bool_or"):  # over booleans: min and max
            if isinstance(e, Lit) and e.value is None:  # bool_or(NULL): a NULL boolean
                e = Lit(None, T.BOOL)
            if e.type.kind != "BOOL":
                raise SqlError(f"{name}: expected a boolean argument, got {e.type}")
            return P.AggCall("min" if name == "bool_and" else "max", e, T.BOOL)
        if name in SPREAD_FUNCS and (not e.type.is_numeric or e.type.kind == "BOOL"):
            raise SqlError(f"{name}: expected a numeric argument, got {e.type}")
        if name in ("sum", "avg", "fsum", "favg") and not e.type.is_numeric:
            raise SqlError(f"{name}: expected a numeric argument, got {e.type}")
        if name == "decimal_avg" and e.type.kind != "DECIMAL":
            raise SqlError(f"decimal_average: expected a DECIMAL argument, got {e.type}")
        if name in ("sum", "avg") and e.type.kind == "BOOL":
            e = Func("cast", [e], T.INT32)
        return P.AggCall(name, e, result_type(name, e.type))


def _group_aggregates(e: exp.Expression) -> list[exp.Expression]:
    """The aggregates of ``e`` that belong to its block's GROUP BY: not in a subquery, not inside
    another aggregate, and not the function of an OVER clause (``sum`` of ``sum(x) OVER ()``, whose
    arguments may hold group aggregates: ``sum(sum(x)) OVER ()``)."""
    out = []
    for a in e.find_all(*AGG_FUNCS):
        if is_window_function(a):
            continue
        above = _ancestors(a, e)
        if any(isinstance(p, (exp.Subquery, exp.Select, exp.Exists)) for p in above):
            continue  # belongs to a subquery's own block
        if not any(isinstance(p, AGG_FUNCS) and not is_window_function(p) for p in above):
            out.append(a)
    return out


def _group_terms(group, items) -> list:
    """GROUP BY's terms; GROUP BY ALL: every select item without an aggregate or a window (DuckDB)."""
    if group is None:
        return []
    if not group.args.get("all"):
        return group.expressions
    return [e for _, e in items
            if not (isinstance(e, exp.Expression) and (_group_aggregates(e) or e.find(exp.Window)))]


def _order_terms(order, n: int) -> list[exp.Ordered]:
    """ORDER BY's terms; ORDER BY ALL [DESC]: every select item, left to right (DuckDB)."""
    if order is None:
        return []
    terms = order.expressions
    if len(terms) == 1 and isinstance(terms[0].this, exp.Var) and terms[0].this.name.upper() == "ALL":
        t = terms[0]
        return [exp.Ordered(this=exp.Literal.number(i + 1), desc=t.args.get("desc"),
                            nulls_first=t.args.get("nulls_first")) for i in range(n)]
    return terms


def _expand_aliases(e: exp.Expression, alias_map: dict[str, exp.Expression], scope: Scope) -> exp.Expression:
    """HAVING may name a select-list alias (as DuckDB allows) when no input column has that name."""
    names = {c.name_key for c in scope.cols}

    def swap(node):
        if isinstance(node, exp.Column) and not node.table and node.name.lower() in alias_map \
                and node.name.lower() not in names:
            return alias_map[node.name.lower()].copy()
        return node
    return e.copy().transform(swap)


def _lateral_aliases(items: list, scope: Scope) -> list:
    """A select item may name an earlier item's alias (DuckDB's lateral column alias) where no
    column in scope has that name: the alias's expression is put in its place. Only names that
    would not resolve otherwise are replaced, and not inside subqueries (their own columns)."""
    names = {c.name_key for c in scope._all()}
    earlier: dict[str, exp.Expression] = {}
    out = []
    for name, e in items:
        if isinstance(e, exp.Expression) and earlier:
            def swap(node):
                if isinstance(node, exp.Column) and not node.table and node.name.lower() in earlier \
                        and node.name.lower() not in names and not any(
                            isinstance(p, (exp.Select, exp.Subquery)) for p in _ancestors(node, e)):
                    return earlier[node.name.lower()].copy()
                return node
            if any(isinstance(c, exp.Column) and c.name.lower() in earlier for c in e.find_all(exp.Column)):
                e = e.copy().transform(swap)
        out.append((name, e))
        if isinstance(e, exp.Expression):
            earlier.setdefault(name.lower(), e)
    return out


def _where_aliases(q: exp.Select, parts: list, scope: Scope) -> list:
    """WHERE conjuncts with each unresolvable bare name that is a select alias replaced by its
    expression (not inside subqueries; not an alias of an aggregate or window, which WHERE cannot read)."""
    aliases = {e.alias.lower(): e.this for e in q.expressions if isinstance(e, exp.Alias)
               and not e.this.find(*AGG_FUNCS, exp.Window)}
    if not aliases:
        return parts
    names = {c.name_key for c in scope._all()}

    def swap(node):
        if isinstance(node, exp.Column) and not node.table and node.name.lower() in aliases \
                and node.name.lower() not in names and not any(
                    isinstance(p, (exp.Select, exp.Subquery)) for p in _ancestors(node, node.root())):
            return aliases[node.name.lower()].copy()
        return node
    out = []
    for w in parts:
        for _ in range(len(aliases)):  # an alias of an alias: until no alias name is left
            if not any(isinstance(c, exp.Column) and c.name.lower() in aliases and c.name.lower() not in names
                       for c in w.find_all(exp.Column)):
                break
            w = w.copy().transform(swap)
        out.append(w)
    return out


def _ancestors(node, root):
    out = []
    p = node.parent
    while p is not None and p is not root.parent:
        out.append(p)
        p = p.parent
    return out


def _split_and(e: exp.Expression) -> list[exp.Expression]:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _split_and(e.this) + _split_and(e.expression)
    return [e]


def _has_subquery(e: exp.Expression) -> bool:
    return any(True for _ in e.find_all(exp.Subquery, exp.Exists, exp.Select))


def _using_pairs(j: exp.Join, scope: Scope, rcols: list[ScopeCol]) -> list[tuple[ScopeCol, ScopeCol]]:
    """(left column, right column) of each name in ``j``'s USING list, or, for a NATURAL join,
    of each name both sides show; the left one is found by its bare name among the columns so far."""
    if str(j.args.get("method") or "").upper() == "NATURAL":
        right_names = {c.name_key for c in rcols}
        names = list(dict.fromkeys(c.name for c in scope.cols if not c.hidden and c.name_key in right_names))
        if not names:  # DuckDB's error too: a cross product is written CROSS JOIN
            raise SqlError("NATURAL JOIN: the two sides have no column name in common")
    else:
        names = [u.name for u in j.args.get("using") or []]
    pairs = []
    for name in names:
        left = [c for c in scope.cols if c.name_key == name.lower() and not c.hidden]
        right = [c for c in rcols if c.name_key == name.lower()]
        if len(left) != 1 or len(right) != 1:
            side = "left" if len(left) != 1 else "right"
            what = "is ambiguous" if (left if side == "left" else right) else "is not a column"
            raise SqlError(f"JOIN ... USING: {name!r} {what} on the {side} side")
        pairs.append((left[0], right[0]))
    return pairs


def _equal(a: ScopeCol, b: ScopeCol) -> Expr:
    _common([a.type, b.type], "USING")
    return cmp("=", Ref(a.cid, a.type, a.name), Ref(b.cid, b.type, b.name))


def _value_over_no_rows(proj: P.Project) -> Lit:
    """The value a decorrelated scalar subquery (``proj``: its keys, then its value, over its
    aggregate and HAVING) takes for an outer row no subquery row matches: its select expression
    over the aggregates of no rows (a count 0, every other aggregate NULL)."""
    node, having = proj.child, []
    while isinstance(node, (P.Sort, P.Filter)):
        if isinstance(node, P.Filter):
            having.append(node.predicate)
        node = node.child
    if not isinstance(node, P.Aggregate):
        raise NotSupportedError("correlated scalar subquery that is not a single aggregate")
    values = {o.cid: Lit(0, o.type) for o, a in node.aggs if a.func in ("count", "count_star", "count_distinct")}
    out = value_with(proj.exprs[-1][1], values)
    if out is None:
        raise NotSupportedError("correlated scalar subquery whose value is not known over no rows")
    for pred in having if out.value is not None else []:
        kept = value_with(pred, values)
        if kept is None or kept.value is True:
            # a group its HAVING drops is NULL, no group is ``out``: the left join pads both alike
            raise NotSupportedError("correlated scalar subquery with HAVING whose value over no rows is not NULL")
        return Lit(None, out.type)  # HAVING drops the one row of no rows: NULL as well
    return out


def _order_position(e: exp.Expression, n: int, literals_allowed: bool) -> int | None:
    """The 0-based select-list position of an ORDER BY term that is an integer literal (None for
    another expression). As DuckDB, a position outside 1..n, and a literal that is no integer
    (a string, a decimal, NULL, a boolean), is an error: ordering by a constant has no effect
    (unless ``SET order_by_non_integer_literal=true``)."""
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and not e.this.is_string:
        raise SqlError(f"ORDER term out of range - should be between 1 and {n}")
    if isinstance(e, (exp.Null, exp.Boolean)) or (isinstance(e, exp.Literal) and (e.is_string or not e.this.isdigit())):
        if literals_allowed:
            return None
        raise SqlError(f"ORDER BY non-integer literal has no effect: {e.sql()} "
                       "(SET order_by_non_integer_literal=true to allow it)")
    if not isinstance(e, exp.Literal):
        return None
    if not 1 <= int(e.this) <= n:
        raise SqlError(f"ORDER term out of range - should be between 1 and {n}")
    return int(e.this) - 1
