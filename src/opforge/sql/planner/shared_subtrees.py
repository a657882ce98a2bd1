"""Subtrees of one plan that compute the same rows under other column ids, so the executor runs
each once and reuses its result (``sql/executor.py``).

The binder inlines a CTE at every reference with fresh column ids, and binds the block under a
ROLLUP once per grouping set: TPC-DS q14 read its ``cross_items`` CTE (three joins of a year of
sales, intersected) 15 times, 3 channels in each of the 5 grouping sets; DuckDB computes it once.
Two subtrees are the same when they are equal up to a renaming of column ids: each node's *shape*
names its inputs' columns by position (input number, output position), never by id, and the
shapes are interned into small ints bottom up, so a plan of n nodes is keyed in O(n).

A subtree is reused when it is computed at least twice, holds no volatile function and no column
of an outer query, and either holds an aggregate, union, distinct or window (what a CTE computes)
or holds a join and no copy of it can receive a runtime filter (no join above it before a
top-k, limit or window: TPC-DS q18's 7-way join under each of its ROLLUP's 5 grouping sets). A
shared result is computed without the runtime filters pushed into it (it must serve every copy),
and a join tree's own copies' filters (q75: one year of sales from each copy's date join) cut it
more than sharing saves. ``plan_reuse`` counts each shape's uses the way the executor meets them
(a subtree inside a reused one is not run again), so the executor can drop a result after its
last use. The optimizer's pruning keeps copies alike (``shapes``; ``optimizer._prune_plan``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from opforge.sql import plan as P
from opforge.sql.expr import Expr, Func, Lit, Ref

VOLATILE = {"random", "rand", "uuid", "gen_random_uuid", "nextval"}  # another value at every call
_WORK = (P.Aggregate, P.Union, P.Distinct, P.Window, P.WindowFunctions)
_PASSES = (P.Filter, P.Project, P.Aggregate, P.Sort, P.Distinct, P.Union)  # may pass a runtime filter down
# a shared subtree holds one of these, and its copies hold copies of it: where none is met twice,
# no subtree is shared
SHARE_MARKS = (P.Join, *_WORK)


class _Unshareable(Exception):
    """The subtree reads a column its inputs do not output (an outer query's) or a volatile function."""


@dataclass
class Reuse:
    """Which nodes share a shape, and how many times each shared shape is used after it is computed."""
    shape: dict[int, int] = field(default_factory=dict)  # id(node) -> shape, for shared nodes only
    uses: dict[int, int] = field(default_factory=dict)  # shape -> times its result is read again

    def key(self, node: P.Node) -> int | None:
        return self.shape.get(id(node))


def shapes(root: P.Node) -> dict[int, int | None]:
    """``id(node) -> shape`` for every node of ``root``: equal for subtrees equal up to column ids,
    None for one that is never shared."""
    interned = _Shapes()
    shape_of: dict[int, int | None] = {}

    def visit(node: P.Node) -> int | None:
        if id(node) not in shape_of:
            kids = [visit(c) for c in node.inputs()]
            shape_of[id(node)] = None if any(k is None for k in kids) else interned.of(node, kids)
        return shape_of[id(node)]

    visit(root)
    return shape_of


def plan_reuse(root: P.Node) -> Reuse:
    """The shared subtrees of ``root`` (see the module docstring)."""
    shape_of = shapes(root)
    holds: dict[int, str] = {}  # "work" (an aggregate ... below), "join" or ""

    def visit(node: P.Node) -> None:
        if id(node) in holds:
            return
        for c in node.inputs():
            visit(c)
        below = {holds[id(c)] for c in node.inputs()}
        holds[id(node)] = "work" if isinstance(node, _WORK) or "work" in below else \
            "join" if isinstance(node, P.Join) or "join" in below else ""

    visit(root)
    filtered: set[int] = set()  # shapes with a copy that a runtime filter may reach

    def reach(node: P.Node, may: bool) -> None:
        if may and shape_of[id(node)] is not None:
            filtered.add(shape_of[id(node)])
        for c in node.inputs():
            reach(c, isinstance(node, P.Join) or (may and isinstance(node, _PASSES)))

    reach(root, False)
    worthy = {k: holds[k] == "work" or (holds[k] == "join" and shape_of[k] not in filtered) for k in holds}
    runs: dict[int, int] = {}  # shape -> times the executor meets it, one copy of each shape expanded
    nodes: dict[int, list[P.Node]] = {}

    def meet(node: P.Node) -> None:
        s = shape_of[id(node)]
        if s is not None and worthy[id(node)]:
            runs[s] = runs.get(s, 0) + 1
            nodes.setdefault(s, []).append(node)
            if runs[s] > 1:
                return
        for c in node.inputs():
            meet(c)

    meet(root)
    out = Reuse()
    for s, n in runs.items():
        if n > 1:
            out.uses[s] = n - 1
            for node in nodes[s]:
                out.shape[id(node)] = s
    return out


class _Shapes:
    """Interns node shapes: equal ints for subtrees equal up to column ids."""

    def __init__(self):
        self._ids: dict[tuple, int] = {}

    def of(self, node: P.Node, kids: list[int]) -> int | None:
        try:
            key = (type(node).__name__, tuple(kids), tuple(o.type for o in node.outputs), _own(node))
        except _Unshareable:
            return None
        return self._ids.setdefault(key, len(self._ids))


def _own(node: P.Node) -> tuple:
    """``node``'s own fields, its expressions' columns by (input, position)."""
    where: dict[int, tuple[int, int]] = {}
    for i, c in enumerate(node.inputs()):
        for j, o in enumerate(c.outputs):
            where[o.cid] = (i, j)
    if isinstance(node, P.Scan):
        where = {o.cid: (0, j) for j, o in enumerate(node.outputs)}
        return node.table, tuple(o.name for o in node.outputs), _exprs(node.filters, where)
    e = lambda x: _expr(x, where)  # noqa: E731
    if isinstance(node, (P.OneRow, P.Distinct)):
        return ()
    if isinstance(node, P.Filter):
        return (e(node.predicate),)
    if isinstance(node, P.Project):
        return tuple(e(x) for _, x in node.exprs)
    if isinstance(node, P.Aggregate):
        return (tuple(e(x) for _, x in node.keys), tuple(_agg(c, where) for _, c in node.aggs), node.grouped)
    if isinstance(node, P.Window):
        return _exprs(node.partition, where), tuple(_agg(c, where) for _, c in node.aggs)
    if isinstance(node, P.WindowFunctions):
        order = tuple((e(x), d, nf) for x, d, nf in node.order)
        calls = tuple((c.func, _exprs(c.args, where), c.type, _frame(c.frame, where), c.ignore_nulls)
                      for _, c in node.calls)
        return _exprs(node.partition, where), order, calls
    if isinstance(node, P.Join):
        residual = None if node.residual is None else e(node.residual)
        return node.kind, _exprs(node.left_keys, where), _exprs(node.right_keys, where), residual, node.null_aware
    if isinstance(node, (P.Sort, P.TopK)):
        keys = tuple((e(x), d, nf) for x, d, nf in node.keys)
        return (keys,) if isinstance(node, P.Sort) else (keys, node.limit, node.offset)
    if isinstance(node, P.Limit):
        return node.limit, node.offset
    if isinstance(node, P.Union):
        return (node.all,)
    if isinstance(node, P.Unnest):
        return tuple(e(x) for _, x in node.lists)
    raise _Unshareable(type(node).__name__)  # a node kind this module does not know: never shared


def _exprs(exprs, where) -> tuple:
    return tuple(_expr(x, where) for x in exprs)


def _agg(call: P.AggCall, where) -> tuple:
    return call.func, None if call.arg is None else _expr(call.arg, where), call.type


def _frame(frame: P.Frame | None, where) -> tuple | None:
    if frame is None:
        return None
    bound = lambda b: (b.kind, None if b.offset is None else _expr(b.offset, where))  # noqa: E731
    return frame.unit, bound(frame.start), bound(frame.end)


def _expr(x: Expr, where) -> tuple:
    if isinstance(x, Ref):
        if x.cid not in where:
            raise _Unshareable(f"column {x} of an outer query")
        return "ref", where[x.cid], x.type
    if isinstance(x, Lit):
        return "lit", type(x.value).__name__, repr(x.value), x.type
    if isinstance(x, Func):
        if x.name in VOLATILE:
            raise _Unshareable(x.name)
        return "func", x.name, _extra(x.extra, where), x.type, _exprs(x.args, where)
    raise _Unshareable(type(x).__name__)


def _extra(value, where):
    """A function's extra argument by value when it is plain data, else by identity (the same
    object is the same argument; another one with the same fields is not assumed to be)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return type(value).__name__, repr(value)
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_extra(v, where) for v in value)
    if isinstance(value, Expr):
        return _expr(value, where)
    return "object", id(value)
