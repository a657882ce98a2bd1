"""The rule checker: makes a region's peers fit its placement rules (PD's
rule checker).

For one region it proposes at most one operator, the first of, in order:

1. replace a peer (of a rule) whose store is down or offline/tombstone:
   ``[TransferLeader off it if it leads] AddLearner -> PromoteLearner -> RemovePeer``
   onto a store that keeps the rule's constraints and isolation
   (``replace-rule-down-peer`` / ``replace-rule-offline-peer``, HIGH);
2. add the replicas a rule is missing (``add-rule-peer``; HIGH when the
   healthy voters are at or below a bare majority of the voters the rules
   want, i.e. one more failure would lose quorum; MEDIUM otherwise);
3. fix roles: promote a learner a voter rule holds, transfer the leader to the
   peer a leader rule holds (or off a peer a follower rule holds), demote a
   voter a learner rule holds through joint consensus (MEDIUM);
4. remove an orphan peer (no rule wants it) -- only when every rule has all
   its peers, healthy and in the right role; a healthy orphan only when the
   whole region is healthy (MEDIUM);
5. move a peer to a better-isolated store (``move-to-better-location``, LOW),
   only for a healthy, satisfied region and only for a strict improvement.

Each stage lists its candidates best first; the first one that passes the
safety replay below is returned.

Safety: before any operator is returned its steps are replayed on a copy of
the region; every intermediate state must keep a majority of voters healthy
(on a store that is not down or a tombstone, and not reported down) -- in
both configurations while in joint consensus -- and keep the leader on a
voter. A region that has already lost that majority gets no membership change
(none could commit). So: add before remove, and never remove or demote a
healthy voter while another voter is down unless the rest keep a majority.

Regions that span a rule boundary (no rules apply), have no leader, are in
joint consensus, or already have an operator (``ctx.busy_regions``) are left
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from opforge.placement.cluster import Peer, PeerRole, Region, Store, StoreState
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import move_peer, remove_peer
from opforge.placement.operator.operator import Operator, OpKind, Priority
from opforge.placement.operator.step import (
    AddLearner, AddPeer, ChangePeerV2Enter, ChangePeerV2Leave, PromoteLearner, RemovePeer, Step, TransferLeader,
)
from opforge.placement.rules import (
    RegionFit, Rule, RuleFit, RuleManager, distinct_score, match_label_constraints, rules_for_context,
)


def majority(n: int) -> int:
    return n // 2 + 1


# --------------------------------------------------------------------------
# liveness and the safety replay
# --------------------------------------------------------------------------
def store_is_live(cluster, store_id: int) -> bool:
    """The store serves requests: known, not down, not a tombstone (an offline
    store being drained still serves)."""
    s = cluster.get_store(store_id)
    return s is not None and s.state != StoreState.TOMBSTONE and not cluster.is_store_down(store_id)


@dataclass
class _SimPeer:
    id: int
    store_id: int
    role: PeerRole


def _quorum_ok(peers: dict[int, _SimPeer], leader_store: int | None, healthy) -> bool:
    roles = {p.role for p in peers.values()}
    joint = PeerRole.INCOMING_VOTER in roles or PeerRole.DEMOTING_VOTER in roles
    configs = ([(PeerRole.VOTER, PeerRole.DEMOTING_VOTER), (PeerRole.VOTER, PeerRole.INCOMING_VOTER)]
               if joint else [(PeerRole.VOTER,)])
    for cfg in configs:
        members = [p for p in peers.values() if p.role in cfg]
        if not members or sum(1 for p in members if healthy(p)) < majority(len(members)):
            return False
    lp = peers.get(leader_store) if leader_store is not None else None
    return lp is not None and lp.role in (PeerRole.VOTER, PeerRole.INCOMING_VOTER)


def region_quorum_ok(region: Region, cluster) -> bool:
    """A majority of the region's voters are healthy, and it has a leader."""
    peers = {p.store_id: _SimPeer(p.id, p.store_id, p.role) for p in region.peers}
    down = set(region.down_peers)
    return _quorum_ok(peers, region.leader.store_id if region.leader else None,
                      lambda p: p.id not in down and store_is_live(cluster, p.store_id))


def steps_keep_quorum(region: Region, steps: list[Step], cluster) -> bool:
    """Replay ``steps`` on a copy of ``region``: does every state after a step
    keep a healthy majority of voters and its leader on a voter?"""
    peers = {p.store_id: _SimPeer(p.id, p.store_id, p.role) for p in region.peers}
    leader = region.leader.store_id if region.leader else None
    down = set(region.down_peers)

    def healthy(p: _SimPeer) -> bool:
        return p.id not in down and store_is_live(cluster, p.store_id)

    for s in steps:
        if isinstance(s, AddLearner):
            if s.to_store in peers:
                return False
            peers[s.to_store] = _SimPeer(s.peer_id, s.to_store, PeerRole.LEARNER)
        elif isinstance(s, AddPeer):
            if s.to_store in peers:
                return False
            peers[s.to_store] = _SimPeer(s.peer_id, s.to_store, PeerRole.VOTER)
        elif isinstance(s, PromoteLearner):
            p = peers.get(s.to_store)
            if p is None or p.role != PeerRole.LEARNER:
                return False
            p.role = PeerRole.VOTER
        elif isinstance(s, RemovePeer):
            if s.from_store not in peers or s.from_store == leader:
                return False
            del peers[s.from_store]
        elif isinstance(s, TransferLeader):
            p = peers.get(s.to_store)
            if p is None or p.role != PeerRole.VOTER or not healthy(p):
                return False
            leader = s.to_store
        elif isinstance(s, ChangePeerV2Enter):
            for st in s.promote:
                if st not in peers:
                    return False
                peers[st].role = PeerRole.INCOMING_VOTER
            for st in s.demote:
                if st not in peers or st == leader:
                    return False
                peers[st].role = PeerRole.DEMOTING_VOTER
        elif isinstance(s, ChangePeerV2Leave):
            for p in peers.values():
                if p.role == PeerRole.INCOMING_VOTER:
                    p.role = PeerRole.VOTER
                elif p.role == PeerRole.DEMOTING_VOTER:
                    p.role = PeerRole.LEARNER
        else:
            continue  # split / merge: membership unchanged
        if not _quorum_ok(peers, leader, healthy):
            return False
    return True


# --------------------------------------------------------------------------
# choosing stores
# --------------------------------------------------------------------------
def pick_target_store(ctx: ScheduleContext, region: Region, rule: Rule, keep: list[Store],
                      exclude: set[int] | None = None) -> Store | None:
    """The best store for a new peer of ``rule``, next to the rule's stores ``keep``.

    Candidates: up stores (state UP, not down), not busy, not low on space,
    holding no peer of the region, matching the rule's label constraints, and
    -- with an isolation level -- in a domain none of ``keep`` is in. The best
    is the most isolated from ``keep`` (PD's distinct score over the rule's
    location labels), then the one with most free space, then fewest regions."""
    cluster = ctx.cluster
    taken = set(region.store_ids) | set(exclude or ())
    level = rule.isolation_level
    used_domains = {s.labels.get(level, "") for s in keep} if level else set()
    best, best_key = None, None
    for s in cluster.up_stores():
        if s.id in taken or s.is_busy:
            continue
        if s.capacity and s.used_ratio > ctx.config.low_space_ratio:
            continue
        if not match_label_constraints(s, rule.label_constraints):
            continue
        if level:
            v = s.labels.get(level, "")
            if not v or v in used_domains:
                continue
        key = (distinct_score(rule.location_labels, keep, s), s.available, -cluster.region_count(s.id), -s.id)
        if best_key is None or key > best_key:
            best, best_key = s, key
    return best


class RuleChecker:
    name = "rule-checker"

    def __init__(self, rules: RuleManager | None = None):
        self.rules = rules  # None: ctx.rules, or the default rule from ctx.config

    def check(self, region: Region, ctx: ScheduleContext) -> list[Operator]:
        if region.id in ctx.busy_regions or region.leader is None or region.in_joint_state:
            return []
        rm = self.rules if self.rules is not None else rules_for_context(ctx)
        if not rm.rules_for(region):
            return []  # spans a rule boundary: the split checker cuts it first
        if not region_quorum_ok(region, ctx.cluster):
            return []  # quorum lost: no membership change could commit
        fit = rm.fit_region(region, ctx.cluster)
        for stage in (self._replace_unhealthy, self._add_missing, self._fix_roles, self._remove_orphan,
                      self._improve_isolation):
            # each stage yields its candidates, best first; the first safe one wins
            for op in stage(region, fit, ctx):
                if steps_keep_quorum(region, op.steps, ctx.cluster):
                    return [op]
        return []

    # -- helpers -----------------------------------------------------------
    @staticmethod
    def _healthy(region: Region, p: Peer, ctx: ScheduleContext) -> bool:
        return (p.id not in region.down_peers and p.id not in region.pending_peers
                and store_is_live(ctx.cluster, p.store_id))

    def _can_lead(self, region: Region, fit: RegionFit, p: Peer, ctx: ScheduleContext) -> bool:
        """PD's allowLeader: a healthy voter on an up store that some voter or
        leader rule of the region would accept."""
        if p.role != PeerRole.VOTER or not self._healthy(region, p, ctx):
            return False
        s = ctx.cluster.get_store(p.store_id)
        if s is None or s.state != StoreState.UP:
            return False
        return any(rf.rule.role in ("voter", "leader") and match_label_constraints(s, rf.rule.label_constraints)
                   for rf in fit.rule_fits)

    def _leader_candidate(self, region: Region, fit: RegionFit, ctx: ScheduleContext,
                          exclude: set[int]) -> Peer | None:
        """A peer to take the leadership: one a leader rule holds first, then a
        peer of a voter rule, with the fewest leaders on its store."""
        def rank(p: Peer):
            rf = fit.rule_fit_of(p.id)
            role = rf.rule.role if rf is not None else None
            pref = 0 if role == "leader" else 1 if role == "voter" else 2
            return (pref, ctx.cluster.leader_count(p.store_id), p.store_id)

        cands = [p for p in region.peers if p.id not in exclude and self._can_lead(region, fit, p, ctx)]
        return min(cands, key=rank) if cands else None

    def _rule_stores(self, rf: RuleFit, ctx: ScheduleContext, without: int | None = None) -> list[Store]:
        out = []
        for p in rf.peers:
            if p.store_id != without and (s := ctx.cluster.get_store(p.store_id)) is not None:
                out.append(s)
        return out

    def _healthy_voters(self, region: Region, ctx: ScheduleContext) -> int:
        return sum(1 for p in region.voters() if p.id not in region.down_peers
                   and store_is_live(ctx.cluster, p.store_id))

    # -- 1. replace down / offline peers ---------------------------------
    def _replace_unhealthy(self, region: Region, fit: RegionFit, ctx: ScheduleContext) -> Iterator[Operator]:
        cluster = ctx.cluster
        for rf in fit.rule_fits:
            for p in rf.peers:
                store = cluster.get_store(p.store_id)
                if store is None:
                    continue
                if cluster.is_store_down(p.store_id):
                    status = "down"
                elif store.state in (StoreState.OFFLINE, StoreState.TOMBSTONE):
                    status = "offline"
                else:
                    continue
                op = self._replace(region, fit, rf, p, status, ctx)
                if op is not None:
                    yield op

    def _replace(self, region: Region, fit: RegionFit, rf: RuleFit, old: Peer, status: str,
                 ctx: ScheduleContext) -> Operator | None:
        target = pick_target_store(ctx, region, rf.rule, self._rule_stores(rf, ctx, without=old.store_id))
        if target is None:
            return None
        kind = OpKind.REPLICA
        steps: list[Step] = []
        new_is_voter = rf.rule.role != "learner"
        late_transfer = False
        if region.leader.id == old.id:
            nl = self._leader_candidate(region, fit, ctx, {old.id})
            if nl is not None:
                steps.append(TransferLeader(old.store_id, nl.store_id))
            elif new_is_voter:
                late_transfer = True  # hand it to the new peer once it votes
            else:
                return None
            kind |= OpKind.LEADER
        pid = ctx.ids()
        steps.append(AddLearner(target.id, pid))
        if new_is_voter:
            steps.append(PromoteLearner(target.id, pid))
        if late_transfer:
            steps.append(TransferLeader(old.store_id, target.id))
        steps.append(RemovePeer(old.store_id, old.id))
        return Operator(f"replace-rule-{status}-peer", region.id, region.epoch, kind, steps, Priority.HIGH, ctx.now)

    # -- 2. add missing peers ----------------------------------------------
    def _add_missing(self, region: Region, fit: RegionFit, ctx: ScheduleContext) -> Iterator[Operator]:
        wanted_voters = sum(rf.rule.count for rf in fit.rule_fits if rf.rule.is_voter_role)
        for rf in fit.rule_fits:
            if len(rf.peers) >= rf.rule.count:
                continue
            target = pick_target_store(ctx, region, rf.rule, self._rule_stores(rf, ctx))
            if target is None:
                continue
            pid = ctx.ids()
            steps: list[Step] = [AddLearner(target.id, pid)]
            priority = Priority.MEDIUM
            if rf.rule.is_voter_role:
                steps.append(PromoteLearner(target.id, pid))
                if self._healthy_voters(region, ctx) <= majority(wanted_voters):
                    priority = Priority.HIGH
            yield Operator("add-rule-peer", region.id, region.epoch, OpKind.REPLICA, steps, priority, ctx.now)

    # -- 3. fix roles --------------------------------------------------------
    def _fix_roles(self, region: Region, fit: RegionFit, ctx: ScheduleContext) -> Iterator[Operator]:
        leader = region.leader
        for rf in fit.rule_fits:
            role = rf.rule.role
            for p in rf.peers_with_different_role:
                if p.role == PeerRole.LEARNER and role != "learner":
                    if self._healthy(region, p, ctx):
                        yield Operator("fix-peer-role", region.id, region.epoch, OpKind.REPLICA,
                                       [PromoteLearner(p.store_id, p.id)], Priority.MEDIUM, ctx.now)
                    continue
                if role == "leader" and p.id != leader.id:
                    if self._can_lead(region, fit, p, ctx):
                        yield Operator("fix-leader-role", region.id, region.epoch, OpKind.LEADER | OpKind.REPLICA,
                                       [TransferLeader(leader.store_id, p.store_id)], Priority.MEDIUM, ctx.now)
                    continue
                if role == "follower" and p.id == leader.id:
                    to = self._leader_candidate(region, fit, ctx, {p.id} | self._follower_rule_peers(fit))
                    if to is not None:
                        yield Operator("fix-follower-role", region.id, region.epoch,
                                       OpKind.LEADER | OpKind.REPLICA,
                                       [TransferLeader(leader.store_id, to.store_id)], Priority.MEDIUM, ctx.now)
                    continue
                if role == "learner" and p.is_voter:
                    steps: list[Step] = []
                    kind = OpKind.REPLICA
                    if p.id == leader.id:
                        to = self._leader_candidate(region, fit, ctx, {p.id})
                        if to is None:
                            continue
                        steps.append(TransferLeader(p.store_id, to.store_id))
                        kind |= OpKind.LEADER
                    steps += [ChangePeerV2Enter((), (p.store_id,)), ChangePeerV2Leave((), (p.store_id,))]
                    yield Operator("fix-demote-voter", region.id, region.epoch, kind, steps, Priority.MEDIUM,
                                   ctx.now)

    @staticmethod
    def _follower_rule_peers(fit: RegionFit) -> set[int]:
        return {p.id for rf in fit.rule_fits if rf.rule.role == "follower" for p in rf.peers}

    # -- 4. remove orphans ---------------------------------------------------
    def _remove_orphan(self, region: Region, fit: RegionFit, ctx: ScheduleContext) -> Iterator[Operator]:
        if not fit.orphan_peers:
            return
        for rf in fit.rule_fits:
            if not rf.is_satisfied() or any(not self._healthy(region, p, ctx) for p in rf.peers):
                return
        cluster = ctx.cluster

        def is_down(p: Peer) -> bool:
            return p.id in region.down_peers or not store_is_live(cluster, p.store_id)

        # down orphans first, then other unhealthy ones (pending, ...), then --
        # only in a fully healthy region -- healthy ones, worst isolated first
        victims = [p for p in fit.orphan_peers if is_down(p)]
        victims += [p for p in fit.orphan_peers if not is_down(p) and not self._healthy(region, p, ctx)]
        if region.is_healthy():
            labels = next((rf.rule.location_labels for rf in fit.rule_fits if rf.rule.location_labels), ())
            stores = {p.store_id: cluster.get_store(p.store_id) for p in region.peers}

            def rank(p: Peer):
                s = stores[p.store_id]
                others = [o for sid, o in stores.items() if sid != p.store_id and o is not None]
                iso = distinct_score(labels, others, s) if s is not None else -1.0
                return (p.is_voter, iso, -cluster.region_count(p.store_id), p.store_id)

            victims += sorted((p for p in fit.orphan_peers if p not in victims), key=rank)
        for victim in victims:
            cands = []
            if region.leader.id == victim.id:
                to = self._leader_candidate(region, fit, ctx, {victim.id})
                if to is None:
                    continue
                cands = [to.store_id]
            try:
                yield remove_peer("remove-orphan-peer", region, victim.store_id, ctx.now, cands,
                                  kind=OpKind.REPLICA, priority=Priority.MEDIUM)
            except ValueError:
                continue

    # -- 5. better isolation --------------------------------------------------
    def _improve_isolation(self, region: Region, fit: RegionFit, ctx: ScheduleContext) -> Iterator[Operator]:
        if not region.is_healthy() or not fit.is_satisfied():
            return
        cluster = ctx.cluster
        for p in region.peers:
            s = cluster.get_store(p.store_id)
            if s is None or s.state != StoreState.UP or cluster.is_store_down(p.store_id):
                return
        for rf in fit.rule_fits:
            labels = rf.rule.location_labels
            if not labels or rf.rule.count <= 1:
                continue
            stores = self._rule_stores(rf, ctx)

            def score(s: Store) -> float:
                return distinct_score(labels, [o for o in stores if o.id != s.id], s)

            old = min(stores, key=lambda s: (score(s), -cluster.region_count(s.id), -s.id))
            keep = [o for o in stores if o.id != old.id]
            target = pick_target_store(ctx, region, rf.rule, keep)
            if target is None or distinct_score(labels, keep, target) <= score(old):
                continue
            yield move_peer("move-to-better-location", region, old.id, target.id, ctx.ids, ctx.now,
                            kind=OpKind.REPLICA, priority=Priority.LOW)
