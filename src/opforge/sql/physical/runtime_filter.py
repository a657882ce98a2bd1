"""Runtime filters at run time: made from one side of a join once that side is computed, pushed
into the other side's scans (``planner/runtime_filters.RuntimeFilter``: min / max, IN-list, blocked
Bloom).

Which joins make one, and for which side (``filter_plan``): a row of one side that matches no row of
the other never reaches the output when that side is not preserved, so
* inner, semi and right joins filter their left (probe) input by the right (build) side's keys;
* left joins and (not null-aware) anti joins filter their right input by the left side's keys
  (their left rows all survive; right rows matching no left row only make the hash table larger).
  A null-aware anti join (NOT IN) is left alone: a NULL on its right side changes every answer.
The filter tests one key pair, the first whose filtered-side key is a column of an integer or DATE
type with a matching kind on the other side (the two sides' values then compare as int64 directly;
strings are dictionary codes of different tables, decimals may differ in scale: no filter). With
several key pairs that one column still excludes every row that cannot match.
Where a filter may go (``route``): a filter on column c
drops, below an operator, only rows that the join above would drop anyway; so it passes through
Filter, Sort, Distinct, a Project that passes c on unchanged, an Aggregate grouping by c, both sides
of an inner join, the left (preserved) side of a left / semi / anti join and the right side of a
right join; across an inner (or semi) join's key equality it is copied to the other side's key;
into each input of a UNION [ALL] as that input's column at c's position (a row it drops would
give a union row the join drops: TPC-DS q05's 15 days reach the three channels' sales and returns
scans below the union of each channel). Never below a Limit / TopK or into a join's NULL-padded side."""
from __future__ import annotations

from dataclasses import dataclass

from opforge.sql import plan as P
from opforge.sql.expr import Batch, Ref, evaluate
from opforge.sql.planner.runtime_filters import RuntimeFilter


@dataclass(frozen=True)
class Pushed:
    """One runtime filter on its way down: the column it tests and where it came from."""

    cid: int
    filter: RuntimeFilter
    source: str

    def on(self, cid: int) -> "Pushed":
        return Pushed(cid, self.filter, self.source)


def _kind(t) -> str | None:
    if t.is_integer and t.kind != "BOOL":
        return "int"
    if t.kind == "DATE":
        return "date"
    return None


def _same_kind(a, b) -> bool:
    return _kind(a.type) is not None and _kind(a.type) == _kind(b.type)


@dataclass(frozen=True)
class FilterPlan:
    """A join's runtime filter: made from ``source`` ("left" / "right")'s key ``pair``, applied to the other."""

    source: str
    pair: int


def filter_plan(node: P.Join, source: str | None = None) -> FilterPlan | None:
    """The runtime filter the join makes, if any (see the module docstring); ``source`` ("left" /
    "right"): the filter from that side, for a caller that knows it keeps the join's answer (a
    semi / anti join marking its left rows from right chunks drops right rows no left key meets)."""
    if source is None:
        if node.kind in ("inner", "semi", "right"):
            source = "right"
        elif node.kind == "left" or (node.kind == "anti" and not node.null_aware):
            source = "left"
        else:
            return None
    for i, (lk, rk) in enumerate(zip(node.left_keys, node.right_keys)):
        target_key = lk if source == "right" else rk
        if isinstance(target_key, Ref) and _same_kind(lk, rk):
            return FilterPlan(source, i)
    return None


def make(node: P.Join, plan: FilterPlan, built: Batch) -> Pushed:
    """The filter from the computed side ``built`` for the other side's key column."""
    src_keys, dst_keys = (node.right_keys, node.left_keys) if plan.source == "right" else \
        (node.left_keys, node.right_keys)
    col = evaluate(src_keys[plan.pair], built)
    f = RuntimeFilter.build(col.values.long(), col.valid)
    key = dst_keys[plan.pair]
    return Pushed(key.cid, f, f"{f.describe()} from join on {key} = {src_keys[plan.pair]}")


def _cids(node: P.Node) -> set[int]:
    return {o.cid for o in node.outputs}


def route(node: P.Node, pushed: list[Pushed]) -> list[list[Pushed]]:
    """The filters each input of ``node`` may take (one list per input, in ``inputs()`` order)."""
    ins = node.inputs()
    if not pushed or not ins:
        return [[] for _ in ins]
    if isinstance(node, (P.Filter, P.Sort, P.Distinct)):
        return [list(pushed)]
    if isinstance(node, P.Project):
        refs = {o.cid: e.cid for o, e in node.exprs if isinstance(e, Ref) and _same_kind(o, e)}
        return [[p.on(refs[p.cid]) for p in pushed if p.cid in refs]]
    if isinstance(node, P.Aggregate):
        refs = {o.cid: e.cid for o, e in node.keys if isinstance(e, Ref) and _same_kind(o, e)}
        return [[p.on(refs[p.cid]) for p in pushed if p.cid in refs]]
    if isinstance(node, P.Join):
        lc, rc = _cids(node.left), _cids(node.right)
        to_left = node.kind in ("inner", "cross", "left", "semi", "anti")
        to_right = node.kind in ("inner", "cross", "right")
        left, right = [], []
        for p in pushed:
            if p.cid in lc and to_left:
                left.append(p)
            if p.cid in rc and to_right:
                right.append(p)
            if node.kind in ("inner", "semi"):  # across the key equality
                for a, b in zip(node.left_keys, node.right_keys):
                    if isinstance(a, Ref) and isinstance(b, Ref) and _same_kind(a, b):
                        if a.cid == p.cid and p.cid in lc:
                            right.append(p.on(b.cid))
                        elif b.cid == p.cid and p.cid in rc and node.kind == "inner":
                            left.append(p.on(a.cid))
        return [left, right]
    if isinstance(node, P.Union):
        at = {o.cid: i for i, o in enumerate(node.outputs)}
        return [[p.on(c.outputs[at[p.cid]].cid) for p in pushed
                 if p.cid in at and _same_kind(c.outputs[at[p.cid]], node.outputs[at[p.cid]])] for c in ins]
    return [[] for _ in ins]
