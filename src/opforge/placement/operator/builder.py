"""Building operators from intent: "move this peer", "transfer this leader".

Schedulers and checkers say what they want; the builder turns it into safe
steps (a new peer joins as a learner, catches up, then becomes a voter; a
leader never sits on a peer about to be removed)."""

from __future__ import annotations

import threading

from opforge.placement.cluster import Region
from opforge.placement.operator.operator import Operator, OpKind, Priority
from opforge.placement.operator.step import (
    AddLearner, MergeRegion, PromoteLearner, RemovePeer, SplitRegion, TransferLeader,
)


class PeerIds:
    """Allocates peer ids that no region has used (PD's id allocator)."""

    def __init__(self, start: int = 1_000_000):
        self._next = start
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            n = self._next
            self._next += 1
            return n

    def peek(self) -> int:
        """The id the next call will hand out (not taken)."""
        return self._next

    def advance_past(self, used: int) -> None:
        """Never hand out an id at or below ``used`` (a heartbeat or a reload saw it)."""
        if used >= self._next:
            with self._lock:
                self._next = max(self._next, used + 1)


def transfer_leader(desc: str, region: Region, to_store: int, now: float,
                    kind: OpKind = OpKind.LEADER, priority: Priority = Priority.MEDIUM) -> Operator:
    return Operator(desc, region.id, region.epoch, kind,
                    [TransferLeader(region.leader.store_id, to_store)], priority, now)


def add_peer(desc: str, region: Region, to_store: int, ids: PeerIds, now: float,
             kind: OpKind = OpKind.REGION, priority: Priority = Priority.MEDIUM) -> Operator:
    pid = ids()
    return Operator(desc, region.id, region.epoch, kind,
                    [AddLearner(to_store, pid), PromoteLearner(to_store, pid)], priority, now)


def add_learner(desc: str, region: Region, to_store: int, ids: PeerIds, now: float,
                kind: OpKind = OpKind.REGION, priority: Priority = Priority.MEDIUM) -> Operator:
    return Operator(desc, region.id, region.epoch, kind, [AddLearner(to_store, ids())], priority, now)


def promote_learner(desc: str, region: Region, store: int, now: float,
                    kind: OpKind = OpKind.REPLICA, priority: Priority = Priority.MEDIUM) -> Operator:
    p = region.peer_on(store)
    return Operator(desc, region.id, region.epoch, kind, [PromoteLearner(store, p.id)], priority, now)


def remove_peer(desc: str, region: Region, from_store: int, now: float, candidates: list[int] | None = None,
                kind: OpKind = OpKind.REGION, priority: Priority = Priority.MEDIUM) -> Operator:
    """Remove the peer on ``from_store``; if it leads, first hand leadership to
    a follower (the first of ``candidates`` that is one, else any)."""
    steps = []
    if region.leader is not None and region.leader.store_id == from_store:
        target = _leader_target(region, from_store, candidates)
        if target is None:
            raise ValueError(f"region {region.id}: no follower can take the leader from store {from_store}")
        steps.append(TransferLeader(from_store, target))
        kind |= OpKind.LEADER
    steps.append(RemovePeer(from_store, region.peer_on(from_store).id))
    return Operator(desc, region.id, region.epoch, kind, steps, priority, now)


def move_peer(desc: str, region: Region, from_store: int, to_store: int, ids: PeerIds, now: float,
              kind: OpKind = OpKind.REGION, priority: Priority = Priority.MEDIUM) -> Operator:
    """Replace the peer on ``from_store`` by a new one on ``to_store``: add a
    learner, promote it, move the leader off ``from_store`` if needed, remove."""
    old = region.peer_on(from_store)
    pid = ids()
    steps = [AddLearner(to_store, pid)]
    if old.is_voter:
        steps.append(PromoteLearner(to_store, pid))
    if region.leader is not None and region.leader.store_id == from_store:
        steps.append(TransferLeader(from_store, to_store if old.is_voter else _leader_target(region, from_store, None)))
        kind |= OpKind.LEADER
    steps.append(RemovePeer(from_store, old.id))
    return Operator(desc, region.id, region.epoch, kind, steps, priority, now)


def split_region(desc: str, region: Region, now: float, keys: tuple[bytes, ...] = (),
                 priority: Priority = Priority.MEDIUM) -> Operator:
    return Operator(desc, region.id, region.epoch, OpKind.SPLIT, [SplitRegion(region.epoch.version, keys)],
                    priority, now)


def merge_regions(desc: str, source: Region, target: Region, now: float) -> tuple[Operator, Operator]:
    """Two operators: the source merges itself into ``target``; the target waits."""
    active = Operator(desc, source.id, source.epoch, OpKind.MERGE,
                      [MergeRegion(source.id, target.id, False, source.epoch.version)], Priority.MEDIUM, now)
    passive = Operator(desc, target.id, target.epoch, OpKind.MERGE,
                       [MergeRegion(source.id, target.id, True, target.epoch.version)], Priority.MEDIUM, now)
    return active, passive


def _leader_target(region: Region, from_store: int, candidates: list[int] | None) -> int | None:
    followers = [p.store_id for p in region.followers() if p.store_id != from_store
                 and p.id not in region.down_peers and p.id not in region.pending_peers]
    for c in candidates or []:
        if c in followers:
            return c
    return followers[0] if followers else None
