"""Cardinality estimation from column statistics: filter selectivities, join sizes by equivalence
classes and distinct counts, and estimated rows for every logical operator (EXPLAIN).

Filters (per conjunct, conjuncts independent): ``col = v`` the value's frequency (its most-common-
value share, else the rest spread over the other distinct values; 0 outside [min, max]); ranges on
one column are merged into one interval and read off [min, max] as a uniform spread; ``IN`` the sum
of its values' frequencies; ``IS NULL`` the NULL fraction; ``OR`` by inclusion-exclusion; ``NOT``
the complement; comparisons exclude NULLs. Anything else: the textbook constants of
``sql/estimate.py``.

Joins (the System R / Swami-Schiefer formula, as in DuckDB's cardinality estimator): the size of
a set S of relations is the product of their (filtered) row counts times, for each equivalence
class of join columns with members in k >= 2 of S's relations, the product of 1 / distinct(c) over
all its members but the one with the fewest distinct values (containment: a value of the smallest
domain finds its match in every other with probability 1 / distinct), times the selectivity of the
other predicates inside S. Classes joining the same two relations (composite keys) are
corrected to an exponential backoff of their pairwise selectivities rather than taken as
independent. The estimate depends on the set only, not on the join order, so the
enumerator compares plans over the same numbers.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from opforge.sql import plan as P
from opforge.sql.column import code_bound, storage_value
from opforge.sql.estimate import selectivity as heuristic_selectivity
from opforge.sql.expr import Expr, Func, Lit, Ref, and_, conjuncts
from opforge.sql.planner import join_graph as G
from opforge.sql.planner.statistics import ColumnStats, TableStats

_FLIP = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
LIKE_SELECTIVITY = 0.1
LIKE_SAMPLE_WORDS = 20_000


# ------------------------------------------------------------------------------- column lookup
class ColumnIndex(Mapping):
    """cid -> ``ColumnStats`` of the base column it carries, looked up in the table's statistics
    only when read: a column's statistics (and the column's load onto the device) are computed
    for the columns the estimates use, not for every column a scan outputs."""

    def __init__(self):
        self.source: dict[int, tuple[Mapping, str]] = {}  # cid -> (TableStats.columns, column name)

    def __getitem__(self, cid: int) -> ColumnStats:
        cols, name = self.source[cid]
        return cols[name]

    def __contains__(self, cid) -> bool:
        return cid in self.source

    def __iter__(self):
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)


def column_index(node: P.Node, tables: dict[str, TableStats]) -> ColumnIndex:
    """cid -> statistics of the base column it carries (through scans, renaming projections and
    grouping keys)."""
    out = ColumnIndex()
    source = out.source

    def walk(n: P.Node):
        for c in n.inputs():
            walk(c)
        if isinstance(n, P.Scan) and n.table in tables:
            cols = tables[n.table].columns
            source.update({o.cid: (cols, o.name) for o in n.outputs if o.name in cols})
        elif isinstance(n, (P.Project, P.Aggregate)):
            pairs = n.exprs if isinstance(n, P.Project) else n.keys
            source.update({o.cid: source[e.cid] for o, e in pairs if isinstance(e, Ref) and e.cid in source})

    walk(node)
    return out


def _literal(col: ColumnStats, ref: Ref, lit: Lit, side: str = "left") -> float | None:
    """A literal in the column's storage units (STRING: its code bound in the dictionary)."""
    if lit.value is None:
        return None
    t = ref.type
    try:
        if t.kind == "STRING":
            if col.dictionary is None or not isinstance(lit.value, str):
                return None
            return float(code_bound(col.dictionary, lit.value, side))
        v = float(storage_value(lit.value, lit.type))
        shift = (t.scale if t.kind == "DECIMAL" else 0) - (lit.type.scale if lit.type.kind == "DECIMAL" else 0)
        return v * 10.0 ** shift
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------- filters
class FilterSelectivity:
    """Selectivity of predicates over columns with known statistics (``stats``: cid -> stats)."""

    def __init__(self, stats: Mapping[int, ColumnStats]):
        self.stats = stats

    def of(self, pred: Expr | None) -> float:
        if pred is None:
            return 1.0
        parts = conjuncts(pred)
        sel = 1.0
        ranges: dict[int, list] = {}
        for c in parts:
            r = self._range_bound(c)
            if r is not None:
                ranges.setdefault(r[0], []).append(r[1:])
            else:
                sel *= self._one(c)
        for cid, bounds in ranges.items():
            sel *= self._interval(self.stats[cid], bounds)
        return min(1.0, max(0.0, sel))

    # a comparison ``col op literal`` as (cid, op, value); None for anything else
    def _column_literal(self, c: Expr):
        if not (isinstance(c, Func) and c.name == "cmp"):
            return None
        a, b = c.args
        op = c.extra
        if isinstance(a, Lit) and isinstance(b, Ref):
            a, b, op = b, a, _FLIP[op]
        if isinstance(a, Ref) and isinstance(b, Lit) and a.cid in self.stats:
            return a, op, b
        return None

    def _range_bound(self, c: Expr):
        hit = self._column_literal(c)
        if hit is None or hit[1] in ("=", "<>"):
            return None
        ref, op, lit = hit
        st = self.stats[ref.cid]
        if st.min is None:
            return None
        if ref.type.kind == "STRING":  # codes: "< w" is "< bound_left(w)", "<= w" is "< bound_right(w)"
            side = "left" if op in ("<", ">=") else "right"
            v = _literal(st, ref, lit, side)
            if v is None:
                return None
            return (ref.cid, "<", v) if op in ("<", "<=") else (ref.cid, ">=", v)
        v = _literal(st, ref, lit)
        return None if v is None else (ref.cid, op, v)

    @staticmethod
    def _interval(st: ColumnStats, bounds) -> float:
        discrete = st.dictionary is not None or float(st.min).is_integer() and float(st.max).is_integer()
        step = 1.0 if discrete else 0.0
        a, b = st.min, st.max  # the kept interval [a, b] (discrete: integer points)
        for op, v in bounds:
            if op == ">":
                a = max(a, math.floor(v) + 1 if discrete else v)
            elif op == ">=":
                a = max(a, math.ceil(v) if discrete else v)
            elif op == "<":
                b = min(b, math.ceil(v) - 1 if discrete else v)
            elif op == "<=":
                b = min(b, math.floor(v) if discrete else v)
        return st.fraction_between(a, b, step)

    def _equals(self, ref: Ref, lit: Lit) -> float:
        st = self.stats[ref.cid]
        if ref.type.kind == "STRING":
            if st.dictionary is None or not isinstance(lit.value, str):
                return 1.0 / max(st.distinct, 1.0)
            lo = code_bound(st.dictionary, lit.value, "left")
            if lo >= len(st.dictionary) or st.dictionary[lo] != lit.value:
                return 0.0
            return st.frequency(float(lo))
        v = _literal(st, ref, lit)
        return 1.0 / max(st.distinct, 1.0) if v is None else st.frequency(v)

    def _one(self, c: Expr) -> float:
        hit = self._column_literal(c)
        if hit is not None:
            ref, op, lit = hit
            eq = self._equals(ref, lit)
            return eq if op == "=" else max(0.0, 1.0 - self.stats[ref.cid].null_fraction - eq)
        if isinstance(c, Func):
            if c.name == "cmp" and c.extra == "=" and all(isinstance(a, Ref) and a.cid in self.stats for a in c.args):
                return 1.0 / max(1.0, *(self.stats[a.cid].distinct for a in c.args))
            if c.name == "in" and isinstance(c.args[0], Ref) and c.args[0].cid in self.stats \
                    and all(isinstance(a, Lit) for a in c.args[1:]):
                hit = min(1.0, sum(self._equals(c.args[0], a) for a in c.args[1:]))
                return 1.0 - self.stats[c.args[0].cid].null_fraction - hit if c.extra else hit
            if c.name == "is_null" and isinstance(c.args[0], Ref) and c.args[0].cid in self.stats:
                return self.stats[c.args[0].cid].null_fraction
            if c.name == "or":
                a, b = self.of(c.args[0]), self.of(c.args[1])
                return a + b - a * b
            if c.name == "not":
                return 1.0 - self.of(c.args[0])
            if c.name == "like":
                hit = self._like(c)
                return 1.0 - hit if c.extra[1] else hit
        return heuristic_selectivity(c)


    def _like(self, c: Func) -> float:
        """LIKE's selectivity from the column's dictionary (``ColumnStats.like_fraction``, over a
        sample of :data:`LIKE_SAMPLE_WORDS` words); :data:`LIKE_SELECTIVITY` without one. TPC-H
        q2's ``p_type LIKE '%BRASS'`` matches 1 in 5."""
        a = c.args[0]
        st = self.stats.get(a.cid) if isinstance(a, Ref) else None
        if st is None or not st.dictionary:
            return LIKE_SELECTIVITY
        return st.like_fraction(c.extra[0], LIKE_SAMPLE_WORDS)


# ------------------------------------------------------------------------------------- joins
class JoinCardinality:
    """Sizes of relation sets of one ``JoinGraph`` (memoized by bitmask)."""

    def __init__(self, graph: G.JoinGraph, leaf_rows: list[float], stats: Mapping[int, ColumnStats],
                 filters: FilterSelectivity):
        self.graph, self.stats, self.filters = graph, stats, filters
        rows = list(leaf_rows)
        for p in graph.predicates:  # one-relation predicates of the graph filter their relation
            if p.rels and p.rels & (p.rels - 1) == 0:
                i = p.rels.bit_length() - 1
                rows[i] *= filters.of(p.expr)
        self.leaf_rows = [max(1.0, r) for r in rows]
        self._memo: dict[int, float] = {}
        # what every set's size reads, computed once (the enumerator asks for hundreds of sets):
        # each class's relations and (relation, distinct count) members, each predicate over 2+
        # relations with its selectivity
        self._classes = [(rels, [(r, self.distinct(r, c)) for r, c in members])
                         for members, rels in zip(graph.classes, graph.class_masks)]
        self._predicates = [(p.rels, self._selectivity(p)) for p in graph.predicates if p.rels & (p.rels - 1)]

    def distinct(self, rel: int, ref: Ref) -> float:
        """Distinct values of a join column: its statistics, capped by its relation's rows (a
        column without statistics is taken as a key of its relation)."""
        st = self.stats.get(ref.cid)
        rows = self.leaf_rows[rel]
        return max(1.0, min(st.distinct, rows) if st is not None and st.distinct > 0 else rows)

    def _selectivity(self, p: G.Predicate) -> float:
        """A predicate's selectivity in a set that holds its relations: what its implied filters
        already removed at the leaves is not removed twice."""
        given = math.prod(self.filters.of(f) for f in p.implies)
        return min(1.0, self.filters.of(p.expr) / given) if given > 0 else 0.0

    def rows(self, mask: int) -> float:
        if mask in self._memo:
            return self._memo[mask]
        out = math.prod(self.leaf_rows[i] for i in G.bits(mask))
        pairs: dict[tuple[int, int], list[float]] = {}
        for rels, members in self._classes:
            inside = rels & mask
            if inside & (inside - 1) == 0:  # the class joins nothing inside the set
                continue
            per_rel: dict[int, float] = {}  # per relation of the set: its member's distinct count
            for r, d in members:
                if mask >> r & 1:
                    per_rel[r] = min(per_rel.get(r, d), d)
            out /= math.prod(sorted(per_rel.values())[1:])
            rels = sorted(per_rel)
            for i, a in enumerate(rels):
                for b in rels[i + 1:]:
                    pairs.setdefault((a, b), []).append(1.0 / max(per_rel[a], per_rel[b]))
        # several classes joining the same two relations (a composite key: ps_partkey, ps_suppkey)
        # are rarely independent: exponential backoff (the most selective, times the square root
        # of the next, the fourth root of the third...) replaces their plain product
        for sels in pairs.values():
            if len(sels) > 1:
                sels.sort()
                out *= math.prod(x ** (0.5 ** k) for k, x in enumerate(sels)) / math.prod(sels)
        for rels, sel in self._predicates:
            if rels & mask == rels:  # inside the set
                out *= sel
        out = max(1.0, out)
        self._memo[mask] = out
        return out


# ------------------------------------------------------------------------------------- operators
class Estimator:
    """Estimated rows of any logical operator, from statistics; inner-join trees through their
    query graph (so EXPLAIN shows what the join enumerator saw)."""

    def __init__(self, root: P.Node, tables: dict[str, TableStats], earlier: "Estimator | None" = None):
        """``earlier``: an estimator of a plan this one was rewritten from, whose estimates it
        shares: a subtree the rewrite kept (the same node) has the same rows, since an estimate
        reads only the subtree and the statistics of the columns made in it (the optimizer's
        passes each estimate the plan the last one left, mostly unchanged)."""
        self.tables = tables
        self.stats = column_index(root, tables)
        self.filters = FilterSelectivity(self.stats)
        self._memo: dict[int, tuple[P.Node, float]] = {} if earlier is None or earlier.tables is not tables \
            else earlier._memo

    def join_cardinality(self, graph: G.JoinGraph) -> JoinCardinality:
        return JoinCardinality(graph, [self.rows(r.node) for r in graph.relations], self.stats, self.filters)

    def rows(self, node: P.Node) -> float:
        hit = self._memo.get(id(node))
        if hit is None or hit[0] is not node:  # the node is kept: its id cannot be reused meanwhile
            hit = self._memo[id(node)] = (node, self._rows(node))
        return hit[1]

    def _key_distinct(self, exprs: list[Expr], rows: float) -> float:
        d = 1.0
        for e in exprs:
            st = self.stats.get(e.cid) if isinstance(e, Ref) else None
            d *= st.distinct if st is not None and st.distinct > 0 else max(1.0, 0.1 * rows)
        return max(1.0, min(d, rows))

    def _groups(self, keys: list[Expr], rows: float) -> float:
        """Distinct key combinations among ``rows`` rows drawn from the keys' ``d`` values
        (Cardenas: d * (1 - (1 - 1/d)^rows)): a filtered or joined input holds fewer of a key's
        values than the table does, and groups shrink rows only once rows approach d."""
        d = self._key_distinct(keys, float("inf"))
        if not math.isfinite(d):  # a key without statistics: the old cap
            return self._key_distinct(keys, rows)
        if d <= 1.0 or rows <= 1.0:
            return max(1.0, min(d, rows))
        return max(1.0, min(rows, -d * math.expm1(rows * math.log1p(-1.0 / d))))

    def _rows(self, n: P.Node) -> float:
        if isinstance(n, P.Scan):
            base = self.tables[n.table].rows if n.table in self.tables else 1000.0
            return base * self.filters.of(None if not n.filters else and_(n.filters))
        if isinstance(n, P.OneRow):
            return 1.0
        if isinstance(n, P.Filter):
            return self.rows(n.child) * self.filters.of(n.predicate)
        if G.is_inner_tree(n):
            graph = G.extract(n)
            if graph is not None:
                return self.join_cardinality(graph).rows(graph.all)
        if isinstance(n, P.Join):
            left, right = self.rows(n.left), self.rows(n.right)
            res = self.filters.of(n.residual)
            if n.kind in ("semi", "anti"):
                if n.left_keys:
                    matched = min(1.0, self._key_distinct(n.right_keys, right) / self._key_distinct(n.left_keys, left))
                else:
                    matched = 0.5
                matched *= res if n.residual is not None else 1.0
                return left * (matched if n.kind == "semi" else max(0.1, 1.0 - matched))
            if n.left_keys:
                inner = left * right / max(self._key_distinct(n.left_keys, left),
                                           self._key_distinct(n.right_keys, right)) * res
            else:
                inner = left * right * res
            return {"left": max(inner, left), "right": max(inner, right),
                    "full": max(inner, left, right)}.get(n.kind, inner)
        if isinstance(n, P.Aggregate):
            child = self.rows(n.child)
            return 1.0 if not n.keys else self._groups([e for _, e in n.keys], child)
        if isinstance(n, P.Distinct):
            child = self.rows(n.child)
            return self._groups([Ref(o.cid, o.type, o.name) for o in n.outputs], child)
        if isinstance(n, P.Limit):
            c = self.rows(n.child)
            return c if n.limit is None else min(c, float(n.limit))
        if isinstance(n, P.TopK):
            return min(self.rows(n.child), float(n.limit))
        if isinstance(n, P.Union):
            return sum(self.rows(c) for c in n.children)
        ins = n.inputs()
        return self.rows(ins[0]) if ins else 1.0


def q_error(estimate: float, actual: float) -> float:
    """max(est / act, act / est), both floored at 1 row: 1 is a perfect estimate."""
    e, a = max(1.0, estimate), max(1.0, actual)
    return max(e / a, a / e)
