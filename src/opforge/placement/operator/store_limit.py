"""Store limits: how fast peers may arrive at, and leave, each store.

Each store has two token buckets (PD's store limit), one per direction:

* ``ADD_PEER`` -- data arriving at the store (AddLearner / AddPeer: a snapshot
  is copied *to* it);
* ``REMOVE_PEER`` -- data leaving it (RemovePeer).

A bucket refills at ``rate`` peers per minute up to ``burst`` peers. The
operator controller takes tokens when it admits an operator, one bucket for
every store the operator adds a peer to or removes a peer from; an operator
whose stores lack tokens waits.

Costs are in *peers*, scaled by region size as PD does: a region smaller than
``SMALL_REGION_MIB`` (20 MiB) costs ``SMALL_REGION_COST`` (0.2) of a peer, any
other region costs one peer (see ``step_cost``). So at the default 15 peers a
minute a store takes 15 normal regions a minute, or 75 small ones.

The default burst is PD's: one peer, or one second's worth of the rate when
the rate is above 60 peers a minute. A rate of 0 (or infinity) means "no
limit", also as in PD.

Time is always passed in (``now``, seconds on any monotonic scale): the limiter
never reads a clock, so a simulator can drive it. Methods that take
``now=None`` use the latest time the limiter has been given (no refill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

SMALL_REGION_MIB = 20  # PD's SmallRegionThreshold
SMALL_REGION_COST = 0.2  # PD: small influence 200 / normal influence 1000
_EPS = 1e-9  # 5 x 0.2 must fit in 1.0


class StoreLimitType(str, Enum):
    ADD_PEER = "add-peer"  # data arriving at the store
    REMOVE_PEER = "remove-peer"  # data leaving the store

    @classmethod
    def parse(cls, value: "StoreLimitType | str") -> "StoreLimitType":
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower().replace("_", "-")
        for t in cls:
            if t.value == text:
                return t
        raise ValueError(f"store limit type must be one of {[t.value for t in cls]}, got {value!r}")


def step_cost(region_size_mib: float) -> float:
    """Tokens (in peers) that adding or removing one peer of a region of this size costs."""
    return SMALL_REGION_COST if region_size_mib < SMALL_REGION_MIB else 1.0


def default_burst(rate_per_min: float) -> float:
    """PD's bucket capacity: one peer, or one second of the rate if that is more."""
    return max(1.0, rate_per_min / 60.0)


def _unlimited(rate: float) -> bool:
    return rate <= 0 or math.isinf(rate)


@dataclass
class _Bucket:
    tokens: float
    last: float  # time of the last refill
    rate: float | None = None  # peers per minute; None: the limiter's default for the type
    burst: float | None = None  # None: derived from the rate


class StoreLimiter:
    """Token buckets per (store, direction).

    ``rate_add`` / ``rate_remove`` are the default rates in peers per minute
    (``ScheduleConfig.store_limit_add_peer`` / ``store_limit_remove_peer``);
    ``set_store_rate`` overrides one store. ``burst`` overrides the capacity of
    every bucket (in peers); None derives it from the rate (``default_burst``).
    A bucket is created full the first time a store is seen.
    """

    def __init__(self, rate_add: float = 15.0, rate_remove: float = 15.0, burst: float | None = None):
        self._default = {StoreLimitType.ADD_PEER: float(rate_add), StoreLimitType.REMOVE_PEER: float(rate_remove)}
        self._burst = burst
        self._buckets: dict[tuple[int, StoreLimitType], _Bucket] = {}
        self._now = 0.0  # the latest time given

    # -- configuration ---------------------------------------------------
    def set_default_rate(self, kind: StoreLimitType | str, rate_per_min: float) -> None:
        """Change the rate of every store without an override. Time already
        elapsed is credited at the new rate on the next refill."""
        kind = StoreLimitType.parse(kind)
        if rate_per_min < 0:
            raise ValueError(f"store limit {kind.value}: rate must be >= 0 peers per minute, got {rate_per_min}")
        self._default[kind] = float(rate_per_min)

    def set_store_rate(self, store_id: int, kind: StoreLimitType | str, rate_per_min: float | None,
                       burst: float | None = None) -> None:
        """Override one store's rate (None: back to the default) and optionally its burst."""
        kind = StoreLimitType.parse(kind)
        if rate_per_min is not None and rate_per_min < 0:
            raise ValueError(f"store limit {kind.value} of store {store_id}: rate must be >= 0, got {rate_per_min}")
        fresh = (store_id, kind) not in self._buckets
        b = self._bucket(store_id, kind)
        b.rate, b.burst = (None if rate_per_min is None else float(rate_per_min)), burst
        cap = self.capacity(store_id, kind)
        b.tokens = cap if fresh else min(b.tokens, cap)  # a new bucket starts full

    def rate(self, store_id: int, kind: StoreLimitType | str) -> float:
        """Peers per minute for this store and direction."""
        kind = StoreLimitType.parse(kind)
        b = self._buckets.get((store_id, kind))
        return b.rate if b is not None and b.rate is not None else self._default[kind]

    def capacity(self, store_id: int, kind: StoreLimitType | str) -> float:
        """Bucket size in peers (``math.inf`` when the store is unlimited)."""
        kind = StoreLimitType.parse(kind)
        rate = self.rate(store_id, kind)
        if _unlimited(rate):
            return math.inf
        b = self._buckets.get((store_id, kind))
        if b is not None and b.burst is not None:
            return b.burst
        return self._burst if self._burst is not None else default_burst(rate)

    # -- tokens ----------------------------------------------------------
    def available(self, store_id: int, kind: StoreLimitType | str, now: float | None = None) -> float:
        """Tokens (peers) the store can spend now; ``math.inf`` when unlimited."""
        kind = StoreLimitType.parse(kind)
        if _unlimited(self.rate(store_id, kind)):
            return math.inf
        return self._refill(store_id, kind, now).tokens

    def can_take(self, store_id: int, kind: StoreLimitType | str, cost: float = 1.0,
                 now: float | None = None) -> bool:
        return self.available(store_id, kind, now) + _EPS >= cost

    def take(self, store_id: int, kind: StoreLimitType | str, cost: float = 1.0, now: float | None = None) -> bool:
        """Spend ``cost`` tokens if the bucket holds them; False (and nothing spent) if not."""
        kind = StoreLimitType.parse(kind)
        if cost < 0:
            raise ValueError(f"store limit {kind.value}: cost must be >= 0, got {cost}")
        if _unlimited(self.rate(store_id, kind)):
            return True
        b = self._refill(store_id, kind, now)
        if b.tokens + _EPS < cost:
            return False
        b.tokens = max(b.tokens - cost, 0.0)
        return True

    def take_all(self, costs: dict[tuple[int, StoreLimitType], float],
                 now: float | None = None) -> tuple[int, StoreLimitType] | None:
        """Spend every ``(store, kind) -> cost`` or none of them. Returns None on
        success, else the first (store, kind) that lacks tokens."""
        for (store_id, kind), cost in costs.items():
            if not self.can_take(store_id, kind, cost, now):
                return store_id, StoreLimitType.parse(kind)
        for (store_id, kind), cost in costs.items():
            self.take(store_id, kind, cost, now)
        return None

    def reset(self, store_id: int | None = None) -> None:
        """Forget buckets (all, or one store's): they come back full."""
        if store_id is None:
            self._buckets.clear()
        else:
            for kind in StoreLimitType:
                self._buckets.pop((store_id, kind), None)

    def to_json(self, now: float | None = None) -> dict:
        out: dict = {}
        for (store_id, kind) in sorted(self._buckets, key=lambda k: (k[0], k[1].value)):
            avail = self.available(store_id, kind, now)
            out.setdefault(str(store_id), {})[kind.value] = {
                "rate_per_min": self.rate(store_id, kind),
                "available": None if math.isinf(avail) else round(avail, 6),
            }
        return out

    # -- internals -------------------------------------------------------
    def _bucket(self, store_id: int, kind: StoreLimitType) -> _Bucket:
        b = self._buckets.get((store_id, kind))
        if b is None:
            b = self._buckets[(store_id, kind)] = _Bucket(tokens=0.0, last=self._now)
            b.tokens = self.capacity(store_id, kind)  # full (inf while unlimited: clamped on refill)
        return b

    def _refill(self, store_id: int, kind: StoreLimitType, now: float | None) -> _Bucket:
        if now is not None and now > self._now:
            self._now = now
        b = self._bucket(store_id, kind)
        t = self._now if now is None else now
        cap = self.capacity(store_id, kind)
        if t > b.last:  # time never runs backwards for a bucket
            rate = self.rate(store_id, kind)
            gained = math.inf if _unlimited(rate) else (t - b.last) * rate / 60.0
            b.tokens = min(cap, b.tokens + gained)
            b.last = t
        else:
            b.tokens = min(cap, b.tokens)
        return b
