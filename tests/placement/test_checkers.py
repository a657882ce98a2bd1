"""Checkers: the rule checker (repairs placement), the merge checker and the
split checker."""

import random

import pytest

from opforge.placement.checkers.merge_checker import MergeChecker
from opforge.placement.checkers.rule_checker import RuleChecker
from opforge.placement.checkers.split_checker import SplitChecker
from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, RegionEpoch, Store, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import PeerIds
from opforge.placement.operator.operator import OpKind, Priority
from opforge.placement.operator.step import (
    AddLearner, AddPeer, ChangePeerV2Enter, ChangePeerV2Leave, MergeRegion, PromoteLearner, RemovePeer,
    SplitRegion, TransferLeader,
)
from opforge.placement.rules import LabelConstraint, Rule, RuleGroup, RuleManager

NOW = 10_000.0
ZONE_CFG = dict(max_replicas=3, location_labels=["zone", "host"], isolation_level="zone")


def make_cluster(zones, down=(), offline=(), tombstone=(), available=None, labels=None):
    """Store i+1 in zones[i], host h{i+1}; down stores last heard from long ago."""
    c = Cluster(max_store_down_time=30.0, clock=lambda: NOW)
    for i, z in enumerate(zones, start=1):
        lab = {"zone": z, "host": f"h{i}"}
        lab.update((labels or {}).get(i, {}))
        state = (StoreState.OFFLINE if i in offline else StoreState.TOMBSTONE if i in tombstone
                 else StoreState.UP)
        c.put_store(Store(i, labels=lab, state=state, capacity=1000,
                          available=(available or {}).get(i, 500), last_heartbeat=0.0 if i in down else NOW))
    return c


def make_region(rid, stores, leader=None, learners=(), down=(), pending=(), start=b"", end=b"", size=1, keys=10):
    """A region with peer id rid*10+store on each store; ``down``/``pending`` name stores."""
    peers = tuple(Peer(rid * 10 + s, s, PeerRole.LEARNER if s in learners else PeerRole.VOTER) for s in stores)
    lead = leader if leader is not None else next(p.store_id for p in peers if p.is_voter)
    by_store = {p.store_id: p for p in peers}
    return Region(rid, start_key=start, end_key=end, epoch=RegionEpoch(3, 5), peers=peers, leader=by_store[lead],
                  approximate_size=size, approximate_keys=keys,
                  down_peers=tuple(by_store[s].id for s in down), pending_peers=tuple(by_store[s].id for s in pending))


def ctx_for(cluster, rules=None, busy=(), **cfg):
    return ScheduleContext(cluster, ScheduleConfig(**cfg), NOW, random.Random(0), PeerIds(), rules=rules,
                           busy_regions=set(busy))


def steps_of(op):
    return [(type(s).__name__, *s.__dict__.values()) for s in op.steps]


def zones_of(cluster, store_ids):
    return sorted(cluster.stores[s].labels["zone"] for s in store_ids)


# ---------------------------------------------------------------------------
# an independent replay of operator steps, used to check safety
# ---------------------------------------------------------------------------
def apply_step(region, step):
    peers = list(region.peers)
    leader = region.leader
    if isinstance(step, (AddLearner, AddPeer)):
        assert region.peer_on(step.to_store) is None, "adds a second peer on one store"
        role = PeerRole.LEARNER if isinstance(step, AddLearner) else PeerRole.VOTER
        peers.append(Peer(step.peer_id, step.to_store, role))
    elif isinstance(step, PromoteLearner):
        p = region.peer_on(step.to_store)
        assert p is not None and p.role == PeerRole.LEARNER
        peers = [Peer(q.id, q.store_id, PeerRole.VOTER) if q.id == p.id else q for q in peers]
    elif isinstance(step, RemovePeer):
        assert leader.store_id != step.from_store, "removes the leader"
        peers = [q for q in peers if q.store_id != step.from_store]
    elif isinstance(step, TransferLeader):
        leader = region.peer_on(step.to_store)
        assert leader is not None and leader.role == PeerRole.VOTER, "leader onto a non-voter"
    elif isinstance(step, ChangePeerV2Enter):
        roles = {s: PeerRole.INCOMING_VOTER for s in step.promote} | {s: PeerRole.DEMOTING_VOTER for s in step.demote}
        peers = [Peer(q.id, q.store_id, roles.get(q.store_id, q.role)) for q in peers]
    elif isinstance(step, ChangePeerV2Leave):
        fin = {PeerRole.INCOMING_VOTER: PeerRole.VOTER, PeerRole.DEMOTING_VOTER: PeerRole.LEARNER}
        peers = [Peer(q.id, q.store_id, fin.get(q.role, q.role)) for q in peers]
    if leader is not None:
        leader = next(q for q in peers if q.id == leader.id)
    ids = {q.id for q in peers}
    return region.clone(peers=tuple(peers), leader=leader,
                        down_peers=tuple(i for i in region.down_peers if i in ids),
                        pending_peers=tuple(i for i in region.pending_peers if i in ids))


def voters_on_up_stores_are_a_majority(region, cluster):
    def up(sid):
        s = cluster.get_store(sid)
        return s is not None and s.state != StoreState.TOMBSTONE and not cluster.is_store_down(sid)

    voters = [p for p in region.peers if p.is_voter]
    return sum(1 for p in voters if up(p.store_id)) >= len(voters) // 2 + 1


# ---------------------------------------------------------------------------
# rule checker
# ---------------------------------------------------------------------------
class TestRuleCheckerReplace:
    def test_down_peer_replaced_in_same_zone(self):
        # z3 has store 3 (down) and store 6; store 4 (z1) has far more room
        c = make_cluster(["z1", "z2", "z3", "z1", "z2", "z3"], down={3}, available={4: 900, 6: 300})
        r = make_region(1, [1, 2, 3], down={3})
        ctx = ctx_for(c, **ZONE_CFG)
        [op] = RuleChecker().check(r, ctx)
        assert op.desc == "replace-rule-down-peer"
        assert op.priority == Priority.HIGH and OpKind.REPLICA in op.kind
        assert [type(s).__name__ for s in op.steps] == ["AddLearner", "PromoteLearner", "RemovePeer"]
        add, promote, remove = op.steps
        assert add.to_store == 6 and promote.to_store == 6 and promote.peer_id == add.peer_id
        assert remove.from_store == 3 and remove.peer_id == 13
        final = r
        for s in op.steps:
            final = apply_step(final, s)
        assert zones_of(c, final.store_ids) == ["z1", "z2", "z3"]

    def test_offline_leader_transferred_off_first(self):
        c = make_cluster(["z1", "z2", "z3", "z1"], offline={1})
        r = make_region(1, [1, 2, 3], leader=1)
        [op] = RuleChecker().check(r, ctx_for(c, **ZONE_CFG))
        assert op.desc == "replace-rule-offline-peer" and op.priority == Priority.HIGH
        assert OpKind.LEADER in op.kind and OpKind.REPLICA in op.kind
        names = [type(s).__name__ for s in op.steps]
        assert names == ["TransferLeader", "AddLearner", "PromoteLearner", "RemovePeer"]
        assert op.steps[0].from_store == 1 and op.steps[0].to_store in (2, 3)
        assert op.steps[1].to_store == 4 and op.steps[3].from_store == 1

    def test_no_store_keeps_isolation_no_op(self):
        # the only z3 store is the down one: do not put a second peer into z1/z2
        c = make_cluster(["z1", "z2", "z3", "z1", "z2"], down={3})
        r = make_region(1, [1, 2, 3], down={3})
        assert RuleChecker().check(r, ctx_for(c, **ZONE_CFG)) == []

    def test_quorum_lost_no_op(self):
        c = make_cluster(["z1", "z2", "z3", "z1", "z2", "z3"], down={2, 3})
        r = make_region(1, [1, 2, 3], down={2, 3})
        assert RuleChecker().check(r, ctx_for(c, **ZONE_CFG)) == []


class TestRuleCheckerAddRemove:
    def test_two_of_three_gets_an_add(self):
        c = make_cluster(["z1", "z2", "z3", "z1"], available={4: 999})
        r = make_region(1, [1, 2])
        [op] = RuleChecker().check(r, ctx_for(c, **ZONE_CFG))
        assert op.desc == "add-rule-peer" and op.priority == Priority.HIGH
        assert [type(s).__name__ for s in op.steps] == ["AddLearner", "PromoteLearner"]
        assert op.steps[0].to_store == 3  # the missing zone, not the roomier z1 store

    def test_add_is_medium_when_quorum_is_not_at_risk(self):
        c = make_cluster(["z1", "z2", "z3", "z4", "z5"])
        r = make_region(1, [1, 2, 3, 4])
        [op] = RuleChecker().check(r, ctx_for(c, max_replicas=5, location_labels=["zone"]))
        assert op.desc == "add-rule-peer" and op.priority == Priority.MEDIUM
        assert op.steps[0].to_store == 5

    def test_four_replicas_remove_worst_isolated(self):
        c = make_cluster(["z1", "z1", "z2", "z3"])
        r = make_region(1, [1, 2, 3, 4], leader=3)
        [op] = RuleChecker().check(r, ctx_for(c, **ZONE_CFG))
        assert op.desc == "remove-orphan-peer"
        assert [type(s).__name__ for s in op.steps] == ["RemovePeer"]
        assert op.steps[0].from_store in (1, 2)
        final = apply_step(r, op.steps[0])
        assert zones_of(c, final.store_ids) == ["z1", "z2", "z3"]

    def test_remove_orphan_leader_moves_leadership_first(self):
        c = make_cluster(["z1", "z2", "z3", "z9"])
        rules = RuleManager(ScheduleConfig(**ZONE_CFG))
        rules.set_rule(Rule("pd", "default", count=3, location_labels=["zone"],
                            label_constraints=[LabelConstraint("zone", "notIn", ["z9"])]))
        r = make_region(1, [1, 2, 3, 4], leader=4)
        [op] = RuleChecker(rules).check(r, ctx_for(c, **ZONE_CFG))
        assert [type(s).__name__ for s in op.steps] == ["TransferLeader", "RemovePeer"]
        assert op.steps[0].to_store in (1, 2, 3) and op.steps[1].from_store == 4

    def test_no_healthy_removal_while_a_rule_peer_is_down(self):
        # the rule wants z1..z3; the z9 peer is an orphan, but the z3 peer is down
        # and there is no other z3 store: the orphan must stay.
        c = make_cluster(["z1", "z2", "z3", "z9"], down={3})
        rules = RuleManager()
        rules.set_rule(Rule("pd", "default", count=3,
                            label_constraints=[LabelConstraint("zone", "in", ["z1", "z2", "z3"])],
                            location_labels=["zone"], isolation_level="zone"))
        r = make_region(1, [1, 2, 3, 4], down={3})
        ops = RuleChecker(rules).check(r, ctx_for(c))
        assert not any(isinstance(s, RemovePeer) and s.from_store == 4 for op in ops for s in op.steps)
        assert ops == []

    def test_unhealthy_extra_goes_before_a_healthy_one(self):
        # four peers for three voters; the z1 peer is pending, the other three
        # are healthy and already in three zones: the pending one is the orphan
        c = make_cluster(["z1", "z2", "z3", "z3"])
        r = make_region(1, [1, 2, 3, 4], leader=2, pending={1})
        [op] = RuleChecker().check(r, ctx_for(c, max_replicas=3, location_labels=["zone"]))
        assert op.desc == "remove-orphan-peer" and steps_of(op) == [("RemovePeer", 1, 11)]

    def test_busy_or_boundary_spanning_region_left_alone(self):
        c = make_cluster(["z1", "z2", "z3"])
        r = make_region(1, [1, 2])
        assert RuleChecker().check(r, ctx_for(c, busy={1}, **ZONE_CFG)) == []
        rules = RuleManager(ScheduleConfig(**ZONE_CFG))
        rules.set_rule(Rule("pd", "t", start_key=b"m", location_labels=["zone"]))
        spanning = make_region(1, [1, 2], start=b"a", end=b"z")
        assert RuleChecker(rules).check(spanning, ctx_for(c, **ZONE_CFG)) == []


class TestRuleCheckerRoles:
    def test_learner_promoted(self):
        c = make_cluster(["z1", "z2", "z3"])
        r = make_region(1, [1, 2, 3], learners={3})
        [op] = RuleChecker().check(r, ctx_for(c, **ZONE_CFG))
        assert op.desc == "fix-peer-role"
        assert steps_of(op) == [("PromoteLearner", 3, 13)]

    def test_leader_rule_moves_leader_into_zone(self):
        c = make_cluster(["z1", "z2", "z3"])
        rules = RuleManager(ScheduleConfig(**ZONE_CFG))
        rules.set_group_bundle(RuleGroup("pd"), [
            Rule("pd", "leader", role="leader", count=1, label_constraints=[LabelConstraint("zone", "in", ["z2"])]),
            Rule("pd", "followers", index=1, role="follower", count=2, location_labels=["zone"]),
        ])
        r = make_region(1, [1, 2, 3], leader=1)
        [op] = RuleChecker(rules).check(r, ctx_for(c, **ZONE_CFG))
        assert op.desc == "fix-leader-role" and OpKind.LEADER in op.kind
        assert steps_of(op) == [("TransferLeader", 1, 2)]
        # once it leads from z2 there is nothing left to do
        assert RuleChecker(rules).check(apply_step(r, op.steps[0]), ctx_for(c, **ZONE_CFG)) == []

    def test_leader_rule_adds_a_peer_when_zone_has_none(self):
        c = make_cluster(["z1", "z2", "z3", "z4"])
        rules = RuleManager()
        rules.set_group_bundle(RuleGroup("pd"), [
            Rule("pd", "leader", role="leader", count=1, label_constraints=[LabelConstraint("zone", "in", ["z4"])]),
            Rule("pd", "voters", index=1, role="voter", count=2, location_labels=["zone"]),
        ])
        r = make_region(1, [1, 2, 3], leader=1)
        [op] = RuleChecker(rules).check(r, ctx_for(c))
        assert op.desc == "add-rule-peer" and op.steps[0].to_store == 4

    def test_voter_demoted_to_learner(self):
        c = make_cluster(["z1", "z2", "z3"], labels={3: {"engine": "columnar"}})
        rules = RuleManager()
        rules.set_group_bundle(RuleGroup("pd"), [
            Rule("pd", "row", role="voter", count=2, label_constraints=[LabelConstraint("engine", "notExists")]),
            Rule("pd", "col", index=1, role="learner", count=1,
                 label_constraints=[LabelConstraint("engine", "in", ["columnar"])]),
        ])
        r = make_region(1, [1, 2, 3], leader=3)
        [op] = RuleChecker(rules).check(r, ctx_for(c))
        assert op.desc == "fix-demote-voter"
        names = [type(s).__name__ for s in op.steps]
        assert names == ["TransferLeader", "ChangePeerV2Enter", "ChangePeerV2Leave"]
        assert op.steps[0].to_store in (1, 2) and op.steps[1].demote == (3,)
        final = r
        for s in op.steps:
            final = apply_step(final, s)
        assert final.peer_on(3).role == PeerRole.LEARNER and rules.fit_region(final, c).is_satisfied()


class TestRuleCheckerIsolation:
    def test_moves_peer_to_better_zone(self):
        c = make_cluster(["z1", "z1", "z2", "z3"])
        r = make_region(1, [1, 2, 3])
        [op] = RuleChecker().check(r, ctx_for(c, max_replicas=3, location_labels=["zone", "host"]))
        assert op.desc == "move-to-better-location" and op.priority == Priority.LOW
        names = [type(s).__name__ for s in op.steps]
        assert names[:2] == ["AddLearner", "PromoteLearner"] and names[-1] == "RemovePeer"
        assert op.steps[0].to_store == 4 and op.steps[-1].from_store in (1, 2)

    def test_no_churn_without_strict_improvement(self):
        c = make_cluster(["z1", "z1", "z2", "z2"])
        r = make_region(1, [1, 2, 3])
        assert RuleChecker().check(r, ctx_for(c, max_replicas=3, location_labels=["zone", "host"])) == []

    def test_converges_to_satisfied_isolated_placement(self):
        c = make_cluster(["z1", "z1", "z2", "z2", "z3", "z3"])
        ctx = ctx_for(c, **ZONE_CFG)
        r = make_region(1, [1], leader=1)
        for _ in range(10):
            ops = RuleChecker().check(r, ctx)
            if not ops:
                break
            for s in ops[0].steps:
                r = apply_step(r, s)
        assert ops == []
        assert RuleManager(ctx.config).fit_region(r, c).is_satisfied()
        assert zones_of(c, r.store_ids) == ["z1", "z2", "z3"]


def random_case(rng):
    n = rng.randint(3, 7)
    zones = [rng.choice(["z1", "z2", "z3"]) for _ in range(n)]
    down = {i for i in range(1, n + 1) if rng.random() < 0.2}
    offline = {i for i in range(1, n + 1) if i not in down and rng.random() < 0.1}
    tomb = {i for i in range(1, n + 1) if i not in down | offline and rng.random() < 0.05}
    c = make_cluster(zones, down=down, offline=offline, tombstone=tomb,
                     available={i: rng.randint(100, 900) for i in range(1, n + 1)})
    for s in c.stores.values():
        s.is_busy = rng.random() < 0.1
    k = rng.randint(1, min(5, n))
    stores = rng.sample(range(1, n + 1), k)
    learners = {s for s in stores[1:] if rng.random() < 0.25}
    voters = [s for s in stores if s not in learners]
    r = make_region(1, stores, leader=rng.choice(voters), learners=learners,
                    down={s for s in stores if (s in down and rng.random() < 0.9) or rng.random() < 0.05},
                    pending={s for s in stores if rng.random() < 0.1})
    cfg = dict(max_replicas=rng.choice([1, 3, 3, 5]))
    if rng.random() < 0.7:
        cfg["location_labels"] = ["zone", "host"]
        if rng.random() < 0.5:
            cfg["isolation_level"] = "zone"
    rules = None
    if rng.random() < 0.3:
        rules = RuleManager(ScheduleConfig(**cfg))
        extra = rng.choice([
            Rule("pd", "lead", role="leader", label_constraints=[LabelConstraint("zone", "in", ["z1"])]),
            Rule("pd", "learn", role="learner", count=1, index=1),
            Rule("pd", "follow", role="follower", count=1, index=1),
        ])
        rules.set_rule(extra)
    return c, r, cfg, rules


def test_safety_property_random_clusters():
    """No rule-checker operator, applied step by step (and then checked again,
    for a few rounds), ever leaves fewer than a majority of voters on up stores."""
    rng = random.Random(20240531)
    produced = 0
    for case in range(1500):
        c, r, cfg, rules = random_case(rng)
        ctx = ctx_for(c, rules=rules, **cfg)
        for _ in range(6):
            ops = RuleChecker().check(r, ctx)
            assert len(ops) <= 1
            if not ops:
                break
            produced += 1
            for step in ops[0].steps:
                r = apply_step(r, step)
                assert voters_on_up_stores_are_a_majority(r, c), (case, str(ops[0]))
                assert r.leader is not None and r.peer_on(r.leader.store_id) is not None
            r = r.clone(pending_peers=(), epoch=RegionEpoch(r.epoch.conf_ver + 1, r.epoch.version))
        for chk in (MergeChecker(), SplitChecker()):
            for op in chk.check(r, ctx):
                assert all(isinstance(s, (MergeRegion, SplitRegion)) for s in op.steps)
    assert produced > 400  # the property was exercised, not vacuous


# ---------------------------------------------------------------------------
# merge checker
# ---------------------------------------------------------------------------
def chain(c, sizes, stores=(1, 2, 3), keys=None):
    """Regions 1..n with consecutive key ranges, all on ``stores``."""
    bounds = [b""] + [bytes([ord("b") + i]) for i in range(len(sizes) - 1)] + [b""]
    regions = []
    for i, size in enumerate(sizes):
        st = stores[i] if isinstance(stores[0], (list, tuple)) else stores
        r = make_region(i + 1, list(st), start=bounds[i], end=bounds[i + 1], size=size,
                        keys=(keys or [10] * len(sizes))[i])
        c.put_region(r)
        regions.append(r)
    return regions


class TestMergeChecker:
    def test_small_region_merges_into_smaller_neighbour(self):
        c = make_cluster(["z1", "z2", "z3"])
        r1, r2, r3 = chain(c, [8, 2, 5])
        ops = MergeChecker().check(r2, ctx_for(c, **ZONE_CFG))
        assert len(ops) == 2
        src, dst = ops
        assert src.region_id == 2 and dst.region_id == 3  # next (5) is smaller than prev (8)
        assert isinstance(src.steps[0], MergeRegion) and not src.steps[0].is_passive
        assert (src.steps[0].from_region, src.steps[0].to_region) == (2, 3)
        assert dst.steps[0].is_passive and OpKind.MERGE in src.kind

    def test_prev_chosen_when_smaller(self):
        c = make_cluster(["z1", "z2", "z3"])
        chain(c, [1, 2, 5])
        [src, dst] = MergeChecker().check(c.regions[2], ctx_for(c, **ZONE_CFG))
        assert dst.region_id == 1

    def test_big_region_not_merged(self):
        c = make_cluster(["z1", "z2", "z3"])
        chain(c, [1, 21, 1])
        assert MergeChecker().check(c.regions[2], ctx_for(c, **ZONE_CFG)) == []
        c2 = make_cluster(["z1", "z2", "z3"])
        chain(c2, [1, 1, 1], keys=[10, 300_000, 10])
        assert MergeChecker().check(c2.regions[2], ctx_for(c2, **ZONE_CFG)) == []

    def test_recently_split_not_merged(self):
        c = make_cluster(["z1", "z2", "z3"])
        chain(c, [1, 1])
        m = MergeChecker()
        m.note_split(1, NOW - 10)
        ctx = ctx_for(c, split_merge_interval=3600, **ZONE_CFG)
        assert m.check(c.regions[1], ctx) == []
        assert m.check(c.regions[2], ctx) == []  # its only neighbour split recently
        ctx.now = NOW + 3600
        assert len(m.check(c.regions[1], ctx)) == 2

    def test_peers_on_other_stores_not_merged(self):
        c = make_cluster(["z1", "z2", "z3", "z1"])
        chain(c, [1, 1], stores=[(1, 2, 3), (4, 2, 3)])
        assert MergeChecker().check(c.regions[1], ctx_for(c, **ZONE_CFG)) == []

    def test_unhealthy_or_underreplicated_not_merged(self):
        c = make_cluster(["z1", "z2", "z3"])
        r1, r2 = chain(c, [1, 1])
        c.put_region(r2.clone(pending_peers=(r2.peers[1].id,)))
        assert MergeChecker().check(r1, ctx_for(c, **ZONE_CFG)) == []
        c2 = make_cluster(["z1", "z2", "z3"])
        chain(c2, [1, 1], stores=(1, 2))
        assert MergeChecker().check(c2.regions[1], ctx_for(c2, **ZONE_CFG)) == []

    def test_rule_boundary_blocks_merge(self):
        c = make_cluster(["z1", "z2", "z3"])
        chain(c, [1, 1, 1])  # [-inf, b) [b, c) [c, +inf)
        rules = RuleManager(ScheduleConfig(**ZONE_CFG))
        rules.set_rule(Rule("pd", "t", index=1, override=True, start_key=b"c", count=3, location_labels=["zone"]))
        ctx = ctx_for(c, rules=rules, **ZONE_CFG)
        [src, dst] = MergeChecker().check(c.regions[2], ctx)
        assert dst.region_id == 1  # not across b"c"
        assert MergeChecker().check(c.regions[3], ctx) == []

    def test_hot_region_not_merged(self):
        c = make_cluster(["z1", "z2", "z3"])
        r1, r2 = chain(c, [1, 1])
        hot = r1.clone(written_bytes=64 * 1024 * 1024)
        c.put_region(hot)
        assert MergeChecker().check(hot, ctx_for(c, **ZONE_CFG)) == []


# ---------------------------------------------------------------------------
# split checker
# ---------------------------------------------------------------------------
class TestSplitChecker:
    def test_oversized_by_size_or_keys(self):
        c = make_cluster(["z1", "z2", "z3"])
        ctx = ctx_for(c, region_max_size=144, region_max_keys=1000)
        big = make_region(1, [1, 2, 3], size=200, keys=10)
        [op] = SplitChecker().check(big, ctx)
        assert op.desc == "split-oversized" and OpKind.SPLIT in op.kind
        assert isinstance(op.steps[0], SplitRegion) and op.steps[0].keys == ()
        assert op.steps[0].start_version == big.epoch.version
        many = make_region(2, [1, 2, 3], size=10, keys=5000)
        assert [o.desc for o in SplitChecker().check(many, ctx)] == ["split-oversized"]
        assert SplitChecker().check(make_region(3, [1, 2, 3], size=144, keys=1000), ctx) == []

    def test_split_at_rule_and_known_boundaries(self):
        c = make_cluster(["z1", "z2", "z3"])
        rules = RuleManager()
        rules.set_rule(Rule("pd", "t", start_key=b"k", end_key=b"p", role="learner"))
        sc = SplitChecker(boundaries=[b"d", b"x"])
        r = make_region(1, [1, 2, 3], start=b"c", end=b"q", size=1)
        assert sc.suggest_split_keys(r, rules) == (b"d", b"k", b"p")
        [op] = sc.check(r, ctx_for(c, rules=rules))
        assert op.desc == "split-by-boundary" and op.steps[0].keys == (b"d", b"k", b"p")
        inside = make_region(2, [1, 2, 3], start=b"k", end=b"p", size=500)
        assert sc.suggest_split_keys(inside, rules) == ()
        [op2] = sc.check(inside, ctx_for(c, rules=rules))
        assert op2.steps[0].keys == ()  # middle

    def test_hot_region_split(self):
        c = make_cluster(["z1", "z2", "z3"])
        bounds = [b"", b"b", b"c", b"d", b"e", b""]
        for i in range(5):
            c.put_region(make_region(i + 1, [1, 2, 3], start=bounds[i], end=bounds[i + 1]).clone(
                written_bytes=1 << 20, query_num=10))
        ctx = ctx_for(c)
        sc = SplitChecker()
        assert sc.check(c.regions[1], ctx) == []
        warm_but_small = c.regions[2].clone(written_bytes=8 << 20, read_bytes=1 << 20)
        c.put_region(warm_but_small)
        ctx.now += 1  # averages are taken once per tick
        assert sc.check(warm_but_small, ctx) == []  # 9x the mean, but under 30 MiB/s: move it, don't split
        c.put_region(c.regions[2].clone(written_bytes=1 << 20, read_bytes=0))
        hot = c.regions[3].clone(written_bytes=32 << 20, read_bytes=1 << 20)
        c.put_region(hot)
        ctx.now += 1
        assert [o.desc for o in sc.check(hot, ctx)] == ["split-hot"]
        by_queries = c.regions[4].clone(query_num=5000)
        c.put_region(by_queries)
        ctx.now += 1
        assert [o.desc for o in sc.check(by_queries, ctx)] == ["split-hot"]
        # 3x the average is not "far above"
        warm = c.regions[5].clone(written_bytes=3 << 20)
        c.put_region(warm)
        ctx.now += 1
        assert sc.check(warm, ctx) == []

    def test_single_key_or_leaderless_not_split(self):
        c = make_cluster(["z1", "z2", "z3"])
        ctx = ctx_for(c)
        assert SplitChecker().check(make_region(1, [1, 2, 3], size=500, keys=1), ctx) == []
        assert SplitChecker().check(make_region(2, [1, 2, 3], size=500).clone(leader=None), ctx) == []

    def test_bad_boundary(self):
        with pytest.raises(ValueError, match="bytes"):
            SplitChecker(boundaries=["k"])
