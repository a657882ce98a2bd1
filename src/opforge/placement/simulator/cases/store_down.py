"""store-down: store 1 fails at tick 5 and never comes back. Once the driver
deems it down (max_store_down_time), its replicas must be re-created on the
other stores (PD's makeup-down-replicas).

Pass: every region has max_replicas voters, all on up stores, and fits its
rules; the up stores' region counts are within 5 % of the mean.
"""

from opforge.placement.simulator.cases import (
    Case, Check, RegionSpec, StoreDown, StoreSpec, all_of, balanced, ideal_rebalance_mib, random_placement,
    repaired,
)


def _check(run) -> Check:
    rep = repaired(run)
    if not rep.ok:
        return rep
    return all_of(rep, balanced(run, leaders=False, regions=True))


CASE = Case(
    name="store-down",
    description="6 stores, 750 regions of 32 MiB placed at random; store 1 goes down for good at tick 5",
    criterion="every region has 3 voters on up stores and fits its rules; region counts of the up stores "
              "within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=750, replicas=3, size_mib=32, placement=random_placement),
    events=[StoreDown(5, 1)],
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=_check,
    max_ticks=900,
    ideal=ideal_rebalance_mib,
    ideal_doc="data the up stores gained (the replicas lost with store 1, re-created once)",
    kind="repair",
)
