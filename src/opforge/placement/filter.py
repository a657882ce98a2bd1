"""Store filters shared by the schedulers (PD's pkg/schedule/filter), and the
random region pickers they use.

Every filter is a small function that returns a *reason* (a short string
naming why the store is refused) or ``None`` when the store is acceptable, so
a caller can both decide and explain. The composite checks
``region_source_reason``, ``region_target_reason``, ``leader_source_reason``
and ``leader_target_reason`` chain them in the order PD does.

Location (isolation) is scored as PD's ``DistinctScore``: for each other
replica, a store that first differs from the candidate at label level ``i`` of
``location_labels`` (0 = the outermost, e.g. zone) adds ``100 ** (n - i - 1)``;
a store in the very same location adds nothing. A higher score is a better
spread. A candidate that replaces a peer must score at least what the peer it
replaces scores against the remaining replicas (PD's location safeguard).
"""

from __future__ import annotations

import bisect
import random
import weakref
from typing import Callable, Iterable, Iterator

from opforge.placement.cluster import Cluster, Region, Store, StoreState
from opforge.placement.context import ScheduleContext
from opforge.placement.location import REPLICA_BASE_SCORE, compare_location, distinct_score  # noqa: F401

MIB = 1024 * 1024
# A store sending or receiving this many snapshots at once takes no more work
# (PD's max-snapshot-count); one with this many pending peers takes no new one.
MAX_SNAPSHOT_COUNT = 64

# reasons
STORE_MISSING = "store-missing"
STORE_TOMBSTONE = "store-tombstone"
STORE_OFFLINE = "store-offline"
STORE_DOWN = "store-down"
STORE_BUSY = "store-busy"
TOO_MANY_SNAPSHOTS = "too-many-snapshots"
EXCLUDED = "excluded"
LOW_SPACE = "low-space"
NOT_MATCH_ISOLATION = "not-match-isolation"
LEADER_TRANSFER_PAUSED = "leader-transfer-paused"
NOT_FOLLOWER = "not-follower"
PEER_UNHEALTHY = "peer-unhealthy"


# -- store state -------------------------------------------------------------
def removed(store: Store | None) -> str | None:
    """A store that is gone or a tombstone is neither a source nor a target."""
    if store is None:
        return STORE_MISSING
    if store.state == StoreState.TOMBSTONE:
        return STORE_TOMBSTONE
    return None


def removing(store: Store) -> str | None:
    """An offline store is being drained: it may give, never take."""
    return STORE_OFFLINE if store.state == StoreState.OFFLINE else None


def down(cluster: Cluster, store: Store) -> str | None:
    return STORE_DOWN if cluster.is_store_down(store.id) else None


def busy(store: Store) -> str | None:
    return STORE_BUSY if store.is_busy else None


def snapshot_pressure(store: Store, *, sending: bool) -> str | None:
    """Too many snapshots in flight: as a source (``sending``) or a target."""
    n = store.sending_snap_count if sending else store.receiving_snap_count
    return TOO_MANY_SNAPSHOTS if n >= MAX_SNAPSHOT_COUNT else None


def excluded(region: Region, store: Store) -> str | None:
    """The store already holds a peer of the region."""
    return EXCLUDED if region.peer_on(store.id) is not None else None


def is_low_space(store: Store, low_space_ratio: float, incoming_mib: float = 0.0) -> bool:
    """Would the store have less than ``(1 - low_space_ratio)`` of its capacity
    free after taking ``incoming_mib`` more? A store that reports no capacity is
    never low on space (its size is unknown)."""
    if store.capacity <= 0:
        return False
    return store.available - incoming_mib * MIB < (1.0 - low_space_ratio) * store.capacity


def low_space(ctx: ScheduleContext, store: Store, incoming_mib: float = 0.0) -> str | None:
    """Refuse a target that is (or, with the region and what is already on its
    way there, would be) low on space."""
    pending = max(ctx.store_influence(store.id).region_size, 0)
    return LOW_SPACE if is_low_space(store, ctx.config.low_space_ratio, incoming_mib + pending) else None


# -- leader transfer pause (set by evict-leader) --------------------------------
_paused: "weakref.WeakKeyDictionary[Cluster, dict[int, float]]" = weakref.WeakKeyDictionary()


def pause_leader_transfer(cluster: Cluster, store_ids: Iterable[int], until: float) -> None:
    """No scheduler moves leaders *onto* these stores before ``until`` (the
    evict-leader scheduler renews this each time it runs)."""
    d = _paused.setdefault(cluster, {})
    for sid in store_ids:
        d[sid] = max(d.get(sid, until), until)


def resume_leader_transfer(cluster: Cluster, store_ids: Iterable[int]) -> None:
    d = _paused.get(cluster)
    if d:
        for sid in store_ids:
            d.pop(sid, None)


def leader_transfer_paused(cluster: Cluster, store_id: int, now: float) -> str | None:
    d = _paused.get(cluster)
    if d and d.get(store_id, -1.0) > now:
        return LEADER_TRANSFER_PAUSED
    return None


# -- location ----------------------------------------------------------------
def _region_stores(cluster: Cluster, region: Region, without: int | None = None) -> list[Store]:
    out = []
    for p in region.peers:
        if p.store_id == without:
            continue
        s = cluster.get_store(p.store_id)
        if s is not None:
            out.append(s)
    return out


class LocationSafeguard:
    """PD's location safeguard for replacing the peer on ``source``: a target
    must spread the region at least as well as the source did."""

    def __init__(self, location_labels: list[str], region_stores: list[Store], source: Store):
        self.labels = list(location_labels)
        self.others = [s for s in region_stores if s.id != source.id]
        self.safe_score = distinct_score(self.labels, self.others, source)

    def target(self, store: Store) -> str | None:
        if not self.labels:
            return None
        return None if distinct_score(self.labels, self.others, store) >= self.safe_score else NOT_MATCH_ISOLATION


def isolation(config_labels: list[str], isolation_level: str, others: list[Store], source: Store | None,
              candidate: Store) -> str | None:
    """With ``isolation_level`` set (e.g. "zone"), a candidate must not share
    that level with another replica, unless the peer it replaces already did
    (so a move never makes isolation worse)."""
    if not isolation_level or isolation_level not in config_labels:
        return None
    depth = config_labels.index(isolation_level) + 1
    labels = config_labels[:depth]

    def collides(store: Store) -> bool:
        return any(o.id != store.id and compare_location(o, store, labels) == -1 for o in others)

    if collides(candidate) and not (source is not None and collides(source)):
        return NOT_MATCH_ISOLATION
    return None


# -- composites --------------------------------------------------------------
def region_source_reason(ctx: ScheduleContext, store: Store | None) -> str | None:
    """May peers be moved away from this store (balance, shuffle)?"""
    return (removed(store) or down(ctx.cluster, store) or busy(store)
            or snapshot_pressure(store, sending=True))


def store_target_reason(ctx: ScheduleContext, store: Store | None) -> str | None:
    """The region-independent part of ``region_target_reason``."""
    return (removed(store) or removing(store) or down(ctx.cluster, store) or busy(store)
            or snapshot_pressure(store, sending=False))


def region_target_reason(ctx: ScheduleContext, region: Region, store: Store | None,
                         source: Store | None = None, safeguard: LocationSafeguard | None = None,
                         store_checked: bool = False) -> str | None:
    """May ``store`` receive a new peer of ``region`` (replacing the one on
    ``source`` when given)? ``store_checked``: the caller already applied
    ``store_target_reason`` to it."""
    reason = (None if store_checked else store_target_reason(ctx, store)) or excluded(region, store) \
        or low_space(ctx, store, region.approximate_size)
    if reason:
        return reason
    labels = ctx.config.location_labels
    if labels:
        if source is not None:
            if safeguard is None:
                safeguard = LocationSafeguard(labels, _region_stores(ctx.cluster, region), source)
            reason = safeguard.target(store)
            if reason:
                return reason
        others = _region_stores(ctx.cluster, region, without=source.id if source is not None else None)
        return isolation(labels, ctx.config.isolation_level, others, source, store)
    return None


def leader_source_reason(ctx: ScheduleContext, store: Store | None) -> str | None:
    return removed(store) or down(ctx.cluster, store)


def leader_store_target_reason(ctx: ScheduleContext, store: Store | None) -> str | None:
    """The region-independent part of ``leader_target_reason``."""
    return (removed(store) or removing(store) or down(ctx.cluster, store) or busy(store)
            or leader_transfer_paused(ctx.cluster, store.id, ctx.now))


def leader_target_reason(ctx: ScheduleContext, region: Region, store: Store | None) -> str | None:
    """May ``store`` take the leadership of ``region``? It must hold a healthy
    voter that is not the leader, and be up and willing."""
    reason = leader_store_target_reason(ctx, store)
    if reason:
        return reason
    p = region.peer_on(store.id)
    if p is None or not p.is_voter or (region.leader is not None and p.id == region.leader.id):
        return NOT_FOLLOWER
    if p.id in region.down_peers or p.id in region.pending_peers:
        return PEER_UNHEALTHY
    return leader_rule_reason(ctx, region, store)


def leader_rule_reason(ctx: ScheduleContext, region: Region, store: Store) -> str | None:
    """Placement rules that say where a region's leader lives (role "leader",
    with label constraints) bind balance-leader too, or the rule checker and
    the balancer would move the same leader back and forth."""
    rules = ctx.rules
    if rules is None or not hasattr(rules, "rules_for"):
        return None
    for rule in rules.rules_for(region):
        if rule.role == "leader" and rule.label_constraints and not rule.matches_store(store):
            return "placement rules put this region's leader elsewhere"
    return None


# -- picking regions -----------------------------------------------------------
def schedulable(ctx: ScheduleContext, region: Region, *, healthy_only: bool = True,
                replicated: bool = False) -> bool:
    """A region a scheduler may touch: no operator on it, not in joint
    consensus, healthy (no down or pending peers) when asked, and with the
    configured number of voters when ``replicated``."""
    if region.id in ctx.busy_regions or region.in_joint_state or region.leader is None:
        return False
    if healthy_only and not region.is_healthy():
        return False
    if replicated and len(region.voters()) != ctx.config.max_replicas:
        return False
    return True


_SMALL = 256  # sets up to this size are sampled directly
_MAX_PROBES = 4096  # random positions tried per call of sample_regions, at most


def sample_regions(cluster: Cluster, ids: set[int], rng: random.Random, n: int,
                   accept: Callable[[Region], bool] | None = None, draws: int | None = None,
                   max_probes: int = 4096) -> Iterator[Region]:
    """Yield up to ``n`` distinct random regions among ``ids`` that ``accept``
    (lazily: stop iterating when done), looking at about ``draws`` members
    (default ``max(4 n, 16)``) and at most ``max_probes`` random positions
    before giving up.

    A Python set cannot be indexed, so drawing from a large one costs
    O(len(ids)). Instead, large sets are sampled through the cluster's sorted
    start-key index: draw a random region of the whole cluster and keep it if
    it is in ``ids``. That hits with probability len(ids)/len(regions), about
    replicas/stores for a store's regions, so a draw costs O(stores) probes at
    worst, never O(regions)."""
    size = len(ids)
    if size == 0 or n <= 0:
        return
    draws = max(4 * n, 16) if draws is None else max(int(draws), 1)
    total = len(cluster.regions)
    if total == 0 or size <= _SMALL or size * 64 < total:
        # Small (or sparse, where probing would mostly miss): draw from the set itself.
        for rid in rng.sample(list(ids), min(size, draws, max(max_probes, 1))):
            r = cluster.regions.get(rid)
            if r is not None and (accept is None or accept(r)):
                yield r
                n -= 1
                if n <= 0:
                    return
        return
    seen: set[int] = set()
    probes = min(_MAX_PROBES, max_probes, max(64, draws * (total // size + 1)))
    for _ in range(probes):
        rid = cluster.random_region_id(rng)
        if rid is None or rid in seen or rid not in ids:
            continue
        seen.add(rid)
        r = cluster.regions.get(rid)
        if r is not None and (accept is None or accept(r)):
            yield r
            n -= 1
            if n <= 0:
                return


def pick_region(ctx: ScheduleContext, ids: set[int], accept: Callable[[Region], bool] | None = None,
                *, healthy_only: bool = True, replicated: bool = False) -> Region | None:
    """One random schedulable region among ``ids`` (see ``schedulable``)."""
    def ok(r: Region) -> bool:
        return schedulable(ctx, r, healthy_only=healthy_only, replicated=replicated) and (accept is None or accept(r))
    return next(sample_regions(ctx.cluster, ids, ctx.rng, 1, ok), None)


def regions_from(cluster: Cluster, start_key: bytes, end_key: bytes = b"") -> Iterator[Region]:
    """Regions in key order whose range overlaps ``[start_key, end_key)``
    (``end_key`` b"" = to the end), lazily."""
    yield from cluster.scan(start_key, end_key)


class RangeView:
    """The regions that start in ``[start_key, end_key)`` (``end_key`` b"" =
    to the end), by position in key order: ``len`` and ``at(i)`` are O(1)
    after an O(log regions) set-up, so random picks never cost O(range).
    Valid until the cluster's regions change."""

    def __init__(self, cluster: Cluster, start_key: bytes = b"", end_key: bytes = b""):
        self.cluster = cluster
        starts = getattr(cluster, "_starts", None)
        start_to_id = getattr(cluster, "_start_to_id", None)
        if starts is None or start_to_id is None:  # no key index: materialize (not expected)
            starts = sorted(r.start_key for r in cluster.regions.values())
            start_to_id = {r.start_key: r.id for r in cluster.regions.values()}
        self._starts, self._ids = starts, start_to_id
        self.lo = bisect.bisect_left(starts, start_key)
        self.hi = bisect.bisect_left(starts, end_key) if end_key else len(starts)
        self.hi = max(self.hi, self.lo)

    def __len__(self) -> int:
        return self.hi - self.lo

    def at(self, i: int) -> Region | None:
        """The ``i``-th region of the range in key order (0-based)."""
        return self.cluster.regions.get(self._ids.get(self._starts[self.lo + i], -1))

    def random(self, rng: random.Random) -> Region | None:
        return self.at(rng.randrange(len(self))) if len(self) else None

    def index_of(self, key: bytes) -> int:
        """Position of the first region of the range starting at or after ``key``."""
        return min(max(bisect.bisect_left(self._starts, key, self.lo, self.hi) - self.lo, 0), len(self))
