"""The join order optimizer: each tree of inner joins in a logical plan is replaced by the best
tree the enumerators find (as DuckDB's ``join_order_optimizer`` ties its query graph, enumerator,
cost model and cardinality estimator together).

``mode`` (``connect(join_reordering=...)``, the names Trino and DuckDB users know):
* "auto": DPccp while its csg-cmp pairs stay within ``max_pairs`` (10000: stars of 11
  relations, cliques of 9, chains and cycles of many more) and ``time_budget_s``, else
  Greedy Operator Ordering;
* "greedy": Greedy Operator Ordering always;
* "none": the binder's order (FROM order, connected relations first).

Every rebuilt join carries a note for EXPLAIN: which rule chose the order, the estimated rows,
the physical choice with its reason and any skewed key (a most-common value above the threshold).
Each rebuilt join also carries, for the executor, the physical choice itself (``Join.physical``:
algorithm, build side = the right input), the probe key's heavy hitters (``Join.heavy_keys``) and,
with several workers, the planned distribution (``Join.distribution``). Where columns are read by
position (the query's result, a UNION input) the rebuilt tree's outputs are put back in their
original order.
"""
from __future__ import annotations

import dataclasses
import operator
import time
from dataclasses import dataclass

from opforge.sql import plan as P
from opforge.sql.expr import Ref, and_
from opforge.sql.physical.joins.base import DENSE_RANGE_PER_ROW, Hardware
from opforge.sql.planner import dp, greedy
from opforge.sql.planner import join_graph as G
from opforge.sql.planner.cardinality import Estimator
from opforge.sql.planner.join_tree import JoinPlan, Planning
from opforge.sql.planner.distribution import choose_distribution
from opforge.sql.planner.physical_choice import JoinChoice, PhysicalCost
from opforge.sql.planner.statistics import TableStats

MODES = ("auto", "greedy", "none")
SKEW_THRESHOLD = 0.1  # a join key value holding more than this share of its rows is reported


def check_mode(mode) -> None:
    if mode not in MODES:
        raise ValueError(f"opforge.sql.connect: join_reordering must be one of {MODES}, got {mode!r}")


@dataclass
class Decision:
    """What the optimizer did for one inner-join tree (EXPLAIN, tests)."""

    rule: str
    relations: int
    plan: JoinPlan


def _width(node: P.Node) -> float:
    return float(sum(o.type.torch_dtype.itemsize for o in node.outputs)) or 1.0


def _leaf_scan(node: P.Node) -> P.Scan | None:
    while isinstance(node, P.Filter):
        node = node.child
    return node if isinstance(node, P.Scan) else None


class JoinOrderOptimizer:
    """One planning pass over a logical plan. ``stats``: table name -> ``TableStats``; ``tables``:
    name -> ``Table`` (which columns are stored in key order); ``model``: the enumerators' cost
    model (default the GPU one, ``PhysicalCost``; ``COut`` for C_out); ``max_pairs`` and
    ``time_budget_s`` bound DPccp before the greedy fallback; ``skew_threshold``: the share of
    rows above which one join key value is reported as skewed."""

    def __init__(self, stats: dict[str, TableStats], tables: dict | None = None, mode: str = "auto",
                 hardware: Hardware = Hardware(), model=None, max_pairs: int | None = dp.DEFAULT_MAX_PAIRS,
                 time_budget_s: float | None = 1.0, skew_threshold: float = SKEW_THRESHOLD,
                 workers: int = 1, join_distribution: str = "auto"):
        check_mode(mode)
        self.skew_threshold = skew_threshold
        self.workers, self.join_distribution = workers, join_distribution
        self.stats, self.tables, self.mode = stats, tables or {}, mode
        self.model = model or PhysicalCost(hardware)
        self.table_budget = hardware.table_budget  # a broadcast build side must fit one worker
        self.max_pairs, self.time_budget_s = max_pairs, time_budget_s
        self.decisions: list[Decision] = []
        self.estimator: Estimator | None = None
        # query graphs (by adjacency) DPccp refused: its pair count depends on nothing else, and a
        # plan often holds one graph several times (TPC-DS q64: the 18 relations of each copy of
        # cross_sales), each refused after some 10,000 steps
        self._refused: dict[tuple[int, ...], str] = {}

    def optimize(self, root: P.Node, earlier: Estimator | None = None) -> P.Node:
        """``earlier``: the estimator of the plan ``root`` was rewritten from (its estimates shared)."""
        if self.mode == "none":
            return root
        self.estimator = Estimator(root, self.stats, earlier)
        return self._walk(root, keep_order=True)

    # ----------------------------------------------------------------------------------- walk
    def _walk(self, node: P.Node, keep_order: bool) -> P.Node:
        """``keep_order``: someone reads ``node``'s columns by position (the query's result, a
        UNION input, through row-wise operators that pass their input's columns on)."""
        graph = G.extract(node) if G.is_inner_tree(node) else None
        if graph is None:
            passes = isinstance(node, (P.Union, P.Filter, P.Sort, P.Limit, P.TopK, P.Distinct, P.Join))
            down = isinstance(node, P.Union) or (keep_order and passes)
            return _with_inputs(node, [self._walk(c, down) for c in node.inputs()])
        for r in graph.relations:
            r.node = self._walk(r.node, False)
        return self._reorder(node, graph, keep_order)

    def _leaf_facts(self, rel: G.Relation) -> tuple[frozenset, dict]:
        """Sorted and dense-unique key columns of a scan leaf (what merge / direct joins need)."""
        scan = _leaf_scan(rel.node)
        if scan is None or scan.table not in self.stats:
            return frozenset(), {}
        table, tstats = self.tables.get(scan.table), self.stats[scan.table]
        sorted_cids, dense = set(), {}
        for o in scan.outputs:
            st = tstats.columns.get(o.name)
            ordered = st.sorted if st is not None and st.sorted is not None else (  # chunked statistics know
                table is not None and table.column(o.name).sorted)
            if ordered:
                sorted_cids.add(o.cid)
            if st is not None and o.type.is_integer and st.min is not None and st.nulls == 0 \
                    and st.exact and st.distinct == st.rows:
                span = st.max - st.min + 1
                if span <= DENSE_RANGE_PER_ROW * st.rows:
                    dense[o.cid] = span
        return frozenset(sorted_cids), dense

    def planning(self, graph: G.JoinGraph) -> Planning:
        facts = [self._leaf_facts(r) for r in graph.relations]
        return Planning(graph, self.estimator.join_cardinality(graph), self.model,
                        [_width(r.node) for r in graph.relations], [f[0] for f in facts], [f[1] for f in facts])

    def choose(self, graph: G.JoinGraph) -> tuple[JoinPlan, str]:
        planning = self.planning(graph)
        n = graph.size
        if self.mode == "greedy":
            return greedy.best_plan(planning), f"greedy (GOO, join_reordering=greedy) over {n} relations"
        deadline = None if self.time_budget_s is None else time.perf_counter() + self.time_budget_s
        shape = tuple(graph.adjacency)
        refused = self._refused.get(shape)
        if refused is None:
            try:
                plan = dp.best_plan(planning, self.max_pairs, deadline)
                return plan, f"DPccp over {n} relations ({planning.joins_costed} joins costed)"
            except dp.BudgetExceeded as e:
                refused = self._refused[shape] = str(e)
        return greedy.best_plan(planning), f"greedy (GOO) over {n} relations: DPccp {refused}"

    # -------------------------------------------------------------------------------- rebuild
    def _reorder(self, original: P.Node, graph: G.JoinGraph, keep_order: bool) -> P.Node:
        plan, rule = self.choose(graph)
        self.decisions.append(Decision(rule, graph.size, plan))
        node = self._build(plan, graph, rule)
        want = [o.cid for o in original.outputs]
        if keep_order and [o.cid for o in node.outputs] != want:
            by_cid = {o.cid: o for o in node.outputs}
            node = P.Project(node, [(by_cid[c], Ref(c, by_cid[c].type, by_cid[c].name)) for c in want])
        return node

    def _build(self, plan: JoinPlan, graph: G.JoinGraph, rule: str) -> P.Node:
        if plan.is_leaf:
            i = G.bits(plan.mask)[0]
            node = graph.relations[i].node
            local = graph.local_conditions(i)
            if local and isinstance(node, P.Scan):
                return P.Scan(node.table, node.outputs, node.filters + local)
            return P.Filter(node, and_(local)) if local else node
        a, b = plan.left, plan.right
        if getattr(plan.choice, "build", "right") == "left":
            a, b = b, a  # the build side goes right: the executor's convention for its table
            plan = dataclasses.replace(plan, left=a, right=b, choice=dataclasses.replace(plan.choice, build="right"))
        left, right = self._build(a, graph, rule), self._build(b, graph, rule)
        keys, residual = graph.join_conditions(a.mask, b.mask)
        kind = "inner" if keys or residual else "cross"
        join = P.Join(left, right, kind, [k for k, _ in keys], [k for _, k in keys],
                      and_(residual) if residual else None)
        join.note = _note(plan, rule) + self._skew(keys)
        join.physical = plan.choice if isinstance(plan.choice, JoinChoice) else None
        join.heavy_keys = self._heavy(keys)
        if self.workers > 1 and keys:
            join.distribution = choose_distribution(b.rows * b.width, a.rows * a.width, self.workers,
                                                    self.join_distribution, worker_memory=self.table_budget)
            join.note += f"; planned distribution {join.distribution.method}: {join.distribution.reason}"
        return join

    def _heavy(self, keys) -> tuple:
        """The probe (left) key's most-common values above the skew threshold (one key pair only):
        the executor's partitioned joins split them off (``physical/skew.py``)."""
        if len(keys) != 1 or not isinstance(keys[0][0], Ref):
            return ()
        st = self.estimator.stats.get(keys[0][0].cid)
        if st is None or st.dictionary is not None or not keys[0][0].type.is_integer:
            return ()
        return tuple(int(v) for v, _ in st.heavy_hitters(self.skew_threshold))

    def _skew(self, keys) -> str:
        """Heavy-hitter join keys from the statistics (the input of skew handling, EXPLAIN)."""
        found = []
        for pair in keys:
            for e in pair:
                st = self.estimator.stats.get(e.cid) if isinstance(e, Ref) else None
                heavy = st.heavy_hitters(self.skew_threshold) if st is not None else []
                if heavy:
                    v, f = heavy[0]
                    shown = repr(st.dictionary[int(v)]) if st.dictionary else f"{v:g}"
                    found.append(f"{e} = {shown} holds {f:.0%}")
        return f"; skewed keys (> {self.skew_threshold:.0%} of rows): {', '.join(found)}" if found else ""


def _note(plan: JoinPlan, rule: str) -> str:
    choice = plan.choice.describe() if plan.choice is not None and hasattr(plan.choice, "describe") else ""
    text = f"order: {rule}; est. rows={plan.rows:.0f}"
    return text + (f"; planned {choice}" if choice else "")


def replace_subtree(node: P.Node, old: P.Node, new: P.Node) -> P.Node:
    """``node`` with its subtree ``old`` (by identity) replaced by ``new``."""
    if node is old:
        return new
    return _with_inputs(node, [replace_subtree(c, old, new) for c in node.inputs()])


def _with_inputs(node: P.Node, inputs: list[P.Node]) -> P.Node:
    """``node`` over new inputs (the same node when they did not change)."""
    if all(map(operator.is_, node.inputs(), inputs)):
        return node
    if isinstance(node, P.Join):
        return dataclasses.replace(node, left=inputs[0], right=inputs[1])
    if isinstance(node, P.Union):
        return P.Union(inputs, node.outputs, node.all)
    if isinstance(node, P.Filter):
        return P.Filter(inputs[0], node.predicate)
    if isinstance(node, P.Project):
        return P.Project(inputs[0], node.exprs)
    if isinstance(node, P.Aggregate):
        return dataclasses.replace(node, child=inputs[0])
    if isinstance(node, P.Window):
        return P.Window(inputs[0], node.partition, node.aggs)
    if isinstance(node, (P.WindowFunctions, P.Unnest)):
        return dataclasses.replace(node, child=inputs[0])
    if isinstance(node, P.Sort):
        return P.Sort(inputs[0], node.keys)
    if isinstance(node, P.Limit):
        return P.Limit(inputs[0], node.limit, node.offset)
    if isinstance(node, P.TopK):
        return P.TopK(inputs[0], node.keys, node.limit, node.offset)
    if isinstance(node, P.Distinct):
        return P.Distinct(inputs[0])
    raise TypeError(f"join order optimizer: cannot rebuild {type(node).__name__}")
