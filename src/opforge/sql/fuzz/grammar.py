"""Random queries over the fuzz tables (``fuzz/tables.py``), written as DuckDB-dialect SQL text.

The grammar covers what a rewrite can get wrong around NULLs and joins: inner / left / right /
full / semi / anti joins with extra ON predicates, NULL-heavy predicates (coalesce, IS [NOT] NULL,
IS [NOT] DISTINCT FROM, NOT IN with a NULL), aggregates with GROUP BY / HAVING, window functions,
EXISTS / IN / scalar subqueries (correlated or not) and ORDER BY + LIMIT. Every query has one
answer: ORDER BY + LIMIT always sorts by all output columns, and the window functions that depend
on the order of ties (row_number, lag, lead, ROWS frames) only order by a primary key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

from opforge.sql.fuzz.tables import COLUMNS, EDGES, FuzzTables

NUMERIC = ("int", "dec")
COMPARISONS = ("=", "<>", "<", "<=", ">", ">=")


@dataclass(frozen=True)
class Query:
    sql: str
    ordered: bool  # ORDER BY covers every output column: the row order is part of the answer
    columns: list[str]


@dataclass(frozen=True)
class Col:
    alias: str
    table: str
    name: str
    kind: str

    def __str__(self) -> str:
        return f"{self.alias}.{self.name}"


class Generator:
    """One query per :meth:`query` call, drawn from ``rng``."""

    def __init__(self, tables: FuzzTables, rng: random.Random):
        self.t, self.rng = tables, rng
        self.subqueries = 0
        self.shapes: dict[str, dict[str, str]] = {}  # alias of a derived table -> {column: kind}

    def columns_of(self, alias: str, table: str) -> dict[str, str]:
        return self.shapes.get(alias) or COLUMNS[table][1]

    # ---- leaves ------------------------------------------------------------------------------
    def columns(self, scope, kinds=None) -> list[Col]:
        return [Col(a, t, c, k) for a, t in scope for c, k in self.columns_of(a, t).items()
                if kinds is None or k in kinds]

    def literal(self, col: Col) -> str:
        values = self.t.values.get((col.table, col.name))
        if values is None:  # an aggregate of a derived table
            return str(self.rng.randint(0, 4)) if col.kind == "int" else f"{self.rng.randint(0, 9000)}.50"
        if not values:
            return "NULL"
        v = self.rng.choice(values)
        if col.kind == "int":
            return str(v)
        if col.kind == "dec":
            return str(Decimal(v))
        if col.kind == "date":
            return f"DATE '{v.isoformat()}'"
        return "'" + str(v).replace("'", "''") + "'"

    # ---- predicates --------------------------------------------------------------------------
    def simple_predicate(self, scope) -> str:
        r = self.rng
        c = r.choice(self.columns(scope))
        same = [o for o in self.columns(scope, (c.kind,)) if o != c]
        form = r.randrange(10)
        if form == 0:
            return f"{c} IS {r.choice(['', 'NOT '])}NULL"
        if form == 1:
            return f"coalesce({c}, {self.literal(c)}) {r.choice(COMPARISONS)} {self.literal(c)}"
        if form == 2:
            other = str(r.choice(same)) if same and r.random() < 0.5 else self.literal(c)
            return f"{c} IS {r.choice(['', 'NOT '])}DISTINCT FROM {other}"
        if form == 3:
            lo, hi = sorted([self.literal(c), self.literal(c)], key=lambda s: s)  # may be empty: fine
            return f"{c} BETWEEN {lo} AND {hi}"
        if form == 4:
            items = [self.literal(c) for _ in range(r.randint(1, 3))] + (["NULL"] if r.random() < 0.3 else [])
            return f"{c} {r.choice(['', 'NOT '])}IN ({', '.join(items)})"
        if form == 5 and same:
            return f"{c} {r.choice(COMPARISONS)} {r.choice(same)}"
        if form == 6 and c.kind == "str" and self.t.values.get((c.table, c.name)):
            prefix = str(r.choice(self.t.values[(c.table, c.name)]))[:2].replace("'", "''")
            return f"{c} {r.choice(['', 'NOT '])}LIKE '{prefix}%'"
        return f"{c} {r.choice(COMPARISONS)} {self.literal(c)}"

    def predicate(self, scope, depth: int = 0) -> str:
        r = self.rng.random()
        if depth < 2 and r < 0.25:
            op = self.rng.choice(["AND", "OR"])
            return f"({self.predicate(scope, depth + 1)} {op} {self.predicate(scope, depth + 1)})"
        if depth < 2 and r < 0.32:
            return f"NOT ({self.predicate(scope, depth + 1)})"
        if r < 0.5 and self.subqueries < 2:
            sub = self.subquery_predicate(scope)
            if sub:
                return sub
        return self.simple_predicate(scope)

    def edge_from(self, scope):
        """(outer column, inner table, inner column) for a join edge leaving ``scope``, or None."""
        options = []
        for a, t in scope:
            mine = self.columns_of(a, t)
            for ta, ca, tb, cb in EDGES:
                if ta == t and ca in mine:
                    options.append((Col(a, t, ca, "int"), tb, cb))
                if tb == t and cb in mine:
                    options.append((Col(a, t, cb, "int"), ta, ca))
        return self.rng.choice(options) if options else None

    def subquery_predicate(self, scope) -> str | None:
        edge = self.edge_from(scope)
        if edge is None:
            return None
        outer, table, column = edge
        self.subqueries += 1
        s = f"s{self.subqueries}"
        inner = [(s, table)]
        extra = f" AND {self.simple_predicate(inner)}" if self.rng.random() < 0.5 else ""
        form = self.rng.randrange(3)
        if form == 0:
            neg = self.rng.choice(["", "NOT "])
            return f"{neg}EXISTS (SELECT 1 FROM {table} {s} WHERE {s}.{column} = {outer}{extra})"
        if form == 1:
            neg = self.rng.choice(["", "NOT "])
            where = f" WHERE {extra[5:]}" if extra else ""
            return f"{outer} {neg}IN (SELECT {s}.{column} FROM {table} {s}{where})"
        nums = self.columns(inner, NUMERIC)
        outer_nums = self.columns(scope, NUMERIC)
        target = self.rng.choice(nums)
        agg = self.rng.choice(["min", "max", "sum", "count", "avg"])
        correlate = f"{s}.{column} = {outer}" if self.rng.random() < 0.6 else "TRUE"
        left = self.rng.choice(outer_nums)
        return (f"{left} {self.rng.choice(COMPARISONS)} (SELECT {agg}({target}) FROM {table} {s} "
                f"WHERE {correlate}{extra})")

    # ---- FROM --------------------------------------------------------------------------------
    def from_clause(self):
        r = self.rng
        first = r.choice(list(COLUMNS))
        scope, text = [("t0", first)], f"{first} t0"
        for i in range(1, r.choice([0, 1, 1, 2, 2]) + 1):
            in_scope = {t for _, t in scope}
            options = [(a, mine, o, oc) for a, t in scope for ta, ca, tb, cb in EDGES
                       for me, mine, o, oc in ((ta, ca, tb, cb), (tb, cb, ta, ca))
                       if t == me and mine in self.columns_of(a, t) and o not in in_scope]
            if not options:
                break
            alias, mine, other, other_col = r.choice(options)
            relation = other
            if r.random() < 0.25:
                relation = self.derived_table(f"t{i}", other, other_col)
            kind = r.choice(["JOIN", "LEFT JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN", "SEMI JOIN", "ANTI JOIN"])
            on = f"{alias}.{mine} = t{i}.{other_col}"
            if r.random() < 0.35:
                on += f" AND {self.simple_predicate([(f't{i}', other)])}"
            if r.random() < 0.15:  # a non-equi condition across both sides
                right = r.choice(self.columns([(f"t{i}", other)]))
                left = self.columns(scope, (right.kind,))
                if left:
                    on += f" {r.choice(['AND', 'OR'])} {r.choice(left)} {r.choice(COMPARISONS)} {right}"
            text += f" {kind} {relation} t{i} ON {on}"
            if kind in ("SEMI JOIN", "ANTI JOIN"):
                break  # the right side's columns are not visible after a semi / anti join
            scope.append((f"t{i}", other))
        return text, scope

    def derived_table(self, alias: str, table: str, key: str) -> str:
        """A grouped subquery in FROM, one row per ``key``: aggregates then meet outer joins above them."""
        r = self.rng
        n, kind = r.choice([(c, k) for c, k in COLUMNS[table][1].items() if k in NUMERIC and c != key] or [(key, "int")])
        agg, agg_kind = r.choice([("count(*)", "int"), (f"count(d.{n})", "int"), (f"sum(d.{n})", kind),
                                  (f"max(d.{n})", kind), (f"sum(coalesce(d.{n}, 0))", kind)])
        where = f" WHERE {self.simple_predicate([('d', table)])}" if r.random() < 0.5 else ""
        self.shapes[alias] = {key: "int", f"agg_{alias}": agg_kind}
        return f"(SELECT d.{key} AS {key}, {agg} AS agg_{alias} FROM {table} d{where} GROUP BY d.{key})"

    # ---- SELECT ------------------------------------------------------------------------------
    def scalar(self, scope) -> tuple[str, str]:
        """(expression, kind) of one output value."""
        r = self.rng
        c = r.choice(self.columns(scope))
        form = r.randrange(8)
        if form == 0:
            return f"coalesce({c}, {self.literal(c)})", c.kind
        if form == 1 and c.kind in NUMERIC:
            return f"{c} {r.choice(['+', '-', '*'])} {r.randint(1, 9)}", c.kind
        if form == 2:
            same = self.columns(scope, (c.kind,))
            return f"CASE WHEN {self.simple_predicate(scope)} THEN {c} ELSE {r.choice(same)} END", c.kind
        if form == 3:
            return f"({c} IS NULL)", "bool"
        return str(c), c.kind

    def aggregate(self, scope) -> tuple[str, str]:
        r = self.rng
        c = r.choice(self.columns(scope))
        nums = self.columns(scope, NUMERIC)
        n = r.choice(nums) if nums else None
        form = r.randrange(8)
        if form == 0:
            return "count(*)", "int"
        if form == 1:
            return f"count({c})", "int"
        if form == 2:
            return f"count(DISTINCT {c})", "int"
        if form == 3 and n:
            return f"sum({n})", n.kind
        if form == 4 and n:
            return f"sum(coalesce({n}, 0))", n.kind
        if form == 5 and n:
            return f"avg({n})", "float"
        return f"{r.choice(['min', 'max'])}({c})", c.kind

    def window(self, scope, keyed: bool) -> tuple[str, str]:
        r = self.rng
        part = f"PARTITION BY {r.choice(self.columns(scope))}" if r.random() < 0.6 else ""
        order_cols = [str(c) for c in r.sample(self.columns(scope), r.randint(0, 2))]
        if keyed:  # a single table: ordering by its primary key makes every row's position unique
            alias, table = scope[0]
            order_cols += [f"{alias}.{k}" for k in COLUMNS[table][0]]
        order = ("ORDER BY " + ", ".join(f"{c} {r.choice(['ASC', 'DESC'])}" for c in order_cols)) if order_cols else ""
        over = f"OVER ({part} {order})".replace("( ", "(").replace(" )", ")")
        c = r.choice(self.columns(scope))
        nums = self.columns(scope, NUMERIC)
        choices = [("count(*)", "int"), (f"count({c})", "int"), (f"{r.choice(['min', 'max'])}({c})", c.kind)]
        if nums:
            n = r.choice(nums)
            choices += [(f"sum({n})", n.kind), (f"avg({n})", "float")]
        if order_cols:
            choices += [("rank()", "int"), ("dense_rank()", "int")]
        if keyed:
            choices += [("row_number()", "int"), (f"lag({c})", c.kind), (f"lead({c}, 2)", c.kind)]
            if nums and r.random() < 0.3:
                n = r.choice(nums)
                frame = r.choice(["ROWS BETWEEN 1 PRECEDING AND CURRENT ROW",
                                  "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING"])
                return f"sum({n}) OVER ({part} {order} {frame})".replace("( ", "("), n.kind
        fn, kind = r.choice(choices)
        return f"{fn} {over}", kind

    def query(self) -> Query:
        r = self.rng
        self.subqueries = 0
        from_text, scope = self.from_clause()
        where = f" WHERE {self.predicate(scope)}" if r.random() < 0.7 else ""
        shape = r.choice(["project", "project", "aggregate", "aggregate", "window"])
        group = having = ""
        distinct = ""
        if shape == "aggregate":
            keys = [self.scalar(scope) for _ in range(r.randint(0, 2))]
            items = keys + [self.aggregate(scope) for _ in range(r.randint(1, 3))]
            if keys:
                terms = ", ".join(k for k, _ in keys)
                group = f" GROUP BY {r.choice(['ROLLUP', 'CUBE'])} ({terms})" if r.random() < 0.15 else f" GROUP BY {terms}"
            if items[-1][1] != "float" and r.random() < 0.15:  # a window over the groups (ties of floats: no)
                agg, kind = items[-1]
                fn = r.choice(["rank()", "dense_rank()", f"sum({agg})" if kind in NUMERIC else "count(*)"])
                items.append((f"{fn} OVER (ORDER BY {agg} {r.choice(['ASC', 'DESC'])})",
                              kind if fn.startswith("sum") else "int"))
            if r.random() < 0.35:
                agg, kind = self.aggregate(scope)
                having = f" HAVING {agg} > {r.randint(0, 3)}" if kind == "int" else f" HAVING {agg} IS NOT NULL"
        elif shape == "window":
            keyed = len(scope) == 1 and "JOIN" not in from_text
            items = [self.scalar(scope) for _ in range(r.randint(1, 2))]
            items += [self.window(scope, keyed) for _ in range(r.randint(1, 2))]
        else:
            items = [self.scalar(scope) for _ in range(r.randint(1, 4))]
            if r.random() < 0.15 and self.subqueries < 2 and (edge := self.edge_from(scope)):
                outer, table, column = edge
                items.append((f"(SELECT count(*) FROM {table} x WHERE x.{column} = {outer})", "int"))
            distinct = "DISTINCT " if r.random() < 0.2 else ""
        names = [f"c{i}" for i in range(len(items))]
        select = ", ".join(f"{e} AS {n}" for (e, _), n in zip(items, names))
        text = f"SELECT {distinct}{select} FROM {from_text}{where}{group}{having}"
        if all(k != "float" for _, k in items) and r.random() < 0.12:  # floats would meet INTERSECT exactly
            op = r.choice(["UNION", "UNION ALL", "INTERSECT", "INTERSECT ALL", "EXCEPT", "EXCEPT ALL"])
            other_where = f" WHERE {self.predicate(scope)}" if r.random() < 0.8 else ""
            text += f" {op} SELECT {distinct}{select} FROM {from_text}{other_where}{group}{having}"
        ordered = False
        if all(k != "float" for _, k in items) and r.random() < 0.4:
            keys = [f"{i + 1} {r.choice(['ASC', 'DESC'])}{r.choice(['', ' NULLS FIRST', ' NULLS LAST'])}"
                    for i in range(len(items))]
            text += " ORDER BY " + ", ".join(keys)
            if r.random() < 0.7:
                text += f" LIMIT {r.randint(1, 20)}" + (f" OFFSET {r.randint(1, 5)}" if r.random() < 0.2 else "")
            ordered = True
        return Query(text, ordered, names)


def queries(tables: FuzzTables, count: int, seed: int = 0):
    """``count`` queries; query ``i`` depends only on (seed, i), so any one of them can be re-made alone."""
    for i in range(count):
        yield i, Generator(tables, random.Random(f"{seed}:{i}")).query()
