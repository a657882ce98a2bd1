"""What the placement simulator predicts for a cluster's scale-out.

``predict_scale_out(cluster)`` builds a simulator case of the cluster's own layout (its up stores,
each region's replicas with its leader first, sizes as the region heartbeats report them), adds one
empty store at tick 0, runs the driver the cluster runs (same schedulers, limits, replica count, no
merging) until it has had nothing in flight for a while, and returns the operator steps the
simulated workers applied and the region counts they ended with. The real scale-out
(``Cluster.add_worker`` + ``settle``) is held to that number: the simulator is the plan the
workers should follow, not an estimate to beat by luck.
"""
from __future__ import annotations

from dataclasses import dataclass

from opforge.cluster import pd_service
from opforge.placement.simulator.cases import AddStore, Case, Check, RegionSpec, StoreSpec


@dataclass
class Prediction:
    steps: int  # operator steps the simulated workers applied
    region_counts: dict[int, int]  # store id -> replicas it holds at the end
    passed: bool  # the driver settled (nothing in flight for ``hold_ticks``) within the tick budget


def _idle(run) -> Check:
    busy = run.driver.controller.running()
    return Check(not busy, f"{len(busy)} operators in flight")


def scale_out_case(cluster, hold_ticks: int = 20, max_ticks: int = 600) -> tuple[Case, int]:
    """The case of ``cluster``'s current layout with one store added; returns it and the new store's id."""
    up = [s for s in cluster.store_of if s not in cluster.draining]
    placements = []
    for meta in cluster.regions.values():
        stores = [p["store_id"] for p in meta.peers]
        lead = meta.leader_store
        placements.append(([lead] + [s for s in stores if s != lead], max(1, meta.bytes >> 20)))
    new = max(cluster.store_of + sorted(cluster.dead_stores)) + 1
    specs = [StoreSpec(s, {"host": f"h{s}"}) for s in up]
    case = Case(
        name="cluster-scale-out", description=f"{len(up)} -> {len(up) + 1} stores, {len(placements)} regions",
        criterion="no operator in flight", stores=specs,
        regions=RegionSpec(count=len(placements), replicas=cluster.replicas, size_mib=lambda j, rng: placements[j][1],
                           placement=lambda j, rng, stores, replicas: placements[j][0]),
        check=_idle, events=[AddStore(0, StoreSpec(new, {"host": f"h{new}"}))],
        config={**pd_service.config_overrides(), "max_replicas": cluster.replicas},
        schedulers=pd_service.SCHEDULERS, setup=lambda run: pd_service.without_merging(run.driver),
        hold_ticks=hold_ticks, max_ticks=max_ticks)
    return case, new


def predict_scale_out(cluster) -> Prediction:
    from opforge.placement.simulator.runner import run_case

    case, _ = scale_out_case(cluster)
    result = run_case(case)
    counts = {sid: col[-1] for sid, col in result.series["regions"].items() if col and col[-1] is not None}
    return Prediction(sum(result.steps["applied"].values()), counts, result.passed)
