"""delete-nodes: an admin removes store 6 (set offline through the driver).
Its replicas must move to the others; it then becomes a tombstone.

Pass (PD's delete-nodes case): store 6 holds nothing and is a tombstone,
every region is fully replicated on the remaining stores, and their leader
and region counts are within 5 % of the mean.
"""

from opforge.placement.cluster import StoreState
from opforge.placement.simulator.cases import (
    Case, Check, DeleteStore, RegionSpec, StoreSpec, all_of, balanced, ideal_rebalance_mib, random_placement,
    repaired,
)


def _check(run) -> Check:
    store = run.driver.cluster.get_store(6)
    gone = Check(run.sim.peer_count(6) == 0 and store is not None and store.state == StoreState.TOMBSTONE,
                 f"store 6: {run.sim.peer_count(6)} replicas, {store.state.value if store else '?'}")
    if not gone.ok:
        return gone
    bal = balanced(run, leaders=True, regions=True)
    return all_of(gone, bal, repaired(run)) if bal.ok else all_of(gone, bal)


CASE = Case(
    name="delete-nodes",
    description="6 stores, 750 regions of 32 MiB placed at random; store 6 is deleted at tick 5",
    criterion="store 6 empty and a tombstone; every region fully replicated; leader and region counts "
              "of the other stores within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=750, replicas=3, size_mib=32, placement=random_placement),
    events=[DeleteStore(5, 6)],
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=_check,
    max_ticks=900,
    ideal=ideal_rebalance_mib,
    ideal_doc="data the remaining stores gained (what store 6 held, re-created once)",
    kind="repair",
)
