"""The driver's contract: heartbeats in, steps out; bad input refused, state intact."""

import pytest

from opforge.placement.cluster import Peer, PeerRole, Region, RegionEpoch, Store, StoreState
from opforge.placement.driver import Driver
from opforge.placement.heartbeat import HeartbeatError, RegionHeartbeat, StoreHeartbeat


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _driver(n_stores=4, **cfg):
    clock = Clock()
    d = Driver(clock=clock, schedulers=())
    for k, v in cfg.items():
        d.set_config(k, v)
    for i in range(1, n_stores + 1):
        d.put_store(Store(i, f"w{i}", {"zone": f"z{i}"}, capacity=100 << 30, available=80 << 30))
    return d, clock


def _region(rid=1, stores=(1, 2, 3), leader=1, start=b"", end=b"", epoch=(1, 1), **kw):
    peers = tuple(Peer(rid * 10 + s, s) for s in stores)
    lead = next(p for p in peers if p.store_id == leader)
    return Region(rid, start, end, RegionEpoch(*epoch), peers, lead, **kw)


def test_region_heartbeat_from_unknown_store_is_refused_and_counted():
    d, _ = _driver(3)
    with pytest.raises(HeartbeatError, match="unknown store 9"):
        d.handle_region_heartbeat(RegionHeartbeat(_region(stores=(1, 2, 9))))
    assert d.errors == 1 and not d.cluster.regions


def test_store_heartbeat_for_unregistered_store_is_refused():
    d, _ = _driver(2)
    with pytest.raises(HeartbeatError, match="not registered"):
        d.handle_store_heartbeat(StoreHeartbeat(Store(7, capacity=10, available=5)))


def test_malformed_heartbeats_are_refused_with_the_field_named_and_the_driver_keeps_going():
    d, _ = _driver(3)
    good = RegionHeartbeat(_region()).to_json()
    bad = dict(good, epoch={"conf_ver": "x", "version": 1})
    with pytest.raises(HeartbeatError, match="conf_ver"):
        d.handle_region_heartbeat(bad)
    with pytest.raises(HeartbeatError, match="leader_peer_id"):
        d.handle_region_heartbeat(dict(good, leader_peer_id=999))
    with pytest.raises(HeartbeatError, match="start_key must sort before end_key"):
        d.handle_region_heartbeat(dict(good, start_key="ff", end_key="00"))
    with pytest.raises(HeartbeatError, match="schema_version"):
        d.handle_region_heartbeat(dict(good, schema_version=99))
    with pytest.raises(HeartbeatError, match="available"):
        d.handle_store_heartbeat({"store_id": 1, "capacity": 5, "available": 9})
    d.handle_region_heartbeat(good)
    assert d.cluster.regions[1].leader.store_id == 1
    assert d.errors == 5


def test_stale_epoch_is_refused_and_the_known_region_kept():
    d, _ = _driver(3)
    d.handle_region_heartbeat(RegionHeartbeat(_region(epoch=(3, 5))))
    with pytest.raises(HeartbeatError, match="stale epoch"):
        d.handle_region_heartbeat(RegionHeartbeat(_region(epoch=(2, 5))))
    assert d.cluster.regions[1].epoch == RegionEpoch(3, 5)


def test_split_children_replace_their_parent():
    d, _ = _driver(3)
    d.handle_region_heartbeat(RegionHeartbeat(_region(1, start=b"", end=b"")))
    d.handle_region_heartbeat(RegionHeartbeat(_region(2, start=b"", end=b"m", epoch=(1, 2))))
    assert 1 not in d.cluster.regions  # the parent's range is now covered by a newer version
    d.handle_region_heartbeat(RegionHeartbeat(_region(1, start=b"m", end=b"", epoch=(1, 2))))
    assert d.cluster.region_for_key(b"a").id == 2 and d.cluster.region_for_key(b"z").id == 1


def test_admin_transfer_leader_is_answered_on_the_next_heartbeat_until_done():
    d, clock = _driver(3)
    r = _region()
    d.handle_region_heartbeat(RegionHeartbeat(r))
    op = d.add_operator("transfer-leader", 1, to_store=2)
    resp = d.handle_region_heartbeat(RegionHeartbeat(r))
    assert resp.step is not None and resp.step.to_json() == {"kind": "TransferLeader", "from_store": 1, "to_store": 2}
    assert resp.operator_id == op.id
    clock.t += 1
    done = r.clone(leader=r.peer_on(2))
    assert d.handle_region_heartbeat(RegionHeartbeat(done)).step is None
    assert op.status.value == "success"


def test_admin_operator_errors_name_the_problem():
    d, _ = _driver(3)
    d.handle_region_heartbeat(RegionHeartbeat(_region()))
    with pytest.raises(ValueError, match="not an up store"):
        d.add_operator("add-peer", 1, to_store=42)
    with pytest.raises(ValueError, match="already holds a peer"):
        d.add_operator("add-peer", 1, to_store=2)
    with pytest.raises(ValueError, match="unknown operator kind"):
        d.add_operator("teleport", 1)
    with pytest.raises(ValueError, match="region 5 is not known"):
        d.add_operator("split-region", 5)


def test_store_states_follow_pd_rules():
    d, _ = _driver(4)
    d.handle_region_heartbeat(RegionHeartbeat(_region()))
    with pytest.raises(ValueError, match="still holds 1 regions"):
        d.set_store_state(1, "tombstone")
    d.set_store_state(4, "tombstone")
    with pytest.raises(ValueError, match="tombstone"):
        d.set_store_state(4, "up")
    with pytest.raises(HeartbeatError, match="tombstone"):
        d.handle_store_heartbeat(StoreHeartbeat(Store(4, capacity=10, available=5)))
    d.set_store_state(2, StoreState.OFFLINE)
    d.handle_store_heartbeat(StoreHeartbeat(Store(2, capacity=10, available=5)))  # a worker cannot undo it
    assert d.cluster.get_store(2).state == StoreState.OFFLINE


def test_a_store_without_heartbeats_goes_down_and_its_peers_are_replaced():
    d, clock = _driver(4, max_store_down_time=30)
    r = _region(stores=(1, 2, 3), leader=1)
    d.handle_region_heartbeat(RegionHeartbeat(r))
    clock.t += 31
    for sid in (1, 2, 4):  # store 3 is silent
        d.handle_store_heartbeat(StoreHeartbeat(Store(sid, capacity=100 << 30, available=80 << 30)))
    assert d.cluster.is_store_down(3) and not d.cluster.is_store_down(4)
    r = r.clone(down_peers=(r.peer_on(3).id,))
    d.handle_region_heartbeat(RegionHeartbeat(r))
    ops = d.tick()
    assert [op.region_id for op in ops] == [1]
    step = d.handle_region_heartbeat(RegionHeartbeat(r)).step
    assert step.to_json()["kind"] in ("AddLearner", "AddPeer") and step.to_store == 4


def test_learner_roles_round_trip_through_json():
    r = _region()
    r = r.clone(peers=r.peers + (Peer(99, 4, PeerRole.LEARNER),), pending_peers=(99,))
    back = RegionHeartbeat(r).to_json()
    from opforge.placement.heartbeat import parse_region_heartbeat

    assert parse_region_heartbeat(back).region == r
