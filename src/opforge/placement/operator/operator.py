"""An Operator: the ordered steps that take one region from what it is to
what a scheduler or checker wants, with a status, a priority and deadlines."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum, IntEnum, IntFlag

from opforge.placement.cluster import Region, RegionEpoch
from opforge.placement.operator.step import MergeRegion, Step

# An operator created but not started within this many seconds has expired
# (PD's value). PD pushes a new operator's first step at once; here steps ride
# on region heartbeat replies, so a worker whose region has an operator
# heartbeats that region promptly (the simulator and client.HeartbeatLoop do).
EXPIRE_AFTER = 3.0


class OpKind(IntFlag):
    LEADER = 1  # moves leadership
    REGION = 2  # moves data (peers)
    SPLIT = 4
    MERGE = 8
    HOT = 16
    REPLICA = 32  # repairs replica count or placement
    ADMIN = 64  # asked for by a person


class OpStatus(str, Enum):
    CREATED = "created"
    STARTED = "started"
    SUCCESS = "success"
    CANCELED = "canceled"
    REPLACED = "replaced"
    EXPIRED = "expired"
    TIMEOUT = "timeout"

    @property
    def is_end(self) -> bool:
        return self not in (OpStatus.CREATED, OpStatus.STARTED)


class Priority(IntEnum):
    LOW = 0
    MEDIUM = 1
    HIGH = 2
    URGENT = 3


_ids = itertools.count(1)


@dataclass
class Operator:
    desc: str  # which scheduler or checker made it, e.g. "balance-leader"
    region_id: int
    epoch: RegionEpoch  # the region's epoch when the operator was made
    kind: OpKind
    steps: list[Step]
    priority: Priority = Priority.MEDIUM
    created_at: float = 0.0
    id: int = field(default_factory=lambda: next(_ids))
    status: OpStatus = OpStatus.CREATED
    current: int = 0  # index of the step in progress
    started_at: float = 0.0
    step_started_at: float = 0.0
    ended_at: float = 0.0
    cancel_reason: str = ""

    def __str__(self) -> str:
        steps = ", ".join(f"{type(s).__name__}{tuple(v for v in s.__dict__.values())}" for s in self.steps)
        return f"{self.desc} #{self.id} region {self.region_id} [{self.status.value}] {self.current}/{len(self.steps)}: {steps}"

    # -- lifecycle ---------------------------------------------------------
    def start(self, now: float) -> None:
        if self.status == OpStatus.CREATED:
            self.status, self.started_at, self.step_started_at = OpStatus.STARTED, now, now

    def end(self, status: OpStatus, now: float, reason: str = "") -> None:
        if not self.status.is_end:
            self.status, self.ended_at, self.cancel_reason = status, now, reason

    def check(self, region: Region, now: float) -> Step | None:
        """Advance past every step the region shows finished; return the step
        to run now, or None when the operator is done (status SUCCESS)."""
        if self.status.is_end:
            return None
        while self.current < len(self.steps) and self.steps[self.current].is_finished(region):
            self.current += 1
            self.step_started_at = now
        if self.current >= len(self.steps):
            self.end(OpStatus.SUCCESS, now)
            return None
        return self.steps[self.current]

    def is_stale(self, region: Region) -> bool:
        """The region changed in a way the operator did not cause and cannot follow.

        Membership changes the operator itself makes bump conf_ver, and a merge or
        split it runs bumps version; anything beyond the steps' own budget is stale."""
        conf_budget = sum(1 for s in self.steps if type(s).__name__ in _CONF_CHANGES)
        version_budget = sum(1 for s in self.steps if type(s).__name__ == "SplitRegion")
        if region.epoch.conf_ver < self.epoch.conf_ver or region.epoch.version < self.epoch.version:
            return True
        if region.epoch.conf_ver > self.epoch.conf_ver + conf_budget:
            return True
        # A merge sets the target's version to max(source, target) + 1: any rise is its own.
        merging = any(type(s).__name__ == "MergeRegion" for s in self.steps)
        return not merging and region.epoch.version > self.epoch.version + version_budget

    def is_timed_out(self, region: Region, now: float) -> bool:
        if self.status == OpStatus.CREATED:
            return now - self.created_at > EXPIRE_AFTER
        if self.status != OpStatus.STARTED or self.current >= len(self.steps):
            return False
        return now - self.step_started_at > self.steps[self.current].timeout(region)

    @property
    def is_merge_source(self) -> bool:
        return any(isinstance(s, MergeRegion) and not s.is_passive for s in self.steps)

    def to_json(self) -> dict:
        return {"id": self.id, "desc": self.desc, "region_id": self.region_id, "kind": int(self.kind),
                "kind_names": [k.name.lower() for k in OpKind if k in self.kind],
                "priority": self.priority.name.lower(), "status": self.status.value, "current_step": self.current,
                "steps": [s.to_json() for s in self.steps], "epoch": [self.epoch.conf_ver, self.epoch.version],
                "cancel_reason": self.cancel_reason}


_CONF_CHANGES = {"AddLearner", "AddPeer", "PromoteLearner", "RemovePeer", "ChangePeerV2Enter", "ChangePeerV2Leave"}
