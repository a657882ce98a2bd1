"""The query graph of a tree of inner joins: relations (the tree's leaves: scans, subqueries, outer
joins...), equivalence classes of join columns and the other predicates, each tagged with the set
of relations it reads (a bitmask; relation i is bit i).

Equalities ``a = b`` between column references of one type become equivalence classes (union-find,
as in DuckDB's ``query_graph``): ``a = b`` and ``b = c`` also connect ``a``'s and ``c``'s
relations, so the enumerator may join those two directly without a cross product. A join of two
relation sets takes one equality per class spanning both sides (by induction every class's members
inside each side are already equal), plus every other predicate that first becomes evaluable there.
An OR over several relations also yields the one-relation filters it implies (``implied_filters``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opforge.sql import plan as P
from opforge.sql import types as T
from opforge.sql.expr import Expr, Func, Ref, and_, cmp, conjuncts, disjuncts


@dataclass
class Relation:
    index: int
    node: P.Node
    cids: frozenset[int]


@dataclass
class Predicate:
    expr: Expr
    rels: int  # bitmask of the relations it reads
    implies: list[Expr] = field(default_factory=list)  # one-relation filters derived from it
    sides: tuple[int, int] | None = None  # an equality ``a = b``: the relations a and b read

    def key(self, left: int, right: int) -> tuple[Expr, Expr] | None:
        """(left expr, right expr) when the predicate is an equality between an expression over
        ``left`` and one over ``right`` (either order): an equi-join key of joining the two."""
        if self.sides is None or not all(self.sides):
            return None
        (a, b), (ra, rb) = self.expr.args, self.sides
        if ra & left == ra and rb & right == rb:
            return a, b
        if rb & left == rb and ra & right == ra:
            return b, a
        return None


def implied_filters(pred: Expr, owner: dict[int, int]) -> dict[int, Expr]:
    """An OR over several relations implies, for each relation that every branch constrains, the OR
    of those branches' conjuncts over that relation alone: ``(n1 = 'FR' AND n2 = 'DE') OR (n1 = 'DE'
    AND n2 = 'FR')`` implies ``n1 = 'FR' OR n1 = 'DE'`` (and the same for n2), filters that can
    run at the scans, long before the join that evaluates the OR (TPC-H Q7, Q19)."""
    branches = [conjuncts(d) for d in disjuncts(pred)]
    if len(branches) < 2:
        return {}
    out = {}
    for r in {owner[c] for c in pred.cids()}:
        parts = [[c for c in b if c.cids() and all(owner[x] == r for x in c.cids())] for b in branches]
        if all(parts):
            ors = and_(parts[0])
            for p in parts[1:]:
                ors = Func("or", [ors, and_(p)], T.BOOL)
            out[r] = ors
    return out


@dataclass
class JoinGraph:
    relations: list[Relation]
    classes: list[list[tuple[int, Ref]]]  # equivalence classes: (relation index, column) members
    predicates: list[Predicate]  # everything that is not a class equality
    adjacency: list[int] = field(default_factory=list)  # per relation: bitmask of its neighbours

    class_masks: list[int] = field(default_factory=list)  # per class: bitmask of its relations

    def __post_init__(self):
        self.class_masks = [sum({1 << r for r, _ in members}) for members in self.classes]
        self.adjacency = [0] * len(self.relations)
        for members in self.classes:
            rels = {r for r, _ in members}
            for r in rels:
                for s in rels - {r}:
                    self.adjacency[r] |= 1 << s
        for p in self.predicates:
            if _is_equi_edge(p):
                a, b = _bits(p.rels)
                self.adjacency[a] |= 1 << b
                self.adjacency[b] |= 1 << a

    @property
    def size(self) -> int:
        return len(self.relations)

    @property
    def all(self) -> int:
        return (1 << self.size) - 1

    def neighbors(self, mask: int) -> int:
        """Relations adjacent to ``mask`` and outside it."""
        out = 0
        for i in _bits(mask):
            out |= self.adjacency[i]
        return out & ~mask

    def connected(self, left: int, right: int) -> bool:
        """An edge joins the two (disjoint) sets: their join is not a cross product."""
        return bool(self.neighbors(left) & right)

    def is_connected(self, mask: int) -> bool:
        """``mask``'s relations form one connected subgraph."""
        if mask == 0:
            return False
        seen = mask & -mask
        while True:
            grown = seen | (self.neighbors(seen) & mask)
            if grown == seen:
                return seen == mask
            seen = grown

    def components(self) -> list[int]:
        """The connected components, as bitmasks, in order of their lowest relation."""
        left, out = self.all, []
        while left:
            comp = left & -left
            while True:
                grown = comp | (self.neighbors(comp) & left)
                if grown == comp:
                    break
                comp = grown
            out.append(comp)
            left &= ~comp
        return out

    def join_conditions(self, left: int, right: int) -> tuple[list[tuple[Expr, Expr]], list[Expr]]:
        """(equi-join key pairs left -> right, residual predicates) of joining ``left`` with
        ``right``: one (left col, right col) equality per equivalence class spanning both sides,
        then those of the other predicates that first become evaluable here, the rest residual."""
        keys = []
        for members, rels in zip(self.classes, self.class_masks):
            if rels & left and rels & right:
                lcol = next(c for r, c in members if left >> r & 1)
                rcol = next(c for r, c in members if right >> r & 1)
                keys.append((lcol, rcol))
        both = left | right
        residual = []
        for p in self.predicates:
            if p.rels and p.rels & both == p.rels and p.rels & left != p.rels and p.rels & right != p.rels:
                key = p.key(left, right)
                if key:
                    keys.append(key)
                else:
                    residual.append(p.expr)
        return keys, residual

    def local_conditions(self, index: int) -> list[Expr]:
        """Predicates over one relation alone (class members sharing a relation, stray filters)."""
        out = [p.expr for p in self.predicates if p.rels == 1 << index]
        for members in self.classes:
            mine = [c for r, c in members if r == index]
            out += [cmp("=", mine[0], c) for c in mine[1:]]
        return out


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask  # one step per relation, not per bit position
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def bits(mask: int) -> list[int]:
    """The relation indices in a bitmask, ascending."""
    return _bits(mask)


def _is_equi_edge(p: Predicate) -> bool:
    """A binary equality between expressions over two different relations (an equi-join edge)."""
    e = p.expr
    return bin(p.rels).count("1") == 2 and getattr(e, "name", None) == "cmp" and e.extra == "="


def is_inner_tree(node: P.Node) -> bool:
    return isinstance(node, P.Join) and node.kind in ("inner", "cross")


def _same_domain(a: Ref, b: Ref) -> bool:
    return a.type == b.type or (a.type.is_integer and b.type.is_integer)


def extract(node: P.Node) -> JoinGraph | None:
    """The query graph of the inner-join tree rooted at ``node`` (Filters between its joins
    included), or None when ``node`` is not an inner join or a predicate reads a column that no
    leaf produces (an outer reference)."""
    if not is_inner_tree(node):
        return None
    leaves: list[P.Node] = []
    exprs: list[Expr] = []

    def walk(n: P.Node):
        if isinstance(n, P.Filter) and _over_inner_tree(n):
            exprs.extend(conjuncts(n.predicate))
            walk(n.child)
        elif is_inner_tree(n):
            exprs.extend(cmp("=", a, b) for a, b in zip(n.left_keys, n.right_keys))
            exprs.extend(conjuncts(n.residual))
            walk(n.left)
            walk(n.right)
        else:
            leaves.append(n)

    walk(node)
    relations = [Relation(i, n, frozenset(o.cid for o in n.outputs)) for i, n in enumerate(leaves)]
    owner = {cid: r.index for r in relations for cid in r.cids}
    parent: dict[int, int] = {}

    def find(c: int) -> int:
        while parent.setdefault(c, c) != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    refs: dict[int, Ref] = {}
    predicates = []
    for e in exprs:
        if not e.cids() <= owner.keys():
            return None
        a, b = (e.args if getattr(e, "name", None) == "cmp" and e.extra == "=" else (None, None))
        if isinstance(a, Ref) and isinstance(b, Ref) and a.cid != b.cid and _same_domain(a, b):
            refs[a.cid], refs[b.cid] = a, b
            parent[find(a.cid)] = find(b.cid)
            continue
        mask = _rels(e, owner)
        implied = implied_filters(e, owner) if mask & (mask - 1) else {}
        sides = (_rels(a, owner), _rels(b, owner)) if a is not None else None
        predicates.append(Predicate(e, mask, list(implied.values()), sides))
        # once applied at the leaf (a plan this planner built) they are not applied again
        predicates.extend(Predicate(f, 1 << r) for r, f in implied.items()
                          if str(f) not in {str(c) for c in _leaf_filters(relations[r].node)})
    groups: dict[int, list[tuple[int, Ref]]] = {}
    for cid in sorted(refs):
        groups.setdefault(find(cid), []).append((owner[cid], refs[cid]))
    return JoinGraph(relations, list(groups.values()), predicates)


def _rels(e: Expr, owner: dict[int, int]) -> int:
    """Bitmask of the relations whose columns ``e`` reads."""
    mask = 0
    for c in e.cids():
        mask |= 1 << owner[c]
    return mask


def _leaf_filters(n: P.Node) -> list[Expr]:
    """The conjuncts a leaf already filters by (its Filters and its scan's pushed-down filters)."""
    out = []
    while isinstance(n, P.Filter):
        out += conjuncts(n.predicate)
        n = n.child
    if isinstance(n, P.Scan):
        out += [c for f in n.filters for c in conjuncts(f)]
    return out


def _over_inner_tree(n: P.Node) -> bool:
    while isinstance(n, P.Filter):
        n = n.child
    return is_inner_tree(n)
