"""The operator controller and the store limits, as a specification.

Time is simulated: every call passes ``now`` explicitly."""

import math

import pytest

from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, RegionEpoch, Store
from opforge.placement.config import ScheduleConfig
from opforge.placement.operator import builder
from opforge.placement.operator.controller import OperatorController
from opforge.placement.operator.operator import EXPIRE_AFTER, Operator, OpKind, OpStatus, Priority
from opforge.placement.operator.step import AddLearner, PromoteLearner, RemovePeer, TransferLeader
from opforge.placement.operator.store_limit import (
    SMALL_REGION_COST, StoreLimiter, StoreLimitType, default_burst, step_cost,
)

V, L = PeerRole.VOTER, PeerRole.LEARNER
ADD, REMOVE = StoreLimitType.ADD_PEER, StoreLimitType.REMOVE_PEER


def make_region(rid, stores=(1, 2, 3), leader_store=None, conf_ver=1, version=1, size=50, extra=(), pending=()):
    """Region ``rid`` with voters on ``stores`` (peer id = rid*100 + store) plus ``extra`` peers."""
    peers = [Peer(rid * 100 + s, s, V) for s in stores] + [Peer(pid, s, role) for pid, s, role in extra]
    leader_store = stores[0] if leader_store is None else leader_store
    leader = next(p for p in peers if p.store_id == leader_store)
    start = bytes([rid])
    return Region(rid, start, bytes([rid + 1]), RegionEpoch(conf_ver, version), tuple(peers), leader,
                  approximate_size=size, pending_peers=tuple(pending))


@pytest.fixture
def cluster():
    c = Cluster(clock=lambda: 0.0)
    for sid in range(1, 7):
        c.put_store(Store(sid, capacity=1000, available=1000))
    for rid in range(1, 21):
        c.put_region(make_region(rid))
    return c


def make_controller(cluster, **config):
    cfg = ScheduleConfig(**{"store_limit_add_peer": 6000.0, "store_limit_remove_peer": 6000.0, **config})
    return OperatorController(cluster, cfg, clock=lambda: 0.0)


@pytest.fixture
def ids():
    return builder.PeerIds(10_000)


def tl(cluster, rid, to_store, now=0.0, priority=Priority.MEDIUM, kind=OpKind.LEADER):
    return builder.transfer_leader("balance-leader", cluster.regions[rid], to_store, now, kind=kind, priority=priority)


def heartbeat(cluster, ctrl, region, now):
    cluster.put_region(region)
    return ctrl.dispatch(region, now)


# -- store limits --------------------------------------------------------------
class TestStoreLimiter:
    def test_bucket_starts_full_and_refills_at_the_rate(self):
        lim = StoreLimiter(rate_add=30, rate_remove=30)  # one peer every 2 s, burst 1
        assert lim.available(1, ADD, now=0) == pytest.approx(1.0)
        assert lim.take(1, ADD, 1.0, now=0)
        assert not lim.take(1, ADD, 1.0, now=1.0)  # half a token
        assert lim.available(1, ADD, now=1.0) == pytest.approx(0.5)
        assert lim.take(1, ADD, 1.0, now=2.0)

    def test_refused_take_spends_nothing(self):
        lim = StoreLimiter(rate_add=60)
        lim.take(1, ADD, 0.6, now=0)
        assert not lim.take(1, ADD, 0.5, now=0)
        assert lim.available(1, ADD, now=0) == pytest.approx(0.4)

    def test_refill_is_capped_at_the_burst(self):
        lim = StoreLimiter(rate_add=15)
        lim.take(1, ADD, 1.0, now=0)
        assert lim.available(1, ADD, now=3600) == pytest.approx(1.0)
        lim2 = StoreLimiter(rate_add=15, burst=5)
        assert lim2.available(1, ADD, now=0) == pytest.approx(5.0)

    def test_default_burst_follows_pd(self):
        assert default_burst(15) == 1.0
        assert default_burst(600) == 10.0

    def test_directions_and_stores_are_independent(self):
        lim = StoreLimiter(rate_add=15, rate_remove=15)
        assert lim.take(1, ADD, now=0)
        assert lim.take(1, REMOVE, now=0)
        assert lim.take(2, "add-peer", now=0)
        assert not lim.take(1, "add_peer", now=0)

    def test_small_regions_cost_less(self):
        assert step_cost(5) == SMALL_REGION_COST
        assert step_cost(20) == step_cost(144) == 1.0
        lim = StoreLimiter(rate_add=15)
        assert all(lim.take(1, ADD, step_cost(5), now=0) for _ in range(5))  # 5 x 0.2 fits in one peer
        assert not lim.take(1, ADD, step_cost(5), now=0)

    def test_zero_or_infinite_rate_is_unlimited(self):
        lim = StoreLimiter(rate_add=0, rate_remove=math.inf)
        assert all(lim.take(1, ADD, 1.0, now=0) for _ in range(100))
        assert all(lim.take(1, REMOVE, 1.0, now=0) for _ in range(100))
        assert lim.available(1, ADD, now=0) == math.inf

    def test_time_never_runs_backwards(self):
        lim = StoreLimiter(rate_add=30)
        lim.take(1, ADD, 1.0, now=10)
        assert lim.available(1, ADD, now=5) == pytest.approx(0.0)
        assert lim.available(1, ADD, now=11) == pytest.approx(0.5)

    def test_now_none_uses_the_latest_time_seen(self):
        lim = StoreLimiter(rate_add=30)
        lim.take(1, ADD, 1.0, now=100)
        assert not lim.take(1, ADD)  # no refill without time
        lim.available(2, ADD, now=102)  # time moves on (through another store)
        assert lim.take(1, ADD)

    def test_per_store_override(self):
        lim = StoreLimiter(rate_add=15)
        lim.set_store_rate(3, ADD, 120)  # 2 peers a second, burst 2
        assert lim.rate(3, ADD) == 120 and lim.capacity(3, ADD) == 2
        assert lim.take(3, ADD, now=0) and lim.take(3, ADD, now=0) and not lim.take(3, ADD, now=0)
        lim.set_store_rate(3, ADD, None)
        assert lim.rate(3, ADD) == 15

    def test_take_all_is_all_or_nothing(self):
        lim = StoreLimiter(rate_add=15, rate_remove=15)
        lim.take(2, REMOVE, 1.0, now=0)
        assert lim.take_all({(1, ADD): 1.0, (2, REMOVE): 1.0}, now=0) == (2, REMOVE)
        assert lim.available(1, ADD, now=0) == pytest.approx(1.0)

    def test_bad_input(self):
        with pytest.raises(ValueError, match="store limit type"):
            StoreLimiter().take(1, "sideways")
        with pytest.raises(ValueError, match="cost"):
            StoreLimiter().take(1, ADD, -1)


# -- admission and dispatch ----------------------------------------------------
class TestMovePeerLifecycle:
    def test_move_peer_runs_to_success(self, cluster, ids):
        ctrl = make_controller(cluster)
        op = builder.move_peer("balance-region", cluster.regions[5], 2, 4, ids, now=0)
        assert ctrl.add(op, now=0) and ctrl.last_refusal == ""
        pid = op.steps[0].peer_id
        assert ctrl.get(5) is op and op.status == OpStatus.CREATED
        r = cluster.regions[5]
        assert heartbeat(cluster, ctrl, r, 1) == AddLearner(4, pid) and op.status == OpStatus.STARTED
        r = make_region(5, conf_ver=2, extra=[(pid, 4, L)], pending=(pid,))
        assert heartbeat(cluster, ctrl, r, 2) == AddLearner(4, pid)
        r = make_region(5, conf_ver=2, extra=[(pid, 4, L)])
        assert heartbeat(cluster, ctrl, r, 3) == PromoteLearner(4, pid)
        r = make_region(5, conf_ver=3, extra=[(pid, 4, V)])
        assert heartbeat(cluster, ctrl, r, 4) == RemovePeer(2, 502)
        r = make_region(5, stores=(1, 3), conf_ver=4, extra=[(pid, 4, V)])
        assert heartbeat(cluster, ctrl, r, 5) is None
        assert op.status == OpStatus.SUCCESS and ctrl.get(5) is None
        assert ctrl.history(1) == [op]
        assert ctrl.counts_by_status() == {"success": 1}

    def test_dispatch_without_operator(self, cluster):
        assert make_controller(cluster).dispatch(cluster.regions[1], 0) is None

    def test_skipped_steps_finish_at_once(self, cluster, ids):
        ctrl = make_controller(cluster)
        op = builder.move_peer("x", cluster.regions[5], 2, 4, ids, now=0)
        ctrl.add(op, now=0)
        pid = op.steps[0].peer_id
        # the whole move already happened (e.g. reported late): nothing to send
        done = make_region(5, stores=(1, 3), conf_ver=4, extra=[(pid, 4, V)])
        assert heartbeat(cluster, ctrl, done, 1) is None
        assert op.status == OpStatus.SUCCESS


class TestRefusals:
    def test_stale_epoch_refused_at_add(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 3, 2)
        cluster.put_region(make_region(3, conf_ver=2))
        assert not ctrl.add(op, now=0)
        assert ctrl.last_refusal.startswith("stale epoch")
        assert ctrl.get(3) is None and op.status == OpStatus.CREATED

    def test_unknown_region_refused(self, cluster):
        ctrl = make_controller(cluster)
        op = Operator("x", 99, RegionEpoch(), OpKind.LEADER, [TransferLeader(1, 2)], created_at=0)
        assert not ctrl.add(op, now=0) and "not found" in ctrl.last_refusal

    def test_expired_operator_refused(self, cluster):
        ctrl = make_controller(cluster)
        assert not ctrl.add(tl(cluster, 3, 2, now=0), now=EXPIRE_AFTER + 1)
        assert "expired" in ctrl.last_refusal

    def test_same_operator_twice(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 3, 2)
        assert ctrl.add(op, now=0)
        assert not ctrl.add(op, now=0) and "already" in ctrl.last_refusal


class TestStaleAndTimeouts:
    def test_foreign_epoch_change_cancels(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 4, 2)
        ctrl.add(op, now=0)
        assert heartbeat(cluster, ctrl, cluster.regions[4], 1) == TransferLeader(1, 2)
        # someone else changed membership: conf_ver beyond the operator's own budget
        assert heartbeat(cluster, ctrl, make_region(4, conf_ver=2), 2) is None
        assert op.status == OpStatus.CANCELED and op.cancel_reason == "stale epoch"
        assert ctrl.get(4) is None

    def test_never_started_operator_expires(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 4, 2, now=0)
        ctrl.add(op, now=0)
        assert heartbeat(cluster, ctrl, cluster.regions[4], EXPIRE_AFTER + 0.5) is None
        assert op.status == OpStatus.EXPIRED and ctrl.get(4) is None

    def test_fast_step_times_out(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 4, 2)
        ctrl.add(op, now=0)
        r = cluster.regions[4]
        ctrl.dispatch(r, 0)
        assert ctrl.dispatch(r, 10) == TransferLeader(1, 2)
        assert ctrl.dispatch(r, 10.5) is None
        assert op.status == OpStatus.TIMEOUT and ctrl.get(4) is None

    @pytest.mark.parametrize("size, alive_at, dead_at", [(10, 60.0, 60.5), (3000, 89.0, 90.5)])
    def test_slow_step_timeout_scales_with_size(self, cluster, ids, size, alive_at, dead_at):
        ctrl = make_controller(cluster)
        cluster.put_region(make_region(6, size=size))
        op = builder.add_learner("replica", cluster.regions[6], 4, ids, now=0)
        ctrl.add(op, now=0)
        r = cluster.regions[6]
        ctrl.dispatch(r, 0)
        assert ctrl.dispatch(r, alive_at) == op.steps[0]
        assert ctrl.dispatch(r, dead_at) is None and op.status == OpStatus.TIMEOUT

    def test_check_timeouts_sweeps_silent_regions(self, cluster):
        ctrl = make_controller(cluster)
        started, never = tl(cluster, 1, 2), tl(cluster, 2, 3)
        ctrl.add(started, now=0)
        ctrl.add(never, now=0)
        ctrl.dispatch(cluster.regions[1], 0)
        assert ctrl.check_timeouts(2) == []
        ended = ctrl.check_timeouts(EXPIRE_AFTER + 1)
        assert ended == [never] and never.status == OpStatus.EXPIRED
        assert ctrl.check_timeouts(11) == [started] and started.status == OpStatus.TIMEOUT
        assert ctrl.running() == []

    def test_check_timeouts_notices_progress_in_the_cluster_view(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 1, 2)
        ctrl.add(op, now=0)
        ctrl.dispatch(cluster.regions[1], 0)
        cluster.put_region(make_region(1, leader_store=2))
        ctrl.check_timeouts(30)
        assert op.status == OpStatus.SUCCESS


class TestPriority:
    def test_higher_priority_replaces(self, cluster):
        ctrl = make_controller(cluster)
        low = tl(cluster, 7, 2, priority=Priority.LOW)
        high = tl(cluster, 7, 3, priority=Priority.HIGH)
        assert ctrl.add(low, now=0)
        ctrl.dispatch(cluster.regions[7], 0)
        assert ctrl.add(high, now=1)
        assert low.status == OpStatus.REPLACED and f"#{high.id}" in low.cancel_reason
        assert ctrl.get(7) is high
        assert ctrl.dispatch(cluster.regions[7], 1) == TransferLeader(1, 3)

    @pytest.mark.parametrize("second", [Priority.MEDIUM, Priority.LOW])
    def test_equal_or_lower_priority_is_refused(self, cluster, second):
        ctrl = make_controller(cluster)
        first = tl(cluster, 7, 2)
        ctrl.add(first, now=0)
        assert not ctrl.add(tl(cluster, 7, 3, priority=second), now=0)
        assert "already has operator" in ctrl.last_refusal
        assert ctrl.get(7) is first and first.status == OpStatus.CREATED

    def test_preemption_frees_its_limit_slot(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=1)
        ctrl.add(tl(cluster, 7, 2, priority=Priority.LOW), now=0)
        assert ctrl.add(tl(cluster, 7, 3, priority=Priority.URGENT), now=0)
        assert ctrl.operator_count(OpKind.LEADER) == 1


class TestKindLimitsAndWaiting:
    def test_limit_queues_then_promotes(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=2)
        ops = [tl(cluster, rid, 2) for rid in (1, 2, 3)]
        assert ctrl.add(ops[0], now=0) and ctrl.add(ops[1], now=0)
        assert not ctrl.add(ops[2], now=0)
        assert ctrl.last_refusal.startswith("waiting: leader_schedule_limit 2")
        assert ctrl.get(3) is None and ctrl.get_waiting(3) is ops[2]
        assert ctrl.promote_waiting(0.5) == []  # still full
        ctrl.dispatch(cluster.regions[1], 1)
        heartbeat(cluster, ctrl, make_region(1, leader_store=2), 1.5)
        assert ops[0].status == OpStatus.SUCCESS
        assert ctrl.promote_waiting(2) == [ops[2]]
        assert ctrl.get(3) is ops[2] and ctrl.waiting() == []
        assert ctrl.operator_count(OpKind.LEADER) == 2

    def test_a_waiting_region_refuses_equal_priority(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        assert not ctrl.add(tl(cluster, 1, 2), now=0)
        assert not ctrl.add(tl(cluster, 1, 3), now=0)
        assert "waiting operator" in ctrl.last_refusal
        urgent = tl(cluster, 1, 3, priority=Priority.HIGH)
        waiting = ctrl.get_waiting(1)
        assert not ctrl.add(urgent, now=0)  # still over the limit: queued, and the old waiter is replaced
        assert waiting.status == OpStatus.REPLACED and ctrl.get_waiting(1) is urgent

    def test_promotion_order_is_priority_then_age(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=1)
        blocker = tl(cluster, 20, 2)
        ctrl.add(blocker, now=0)
        low = tl(cluster, 1, 2, now=0.0, priority=Priority.LOW)
        med_old = tl(cluster, 2, 2, now=0.1)
        high = tl(cluster, 3, 2, now=0.2, priority=Priority.HIGH)
        med_new = tl(cluster, 4, 2, now=0.3)
        for op in (low, med_old, high, med_new):
            assert not ctrl.add(op, now=op.created_at)
        assert ctrl.waiting() == [high, med_old, med_new, low]
        order = []
        running = blocker
        for t in (0.5, 0.6, 0.7, 0.8):
            ctrl.remove(running.region_id, now=t)
            (running,) = ctrl.promote_waiting(t)
            order.append(running)
        assert order == [high, med_old, med_new, low]
        assert blocker.status == OpStatus.CANCELED and blocker.cancel_reason == "canceled by admin"

    def test_waiting_operators_expire(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        op = tl(cluster, 1, 2, now=0)
        assert not ctrl.add(op, now=0)
        assert ctrl.promote_waiting(EXPIRE_AFTER + 0.1) == []
        assert op.status == OpStatus.EXPIRED and ctrl.waiting() == []
        assert ctrl.counts_by_status() == {"expired": 1}

    def test_check_timeouts_drops_expired_waiters(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        op = tl(cluster, 1, 2, now=0)
        ctrl.add(op, now=0)
        assert ctrl.check_timeouts(EXPIRE_AFTER + 0.1) == [op]
        assert op.status == OpStatus.EXPIRED

    def test_stale_waiter_is_dropped_on_promotion(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        op = tl(cluster, 1, 2)
        ctrl.add(op, now=0)
        cluster.put_region(make_region(1, version=2))
        ctrl.config.leader_schedule_limit = 5
        assert ctrl.promote_waiting(1) == []
        assert op.status == OpStatus.CANCELED and "stale epoch" in op.cancel_reason

    def test_admin_operators_bypass_kind_limits(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        op = tl(cluster, 1, 2, kind=OpKind.LEADER | OpKind.ADMIN)
        assert ctrl.add(op, now=0)
        assert ctrl.operator_count(OpKind.LEADER) == 1  # counted all the same

    def test_each_flag_counts_against_its_own_limit(self, cluster, ids):
        ctrl = make_controller(cluster, leader_schedule_limit=1, region_schedule_limit=10)
        ctrl.add(tl(cluster, 1, 2), now=0)
        move_leader = builder.move_peer("x", cluster.regions[2], 1, 4, ids, now=0)  # REGION | LEADER
        move_follower = builder.move_peer("x", cluster.regions[3], 2, 4, ids, now=0)
        assert not ctrl.add(move_leader, now=0) and "leader_schedule_limit" in ctrl.last_refusal
        assert ctrl.add(move_follower, now=0)
        assert ctrl.operator_count(OpKind.REGION) == 1

    def test_split_has_no_limit(self, cluster):
        ctrl = make_controller(cluster, region_schedule_limit=0, leader_schedule_limit=0)
        assert ctrl.add(builder.split_region("split", cluster.regions[1], 0), now=0)


class TestStoreLimitAdmission:
    def test_store_limit_queues_until_tokens_refill(self, cluster, ids):
        ctrl = make_controller(cluster, store_limit_add_peer=60.0)  # one peer a second, burst 1
        a = builder.move_peer("x", cluster.regions[1], 2, 4, ids, now=0)
        b = builder.move_peer("x", cluster.regions[2], 2, 4, ids, now=0)
        assert ctrl.add(a, now=0)
        assert not ctrl.add(b, now=0)
        assert ctrl.last_refusal.startswith("waiting: store 4 add-peer limit")
        assert ctrl.promote_waiting(0.5) == []
        assert ctrl.promote_waiting(1.0) == [b]

    def test_remove_side_is_limited_on_the_source(self, cluster, ids):
        ctrl = make_controller(cluster, store_limit_remove_peer=15.0)
        assert ctrl.add(builder.move_peer("x", cluster.regions[1], 3, 4, ids, now=0), now=0)
        assert not ctrl.add(builder.move_peer("x", cluster.regions[2], 3, 5, ids, now=0), now=0)
        assert "store 3 remove-peer" in ctrl.last_refusal
        assert ctrl.add(builder.move_peer("x", cluster.regions[3], 2, 5, ids, now=0), now=0)

    def test_small_regions_cost_a_fifth(self, cluster, ids):
        ctrl = make_controller(cluster, store_limit_add_peer=15.0)
        for rid in range(1, 7):
            cluster.put_region(make_region(rid, size=5))
        results = [ctrl.add(builder.add_learner("x", cluster.regions[rid], 4, ids, now=0), now=0)
                   for rid in range(1, 7)]
        assert results == [True] * 5 + [False]

    def test_leader_moves_take_no_tokens(self, cluster):
        ctrl = make_controller(cluster, store_limit_add_peer=15.0, store_limit_remove_peer=15.0)
        assert all(ctrl.add(tl(cluster, rid, 2), now=0) for rid in (1, 2, 3, 4))

    def test_config_changes_reach_the_limiter(self, cluster, ids):
        ctrl = make_controller(cluster)
        ctrl.config.set("store_limit_add_peer", "15")
        assert ctrl.add(builder.add_learner("x", cluster.regions[1], 4, ids, now=0), now=0)
        assert not ctrl.add(builder.add_learner("x", cluster.regions[2], 4, ids, now=0), now=0)


class TestMerge:
    def pair(self, cluster):
        return builder.merge_regions("merge-checker", cluster.regions[8], cluster.regions[9], 0)

    def test_pair_admitted_together(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        assert ctrl.add_pair(src, dst, now=0)
        assert ctrl.get(8) is src and ctrl.get(9) is dst
        assert ctrl.operator_count(OpKind.MERGE) == 2

    def test_pair_refused_together(self, cluster):
        ctrl = make_controller(cluster)
        ctrl.add(tl(cluster, 9, 2, priority=Priority.HIGH), now=0)
        src, dst = self.pair(cluster)
        assert not ctrl.add_pair(src, dst, now=0)
        assert "region 9" in ctrl.last_refusal and ctrl.get(8) is None

    def test_pair_refused_when_one_side_is_stale(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        cluster.put_region(make_region(8, version=2))
        assert not ctrl.add_pair(src, dst, now=0)
        assert ctrl.get(9) is None

    def test_pair_waits_together(self, cluster):
        ctrl = make_controller(cluster, merge_schedule_limit=3)
        assert ctrl.add_pair(*builder.merge_regions("m", cluster.regions[1], cluster.regions[2], 0), now=0)
        src, dst = self.pair(cluster)
        assert not ctrl.add_pair(src, dst, now=0) and "merge_schedule_limit 3" in ctrl.last_refusal
        assert ctrl.get(8) is None and ctrl.get(9) is None
        assert ctrl.waiting() == [src, dst]
        ctrl.remove(1, now=0.5)  # cancels its partner on region 2 as well
        assert ctrl.promote_waiting(0.5) == [src, dst]

    def test_merge_completes(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        ctrl.add_pair(src, dst, now=0)
        assert heartbeat(cluster, ctrl, cluster.regions[8], 1) == src.steps[0]
        assert heartbeat(cluster, ctrl, cluster.regions[9], 1) == dst.steps[0]
        # the source merged into the target: it disappears, the target's version grows
        cluster.remove_region(8)
        assert ctrl.region_removed(8, now=2) is src
        assert src.status == OpStatus.SUCCESS
        assert heartbeat(cluster, ctrl, make_region(9, version=2), 3) is None
        assert dst.status == OpStatus.SUCCESS
        assert ctrl.counts_by_status() == {"success": 2}

    def test_region_removed_cancels_other_operators(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 5, 2)
        ctrl.add(op, now=0)
        ctrl.dispatch(cluster.regions[5], 0)
        assert ctrl.region_removed(5, now=1) is op
        assert op.status == OpStatus.CANCELED and op.cancel_reason == "region removed"

    def test_unstarted_merge_source_is_not_a_success(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        ctrl.add_pair(src, dst, now=0)
        ctrl.region_removed(8, now=1)
        assert src.status == OpStatus.CANCELED and dst.status == OpStatus.CANCELED

    def test_failed_half_cancels_its_partner(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        ctrl.add_pair(src, dst, now=0)
        ctrl.dispatch(cluster.regions[8], 0)
        ctrl.dispatch(cluster.regions[9], 0)
        heartbeat(cluster, ctrl, make_region(9, conf_ver=2), 1)  # foreign change on the target
        assert dst.status == OpStatus.CANCELED
        assert src.status == OpStatus.CANCELED and "merge partner" in src.cancel_reason
        assert ctrl.running() == []

    def test_check_timeouts_finishes_a_vanished_source(self, cluster):
        ctrl = make_controller(cluster)
        src, dst = self.pair(cluster)
        ctrl.add_pair(src, dst, now=0)
        ctrl.dispatch(cluster.regions[8], 0)
        cluster.remove_region(8)
        ctrl.check_timeouts(1)
        assert src.status == OpStatus.SUCCESS and dst.status == OpStatus.CREATED


class TestInfluence:
    def test_move_peer(self, cluster, ids):
        ctrl = make_controller(cluster)
        cluster.put_region(make_region(5, size=40))
        op = builder.move_peer("x", cluster.regions[5], 2, 4, ids, now=0)
        ctrl.add(op, now=0)
        inf = ctrl.influence()
        assert (inf[4].region_size, inf[4].region_count) == (40, 1)
        assert (inf[2].region_size, inf[2].region_count) == (-40, -1)
        assert inf[4].leader_count == inf[2].leader_count == 0
        assert set(inf) == {2, 4}

    def test_finished_steps_no_longer_count(self, cluster, ids):
        ctrl = make_controller(cluster)
        cluster.put_region(make_region(5, size=40))
        op = builder.move_peer("x", cluster.regions[5], 2, 4, ids, now=0)
        ctrl.add(op, now=0)
        pid = op.steps[0].peer_id
        heartbeat(cluster, ctrl, make_region(5, size=40, conf_ver=2, extra=[(pid, 4, L)]), 1)
        inf = ctrl.influence()
        assert 4 not in inf and (inf[2].region_size, inf[2].region_count) == (-40, -1)

    def test_transfer_leader(self, cluster):
        ctrl = make_controller(cluster)
        cluster.put_region(make_region(6, size=30))
        ctrl.add(tl(cluster, 6, 3), now=0)
        inf = ctrl.influence()
        assert (inf[1].leader_size, inf[1].leader_count) == (-30, -1)
        assert (inf[3].leader_size, inf[3].leader_count) == (30, 1)
        assert inf[1].region_count == inf[3].region_count == 0

    def test_move_leader_peer_sums_per_store(self, cluster, ids):
        ctrl = make_controller(cluster)
        ctrl.add(builder.move_peer("x", cluster.regions[5], 1, 4, ids, now=0), now=0)
        ctrl.add(tl(cluster, 6, 4), now=0)
        inf = ctrl.influence()
        assert (inf[4].region_size, inf[4].region_count, inf[4].leader_count, inf[4].leader_size) == (50, 1, 2, 100)
        assert (inf[1].region_count, inf[1].leader_count) == (-1, -2)

    def test_empty(self, cluster):
        assert make_controller(cluster).influence() == {}


class TestAdminAndReading:
    def test_remove_cancels_with_reason(self, cluster):
        ctrl = make_controller(cluster)
        op = tl(cluster, 1, 2)
        ctrl.add(op, now=0)
        assert ctrl.remove(1, "operator by hand", now=1)
        assert op.status == OpStatus.CANCELED and op.cancel_reason == "operator by hand" and op.ended_at == 1
        assert not ctrl.remove(1)

    def test_remove_a_waiting_operator(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=0)
        op = tl(cluster, 1, 2)
        ctrl.add(op, now=0)
        assert ctrl.remove(1, now=0) and op.status == OpStatus.CANCELED and ctrl.waiting() == []

    def test_history_most_recent_first_and_limited(self, cluster):
        ctrl = OperatorController(cluster, ScheduleConfig(), clock=lambda: 0.0, history_size=3)
        ops = [tl(cluster, rid, 2) for rid in range(1, 6)]
        for op in ops:
            ctrl.add(op, now=0)
        for t, op in enumerate(ops):
            ctrl.remove(op.region_id, now=t)
        assert ctrl.history() == [ops[4], ops[3], ops[2]]
        assert ctrl.history(1) == [ops[4]]
        assert ctrl.counts_by_status() == {"canceled": 5}

    def test_counts_by_status_mixes_running_waiting_ended(self, cluster):
        ctrl = make_controller(cluster, leader_schedule_limit=2)
        a, b, c, d = (tl(cluster, rid, 2) for rid in (1, 2, 3, 4))
        for op in (a, b, c):
            ctrl.add(op, now=0)
        ctrl.dispatch(cluster.regions[1], 0)
        ctrl.add(d, now=0)
        ctrl.remove(3, now=0)
        assert ctrl.counts_by_status() == {"started": 1, "created": 1, "canceled": 1, "waiting": 1}
        assert ctrl.busy_region_ids() == {1, 2, 4}

    def test_clock_is_used_when_now_is_omitted(self, cluster):
        t = [0.0]
        ctrl = OperatorController(cluster, ScheduleConfig(), clock=lambda: t[0])
        op = tl(cluster, 1, 2)
        ctrl.add(op)
        t[0] = EXPIRE_AFTER + 1
        assert ctrl.dispatch(cluster.regions[1]) is None and op.status == OpStatus.EXPIRED

    def test_to_json(self, cluster):
        ctrl = make_controller(cluster)
        ctrl.add(tl(cluster, 1, 2), now=0)
        j = ctrl.to_json()
        assert j["running"][0]["region_id"] == 1 and j["counts"] == {"created": 1}


class TestInvariants:
    def test_random_workload_keeps_books_straight(self, cluster, ids):
        """A seeded random mix of adds, heartbeats, sweeps and removals: the
        per-kind counts, the queue index and the partner links stay consistent."""
        import random
        from collections import Counter

        from opforge.placement.operator.controller import KIND_LIMITS

        rng = random.Random(7)
        ctrl = make_controller(cluster, leader_schedule_limit=3, region_schedule_limit=4, merge_schedule_limit=2,
                               store_limit_add_peer=30.0, store_limit_remove_peer=30.0)
        now = 0.0
        for _ in range(600):
            now += rng.random() * 0.5
            rid = rng.randint(1, 19)
            r = cluster.regions[rid]
            action = rng.random()
            prio = rng.choice(list(Priority))
            if action < 0.3:
                ctrl.add(tl(cluster, rid, rng.choice([2, 3]), now=now, priority=prio), now=now)
            elif action < 0.5:
                ctrl.add(builder.move_peer("m", r, rng.choice([2, 3]), rng.choice([4, 5, 6]), ids, now), now=now)
            elif action < 0.55:
                ctrl.add_pair(*builder.merge_regions("merge", r, cluster.regions[rid + 1], now), now=now)
            elif action < 0.8:
                ctrl.dispatch(r, now)
            elif action < 0.9:
                ctrl.check_timeouts(now)
                ctrl.promote_waiting(now)
            else:
                ctrl.remove(rid, now=now)
            running = ctrl.running()
            want = Counter(flag for op in running for flag, _ in KIND_LIMITS if flag in op.kind)
            for flag, _ in KIND_LIMITS:
                assert ctrl.operator_count(flag) == want[flag]
            assert all(op.status in (OpStatus.CREATED, OpStatus.STARTED) for op in running)
            waiting = ctrl.waiting()
            assert all(op.status == OpStatus.CREATED for op in waiting)
            assert {op.region_id for op in waiting} == set(ctrl._waiting)
            assert all(ctrl.get(op.region_id) is not op for op in waiting)
            assert all(op.status.is_end for op in ctrl.history())
            for op_id, partner in ctrl._partner.items():
                assert ctrl._partner[partner.id].id == op_id
        counts = ctrl.counts_by_status()
        assert {"replaced", "expired", "canceled", "timeout"} <= set(counts)  # the paths were exercised
