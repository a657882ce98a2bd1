"""Schedulers on small hand-built clusters: what they move, and that applying
their operators converges without moves that undo one another."""

import random
from collections import Counter

import pytest

from opforge.placement import filter as flt
from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, RegionEpoch, Store, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import ScheduleContext
from opforge.placement.operator.builder import PeerIds
from opforge.placement.operator.operator import OpKind, Priority
from opforge.placement.operator.step import AddLearner, PromoteLearner, RemovePeer, TransferLeader
from opforge.placement.schedulers import SCHEDULERS, create
from opforge.placement.schedulers.balance_leader import BalanceLeaderScheduler
from opforge.placement.schedulers.balance_region import BalanceRegionScheduler
from opforge.placement.schedulers.evict_leader import EvictLeaderScheduler
from opforge.placement.schedulers.hot_region import HotRegionScheduler
from opforge.placement.schedulers.scatter_range import ScatterRangeScheduler
from opforge.placement.schedulers.shuffle_leader import ShuffleLeaderScheduler
from opforge.placement.schedulers.shuffle_region import ShuffleRegionScheduler

GIB = 1024 ** 3
MIB = 1024 ** 2


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


class Env:
    """A cluster, its config and a seeded random source, with helpers to build and to apply operators."""

    def __init__(self, n_stores, labels=None, capacity=1000 * GIB, config=None, seed=11):
        self.clock = Clock()
        self.cluster = Cluster(max_store_down_time=30.0, clock=self.clock)
        self.config = config or ScheduleConfig()
        self.rng = random.Random(seed)
        self.ids = PeerIds()
        for i in range(1, n_stores + 1):
            self.add_store(i, (labels or {}).get(i, {}), capacity)

    def add_store(self, sid, labels=None, capacity=1000 * GIB):
        self.cluster.put_store(Store(sid, labels=dict(labels or {}), capacity=capacity, available=capacity,
                                     last_heartbeat=self.clock()))

    def add_region(self, rid, stores, leader=None, size=10, key=None, **flows):
        peers = tuple(Peer(rid * 100 + i, s) for i, s in enumerate(stores))
        lead = next(p for p in peers if p.store_id == (leader if leader is not None else stores[0]))
        k = key if key is not None else b"k%06d" % rid
        r = Region(rid, start_key=k, end_key=k + b"\xff", peers=peers, leader=lead, approximate_size=size, **flows)
        self.cluster.put_region(r)
        return r

    def ctx(self, busy=()):
        return ScheduleContext(self.cluster, self.config, self.clock(), self.rng, self.ids, {}, None, set(busy))

    def apply(self, op):
        """Run every step of ``op`` on its region, as the workers would."""
        r = self.cluster.regions[op.region_id]
        assert r.epoch == op.epoch
        peers, leader, conf = list(r.peers), r.leader, r.epoch.conf_ver
        for step in op.steps:
            if isinstance(step, TransferLeader):
                assert leader.store_id == step.from_store
                leader = next(p for p in peers if p.store_id == step.to_store)
                assert leader.is_voter
            elif isinstance(step, AddLearner):
                assert all(p.store_id != step.to_store for p in peers)
                peers.append(Peer(step.peer_id, step.to_store, PeerRole.LEARNER))
                conf += 1
            elif isinstance(step, PromoteLearner):
                peers = [Peer(p.id, p.store_id, PeerRole.VOTER) if p.id == step.peer_id else p for p in peers]
                if leader.id == step.peer_id:
                    leader = Peer(leader.id, leader.store_id, PeerRole.VOTER)
                conf += 1
            elif isinstance(step, RemovePeer):
                assert leader.store_id != step.from_store, "removing the leader's peer"
                peers = [p for p in peers if p.store_id != step.from_store]
                conf += 1
            else:
                raise AssertionError(f"unexpected step {step}")
        self.cluster.put_region(r.clone(peers=tuple(peers), leader=leader,
                                        epoch=RegionEpoch(conf, r.epoch.version)))

    def run(self, schedulers, rounds=200):
        """Schedule and apply until no scheduler proposes anything; return the operators."""
        done = []
        for _ in range(rounds):
            ops, busy = [], set()
            for s in schedulers:  # as the driver: a region with an operator takes no second one
                new = s.schedule(self.ctx(busy))
                assert not {op.region_id for op in new} & busy
                busy |= {op.region_id for op in new}
                ops += new
            if not ops:
                return done
            for op in ops:
                self.apply(op)
            done += ops
        raise AssertionError(f"no convergence after {rounds} rounds ({len(done)} operators)")

    def leaders(self):
        return {s: self.cluster.leader_count(s) for s in self.cluster.stores}

    def sizes(self):
        return {s: self.cluster.region_size(s) for s in self.cluster.stores}


def transfers(ops):
    return [(s.from_store, s.to_store) for op in ops for s in op.steps if isinstance(s, TransferLeader)]


def peer_moves(ops):
    out = []
    for op in ops:
        add = next(s.to_store for s in op.steps if isinstance(s, AddLearner))
        rem = next(s.from_store for s in op.steps if isinstance(s, RemovePeer))
        out.append((rem, add))
    return out


def assert_no_reversal(pairs):
    seen = set(pairs)
    back = [(a, b) for a, b in seen if (b, a) in seen]
    assert not back, f"moves in both directions: {back}"


# -- balance-leader -------------------------------------------------------------------
def test_balance_leader_moves_from_most_to_fewest():
    env = Env(4)
    for i in range(1, 31):
        env.add_region(i, [1, 2, 3] if i <= 20 else [1, 3, 4], leader=1 if i <= 24 else 2 if i <= 20 else 3)
    # leaders: store 1: 24, store 3: 6 (regions 25..30), stores 2 and 4: 0
    assert env.leaders() == {1: 24, 2: 0, 3: 6, 4: 0}
    ops = BalanceLeaderScheduler(batch=1).schedule(env.ctx())
    assert len(ops) == 1
    op = ops[0]
    assert op.desc == "balance-leader" and op.kind == OpKind.LEADER
    assert len(op.steps) == 1 and isinstance(op.steps[0], TransferLeader)
    assert op.steps[0].from_store == 1 and op.steps[0].to_store in (2, 4)


def test_balance_leader_converges_without_reversal_and_stops_within_tolerance():
    env = Env(3, config=ScheduleConfig(tolerant_size_ratio=1.0))
    for i in range(1, 41):
        env.add_region(i, [1, 2, 3], leader=1)
    ops = env.run([BalanceLeaderScheduler()])
    pairs = transfers(ops)
    assert pairs and all(a == 1 for a, _ in pairs)  # only the overloaded store gives
    assert_no_reversal(pairs)
    counts = env.leaders()
    assert sum(counts.values()) == 40
    # tolerance 1 leader: it stops once no two stores differ by more than 2
    assert max(counts.values()) - min(counts.values()) <= 2
    assert len(ops) == 40 - max(counts.values())


def test_balance_leader_default_tolerance_leaves_small_gaps_alone():
    env = Env(3)
    for i in range(1, 26):
        env.add_region(i, [1, 2, 3], leader=1 if i <= 12 else 2 if i <= 21 else 3)
    assert env.leaders() == {1: 12, 2: 9, 3: 4}  # gap 8 <= 2 * 5
    assert BalanceLeaderScheduler().schedule(env.ctx()) == []
    for i in range(26, 30):
        env.add_region(i, [1, 2, 3], leader=1)  # 16 vs 4: gap 12 > 10
    ops = BalanceLeaderScheduler(batch=1).schedule(env.ctx())
    assert transfers(ops) == [(1, 3)]


def test_balance_leader_batch_counts_its_own_influence():
    env = Env(2, config=ScheduleConfig(tolerant_size_ratio=1.0))
    for i in range(1, 9):
        env.add_region(i, [1, 2], leader=1)
    # 8 vs 0: one call may move at most enough to keep store 1 ahead: 8-k-1 > k+1 -> k <= 2, so 3 moves
    ops = BalanceLeaderScheduler(batch=10).schedule(env.ctx())
    assert len(ops) == 3
    assert len({op.region_id for op in ops}) == 3


def test_balance_leader_skips_busy_regions_and_unfit_targets():
    env = Env(4, config=ScheduleConfig(tolerant_size_ratio=1.0))
    for i in range(1, 21):
        env.add_region(i, [1, 2, 3] if i != 7 else [1, 2, 4], leader=1)
    busy = set(range(1, 21)) - {7}
    for _ in range(5):
        ops = BalanceLeaderScheduler().schedule(env.ctx(busy=busy))
        assert [op.region_id for op in ops] in ([], [7])
    # store 2 down, store 4 holds a pending peer: region 7 has nowhere to go
    env.cluster.get_store(2).last_heartbeat = env.clock() - 100
    r7 = env.cluster.regions[7]
    env.cluster.put_region(r7.clone(pending_peers=(r7.peer_on(4).id,)))
    assert BalanceLeaderScheduler().schedule(env.ctx(busy=busy)) == []


def test_balance_leader_by_size():
    env = Env(2, config=ScheduleConfig(tolerant_size_ratio=1.0))
    env.add_region(1, [1, 2], leader=1, size=100)
    for i in range(2, 12):
        env.add_region(i, [1, 2], leader=2, size=5)
    # counts 1 vs 10, sizes 100 vs 50: by count store 2 gives, by size store 1 would (but 100 > gap)
    assert transfers(BalanceLeaderScheduler(policy="size").schedule(env.ctx())) == []
    by_count = transfers(BalanceLeaderScheduler(policy="count").schedule(env.ctx()))
    assert by_count and all(p == (2, 1) for p in by_count)
    with pytest.raises(ValueError):
        BalanceLeaderScheduler(policy="weight")


# -- balance-region --------------------------------------------------------------------
def test_balance_region_fills_an_empty_store_and_converges():
    env = Env(4)
    for i in range(1, 31):
        env.add_region(i, [1, 2, 3], leader=1 + i % 3, size=10)
    first = BalanceRegionScheduler(batch=1).schedule(env.ctx())
    assert len(first) == 1 and first[0].desc == "balance-region" and OpKind.REGION in first[0].kind
    assert peer_moves(first)[0][1] == 4
    ops = env.run([BalanceRegionScheduler()])
    pairs = peer_moves(ops)
    assert all(dst == 4 for _, dst in pairs)
    assert_no_reversal(pairs)
    sizes = env.sizes()
    assert sum(sizes.values()) == 900
    # tolerance = average region size (10): it stops once no gap exceeds 20 MiB
    assert max(sizes.values()) - min(sizes.values()) <= 20
    for r in env.cluster.regions.values():
        assert len(r.voters()) == 3 and len(r.store_ids) == 3 and not r.learners()


def test_balance_region_respects_low_space():
    env = Env(4, capacity=100 * GIB)
    for i in range(1, 31):
        env.add_region(i, [1, 2, 3], leader=1, size=10)
    env.cluster.get_store(4).available = 15 * GIB  # below 20% free: never a target
    assert BalanceRegionScheduler().schedule(env.ctx()) == []
    # a store low on space is the first to give, even when it holds no more than the others
    env = Env(5, capacity=100 * GIB)
    for i in range(1, 21):
        env.add_region(i, [1 + (i + k) % 4 for k in range(3)], size=10)
    env.add_store(5, capacity=100 * GIB)
    env.cluster.get_store(2).available = 10 * GIB
    ops = BalanceRegionScheduler(batch=1).schedule(env.ctx())
    assert [src for src, _ in peer_moves(ops)] == [2]


def test_balance_region_keeps_replicas_in_distinct_zones():
    labels = {i: {"zone": f"z{(i + 1) // 2}", "host": f"h{i}"} for i in range(1, 7)}  # z1: 1,2  z2: 3,4  z3: 5,6
    env = Env(6, labels=labels, config=ScheduleConfig(location_labels=["zone", "host"]))
    for i in range(1, 31):
        env.add_region(i, [1, 3, 5], leader=1, size=10)
    ops = env.run([BalanceRegionScheduler()])
    assert ops
    zone = {i: labels[i]["zone"] for i in labels}
    for src, dst in peer_moves(ops):
        assert zone[src] == zone[dst]  # the only moves that keep three zones
    for r in env.cluster.regions.values():
        assert len({zone[p.store_id] for p in r.peers}) == 3
    sizes = env.sizes()
    assert max(sizes.values()) - min(sizes.values()) <= 20


def test_balance_region_prefers_a_new_zone_over_sharing_one():
    # region on z1, z2, z3; store 4 is in z1 (empty), store 5 in a new zone z4 (empty)
    labels = {1: {"zone": "z1"}, 2: {"zone": "z2"}, 3: {"zone": "z3"}, 4: {"zone": "z1"}, 5: {"zone": "z4"}}
    env = Env(5, labels=labels, config=ScheduleConfig(location_labels=["zone"]))
    for i in range(1, 21):
        env.add_region(i, [1, 2, 3], size=10)
    ops = env.run([BalanceRegionScheduler()])
    for src, dst in peer_moves(ops):
        assert dst == 5 or (dst == 4 and src == 1)
    for r in env.cluster.regions.values():
        assert len({labels[p.store_id]["zone"] for p in r.peers}) == 3


def test_balance_region_never_uses_busy_regions_or_down_offline_targets():
    env = Env(6)
    for i in range(1, 31):
        env.add_region(i, [1, 2, 3], size=10)
    env.cluster.get_store(4).last_heartbeat = env.clock() - 100  # down
    env.cluster.get_store(5).state = StoreState.OFFLINE
    busy = set(range(1, 31)) - {3, 9}
    seen = set()
    for _ in range(10):
        for op in BalanceRegionScheduler().schedule(env.ctx(busy=busy)):
            seen.add(op.region_id)
            (src, dst), = peer_moves([op])
            assert dst == 6
    assert seen and seen <= {3, 9}


def test_balance_region_skips_unhealthy_or_under_replicated_regions():
    env = Env(4)
    for i in range(1, 21):
        r = env.add_region(i, [1, 2, 3] if i % 2 else [1, 2], size=10)
        if i % 2:
            env.cluster.put_region(r.clone(pending_peers=(r.peers[2].id,)))
    assert BalanceRegionScheduler().schedule(env.ctx()) == []


# -- evict-leader ---------------------------------------------------------------------
def test_evict_leader_empties_a_store_and_keeps_it_empty():
    env = Env(4, config=ScheduleConfig(tolerant_size_ratio=1.0))
    for i in range(1, 31):
        env.add_region(i, [1, 2, 3] if i % 2 else [1, 3, 4], leader=1 if i <= 20 else 2 if i % 2 else 3)
    ev = create("evict-leader", store_ids=[1])
    first = ev.schedule(env.ctx())
    assert first and all(op.desc == "evict-leader" and op.priority == Priority.URGENT for op in first)
    assert all(a == 1 for a, _ in transfers(first))
    for op in first:
        env.apply(op)
    env.run([ev, BalanceLeaderScheduler()])
    counts = env.leaders()
    assert counts[1] == 0 and sum(counts.values()) == 30
    assert max(counts[s] for s in (2, 3, 4)) - min(counts[s] for s in (2, 3, 4)) <= 2
    # once the store is released, balance-leader brings leaders back
    ev.remove_store(1)
    env.run([ev, BalanceLeaderScheduler()])
    assert env.leaders()[1] > 0


def test_evict_leader_does_not_pick_unfit_followers():
    env = Env(3)
    r = env.add_region(1, [1, 2, 3], leader=1)
    env.cluster.put_region(r.clone(pending_peers=(r.peer_on(2).id,)))
    env.cluster.get_store(3).last_heartbeat = env.clock() - 100
    assert EvictLeaderScheduler(1).schedule(env.ctx()) == []
    env.cluster.get_store(3).last_heartbeat = env.clock()
    assert transfers(EvictLeaderScheduler(1).schedule(env.ctx())) == [(1, 3)]


# -- hot-region -------------------------------------------------------------------------
HOT = 20 * MIB  # read bytes per second, over the 8 MiB/s threshold


def test_hot_region_moves_a_hot_leader_from_the_hot_store_to_a_cold_one():
    env = Env(3)
    for i in range(1, 5):
        env.add_region(i, [1, 2, 3], leader=1, read_bytes=HOT)
    for i in range(5, 11):
        env.add_region(i, [1, 2, 3], leader=1 + i % 3, read_bytes=MIB)  # cold
    hot = HotRegionScheduler(kinds=("read-leader",))
    ops = hot.schedule(env.ctx())
    assert ops
    for op in ops:
        assert op.desc == "hot-region" and OpKind.HOT in op.kind and OpKind.LEADER in op.kind
        assert op.region_id <= 4
    assert all(a == 1 and b in (2, 3) for a, b in transfers(ops))
    env.run([hot])
    hot_leaders = Counter(env.cluster.regions[i].leader.store_id for i in range(1, 5))
    assert sorted(hot_leaders.values()) == [1, 1, 2]


def test_hot_region_moves_the_leader_peer_when_no_follower_is_cool_enough():
    env = Env(4)
    for i in range(1, 11):  # hot leaders: store 1 has 4, stores 2 and 3 have 3 each, store 4 none
        env.add_region(i, [1, 2, 3], leader=1 if i <= 4 else 2 if i <= 7 else 3, read_bytes=HOT)
    ops = HotRegionScheduler(kinds=("read-leader",), batch=1).schedule(env.ctx())
    assert len(ops) == 1
    op = ops[0]
    assert OpKind.HOT in op.kind and OpKind.REGION in op.kind and op.region_id <= 4
    assert peer_moves(ops) == [(1, 4)] and transfers(ops) == [(1, 4)]
    env.apply(op)
    assert env.cluster.regions[op.region_id].leader.store_id == 4


def test_hot_region_leaves_a_single_hot_leader_alone():
    env = Env(3)
    env.add_region(1, [1, 2, 3], leader=1, read_bytes=HOT)
    assert HotRegionScheduler().schedule(env.ctx()) == []  # moving it would just move the hot spot


def test_hot_region_moves_write_hot_peers_to_an_idle_store():
    env = Env(4)
    for i in range(1, 7):
        env.add_region(i, [1, 2, 3], leader=1 + i % 3, written_bytes=HOT)
    hot = HotRegionScheduler(kinds=("write-peer",))
    ops = env.run([hot])
    pairs = peer_moves(ops)
    assert pairs and all(dst == 4 for _, dst in pairs)
    per_store = Counter(p.store_id for r in env.cluster.regions.values() for p in r.peers)
    assert max(per_store.values()) - min(per_store.values()) <= 1  # 18 hot peers over 4 stores


def test_hot_region_counts_pending_moves():
    env = Env(3)
    for i in range(1, 5):
        env.add_region(i, [1, 2, 3], leader=1, read_bytes=HOT)
    hot = HotRegionScheduler(kinds=("read-leader",), batch=1)
    first = hot.schedule(env.ctx())
    assert len(first) == 1
    # the operator is running (its region busy) but not applied: the next call must not pile on
    second = hot.schedule(env.ctx(busy={first[0].region_id}))
    assert len(second) == 1
    assert transfers(first)[0][1] != transfers(second)[0][1]  # one to each cold store
    third = hot.schedule(env.ctx(busy={first[0].region_id, second[0].region_id}))
    assert third == []  # 2/1/1: balanced


def test_hot_region_observe_feeds_the_cache_on_a_large_cluster():
    env = Env(3)
    for i in range(1, 61):
        env.add_region(i, [1, 2, 3], leader=1, read_bytes=HOT if i in (10, 50) else 0)
    hot = HotRegionScheduler(kinds=("read-leader",), scan_per_call=8)
    hot.observe(env.cluster.regions[50])
    hot.observe(env.cluster.regions[51])  # not hot: ignored
    ops = hot.schedule(env.ctx())  # scanned regions 1..8; region 10 not seen yet
    assert hot.hot_region_ids() == {50}
    assert ops == []  # one hot leader known: nothing to even out
    hot.schedule(env.ctx())  # 9..16
    assert hot.hot_region_ids() == {10, 50}


# -- scatter-range ----------------------------------------------------------------------
def test_scatter_range_evens_the_range_and_leaves_the_rest():
    env = Env(6)
    for i in range(1, 13):
        env.add_region(i, [1, 2, 3], leader=1, key=b"r%03d" % i)
    for i in range(20, 30):
        env.add_region(i, [1, 2, 3], leader=1, key=b"x%03d" % i)
    outside = {i: env.cluster.regions[i] for i in range(20, 30)}
    sched = create("scatter-range", start_key=b"r", end_key=b"s")
    ops = env.run([sched])
    assert ops and all(op.desc == "scatter-range" for op in ops)
    peers = Counter(p.store_id for i in range(1, 13) for p in env.cluster.regions[i].peers)
    leaders = Counter(env.cluster.regions[i].leader.store_id for i in range(1, 13))
    assert sorted(peers[s] for s in range(1, 7)) == [6] * 6  # 36 peers on 6 stores
    assert sorted(leaders[s] for s in range(1, 7)) == [2] * 6
    assert all(env.cluster.regions[i] is outside[i] for i in outside)
    with pytest.raises(ValueError):
        ScatterRangeScheduler(start_key=b"z", end_key=b"a")


def test_scatter_range_over_a_large_range_scans_in_steps_then_evens_it():
    env = Env(6)
    for i in range(1, 13):
        env.add_region(i, [1, 2, 3], leader=1, key=b"r%03d" % i)
    env.add_region(99, [1, 2, 3], leader=1, key=b"x")
    sched = ScatterRangeScheduler(start_key=b"r", end_key=b"s", scan_limit=5)  # 12 regions > 5 per call
    assert sched.schedule(env.ctx()) == []  # regions 1..5 counted
    assert sched.schedule(env.ctx()) == []  # 6..10
    ops = sched.schedule(env.ctx())  # 11, 12: the sweep is complete
    assert ops
    for op in ops:
        env.apply(op)
    env.run([sched], rounds=400)
    peers = Counter(p.store_id for i in range(1, 13) for p in env.cluster.regions[i].peers)
    leaders = Counter(env.cluster.regions[i].leader.store_id for i in range(1, 13))
    assert sorted(peers[s] for s in range(1, 7)) == [6] * 6
    assert sorted(leaders[s] for s in range(1, 7)) == [2] * 6
    assert env.cluster.regions[99].store_ids == {1, 2, 3}


def test_scatter_range_without_keys_evens_the_whole_cluster():
    env = Env(5)
    for i in range(1, 21):
        env.add_region(i, [1, 2, 3], leader=1)
    ops = env.run([create("scatter-range")])
    assert ops
    counts = [env.cluster.region_count(s) for s in range(1, 6)]
    assert sorted(counts) == [12] * 5  # 60 peers
    lead = env.leaders()
    assert max(lead.values()) - min(lead.values()) <= 2
    # it stopped only where no single transfer helps: no region led by a store with
    # two or more leaders above another has a follower there
    for r in env.cluster.regions.values():
        for p in r.followers():
            assert lead[r.leader.store_id] - lead[p.store_id] < 2


# -- shuffle ----------------------------------------------------------------------------
def test_shuffle_leader_produces_valid_transfers():
    env = Env(4)
    for i in range(1, 21):
        env.add_region(i, [1, 2, 3] if i % 2 else [2, 3, 4], leader=2)
    before = {i: r.leader.store_id for i, r in env.cluster.regions.items()}
    for _ in range(5):
        ops = ShuffleLeaderScheduler().schedule(env.ctx())
        assert ops and len({op.region_id for op in ops}) == len(ops)
        for op in ops:
            r = env.cluster.regions[op.region_id]
            (a, b), = transfers([op])
            assert a == r.leader.store_id and b != a and r.peer_on(b) is not None
            env.apply(op)
    after = {i: r.leader.store_id for i, r in env.cluster.regions.items()}
    assert after != before


def test_shuffle_region_produces_valid_moves():
    env = Env(5)
    env.cluster.get_store(5).state = StoreState.OFFLINE
    for i in range(1, 21):
        env.add_region(i, [1, 2, 3], size=10)
    for _ in range(5):
        ops = ShuffleRegionScheduler().schedule(env.ctx())
        assert ops
        for op in ops:
            (src, dst), = peer_moves([op])
            r = env.cluster.regions[op.region_id]
            assert r.peer_on(src) is not None and r.peer_on(dst) is None and dst != 5
            env.apply(op)
            r = env.cluster.regions[op.region_id]
            assert len(r.voters()) == 3 and len(r.store_ids) == 3
    assert env.cluster.region_count(4) > 0


# -- registry ----------------------------------------------------------------------------
def test_registry_names_and_factory():
    assert set(SCHEDULERS) == {"balance-leader", "balance-region", "evict-leader", "shuffle-leader",
                               "shuffle-region", "scatter-range", "hot-region"}
    for name, cls in SCHEDULERS.items():
        s = create(name)
        assert isinstance(s, cls) and s.name == name
    assert create("balance-region", batch=2).batch == 2
    assert create("evict-leader", store_ids=[2, 3]).store_ids == {2, 3}
    with pytest.raises(ValueError):
        create("balance-everything")
    with pytest.raises(ValueError):
        create("balance-leader", colour="red")
    with pytest.raises(ValueError):
        create("balance-leader", batch=0)


def test_all_schedulers_together_on_a_mixed_cluster_only_make_applicable_operators():
    env = Env(6, labels={i: {"zone": f"z{i % 3}"} for i in range(1, 7)},
              config=ScheduleConfig(location_labels=["zone"]))
    rng = random.Random(5)
    for i in range(1, 121):
        stores = [z * 1 for z in rng.sample([1, 2, 3], 3)]  # zones z1, z2, z0 on stores 1..3
        env.add_region(i, stores, leader=stores[0], size=rng.randint(1, 20),
                       read_bytes=HOT if i % 17 == 0 else 0)
    scheds = [create(n) for n in ("balance-leader", "balance-region", "hot-region")]
    ops = env.run(scheds, rounds=300)
    assert ops
    for r in env.cluster.regions.values():
        assert len({i % 3 for i in r.store_ids}) == 3  # zones stay distinct
    assert all(env.cluster.region_count(s) > 0 for s in (4, 5, 6))


def test_scheduler_leaves_its_context_untouched():
    env = Env(3)
    for i in range(1, 11):
        env.add_region(i, [1, 2, 3], leader=1)
    ctx = env.ctx(busy={1})
    BalanceLeaderScheduler().schedule(ctx)
    assert ctx.busy_regions == {1} and ctx.influence == {}
    assert flt.leader_transfer_paused(env.cluster, 1, ctx.now) is None
