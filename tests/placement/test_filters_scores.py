"""Store filters (state, space, isolation) and store scores (region, leader, tolerance)."""

import random

import pytest

from opforge.placement import filter as flt
from opforge.placement import score as sc
from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, Store, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.context import ScheduleContext, StoreInfluence
from opforge.placement.operator.builder import PeerIds, move_peer, transfer_leader

GIB = 1024 ** 3
MIB = 1024 ** 2


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def make_cluster(n_stores=3, labels=None, capacity=100 * GIB, available=None, clock=None):
    clock = clock or Clock()
    c = Cluster(max_store_down_time=30.0, clock=clock)
    for i in range(1, n_stores + 1):
        s = Store(i, labels=dict((labels or {}).get(i, {})), capacity=capacity,
                  available=capacity if available is None else available, last_heartbeat=clock())
        c.put_store(s)
    return c


def region(rid, stores, leader=None, size=10, key=None):
    peers = tuple(Peer(rid * 10 + i, s) for i, s in enumerate(stores))
    lead = next(p for p in peers if p.store_id == (leader if leader is not None else stores[0]))
    k = key if key is not None else b"%06d" % rid
    return Region(rid, start_key=k, end_key=k + b"\xff", peers=peers, leader=lead, approximate_size=size)


def ctx_for(cluster, config=None, influence=None, busy=()):
    return ScheduleContext(cluster, config or ScheduleConfig(), cluster.clock(), random.Random(7), PeerIds(),
                           influence or {}, None, set(busy))


# -- distinct score and isolation --------------------------------------------------
ZONE_HOST = ["zone", "host"]


def _s(i, zone, host):
    return Store(i, labels={"zone": zone, "host": host})


def test_distinct_score_weights_outer_levels_more():
    a, b = _s(1, "z1", "h1"), _s(2, "z2", "h1")
    # another zone: 100 each; same zone other host: 1; same place: 0
    assert flt.distinct_score(ZONE_HOST, [a, b], _s(3, "z3", "h9")) == 200
    assert flt.distinct_score(ZONE_HOST, [a, b], _s(3, "z1", "h2")) == 101
    assert flt.distinct_score(ZONE_HOST, [a, b], _s(3, "z1", "h1")) == 100
    # the candidate itself is skipped; labels compare case-insensitively
    assert flt.distinct_score(ZONE_HOST, [a, b], a) == 100
    assert flt.distinct_score(ZONE_HOST, [a], _s(3, "Z1", "H1")) == 0
    # a store with no labels is considered at the same location as anything
    assert flt.distinct_score(ZONE_HOST, [a, b], Store(3)) == 0
    assert flt.distinct_score([], [a, b], _s(3, "z3", "h3")) == 0


def test_location_safeguard_refuses_a_target_that_shares_a_zone():
    c = make_cluster(6, labels={1: {"zone": "z1", "host": "a"}, 2: {"zone": "z1", "host": "b"},
                                3: {"zone": "z2", "host": "c"}, 4: {"zone": "z2", "host": "d"},
                                5: {"zone": "z3", "host": "e"}, 6: {"zone": "z4", "host": "f"}})
    cfg = ScheduleConfig(location_labels=ZONE_HOST)
    r = region(1, [1, 3, 5])
    c.put_region(r)
    ctx = ctx_for(c, cfg)
    src = c.get_store(1)
    assert flt.region_target_reason(ctx, r, c.get_store(4), src) == flt.NOT_MATCH_ISOLATION  # z2 twice
    assert flt.region_target_reason(ctx, r, c.get_store(2), src) is None  # stays in z1
    assert flt.region_target_reason(ctx, r, c.get_store(6), src) is None  # a new zone
    assert flt.region_target_reason(ctx, r, c.get_store(3), src) == flt.EXCLUDED


def test_isolation_level_blocks_sharing_the_level_but_not_an_existing_violation():
    labels = {1: {"zone": "z1", "host": "a"}, 2: {"zone": "z1", "host": "b"}, 3: {"zone": "z2", "host": "c"},
              4: {"zone": "z2", "host": "d"}, 5: {"zone": "z1", "host": "e"}}
    stores = {i: Store(i, labels=v) for i, v in labels.items()}
    # region on 1 (z1), 3 (z2): replacing 3 by 4 keeps z2; replacing it by 2 puts two replicas in z1
    others = [stores[1]]
    assert flt.isolation(ZONE_HOST, "zone", others, stores[3], stores[4]) is None
    assert flt.isolation(ZONE_HOST, "zone", others, stores[3], stores[2]) == flt.NOT_MATCH_ISOLATION
    # the region already had two replicas in z1 (1 and 2); moving 2 to 5 does not make it worse
    assert flt.isolation(ZONE_HOST, "zone", [stores[1], stores[3]], stores[2], stores[5]) is None
    assert flt.isolation(ZONE_HOST, "", others, stores[3], stores[2]) is None


# -- store state ------------------------------------------------------------------
def test_store_state_filters():
    clock = Clock()
    c = make_cluster(6, clock=clock)
    c.get_store(2).state = StoreState.OFFLINE
    c.get_store(3).state = StoreState.TOMBSTONE
    c.get_store(4).last_heartbeat = clock() - 31  # down
    c.get_store(5).is_busy = True
    c.get_store(6).receiving_snap_count = flt.MAX_SNAPSHOT_COUNT
    ctx = ctx_for(c)
    got = {i: flt.store_target_reason(ctx, c.get_store(i)) for i in range(1, 7)}
    assert got == {1: None, 2: flt.STORE_OFFLINE, 3: flt.STORE_TOMBSTONE, 4: flt.STORE_DOWN, 5: flt.STORE_BUSY,
                   6: flt.TOO_MANY_SNAPSHOTS}
    # an offline store may still give its peers away; a down or tombstone one may not
    assert flt.region_source_reason(ctx, c.get_store(2)) is None
    assert flt.region_source_reason(ctx, c.get_store(4)) == flt.STORE_DOWN
    assert flt.region_source_reason(ctx, c.get_store(3)) == flt.STORE_TOMBSTONE
    assert flt.region_source_reason(ctx, c.get_store(6)) is None  # receiving, not sending
    assert flt.store_target_reason(ctx, None) == flt.STORE_MISSING


def test_low_space_target_filter_counts_the_region_and_pending_influence():
    c = make_cluster(3)
    cfg = ScheduleConfig(low_space_ratio=0.8)  # a store must keep 20 GiB of its 100 GiB free
    s = c.get_store(1)
    s.available = 25 * GIB
    assert not flt.is_low_space(s, 0.8)
    assert not flt.is_low_space(s, 0.8, incoming_mib=4 * 1024)
    assert flt.is_low_space(s, 0.8, incoming_mib=6 * 1024)
    s.available = 15 * GIB
    assert flt.is_low_space(s, 0.8)
    s.available = 25 * GIB
    ctx = ctx_for(c, cfg)
    assert flt.low_space(ctx, s, 1024) is None
    busy_ctx = ctx_for(c, cfg, influence={1: StoreInfluence(region_size=5 * 1024)})
    assert flt.low_space(busy_ctx, s, 1024) == flt.LOW_SPACE
    # unknown capacity never counts as low space
    assert not flt.is_low_space(Store(9), 0.8, incoming_mib=10)


def test_leader_target_needs_a_healthy_follower_and_no_pause():
    c = make_cluster(4)
    r = region(1, [1, 2, 3])
    c.put_region(r)
    ctx = ctx_for(c)
    assert flt.leader_target_reason(ctx, r, c.get_store(2)) is None
    assert flt.leader_target_reason(ctx, r, c.get_store(1)) == flt.NOT_FOLLOWER  # the leader itself
    assert flt.leader_target_reason(ctx, r, c.get_store(4)) == flt.NOT_FOLLOWER  # holds no peer
    pending = r.clone(pending_peers=(r.peer_on(3).id,))
    assert flt.leader_target_reason(ctx, pending, c.get_store(3)) == flt.PEER_UNHEALTHY
    learner = r.clone(peers=(r.peers[0], r.peers[1], Peer(r.peers[2].id, 3, PeerRole.LEARNER)))
    assert flt.leader_target_reason(ctx, learner, c.get_store(3)) == flt.NOT_FOLLOWER
    flt.pause_leader_transfer(c, [2], until=ctx.now + 10)
    assert flt.leader_target_reason(ctx, r, c.get_store(2)) == flt.LEADER_TRANSFER_PAUSED
    later = ctx_for(c)
    later.now = ctx.now + 11
    assert flt.leader_target_reason(later, r, c.get_store(2)) is None  # the pause lapsed
    flt.pause_leader_transfer(c, [2], until=ctx.now + 10)
    flt.resume_leader_transfer(c, [2])
    assert flt.leader_target_reason(ctx, r, c.get_store(2)) is None


# -- region picking ----------------------------------------------------------------
def test_sample_regions_small_set_yields_distinct_accepted_members():
    c = make_cluster(3)
    for i in range(1, 21):
        c.put_region(region(i, [1, 2, 3], leader=1 + i % 3))
    ids = c.leader_region_ids(1)
    got = list(flt.sample_regions(c, ids, random.Random(1), 100, accept=lambda r: r.id % 2 == 0))
    assert {r.id for r in got} == {i for i in ids if i % 2 == 0}
    assert len(got) == len({r.id for r in got})


def test_sample_regions_large_set_probes_the_key_index_and_stays_inside_the_set():
    c = make_cluster(3)
    for i in range(1, 3001):
        c.put_region(region(i, [1, 2, 3], leader=1 + i % 3))
    ids = c.leader_region_ids(2)  # 1000 of 3000: large enough for the key-index path
    rng = random.Random(3)
    seen = set()
    for _ in range(50):
        for r in flt.sample_regions(c, ids, rng, 4):
            assert r.id in ids and r.leader.store_id == 2
            seen.add(r.id)
    assert len(seen) > 150  # spread over the set, not stuck on a few
    ctx = ctx_for(c, busy=set(ids) - {22})  # region 22 leads on store 2 (22 % 3 == 1)
    assert 22 in ids
    picks = [flt.pick_region(ctx, ids) for _ in range(20)]
    assert {r.id for r in picks if r is not None} <= {22}


def test_regions_from_walks_key_order_over_a_range():
    c = make_cluster(3)
    for i in range(1, 11):
        c.put_region(Region(i, start_key=bytes([i * 10]), end_key=bytes([i * 10 + 10]),
                            peers=(Peer(i, 1),), leader=Peer(i, 1)))
    ids = [r.id for r in flt.regions_from(c, bytes([35]), bytes([70]))]
    assert ids == [3, 4, 5, 6]  # 3 covers [30, 40) and overlaps the start
    assert [r.id for r in flt.regions_from(c, bytes([95]))] == [9, 10]


# -- scores -------------------------------------------------------------------------
def test_region_score_is_size_while_roomy_then_rises_steeply_near_full():
    roomy = Store(1, capacity=100 * GIB, available=60 * GIB, used_size=40 * GIB)
    assert sc.region_score(roomy, 40 * 1024, 0.7, 0.8) == 40 * 1024
    assert sc.region_score(roomy, 40 * 1024, 0.7, 0.8, delta=100) == 40 * 1024 + 100
    full = Store(2, capacity=100 * GIB, available=10 * GIB, used_size=90 * GIB)
    assert sc.region_score(full, 90 * 1024, 0.7, 0.8) == sc.MAX_SCORE - 10 * 1024
    # between 30 GiB free (high-space bound) and 20 GiB (low-space bound): continuous, rising
    mid = [sc.region_score(Store(3, capacity=100 * GIB, available=a * GIB, used_size=(100 - a) * GIB),
                           (100 - a) * 1024, 0.7, 0.8) for a in (30, 27, 24, 21, 20)]
    assert mid == sorted(mid) and mid[0] == pytest.approx(70 * 1024)
    assert mid[-1] == pytest.approx(sc.MAX_SCORE - 20 * 1024)
    # a near-full store outranks a roomy store holding far more data
    huge = Store(4, capacity=10_000 * GIB, available=9_000 * GIB, used_size=1_000 * GIB)
    assert sc.region_score(full, 90 * 1024, 0.7, 0.8) > sc.region_score(huge, 1_000 * 1024, 0.7, 0.8)


def test_region_score_amplification_converts_region_mib_to_disk():
    # regions add up to twice the bytes used (compression): moving 2 MiB of regions frees 1 MiB of disk
    s = Store(1, capacity=100 * GIB, available=21 * GIB, used_size=79 * GIB)
    size = 2 * 79 * 1024
    # 2 GiB more of regions would take 1 GiB of disk: 20 GiB free, exactly the low-space bound
    assert sc.region_score(s, size, 0.7, 0.8, delta=2 * 1024) == pytest.approx(sc.MAX_SCORE - 20 * 1024)


def test_store_scores_include_pending_influence():
    c = make_cluster(2)
    for i in range(1, 5):
        c.put_region(region(i, [1, 2], leader=1, size=10))
    ctx = ctx_for(c, influence={1: StoreInfluence(region_size=-10, leader_count=-1, leader_size=-10),
                                2: StoreInfluence(leader_count=1, leader_size=10)})
    assert sc.store_region_score(ctx, 1) == 30
    assert sc.store_leader_score(ctx, 1) == 3
    assert sc.store_leader_score(ctx, 2, sc.LEADER_SIZE) == 10
    assert sc.store_leader_score(ctx, 2, sc.LEADER_COUNT, delta=2) == 3


def test_tolerance_follows_pd():
    c = make_cluster(3)
    for i in range(1, 1201):
        c.put_region(region(i, [1, 2, 3], size=8))
    ctx = ctx_for(c)
    assert sc.tolerant_size_ratio(ctx, sc.LEADER_COUNT) == 5.0
    assert sc.tolerant_size_ratio(ctx, sc.REGION) == pytest.approx(1200 * 0.005)  # 6
    assert sc.average_region_size(c) == 8
    r = c.regions[1]
    assert sc.tolerant_resource(ctx, sc.REGION, r) == pytest.approx(48)
    assert sc.tolerant_resource(ctx, sc.LEADER_COUNT, r) == 5
    big = r.clone(approximate_size=100)
    assert sc.tolerant_resource(ctx, sc.REGION, big) == pytest.approx(600)
    ctx.config.tolerant_size_ratio = 0.25
    # never less than what the move carries
    assert sc.tolerant_resource(ctx, sc.LEADER_COUNT, r) == 1
    assert sc.tolerant_resource(ctx, sc.REGION, big) == 100
    small = make_cluster(2)
    small.put_region(region(1, [1, 2]))
    assert sc.tolerant_size_ratio(ctx_for(small), sc.REGION) == 1.0  # the floor


def test_should_balance_needs_twice_the_tolerance_of_gap():
    c = make_cluster(2)
    for i in range(1, 13):
        c.put_region(region(i, [1], size=10) if i <= 8 else region(i, [2], size=10))
    ctx = ctx_for(c)  # sizes 80 vs 40: gap 40
    assert sc.should_balance(ctx, sc.REGION, 1, 2, 19)
    assert not sc.should_balance(ctx, sc.REGION, 1, 2, 20)
    assert not sc.should_balance(ctx, sc.REGION, 2, 1, 0)


def test_operator_influence_of_moves_and_transfers():
    c = make_cluster(4)
    r = region(1, [1, 2, 3], leader=1, size=30)
    c.put_region(r)
    ids = PeerIds()
    infl = sc.operator_influence(move_peer("t", r, 1, 4, ids, 0.0), r)
    assert infl[4].region_size == 30 and infl[4].region_count == 1 and infl[4].leader_count == 1
    assert infl[1].region_size == -30 and infl[1].region_count == -1 and infl[1].leader_size == -30
    acc = {2: StoreInfluence(leader_count=5)}
    sc.add_operator_influence(acc, transfer_leader("t", r, 2, 0.0), r)
    assert acc[2].leader_count == 6 and acc[2].leader_size == 30 and acc[1].leader_count == -1
