"""Runtime filters at run time: made from a join's build side once it is built, pushed into the
probe side's scans (``planner/runtime_filters.RuntimeFilter``: min / max, IN-list, blocked Bloom).

Which joins make one (``filter_source``): inner, semi and right joins with one key pair whose probe
(left) key is a column of an integer or DATE type and whose build key has the same kind (the two
sides' values then compare as int64 directly; strings are dictionary codes of different tables,
decimals may differ in scale: no filter). Where a filter may go (``route``): a filter on column c
drops, below an operator, only rows that the join above would drop anyway; so it passes through
Filter, Sort, Distinct, a Project that passes c on unchanged, an Aggregate grouping by c, both sides
of an inner join, the left (preserved) side of a left / semi / anti join and the right side of a
right join; across an inner (or semi) join's key equality it is copied to the other side's key.
Never below a Limit / TopK or into a UNION or a join's NULL-padded side."""
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


def filter_source(node: P.Join) -> bool:
    """The join can make a runtime filter for its left input."""
    if node.kind not in ("inner", "semi", "right") or len(node.left_keys) != 1:
        return False
    lk, rk = node.left_keys[0], node.right_keys[0]
    return isinstance(lk, Ref) and _same_kind(lk, rk)


def make(node: P.Join, right: Batch) -> Pushed:
    col = evaluate(node.right_keys[0], right)
    f = RuntimeFilter.build(col.values.long(), col.valid)
    key = node.left_keys[0]
    return Pushed(key.cid, f, f"{f.describe()} from join on {key} = {node.right_keys[0]}")


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
    return [[] for _ in ins]
