"""What a scheduler or checker may read and use while it proposes operators."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from opforge.placement.cluster import Cluster, Region
from opforge.placement.config import ScheduleConfig
from opforge.placement.operator.builder import PeerIds
from opforge.placement.operator.operator import Operator


@dataclass
class StoreInfluence:
    """What running operators will change on a store once they finish
    (schedulers count it, so they do not pile moves onto one store: PD's
    "pending influence")."""

    region_size: int = 0
    region_count: int = 0
    leader_size: int = 0
    leader_count: int = 0


@dataclass
class ScheduleContext:
    cluster: Cluster
    config: ScheduleConfig
    now: float
    rng: random.Random
    ids: PeerIds
    influence: dict[int, StoreInfluence] = field(default_factory=dict)
    rules: object | None = None  # placement.rules.RuleManager when rules are on
    busy_regions: set[int] = field(default_factory=set)  # regions that already have an operator

    def store_influence(self, store_id: int) -> StoreInfluence:
        return self.influence.get(store_id) or StoreInfluence()


class Scheduler(Protocol):
    name: str  # "balance-leader"

    def schedule(self, ctx: ScheduleContext) -> list[Operator]:
        ...


class Checker(Protocol):
    name: str  # "rule-checker"

    def check(self, region: Region, ctx: ScheduleContext) -> list[Operator]:
        ...
