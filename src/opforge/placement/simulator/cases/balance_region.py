"""balance-region: 6 stores, regions placed with a strong skew (stores 1-3
hold most replicas). Peers must move until data is even.

Pass (PD's balance-region case): each store's region count, region size and
leader count within 5 % of the mean.
"""

from opforge.placement.simulator.cases import (
    Case, RegionSpec, StoreSpec, balanced, ideal_rebalance_mib, weighted,
)

CASE = Case(
    name="balance-region",
    description="6 stores, 900 regions of 32 MiB placed with weights 6:5:4:1:1:1",
    criterion="region count, region size and leader count of every store within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=900, replicas=3, size_mib=32,
                       placement=weighted({1: 6, 2: 5, 3: 4, 4: 1, 5: 1, 6: 1})),
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=lambda run: balanced(run, leaders=True, regions=True, sizes=True),
    max_ticks=900,
    ideal=ideal_rebalance_mib,
    ideal_doc="data the stores gained, start to end (the surplus of stores 1-3 spread to the others)",
)
