"""Logical plan nodes. Every node lists its output columns as (cid, name, type); expressions refer to cids."""
from __future__ import annotations

from dataclasses import dataclass, field

from opforge.sql import types as T
from opforge.sql.expr import Expr


@dataclass(eq=False)
class OutCol:
    cid: int
    name: str
    type: T.SqlType


class Node:
    outputs: list[OutCol]

    def inputs(self) -> list["Node"]:
        return []

    def describe(self) -> str:
        return type(self).__name__


class Unary(Node):
    """A node over one ``child``; unless it says otherwise, its rows keep the child's columns."""
    child: Node

    @property
    def outputs(self):
        return self.child.outputs

    def inputs(self):
        return [self.child]


@dataclass(eq=False)
class Scan(Node):
    table: str
    outputs: list[OutCol]
    filters: list[Expr] = field(default_factory=list)

    def describe(self):
        cols = ", ".join(o.name for o in self.outputs)
        f = f" filter=[{' AND '.join(str(x) for x in self.filters)}]" if self.filters else ""
        return f"Scan {self.table} [{cols}]{f}"


@dataclass(eq=False)
class OneRow(Node):
    """FROM-less SELECT: one row, no columns."""
    outputs: list[OutCol] = field(default_factory=list)

    def describe(self):
        return "OneRow"


@dataclass(eq=False)
class Filter(Unary):
    child: Node
    predicate: Expr

    def describe(self):
        return f"Filter {self.predicate}"


@dataclass(eq=False)
class Project(Unary):
    child: Node
    exprs: list[tuple[OutCol, Expr]]

    @property
    def outputs(self):
        return [o for o, _ in self.exprs]

    def describe(self):
        return "Project " + ", ".join(f"{o.name}#{o.cid}={e}" for o, e in self.exprs)


@dataclass(eq=False)
class AggCall:
    func: str  # count count_star count_distinct sum avg min max
    arg: Expr | None
    type: T.SqlType

    def __str__(self):
        return f"{self.func}({'' if self.arg is None else self.arg})"


@dataclass(eq=False)
class Aggregate(Unary):
    child: Node
    keys: list[tuple[OutCol, Expr]]
    aggs: list[tuple[OutCol, AggCall]]
    # positions of the keys the groups are formed on (None: all); the other keys follow from
    # them (functional dependencies, ``planner/dependencies.py``) and are read off each group's first row
    grouped: tuple[int, ...] | None = None

    @property
    def outputs(self):
        return [o for o, _ in self.keys] + [o for o, _ in self.aggs]

    def describe(self):
        k = ", ".join(str(e) for _, e in self.keys)
        a = ", ".join(f"{o.name}#{o.cid}={c}" for o, c in self.aggs)
        on = "" if self.grouped is None else \
            f" grouped on [{', '.join(str(self.keys[i][1]) for i in self.grouped)}] (the other keys follow)"
        return f"Aggregate keys=[{k}]{on} aggs=[{a}]"


@dataclass(eq=False)
class Window(Unary):
    """Each row with aggregates over the rows that share its ``partition`` values (SQL's
    ``agg(x) OVER (PARTITION BY ...)``): the child's columns, then one column per aggregate."""
    child: Node
    partition: list[Expr]
    aggs: list[tuple[OutCol, AggCall]]

    @property
    def outputs(self):
        return self.child.outputs + [o for o, _ in self.aggs]

    def describe(self):
        k = ", ".join(str(e) for e in self.partition)
        a = ", ".join(f"{o.name}#{o.cid}={c}" for o, c in self.aggs)
        return f"Window partition=[{k}] aggs=[{a}]"


@dataclass(frozen=True)
class FrameBound:
    """One end of a window frame: ``kind`` is unbounded_preceding, preceding, current, following or
    unbounded_following; ``offset`` the n of n PRECEDING / FOLLOWING (an expression, per row)."""
    kind: str
    offset: Expr | None = None

    def __str__(self):
        words = {"unbounded_preceding": "UNBOUNDED PRECEDING", "current": "CURRENT ROW",
                 "unbounded_following": "UNBOUNDED FOLLOWING"}
        return words.get(self.kind) or f"{self.offset} {self.kind.upper()}"


@dataclass(frozen=True)
class Frame:
    """A window frame (``unit``: rows, range or groups) between two bounds."""
    unit: str
    start: FrameBound
    end: FrameBound

    def __str__(self):
        return f"{self.unit.upper()} BETWEEN {self.start} AND {self.end}"


@dataclass(eq=False)
class WindowCall:
    """One window function: ``func`` is a ranking function (row_number rank dense_rank percent_rank
    cume_dist ntile), an offset function (lag lead first_value last_value nth_value) or an
    aggregate (count count_star count_distinct sum avg min max); ``frame`` None for the ranking and
    lag / lead functions, which ignore it."""
    func: str
    args: list[Expr]
    type: T.SqlType
    frame: Frame | None = None
    ignore_nulls: bool = False  # offset functions: skip rows whose value is NULL

    def exprs(self) -> list[Expr]:
        """Every expression the call reads: its arguments and its frame's offsets (per row)."""
        bounds = [] if self.frame is None else [self.frame.start.offset, self.frame.end.offset]
        return self.args + [e for e in bounds if e is not None]

    def __str__(self):
        f = f" {self.frame}" if self.frame is not None else ""
        nulls = " IGNORE NULLS" if self.ignore_nulls else ""
        return f"{self.func}({', '.join(str(a) for a in self.args)}){nulls}{f}"


@dataclass(eq=False)
class WindowFunctions(Unary):
    """SQL's ``f(...) OVER (PARTITION BY ... ORDER BY ...)`` for calls sharing one partitioning and
    order: the child's rows (in no particular order) with one more column per call."""
    child: Node
    partition: list[Expr]
    order: list[tuple[Expr, bool, bool]]  # expr, descending, nulls_first
    calls: list[tuple[OutCol, WindowCall]]

    @property
    def outputs(self):
        return self.child.outputs + [o for o, _ in self.calls]

    def describe(self):
        k = ", ".join(str(e) for e in self.partition)
        o = ", ".join(f"{e} {'DESC' if d else 'ASC'}{' NULLS FIRST' if nf else ''}" for e, d, nf in self.order)
        c = ", ".join(f"{oc.name}#{oc.cid}={call}" for oc, call in self.calls)
        return f"WindowFunctions partition=[{k}] order=[{o}] calls=[{c}]"


@dataclass(eq=False)
class Join(Node):
    left: Node
    right: Node
    kind: str  # inner left right full semi anti cross
    left_keys: list[Expr]
    right_keys: list[Expr]
    residual: Expr | None = None
    null_aware: bool = False  # NOT IN: any NULL on the right empties the result
    note: str = ""  # the join planner's reasons (rule, estimate, physical choice), shown by EXPLAIN
    # set by the join planner for the inner joins it builds (None / empty: the executor's own rule):
    physical: object = None  # planner.physical_choice.JoinChoice; its build side is the right input
    heavy_keys: tuple = ()  # probe (left) key values above the skew threshold, from the statistics
    distribution: object = None  # planner.distribution.DistributionChoice (several workers only)

    @property
    def outputs(self):
        if self.kind in ("semi", "anti"):
            return self.left.outputs
        return self.left.outputs + self.right.outputs

    def inputs(self):
        return [self.left, self.right]

    def describe(self):
        keys = ", ".join(f"{a} = {b}" for a, b in zip(self.left_keys, self.right_keys))
        r = f" residual={self.residual}" if self.residual is not None else ""
        note = f" | {self.note}" if self.note else ""
        return f"Join {self.kind}{' null-aware' if self.null_aware else ''} [{keys}]{r}{note}"


@dataclass(eq=False)
class Sort(Unary):
    child: Node
    keys: list[tuple[Expr, bool, bool]]  # expr, descending, nulls_first

    def describe(self):
        return "Sort " + ", ".join(f"{e} {'DESC' if d else 'ASC'}{' NULLS FIRST' if nf else ''}" for e, d, nf in self.keys)


@dataclass(eq=False)
class Limit(Unary):
    child: Node
    limit: int | None
    offset: int = 0

    def describe(self):
        return f"Limit {self.limit} offset {self.offset}"


@dataclass(eq=False)
class TopK(Unary):
    """ORDER BY ... LIMIT k OFFSET o as one operator (the optimizer fuses Limit over Sort): the same
    rows in the same order as the stable sort followed by the slice, without sorting every row."""
    child: Node
    keys: list[tuple[Expr, bool, bool]]  # expr, descending, nulls_first
    limit: int
    offset: int = 0

    def describe(self):
        keys = ", ".join(f"{e} {'DESC' if d else 'ASC'}{' NULLS FIRST' if nf else ''}" for e, d, nf in self.keys)
        return f"TopK {self.limit} offset {self.offset} by {keys}"


@dataclass(eq=False)
class Distinct(Unary):
    child: Node


@dataclass(eq=False)
class Union(Node):
    children: list[Node]
    outputs: list[OutCol]
    all: bool = True

    def inputs(self):
        return self.children

    def describe(self):
        return f"Union{' ALL' if self.all else ''}"


def explain(node: Node, indent: int = 0, estimate=None) -> str:
    """The plan tree, one operator per line; ``estimate(node)`` (optional) adds estimated rows."""
    suffix = f"  (est. rows={estimate(node)})" if estimate is not None else ""
    lines = ["  " * indent + node.describe() + suffix]
    for c in node.inputs():
        lines.append(explain(c, indent + 1, estimate))
    return "\n".join(lines)


def output_cids(node: Node) -> set[int]:
    """The column ids ``node`` outputs."""
    return {o.cid for o in node.outputs}


def expr_cids(exprs) -> set[int]:
    """The column ids ``exprs`` read (None entries skipped)."""
    out: set[int] = set()
    for e in exprs:
        if e is not None:
            out |= e.cids()
    return out


@dataclass(eq=False)
class Unnest(Unary):
    """``SELECT UNNEST(l)``: each child row repeated once per element of its lists, with one more
    column per list holding the element (lists of one row are zipped, the shorter padded with NULL,
    as DuckDB does; a NULL or empty list gives the row no output)."""
    child: Node
    lists: list[tuple[OutCol, Expr]]

    @property
    def outputs(self):
        return self.child.outputs + [o for o, _ in self.lists]

    def describe(self):
        return "Unnest " + ", ".join(f"{o.name}#{o.cid}=UNNEST({e})" for o, e in self.lists)
