"""How a region's peers fit the rules that apply to it (PD's ``RegionFit``,
``RuleFit`` and ``fitRegion``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, Store
from opforge.placement.location import compare_location, isolation_score
from opforge.placement.rules.label_constraint import match_label_constraints
from opforge.placement.rules.rule import Rule

# The location arithmetic is shared with the schedulers' filters.
location_distance_index = compare_location


@dataclass
class RuleFit:
    """The peers one rule got, and how well they fit it."""

    rule: Rule
    peers: list[Peer] = field(default_factory=list)
    peers_with_different_role: list[Peer] = field(default_factory=list)  # right store, wrong role
    unhealthy_peers: list[Peer] = field(default_factory=list)  # down, pending, or on a down store
    isolation_score: float = 0.0
    stores: list[Store] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return max(self.rule.count - len(self.peers), 0)

    def is_satisfied(self) -> bool:
        return len(self.peers) == self.rule.count and not self.peers_with_different_role

    def contains_store(self, store_id: int) -> bool:
        return any(p.store_id == store_id for p in self.peers)

    def _key(self) -> tuple:
        return (len(self.peers), -len(self.unhealthy_peers), -len(self.peers_with_different_role),
                self.isolation_score)

    def to_json(self) -> dict:
        return {"rule": list(self.rule.key), "peers": [p.id for p in self.peers],
                "peers_with_different_role": [p.id for p in self.peers_with_different_role],
                "unhealthy_peers": [p.id for p in self.unhealthy_peers], "missing": self.missing,
                "isolation_score": self.isolation_score}


@dataclass
class RegionFit:
    """How a region's peers are divided among the rules that apply to it."""

    rule_fits: list[RuleFit] = field(default_factory=list)
    orphan_peers: list[Peer] = field(default_factory=list)  # peers no rule wants

    def is_satisfied(self) -> bool:
        """Every rule has its count of peers in the right role and no peer is
        left over (False when no rule applies)."""
        return bool(self.rule_fits) and all(rf.is_satisfied() for rf in self.rule_fits) and not self.orphan_peers

    @property
    def missing(self) -> int:
        return sum(rf.missing for rf in self.rule_fits)

    def rule_fit_of(self, peer_id: int) -> RuleFit | None:
        for rf in self.rule_fits:
            if any(p.id == peer_id for p in rf.peers):
                return rf
        return None

    def rule_fit_of_store(self, store_id: int) -> RuleFit | None:
        for rf in self.rule_fits:
            if rf.contains_store(store_id):
                return rf
        return None

    def to_json(self) -> dict:
        return {"rule_fits": [rf.to_json() for rf in self.rule_fits],
                "orphan_peers": [p.id for p in self.orphan_peers], "satisfied": self.is_satisfied()}


def _store_view(stores) -> tuple[dict[int, Store], Callable[[int], bool]]:
    """(stores by id, is-store-down) from a Cluster, a mapping or an iterable."""
    if isinstance(stores, Cluster):
        return stores.stores, stores.is_store_down
    if isinstance(stores, Mapping):
        by_id = dict(stores)
    else:
        by_id = {s.id: s for s in stores}
    return by_id, (lambda sid: False)


def _matches_role(peer: Peer, is_leader: bool, role: str) -> bool:
    if role == "voter":
        return peer.is_voter
    if role == "leader":
        return is_leader
    if role == "follower":
        return peer.is_voter and not is_leader
    return peer.role == PeerRole.LEARNER


def fit_region(region: Region, rules: list[Rule], stores, down_stores: Iterable[int] = ()) -> RegionFit:
    """Divide ``region``'s peers among ``rules`` (in order) the way PD does.

    Each rule takes up to ``count`` unused peers whose stores match its label
    constraints. Assignments are compared rule by rule, earlier rules first;
    for one rule, more peers beat fewer, then fewer unhealthy peers, then fewer
    peers in the wrong role, then a higher isolation score. Peers no rule takes
    are orphans. Healthy peers are tried first, so ties go to them."""
    by_id, is_down = _store_view(stores)
    down_stores = set(down_stores)
    leader_id = region.leader.id if region.leader is not None else None

    def unhealthy(p: Peer) -> int:
        if p.id in region.down_peers or p.store_id in down_stores or is_down(p.store_id):
            return 0
        return 1 if p.id in region.pending_peers else 2

    peers = sorted(region.peers, key=lambda p: (-unhealthy(p), p.id))
    health = {p.id: unhealthy(p) for p in peers}

    def make_fit(rule: Rule, chosen: tuple[Peer, ...]) -> RuleFit:
        rf = RuleFit(rule, list(chosen))
        rf.stores = [by_id[p.store_id] for p in chosen]
        rf.isolation_score = isolation_score(rf.stores, rule.location_labels)
        for p in chosen:
            if not _matches_role(p, p.id == leader_id, rule.role):
                rf.peers_with_different_role.append(p)
            if health[p.id] < 2:
                rf.unhealthy_peers.append(p)
        return rf

    best: list = [None, None]  # [keys, fits]

    def search(i: int, used: frozenset, fits: list[RuleFit], keys: list[tuple]) -> None:
        if best[0] is not None and keys < best[0][:len(keys)]:
            return  # already worse than the best on an earlier rule
        if i == len(rules):
            if best[0] is None or keys > best[0]:
                best[0], best[1] = list(keys), list(fits)
            return
        rule = rules[i]
        cands = [p for p in peers if p.id not in used and p.store_id in by_id
                 and match_label_constraints(by_id[p.store_id], rule.label_constraints)]
        for combo in itertools.combinations(cands, min(rule.count, len(cands))):
            rf = make_fit(rule, combo)
            search(i + 1, used | {p.id for p in combo}, fits + [rf], keys + [rf._key()])

    search(0, frozenset(), [], [])
    fits = best[1] or []
    taken = {p.id for rf in fits for p in rf.peers}
    return RegionFit(fits, [p for p in peers if p.id not in taken])
