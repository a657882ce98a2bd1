"""Steps, operators and the builder, specified against hand-built region states.

A step is finished when the region a heartbeat reports shows it done: never
because a leader said so. These tests feed regions in and watch."""

import pytest

from opforge.placement.cluster import Peer, PeerRole, Region, RegionEpoch
from opforge.placement.operator import builder
from opforge.placement.operator.operator import EXPIRE_AFTER, Operator, OpKind, OpStatus, Priority
from opforge.placement.operator.step import (
    FAST_STEP_TIMEOUT, SLOW_STEP_BASE_TIMEOUT, SNAPSHOT_MIB_PER_S, AddLearner, AddPeer, ChangePeerV2Enter,
    ChangePeerV2Leave, MergeRegion, PromoteLearner, RemovePeer, SplitRegion, TransferLeader,
)

V, L = PeerRole.VOTER, PeerRole.LEARNER


def region(peers, leader_store=1, conf_ver=1, version=1, size=10, pending=(), rid=7):
    """A region from ``[(peer_id, store_id, role), ...]``."""
    ps = tuple(Peer(pid, sid, role) for pid, sid, role in peers)
    leader = next((p for p in ps if p.store_id == leader_store), None)
    return Region(rid, b"a", b"m", RegionEpoch(conf_ver, version), ps, leader, approximate_size=size,
                  pending_peers=tuple(pending))


BASE = [(11, 1, V), (12, 2, V), (13, 3, V)]


# -- each step's is_finished --------------------------------------------------
class TestTransferLeader:
    def test_not_finished_while_leader_on_source(self):
        assert not TransferLeader(1, 2).is_finished(region(BASE, leader_store=1))

    def test_finished_when_leader_on_target(self):
        assert TransferLeader(1, 2).is_finished(region(BASE, leader_store=2))

    def test_finished_even_if_leader_arrived_on_its_own(self):
        # the leader moved before the step was sent: the step is skipped
        assert TransferLeader(1, 3).is_finished(region(BASE, leader_store=3))

    def test_no_leader_is_not_finished(self):
        assert not TransferLeader(1, 2).is_finished(region(BASE, leader_store=9))

    def test_is_fast(self):
        assert TransferLeader(1, 2).timeout(region(BASE, size=10_000)) == FAST_STEP_TIMEOUT


class TestAddLearner:
    step = AddLearner(4, 20)

    def test_not_finished_before_the_peer_exists(self):
        assert not self.step.is_finished(region(BASE))

    def test_not_finished_while_the_learner_is_pending(self):
        assert not self.step.is_finished(region(BASE + [(20, 4, L)], pending=(20,)))

    def test_finished_once_caught_up(self):
        assert self.step.is_finished(region(BASE + [(20, 4, L)]))

    def test_early_finished_when_already_promoted(self):
        assert self.step.is_finished(region(BASE + [(20, 4, V)]))

    def test_another_peer_on_the_store_does_not_count(self):
        assert not self.step.is_finished(region(BASE + [(99, 4, L)]))

    def test_slow_timeout_grows_with_region_size(self):
        small, big = region(BASE, size=1), region(BASE, size=6000)
        assert self.step.timeout(small) == pytest.approx(SLOW_STEP_BASE_TIMEOUT + 1 / SNAPSHOT_MIB_PER_S)
        assert self.step.timeout(big) == pytest.approx(SLOW_STEP_BASE_TIMEOUT + 60)
        assert self.step.timeout(big) > self.step.timeout(small) > FAST_STEP_TIMEOUT


class TestAddPeer:
    step = AddPeer(4, 20)

    def test_learner_is_not_enough(self):
        assert not self.step.is_finished(region(BASE + [(20, 4, L)]))

    def test_pending_voter_is_not_enough(self):
        assert not self.step.is_finished(region(BASE + [(20, 4, V)], pending=(20,)))

    def test_voter_finishes_it(self):
        assert self.step.is_finished(region(BASE + [(20, 4, V)]))


class TestPromoteLearner:
    step = PromoteLearner(4, 20)

    def test_learner_not_finished(self):
        assert not self.step.is_finished(region(BASE + [(20, 4, L)]))

    def test_incoming_voter_not_finished(self):
        assert not self.step.is_finished(region(BASE + [(20, 4, PeerRole.INCOMING_VOTER)]))

    def test_voter_finished(self):
        assert self.step.is_finished(region(BASE + [(20, 4, V)]))

    def test_is_fast(self):
        assert self.step.timeout(region(BASE, size=5000)) == FAST_STEP_TIMEOUT


class TestRemovePeer:
    step = RemovePeer(3, 13)

    def test_present_not_finished(self):
        assert not self.step.is_finished(region(BASE))

    def test_absent_finished(self):
        assert self.step.is_finished(region(BASE[:2]))

    def test_repeated_heartbeat_stays_finished(self):
        r = region(BASE[:2])
        assert self.step.is_finished(r) and self.step.is_finished(r)


class TestJointConsensus:
    enter = ChangePeerV2Enter(promote=(4,), demote=(3,))
    leave = ChangePeerV2Leave(promote=(4,), demote=(3,))

    def test_enter_waits_for_both_roles(self):
        assert not self.enter.is_finished(region(BASE + [(20, 4, L)]))
        half = region([(11, 1, V), (12, 2, V), (13, 3, V), (20, 4, PeerRole.INCOMING_VOTER)])
        assert not self.enter.is_finished(half)

    def test_enter_finished_in_joint_state(self):
        joint = region([(11, 1, V), (12, 2, V), (13, 3, PeerRole.DEMOTING_VOTER), (20, 4, PeerRole.INCOMING_VOTER)])
        assert self.enter.is_finished(joint)
        assert not self.leave.is_finished(joint)

    def test_leave_finished_after_joint_state(self):
        done = region([(11, 1, V), (12, 2, V), (13, 3, L), (20, 4, V)])
        assert self.enter.is_finished(done)  # already past it: skipped
        assert self.leave.is_finished(done)


class TestSplitAndMerge:
    def test_split_finishes_on_version_bump(self):
        step = SplitRegion(start_version=1)
        assert not step.is_finished(region(BASE, version=1))
        assert step.is_finished(region(BASE, version=2))

    def test_split_json_hex_keys(self):
        assert SplitRegion(1, (b"\x01k",)).to_json() == {"kind": "SplitRegion", "start_version": 1, "keys": ["016b"]}

    def test_passive_merge_finishes_when_target_grows(self):
        step = MergeRegion(7, 8, True, 3)
        assert not step.is_finished(region(BASE, version=3))
        assert step.is_finished(region(BASE, version=4))

    def test_active_merge_never_finishes_by_heartbeat(self):
        step = MergeRegion(7, 8, False, 3)
        assert not step.is_finished(region(BASE, version=9))

    def test_merge_timeout_is_slow(self):
        assert MergeRegion(7, 8, False, 1).timeout(region(BASE, size=100)) == pytest.approx(61.0)


# -- operators over steps ------------------------------------------------------
def make_op(steps, r, kind=OpKind.REGION, now=0.0):
    return Operator("test", r.id, r.epoch, kind, list(steps), Priority.MEDIUM, now)


class TestOperatorCheck:
    def test_returns_first_unfinished_step(self):
        r = region(BASE)
        op = make_op([AddLearner(4, 20), PromoteLearner(4, 20)], r)
        op.start(0)
        assert op.check(r, 1) == AddLearner(4, 20)
        assert op.current == 0

    def test_repeated_heartbeat_returns_same_step(self):
        r = region(BASE)
        op = make_op([TransferLeader(1, 2)], r)
        op.start(0)
        assert op.check(r, 1) == op.check(r, 2) == TransferLeader(1, 2)
        assert op.status == OpStatus.STARTED

    def test_skips_steps_already_done(self):
        # the region already has the caught-up learner: AddLearner is skipped
        r = region(BASE + [(20, 4, L)], conf_ver=2)
        op = make_op([AddLearner(4, 20), PromoteLearner(4, 20)], region(BASE))
        op.start(0)
        assert op.check(r, 5) == PromoteLearner(4, 20)
        assert op.current == 1 and op.step_started_at == 5

    def test_early_finished_operator_succeeds(self):
        done = region([(11, 1, V), (12, 2, V), (20, 4, V)], conf_ver=4)
        op = make_op([AddLearner(4, 20), PromoteLearner(4, 20), RemovePeer(3, 13)], region(BASE))
        op.start(0)
        assert op.check(done, 3) is None
        assert op.status == OpStatus.SUCCESS and op.ended_at == 3

    def test_ended_operator_returns_nothing(self):
        r = region(BASE)
        op = make_op([TransferLeader(1, 2)], r)
        op.end(OpStatus.CANCELED, 1, "test")
        assert op.check(r, 2) is None and op.status == OpStatus.CANCELED

    def test_end_is_final(self):
        op = make_op([TransferLeader(1, 2)], region(BASE))
        op.end(OpStatus.TIMEOUT, 1, "first")
        op.end(OpStatus.SUCCESS, 2)
        assert op.status == OpStatus.TIMEOUT and op.cancel_reason == "first"


class TestOperatorStaleAndTimeout:
    def test_own_conf_changes_are_within_budget(self):
        op = make_op([AddLearner(4, 20), PromoteLearner(4, 20), RemovePeer(3, 13)], region(BASE))
        assert not op.is_stale(region(BASE, conf_ver=4))

    def test_foreign_conf_change_is_stale(self):
        op = make_op([TransferLeader(1, 2)], region(BASE))
        assert op.is_stale(region(BASE, conf_ver=2))

    def test_split_under_the_operator_is_stale(self):
        op = make_op([AddLearner(4, 20)], region(BASE))
        assert op.is_stale(region(BASE, version=2))

    def test_older_epoch_is_stale(self):
        op = make_op([TransferLeader(1, 2)], region(BASE, conf_ver=3))
        assert op.is_stale(region(BASE, conf_ver=2))

    def test_created_operator_expires(self):
        r = region(BASE)
        op = make_op([TransferLeader(1, 2)], r, now=10)
        assert not op.is_timed_out(r, 10 + EXPIRE_AFTER)
        assert op.is_timed_out(r, 10 + EXPIRE_AFTER + 0.01)

    def test_started_fast_step_times_out_after_fast_timeout(self):
        r = region(BASE, size=5000)
        op = make_op([TransferLeader(1, 2)], r)
        op.start(0)
        assert not op.is_timed_out(r, FAST_STEP_TIMEOUT)
        assert op.is_timed_out(r, FAST_STEP_TIMEOUT + 0.01)

    def test_started_slow_step_timeout_depends_on_size(self):
        op_small = make_op([AddLearner(4, 20)], region(BASE, size=1))
        op_big = make_op([AddLearner(4, 20)], region(BASE, size=3000))
        op_small.start(0)
        op_big.start(0)
        small, big = region(BASE, size=1), region(BASE, size=3000)
        assert op_small.is_timed_out(small, 61)
        assert not op_big.is_timed_out(big, 61)  # 60 + 30 s
        assert op_big.is_timed_out(big, 90.5)

    def test_timeout_counts_from_the_current_step(self):
        r0 = region(BASE)
        op = make_op([AddLearner(4, 20), PromoteLearner(4, 20)], r0)
        op.start(0)
        r1 = region(BASE + [(20, 4, L)], conf_ver=2)
        assert op.check(r1, 50) == PromoteLearner(4, 20)
        assert not op.is_timed_out(r1, 59)  # 9 s into the fast step
        assert op.is_timed_out(r1, 60.5)


# -- builder -------------------------------------------------------------------
class TestBuilder:
    def test_move_follower_peer(self):
        ids = builder.PeerIds(100)
        op = builder.move_peer("balance-region", region(BASE), 2, 4, ids, now=0)
        assert op.steps == [AddLearner(4, 100), PromoteLearner(4, 100), RemovePeer(2, 12)]
        assert op.kind == OpKind.REGION

    def test_move_leader_peer_moves_leadership_first(self):
        op = builder.move_peer("balance-region", region(BASE), 1, 4, builder.PeerIds(100), now=0)
        assert op.steps == [AddLearner(4, 100), PromoteLearner(4, 100), TransferLeader(1, 4), RemovePeer(1, 11)]
        assert op.kind == OpKind.REGION | OpKind.LEADER

    def test_move_learner_is_not_promoted(self):
        r = region([(11, 1, V), (12, 2, V), (13, 3, V), (14, 5, L)])
        op = builder.move_peer("x", r, 5, 4, builder.PeerIds(100), now=0)
        assert op.steps == [AddLearner(4, 100), RemovePeer(5, 14)]

    def test_move_peer_walkthrough(self):
        """Feed the region states a leader reports while it moves a leader peer."""
        ids = builder.PeerIds(100)
        r = region(BASE)
        op = builder.move_peer("balance-region", r, 1, 4, ids, now=0)
        op.start(0)
        states = [
            (region(BASE), AddLearner(4, 100)),
            (region(BASE + [(100, 4, L)], conf_ver=2, pending=(100,)), AddLearner(4, 100)),  # snapshot copying
            (region(BASE + [(100, 4, L)], conf_ver=2), PromoteLearner(4, 100)),
            (region(BASE + [(100, 4, V)], conf_ver=3), TransferLeader(1, 4)),
            (region(BASE + [(100, 4, V)], conf_ver=3, leader_store=4), RemovePeer(1, 11)),
            (region(BASE + [(100, 4, V)], conf_ver=3, leader_store=4), RemovePeer(1, 11)),  # repeated
            (region([(12, 2, V), (13, 3, V), (100, 4, V)], conf_ver=4, leader_store=4), None),
        ]
        for t, (state, want) in enumerate(states, start=1):
            assert not op.is_stale(state)
            assert op.check(state, t) == want, f"heartbeat {t}"
        assert op.status == OpStatus.SUCCESS

    def test_add_peer_ids_are_fresh(self):
        ids = builder.PeerIds(5)
        a = builder.add_peer("x", region(BASE), 4, ids, 0)
        b = builder.add_peer("x", region(BASE), 5, ids, 0)
        assert a.steps[0].peer_id != b.steps[0].peer_id

    def test_peer_ids_advance_past(self):
        ids = builder.PeerIds(1)
        ids.advance_past(500)
        assert ids() == 501

    def test_remove_leader_peer_hands_leadership_to_a_candidate(self):
        op = builder.remove_peer("x", region(BASE), 1, 0, candidates=[3])
        assert op.steps == [TransferLeader(1, 3), RemovePeer(1, 11)]
        assert OpKind.LEADER in op.kind

    def test_remove_leader_without_followers_is_refused(self):
        with pytest.raises(ValueError, match="no follower"):
            builder.remove_peer("x", region([(11, 1, V)]), 1, 0)

    def test_remove_follower(self):
        op = builder.remove_peer("x", region(BASE), 3, 0)
        assert op.steps == [RemovePeer(3, 13)]

    def test_transfer_leader(self):
        op = builder.transfer_leader("balance-leader", region(BASE), 2, 0)
        assert op.steps == [TransferLeader(1, 2)] and op.kind == OpKind.LEADER

    def test_merge_pair(self):
        src, dst = region(BASE, rid=7, version=3), region(BASE, rid=8, version=5)
        active, passive = builder.merge_regions("merge", src, dst, 0)
        assert active.is_merge_source and not passive.is_merge_source
        assert active.region_id == 7 and passive.region_id == 8
        assert passive.steps == [MergeRegion(7, 8, True, 5)]
        assert active.kind == passive.kind == OpKind.MERGE

    def test_split(self):
        op = builder.split_region("split", region(BASE, version=4), 0, keys=(b"g",))
        assert op.steps == [SplitRegion(4, (b"g",))] and op.kind == OpKind.SPLIT
