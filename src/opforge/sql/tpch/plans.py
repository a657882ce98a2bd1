"""Join plans of opforge and DuckDB on TPC-H side by side: each engine's join operators with their
actual output rows, from its own profile (opforge's EXPLAIN ANALYZE, DuckDB's
``EXPLAIN (ANALYZE, FORMAT JSON)``), and C_out (Cluet & Moerkotte: the sum of the join results'
sizes) of each plan under those true cardinalities, plus the q-error of the estimates.

Both engines run without runtime (dynamic) filters here: opforge with ``runtime_filters=False``,
DuckDB with its ``join_filter_pushdown`` optimizer disabled. A filter from one join's build side
shrinks the joins below it on the probe side, so with them on the figures would measure the
filters, not the join order.

``kinds="inner"`` (the default) counts inner joins and cross products only: the join trees that
join ordering decides. Semi, anti, mark and outer joins and DuckDB's DELIM joins come from how each
engine decorrelates subqueries, which is not join ordering; ``kinds="all"`` counts them too.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from opforge.sql.planner.cardinality import q_error

DUCKDB_JOINS = ("HASH_JOIN", "NESTED_LOOP_JOIN", "PIECEWISE_MERGE_JOIN", "BLOCKWISE_NL_JOIN", "CROSS_PRODUCT",
                "DELIM_JOIN", "LEFT_DELIM_JOIN", "RIGHT_DELIM_JOIN", "IE_JOIN", "ASOF_JOIN", "POSITIONAL_SCAN")


@dataclass
class JoinOp:
    """One join operator of a plan as its engine's profile reports it."""

    engine: str
    operator: str  # HASH_JOIN ... (DuckDB) or the plan line (opforge)
    kind: str  # inner, left, semi, anti, mark, cross, ...
    actual_rows: int
    est_rows: float | None
    depth: int

    @property
    def inner(self) -> bool:
        return self.kind in ("inner", "cross") and "DELIM" not in self.operator


def duckdb_joins(con, query: str) -> list[JoinOp]:
    """DuckDB's join operators of ``query`` (parsed from its JSON profile), in plan pre-order."""
    con.execute("SET disabled_optimizers = 'join_filter_pushdown'")
    try:
        text = con.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query).fetchall()[0][1]
    finally:
        con.execute("RESET disabled_optimizers")
    profile = json.loads(text)
    out: list[JoinOp] = []

    def walk(node: dict, depth: int) -> None:
        name = node.get("name") or node.get("operator_type") or ""
        if name.strip() in DUCKDB_JOINS and name.strip() != "POSITIONAL_SCAN":
            extra = node.get("extra_info", {}) or {}
            kind = "cross" if name.strip() == "CROSS_PRODUCT" else str(extra.get("Join Type", "inner")).lower()
            rows = node.get("operator_cardinality", node.get("intermediate_rows", 0))
            est = extra.get("Estimated Cardinality")
            out.append(JoinOp("duckdb", name.strip(), kind, int(rows), None if est is None else float(est), depth))
        for c in node.get("children", []) or []:
            walk(c, depth + 1)

    roots = profile.get("operator") if isinstance(profile, dict) and "operator" in profile else \
        profile.get("children", []) if isinstance(profile, dict) else profile
    for r in roots if isinstance(roots, list) else [roots]:
        walk(r, 0)
    return out


def opforge_joins(con, query: str) -> list[JoinOp]:
    """opforge's join operators of ``query`` (EXPLAIN ANALYZE), in plan pre-order."""
    saved = con.runtime_filters
    con.runtime_filters = False
    try:
        stats = con.sql(query).analyze().stats
    finally:
        con.runtime_filters = saved
    out = []
    for s in stats:
        if s.describe.startswith("Join "):
            kind = s.describe.split(" ")[1]
            out.append(JoinOp("opforge", s.describe, kind, int(s.actual_rows), float(s.est_rows), s.depth))
    return out


def c_out(joins: list[JoinOp], kinds: str = "inner") -> int:
    """Sum of the join results' sizes (``kinds``: "inner" or "all", see the module docstring)."""
    return sum(j.actual_rows for j in joins if kinds == "all" or j.inner)


def q_errors(joins: list[JoinOp]) -> list[float]:
    return [q_error(j.est_rows, j.actual_rows) for j in joins if j.est_rows is not None and j.inner]


def compare(con, duck, numbers) -> list[dict]:
    """Per query: both plans' C_out (inner joins and all joins), join counts and q-errors."""
    from opforge.sql.tpch import queries

    rows = []
    for n in numbers:
        q = queries.query(n)
        ours, theirs = opforge_joins(con, q), duckdb_joins(duck, q)
        rows.append({
            "query": queries.name(n),
            "opforge_c_out": c_out(ours), "duckdb_c_out": c_out(theirs),
            "opforge_c_out_all": c_out(ours, "all"), "duckdb_c_out_all": c_out(theirs, "all"),
            "opforge_inner_joins": sum(j.inner for j in ours), "duckdb_inner_joins": sum(j.inner for j in theirs),
            "opforge_q_errors": q_errors(ours), "duckdb_q_errors": q_errors(theirs),
            "opforge_joins": [asdict(j) for j in ours], "duckdb_joins": [asdict(j) for j in theirs],
        })
    return rows
