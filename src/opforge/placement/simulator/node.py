"""Simulated GPU workers (stores) and what a region leader does with a step.

A ``Node`` is one store of the simulated cluster. It hosts region replicas
(the true membership lives in ``SimulatedCluster.regions``), receives the
steps the driver answers to its leaders' region heartbeats, and runs them
*asynchronously*, the way a TiKV leader proposes a command and applies it a
little later:

* fast steps (TransferLeader, PromoteLearner, RemovePeer, the joint-consensus
  enter/leave) apply after ``fast_step_ticks`` (1 by default), times the
  node's slow factor;
* AddLearner / AddPeer apply the membership change just as fast (the new peer
  joins *pending*), then a snapshot is copied to the new peer's store: it
  takes ``size / bandwidth`` ticks there, and a store receives at most
  ``snap_limit`` snapshots at once (the rest queue); the peer stops being
  pending when its snapshot is in;
* SplitRegion / MergeRegion take ``split_merge_ticks``.

Like a real leader, a node checks each step against the region *as it is
when the step applies* (the epoch it was received at, that it still leads the
region, that the peer to promote is a learner, ...) and simply drops a step
that no longer fits; the driver notices on the next heartbeat and resends or
gives up. Membership changes bump ``conf_ver`` by one per step; splits and
merges bump ``version`` (as Raft does in TiKV).

``apply_step`` is the leader's state machine; the simulated cluster calls it
when a task is due and records every change it makes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opforge.placement.cluster import Peer, PeerRole, Store
from opforge.placement.operator.step import (
    AddLearner, AddPeer, ChangePeerV2Enter, ChangePeerV2Leave, MergeRegion, PromoteLearner, RemovePeer,
    SplitRegion, Step, TransferLeader,
)

if TYPE_CHECKING:  # pragma: no cover
    from opforge.placement.simulator.simulated_cluster import SimRegion, SimulatedCluster

MIB = 1 << 20
SPLIT_MERGE_STEPS = (SplitRegion, MergeRegion)


@dataclass
class Task:
    """A step a leader received and will apply at ``ready_at``."""

    region_id: int
    step: Step
    operator_id: int | None
    conf_ver: int  # the region epoch the driver answered (the heartbeat's): the step is for that state
    version: int
    ready_at: float
    duplicate: bool = False  # a replay of a step already run (fault injection)


@dataclass
class SnapshotJob:
    """A region snapshot on its way to a new peer's store."""

    region_id: int
    peer_id: int
    from_store: int
    to_store: int
    size: float  # MiB
    remaining: float  # MiB
    operator_id: int | None = None
    started: bool = False


@dataclass
class Node:
    """One simulated store (a GPU worker)."""

    id: int
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int = 1 << 40  # bytes
    snap_bandwidth: float = 64.0  # MiB per tick, per snapshot
    snap_limit: int = 4  # snapshots received at once
    slow: float = 1.0  # > 1: everything this store does takes that much longer
    alive: bool = True
    down_since: float | None = None
    removed: bool = False  # tombstoned and gone for good
    tasks: dict[int, Task] = field(default_factory=dict)  # region id -> its pending task
    receiving: list[SnapshotJob] = field(default_factory=list)  # snapshots being applied
    snap_queue: deque = field(default_factory=deque)  # snapshots waiting for a slot
    # traffic since the last store heartbeat
    bytes_written: float = 0.0
    bytes_read: float = 0.0
    keys_written: float = 0.0
    keys_read: float = 0.0
    query_num: float = 0.0
    last_store_hb: float = 0.0

    @property
    def address(self) -> str:
        return f"sim-worker-{self.id}:20160"

    # -- steps -----------------------------------------------------------
    def receive(self, region_id: int, step: Step, operator_id: int | None, conf_ver: int, version: int,
                now: float, fast_ticks: float, split_merge_ticks: float) -> bool:
        """A step arrived in a heartbeat response, for the region at epoch
        (``conf_ver``, ``version``) as the driver saw it. Queue it unless a
        task for the region is already pending (a resend of what we are doing)."""
        if not self.alive or region_id in self.tasks:
            return False
        # AddLearner/AddPeer: this is the membership change; the snapshot follows
        delay = split_merge_ticks if isinstance(step, SPLIT_MERGE_STEPS) else fast_ticks
        delay = max(1.0, math.ceil(delay * self.slow))
        self.tasks[region_id] = Task(region_id, step, operator_id, conf_ver, version, now + delay)
        return True

    def due_tasks(self, now: float) -> list[Task]:
        if not self.tasks:
            return []
        due = [t for t in self.tasks.values() if t.ready_at <= now]
        for t in due:
            del self.tasks[t.region_id]
        return due

    def go_down(self, now: float) -> None:
        self.alive = False
        self.down_since = now
        self.tasks.clear()  # proposals in flight are lost

    def come_up(self, now: float) -> None:
        self.alive = True
        self.down_since = None

    # -- snapshots -------------------------------------------------------
    def enqueue_snapshot(self, job: SnapshotJob) -> None:
        self.snap_queue.append(job)

    def progress_snapshots(self, sim: "SimulatedCluster") -> list[SnapshotJob]:
        """Advance snapshots by one tick; return those that finished."""
        if not self.alive:
            return []
        done: list[SnapshotJob] = []
        while self.snap_queue and len(self.receiving) < self.snap_limit:
            job = self.snap_queue.popleft()
            if sim.snapshot_wanted(job):
                job.started = True
                self.receiving.append(job)
        if not self.receiving:
            return done
        rate = self.snap_bandwidth / self.slow
        keep: list[SnapshotJob] = []
        for job in self.receiving:
            if not sim.snapshot_wanted(job):
                continue  # the peer was removed meanwhile
            if not sim.snapshot_source_alive(job):
                keep.append(job)  # the sender is down: the snapshot stalls
                continue
            job.remaining -= rate
            if job.remaining <= 1e-9:
                done.append(job)
            else:
                keep.append(job)
        self.receiving = keep
        return done

    def drop_snapshots_of(self, region_id: int, peer_id: int | None = None) -> None:
        def keep(j: SnapshotJob) -> bool:
            return not (j.region_id == region_id and (peer_id is None or j.peer_id == peer_id))

        self.receiving = [j for j in self.receiving if keep(j)]
        self.snap_queue = deque(j for j in self.snap_queue if keep(j))

    # -- heartbeats ------------------------------------------------------
    def store_heartbeat(self, sim: "SimulatedCluster", now: float) -> Store:
        used_mib = sim.used_mib(self.id)
        used = min(int(used_mib * MIB), self.capacity)
        interval = max(now - self.last_store_hb, 1.0)
        self.last_store_hb = now
        s = Store(
            id=self.id, address=self.address, labels=dict(self.labels), capacity=self.capacity,
            available=self.capacity - used, used_size=used, region_count=sim.peer_count(self.id),
            sending_snap_count=sim.sending_snapshots(self.id),
            receiving_snap_count=len(self.receiving) + len(self.snap_queue),
            is_busy=self.slow > 2.0,
            # rates per second over the heartbeat interval (PD divides by the interval)
            bytes_written=int(self.bytes_written / interval), bytes_read=int(self.bytes_read / interval),
            keys_written=int(self.keys_written / interval), keys_read=int(self.keys_read / interval),
            query_num=int(self.query_num / interval),
        )
        self.bytes_written = self.bytes_read = self.keys_written = self.keys_read = self.query_num = 0.0
        return s


# ---------------------------------------------------------------------------
# The leader's state machine.

@dataclass
class StepOutcome:
    applied: bool
    reason: str = ""  # why it was dropped, when it was
    membership_changed: bool = False
    new_regions: tuple = ()  # ids of regions a split created
    merged_away: int | None = None  # id of the region a merge removed


def _drop(reason: str) -> StepOutcome:
    return StepOutcome(False, reason)


def apply_step(sim: "SimulatedCluster", node: Node, task: Task) -> StepOutcome:
    """Run one step as the region's leader on ``node``. Checks everything a
    real leader would; changes the true cluster through ``sim``."""
    region = sim.regions.get(task.region_id)
    step = task.step
    if region is None:
        return _drop("region gone")
    if isinstance(step, MergeRegion) and step.is_passive:
        return _drop("passive merge step (the target only waits)")
    leader = region.leader
    if leader is None or leader.store_id != node.id:
        return _drop("not the leader any more")
    if (region.conf_ver, region.version) != (task.conf_ver, task.version):
        return _drop("epoch changed since the step was received")
    if isinstance(step, TransferLeader):
        if step.to_store == node.id:
            return _drop("already the leader")
        p = region.peer_on(step.to_store)
        if p is None or p.role not in (PeerRole.VOTER, PeerRole.INCOMING_VOTER):
            return _drop("target is not a voter")
        if p.id in region.pending or not sim.is_alive(step.to_store):
            return _drop("target cannot lead (pending or down)")
        sim.set_leader(region, p, cause=task)
        return StepOutcome(True)
    if isinstance(step, (AddLearner, AddPeer)):
        there = region.peer_on(step.to_store)
        if there is not None and there.id == step.peer_id:
            return _drop("already applied (the new peer is catching up)")
        if there is not None or any(p.id == step.peer_id for p in region.peers):
            return _drop("the store already holds a peer of the region")
        if step.to_store not in sim.nodes or sim.nodes[step.to_store].removed:
            return _drop("unknown store")
        role = PeerRole.LEARNER if isinstance(step, AddLearner) else PeerRole.VOTER
        new = Peer(step.peer_id, step.to_store, role)
        sim.change_membership(region, region.peers + (new,), task)
        sim.start_snapshot(region, new, task)
        return StepOutcome(True, membership_changed=True)
    if isinstance(step, PromoteLearner):
        p = region.peer_on(step.to_store)
        if p is None or p.id != step.peer_id or p.role != PeerRole.LEARNER:
            return _drop("no such learner")
        if p.id in region.pending:
            return _drop("learner still pending")
        peers = tuple(Peer(q.id, q.store_id, PeerRole.VOTER) if q.id == p.id else q for q in region.peers)
        sim.change_membership(region, peers, task)
        return StepOutcome(True, membership_changed=True)
    if isinstance(step, RemovePeer):
        p = region.peer_on(step.from_store)
        if p is None or p.id != step.peer_id:
            return _drop("no such peer")
        if p.id == leader.id:
            return _drop("cannot remove the leader")
        if region.in_joint_state:
            return _drop("in joint state")
        sim.change_membership(region, tuple(q for q in region.peers if q.id != p.id), task)
        return StepOutcome(True, membership_changed=True)
    if isinstance(step, ChangePeerV2Enter):
        if region.in_joint_state:
            return _drop("already in joint state")
        promote, demote = set(step.promote), set(step.demote)
        peers = []
        for q in region.peers:
            if q.store_id in promote:
                if q.role != PeerRole.LEARNER or q.id in region.pending:
                    return _drop("peer to promote is not a caught-up learner")
                q = Peer(q.id, q.store_id, PeerRole.INCOMING_VOTER)
            elif q.store_id in demote:
                if q.role != PeerRole.VOTER or q.id == leader.id:
                    return _drop("peer to demote is not a follower voter")
                q = Peer(q.id, q.store_id, PeerRole.DEMOTING_VOTER)
            peers.append(q)
        if len({q.store_id for q in peers} & (promote | demote)) != len(promote | demote):
            return _drop("a peer to change is missing")
        sim.change_membership(region, tuple(peers), task)
        return StepOutcome(True, membership_changed=True)
    if isinstance(step, ChangePeerV2Leave):
        if not region.in_joint_state:
            return _drop("not in joint state")
        if leader.role == PeerRole.DEMOTING_VOTER:
            return _drop("the leader is being demoted")
        peers = []
        for q in region.peers:
            if q.role == PeerRole.INCOMING_VOTER:
                q = Peer(q.id, q.store_id, PeerRole.VOTER)
            elif q.role == PeerRole.DEMOTING_VOTER:
                q = Peer(q.id, q.store_id, PeerRole.LEARNER)
            peers.append(q)
        sim.change_membership(region, tuple(peers), task)
        return StepOutcome(True, membership_changed=True)
    if isinstance(step, SplitRegion):
        if region.version != step.start_version:
            return _drop("already split")
        if region.in_joint_state or region.pending:
            return _drop("in joint state or catching up")
        new_ids = sim.split_region(region, step.keys, task)
        if not new_ids:
            return _drop("no key to split at")
        return StepOutcome(True, new_regions=tuple(new_ids))
    if isinstance(step, MergeRegion):
        if step.from_region != region.id or region.version != step.start_version:
            return _drop("not this region's merge")
        target = sim.regions.get(step.to_region)
        if target is None:
            return _drop("target gone")
        why = sim.merge_blocker(region, target)
        if why:
            return _drop(why)
        sim.merge_regions(region, target, task)
        return StepOutcome(True, merged_away=region.id)
    return _drop(f"unknown step {type(step).__name__}")
