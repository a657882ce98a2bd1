"""The cluster's indexes stay equal to a rebuild from scratch, whatever the heartbeats."""

import random

from opforge.placement.cluster import Cluster, Peer, Region, RegionEpoch, Store


def _cluster() -> Cluster:
    c = Cluster(clock=lambda: 0.0)
    for s in range(1, 6):
        c.put_store(Store(s, capacity=100, available=50))
    return c


def _region(rng: random.Random, rid: int) -> Region:
    stores = rng.sample(range(1, 6), 3)
    peers = tuple(Peer(rid * 10 + s, s) for s in stores)
    return Region(rid, bytes([rid]), bytes([rid + 1]), RegionEpoch(), peers, rng.choice(peers),
                  approximate_size=rng.randrange(1, 100), written_bytes=rng.randrange(100),
                  query_num=rng.randrange(9))


def test_incremental_indexes_equal_a_rebuild():
    rng = random.Random(5)
    c = _cluster()
    for rid in range(1, 50):
        c.put_region(_region(rng, rid))
    for _ in range(3000):
        rid = rng.randrange(1, 60)
        old = c.regions.get(rid)
        roll = rng.random()
        if old is not None and roll < 0.5:  # the common heartbeat: same members, new sizes and flows
            c.put_region(old.clone(approximate_size=rng.randrange(1, 100), written_bytes=rng.randrange(100),
                                   query_num=rng.randrange(9)))
        elif roll < 0.9:
            c.put_region(_region(rng, rid))  # new members or leader (or a new region)
        else:
            c.remove_region(rid)
    fresh = _cluster()
    for r in c.regions.values():
        fresh.put_region(r)
    for s in range(1, 6):
        assert (c.region_size(s), c.leader_size(s), c.leader_count(s), c.region_count(s)) == (
            fresh.region_size(s), fresh.leader_size(s), fresh.leader_count(s), fresh.region_count(s))
    assert (c.total_flow_bytes, c.total_queries) == (fresh.total_flow_bytes, fresh.total_queries)
    assert [r.id for r in c.scan()] == [r.id for r in fresh.scan()] == sorted(c.regions)
    for r in c.regions.values():
        assert c.region_for_key(r.start_key) is r
