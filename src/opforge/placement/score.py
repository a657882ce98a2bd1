"""Store scores for balancing (PD's pkg/core/store.go RegionScore/LeaderScore
and the tolerance of pkg/schedule/schedulers/utils.go).

* Region score: the MiB of regions a store holds, space-aware. While a store
  has more than ``(1 - high_space_ratio)`` of its capacity free, the score is
  its region size. Below ``(1 - low_space_ratio)`` free the score is
  ``MAX_SCORE - available`` (every such store ranks above every roomy one,
  fullest first). In between, a straight line joins the two, so the score is
  continuous and rises quickly as the store fills up. The store's region size
  over its used bytes (the *amplification*) converts a MiB of regions into a
  MiB of disk.
* Leader score: the count (or MiB) of regions the store leads.
* Tolerance: how much a move must leave of the gap. A move of a region from
  ``s`` to ``t`` is proposed only when ``score(s, -tol) > score(t, +tol)``;
  with ``tol`` at least what the move carries, the source still scores above
  the target afterwards, so moves never reverse each other (no ping-pong).
  With ``tolerant_size_ratio == 0`` the ratio is 5 leaders for leader-count
  balance and ``max(1, 0.005 * max store region count)`` average region sizes
  otherwise, as in PD.

Every score includes the pending influence of running operators
(``ctx.store_influence``).
"""

from __future__ import annotations

from dataclasses import replace

from opforge.placement.cluster import Cluster, Region, Store
from opforge.placement.context import ScheduleContext, StoreInfluence
from opforge.placement.operator.operator import Operator
from opforge.placement.operator.step import AddLearner, AddPeer, RemovePeer, TransferLeader

MIB = 1024 * 1024
MAX_SCORE = float(1024 ** 3)
LEADER_TOLERANT_SIZE_RATIO = 5.0
ADJUST_RATIO = 0.005
MIN_TOLERANT_SIZE_RATIO = 1.0

# balance kinds
LEADER_COUNT = "leader-count"
LEADER_SIZE = "leader-size"
REGION = "region"


# -- pure scores ---------------------------------------------------------------
def region_score(store: Store, region_size: float, high_space_ratio: float, low_space_ratio: float,
                 delta: float = 0.0) -> float:
    """PD's RegionScore (v1) of a store holding ``region_size`` MiB of regions,
    if ``delta`` MiB more were added (negative: taken away)."""
    capacity = store.capacity / MIB
    if capacity <= 0:  # unknown capacity: size only
        return region_size + delta
    available = store.available / MIB
    used = store.used_size / MIB
    amplification = region_size / used if region_size > 0 and used > 0 else 1.0
    free_after = available - delta / amplification
    high_bound = (1.0 - high_space_ratio) * capacity  # above: plenty of room
    low_bound = (1.0 - low_space_ratio) * capacity  # below: low on space
    if free_after >= high_bound:
        return region_size + delta
    if free_after <= low_bound:
        return MAX_SCORE - free_after
    x1, y1 = high_bound, region_size + delta
    x2, y2 = low_bound, MAX_SCORE - low_bound
    return y1 + (y2 - y1) / (x2 - x1) * (free_after - x1)


def leader_score_of(count: float, size: float, kind: str, delta: float = 0.0) -> float:
    return (size if kind == LEADER_SIZE else count) + delta


# -- scores in a context ---------------------------------------------------------
def store_region_score(ctx: ScheduleContext, store_id: int, delta: float = 0.0) -> float:
    """The store's region score with pending influence and ``delta`` MiB."""
    store = ctx.cluster.get_store(store_id)
    size = ctx.cluster.region_size(store_id)
    infl = ctx.store_influence(store_id).region_size
    if store is None:
        return size + infl + delta
    cfg = ctx.config
    return region_score(store, size, cfg.high_space_ratio, cfg.low_space_ratio, infl + delta)


def store_leader_score(ctx: ScheduleContext, store_id: int, kind: str = LEADER_COUNT, delta: float = 0.0) -> float:
    infl = ctx.store_influence(store_id)
    if kind == LEADER_SIZE:
        return ctx.cluster.leader_size(store_id) + infl.leader_size + delta
    return ctx.cluster.leader_count(store_id) + infl.leader_count + delta


def store_score(ctx: ScheduleContext, store_id: int, kind: str, delta: float = 0.0) -> float:
    if kind == REGION:
        return store_region_score(ctx, store_id, delta)
    return store_leader_score(ctx, store_id, kind, delta)


# -- tolerance -----------------------------------------------------------------
def average_region_size(cluster: Cluster) -> float:
    """Mean region size in MiB (replicas count alike in sum and count), at least 1."""
    size = count = 0
    for sid in cluster.stores:
        size += cluster.region_size(sid)
        count += cluster.region_count(sid)
    return max(size / count, 1.0) if count else 1.0


def tolerant_size_ratio(ctx: ScheduleContext, kind: str) -> float:
    ratio = ctx.config.tolerant_size_ratio
    if ratio > 0:
        return ratio
    if kind == LEADER_COUNT:
        return LEADER_TOLERANT_SIZE_RATIO
    biggest = max((ctx.cluster.region_count(sid) for sid in ctx.cluster.stores), default=0)
    return max(biggest * ADJUST_RATIO, MIN_TOLERANT_SIZE_RATIO)


def moved_amount(kind: str, region: Region) -> float:
    """What moving ``region`` (or its leader) changes a score by, before space effects."""
    return 1.0 if kind == LEADER_COUNT else float(region.approximate_size)


def tolerant_resource(ctx: ScheduleContext, kind: str, region: Region, ratio: float | None = None,
                      avg_region_size: float | None = None) -> float:
    """The tolerance, in score units, for moving ``region`` (or its leader):
    never less than what the move carries, so a move cannot reverse the order."""
    ratio = tolerant_size_ratio(ctx, kind) if ratio is None else ratio
    moved = moved_amount(kind, region)
    if kind == LEADER_COUNT:
        return max(ratio, moved)
    avg = average_region_size(ctx.cluster) if avg_region_size is None else avg_region_size
    return max(ratio * max(float(region.approximate_size), avg), moved)


def should_balance(ctx: ScheduleContext, kind: str, source_id: int, target_id: int, tolerance: float) -> bool:
    """PD's shouldBalance: after taking ``tolerance`` off the source and giving
    it to the target, the source must still score strictly higher."""
    return store_score(ctx, source_id, kind, -tolerance) > store_score(ctx, target_id, kind, tolerance)


# -- influence of operators ----------------------------------------------------------
def operator_influence(op: Operator, region: Region) -> dict[int, StoreInfluence]:
    """What ``op`` will change on each store once it has run on ``region``."""
    out: dict[int, StoreInfluence] = {}
    size = region.approximate_size

    def at(sid: int) -> StoreInfluence:
        return out.setdefault(sid, StoreInfluence())

    for step in op.steps:
        if isinstance(step, TransferLeader):
            a, b = at(step.from_store), at(step.to_store)
            a.leader_count -= 1
            a.leader_size -= size
            b.leader_count += 1
            b.leader_size += size
        elif isinstance(step, (AddLearner, AddPeer)):
            t = at(step.to_store)
            t.region_count += 1
            t.region_size += size
        elif isinstance(step, RemovePeer):
            f = at(step.from_store)
            f.region_count -= 1
            f.region_size -= size
    return out


def add_operator_influence(influence: dict[int, StoreInfluence], op: Operator, region: Region) -> None:
    """Fold ``op``'s influence into ``influence`` (in place)."""
    for sid, d in operator_influence(op, region).items():
        cur = influence.get(sid)
        if cur is None:
            influence[sid] = d
        else:
            cur.region_size += d.region_size
            cur.region_count += d.region_count
            cur.leader_size += d.leader_size
            cur.leader_count += d.leader_count


def local_context(ctx: ScheduleContext) -> ScheduleContext:
    """A copy of ``ctx`` whose influence and busy set a scheduler may extend
    with the operators it proposes in this call, leaving ``ctx`` untouched."""
    return replace(ctx, influence={sid: replace(i) for sid, i in ctx.influence.items()},
                   busy_regions=set(ctx.busy_regions))


def note_operator(local: ScheduleContext, op: Operator, region: Region) -> None:
    """Account for ``op`` in a ``local_context``: its influence and its region."""
    add_operator_influence(local.influence, op, region)
    local.busy_regions.add(region.id)
