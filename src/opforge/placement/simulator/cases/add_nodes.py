"""add-nodes: scale out. 3 stores hold every region; a 4th store joins at
tick 0, two more at tick 60. Data and leaders must spread onto the new ones.

Pass (PD's add-nodes case): each of the 6 stores' leader and region counts
within 5 % of the mean.
"""

from opforge.placement.simulator.cases import (
    AddStore, Case, RegionSpec, StoreSpec, balanced, ideal_rebalance_mib, round_robin,
)


def _store(i: int) -> StoreSpec:
    return StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"})


CASE = Case(
    name="add-nodes",
    description="3 -> 4 -> 6 stores: 900 regions of 32 MiB on stores 1-3; store 4 joins at 0, 5 and 6 at 60",
    criterion="leader and region counts of every store within 5% of the mean",
    stores=[_store(i) for i in (1, 2, 3)],
    regions=RegionSpec(count=900, replicas=3, size_mib=32, placement=round_robin),
    events=[AddStore(0, _store(4)), AddStore(60, _store(5)), AddStore(60, _store(6))],
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=lambda run: balanced(run, leaders=True, regions=True),
    max_ticks=900,
    ideal=ideal_rebalance_mib,
    ideal_doc="data the stores gained, start to end (what the new stores had to receive)",
)
