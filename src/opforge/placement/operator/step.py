"""Operator steps. Each step knows, from the region a heartbeat reports,
whether it has completed: so a step the leader skipped, ran twice, or that
finished before we asked is handled by looking, not by trusting replies."""

from __future__ import annotations

from dataclasses import dataclass

from opforge.placement.cluster import PeerRole, Region

# Seconds a step may take before its operator times out: fast steps touch
# metadata only; slow ones copy the region's data (a snapshot).
FAST_STEP_TIMEOUT = 10.0
SLOW_STEP_BASE_TIMEOUT = 60.0
SNAPSHOT_MIB_PER_S = 100.0


@dataclass(frozen=True)
class Step:
    """One change to one region, run by its leader."""

    def is_finished(self, region: Region) -> bool:
        raise NotImplementedError

    def timeout(self, region: Region) -> float:
        return FAST_STEP_TIMEOUT

    def to_json(self) -> dict:
        d = {"kind": type(self).__name__}
        d.update(self.__dict__)
        return d


def _slow(region: Region) -> float:
    return SLOW_STEP_BASE_TIMEOUT + region.approximate_size / SNAPSHOT_MIB_PER_S


@dataclass(frozen=True)
class TransferLeader(Step):
    from_store: int
    to_store: int

    def is_finished(self, region: Region) -> bool:
        return region.leader is not None and region.leader.store_id == self.to_store


@dataclass(frozen=True)
class AddLearner(Step):
    to_store: int
    peer_id: int

    def is_finished(self, region: Region) -> bool:
        p = region.peer_on(self.to_store)
        return p is not None and p.id == self.peer_id and p.id not in region.pending_peers

    def timeout(self, region: Region) -> float:
        return _slow(region)


@dataclass(frozen=True)
class AddPeer(Step):
    """Add a voter directly (no learner phase): only for regions with one replica."""

    to_store: int
    peer_id: int

    def is_finished(self, region: Region) -> bool:
        p = region.peer_on(self.to_store)
        return p is not None and p.id == self.peer_id and p.is_voter and p.id not in region.pending_peers

    def timeout(self, region: Region) -> float:
        return _slow(region)


@dataclass(frozen=True)
class PromoteLearner(Step):
    to_store: int
    peer_id: int

    def is_finished(self, region: Region) -> bool:
        p = region.peer_on(self.to_store)
        return p is not None and p.id == self.peer_id and p.role == PeerRole.VOTER


@dataclass(frozen=True)
class RemovePeer(Step):
    from_store: int
    peer_id: int

    def is_finished(self, region: Region) -> bool:
        return region.peer_on(self.from_store) is None


@dataclass(frozen=True)
class ChangePeerV2Enter(Step):
    """Enter joint consensus: learners to promote become incoming voters,
    voters to demote become demoting voters, in one membership change."""

    promote: tuple[int, ...]  # store ids of learners to promote
    demote: tuple[int, ...]  # store ids of voters to demote

    def is_finished(self, region: Region) -> bool:
        for s in self.promote:
            p = region.peer_on(s)
            if p is None or p.role not in (PeerRole.INCOMING_VOTER, PeerRole.VOTER):
                return False
        for s in self.demote:
            p = region.peer_on(s)
            if p is None or p.role not in (PeerRole.DEMOTING_VOTER, PeerRole.LEARNER):
                return False
        return True


@dataclass(frozen=True)
class ChangePeerV2Leave(Step):
    promote: tuple[int, ...]
    demote: tuple[int, ...]

    def is_finished(self, region: Region) -> bool:
        if region.in_joint_state:
            return False
        return all((p := region.peer_on(s)) is not None and p.role == PeerRole.VOTER for s in self.promote) and all(
            (p := region.peer_on(s)) is None or p.role == PeerRole.LEARNER for s in self.demote)


@dataclass(frozen=True)
class SplitRegion(Step):
    """Split at ``keys`` (empty: the leader picks the middle key)."""

    start_version: int
    keys: tuple[bytes, ...] = ()

    def is_finished(self, region: Region) -> bool:
        return region.epoch.version > self.start_version

    def to_json(self) -> dict:
        return {"kind": "SplitRegion", "start_version": self.start_version, "keys": [k.hex() for k in self.keys]}


@dataclass(frozen=True)
class MergeRegion(Step):
    """Merge ``from_region`` into its neighbour ``to_region``. The source's
    operator runs it (active); the target's operator only waits (passive)."""

    from_region: int
    to_region: int
    is_passive: bool
    start_version: int

    def is_finished(self, region: Region) -> bool:
        # The target's version grows when it absorbs the source; the source
        # itself disappears (the controller finishes its operator then).
        return self.is_passive and region.epoch.version > self.start_version

    def timeout(self, region: Region) -> float:
        return _slow(region)
