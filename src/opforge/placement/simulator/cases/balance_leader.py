"""balance-leader: every region has a replica on each of 3 stores, and every
leader is on store 1. Leaders must spread out; no data needs to move.

Pass (PD's balance-leader case): each store's leader count within 5 % of the
mean (and region counts, already even, stay so).
"""

from opforge.placement.simulator.cases import Case, RegionSpec, StoreSpec, balanced, zero

CASE = Case(
    name="balance-leader",
    description="3 stores, 600 regions replicated on all of them, all leaders on store 1",
    criterion="leader and region counts of every store within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in (1, 2, 3)],
    regions=RegionSpec(count=600, replicas=3, size_mib=32, leader_store=1),
    check=lambda run: balanced(run, leaders=True, regions=True),
    max_ticks=400,
    ideal=zero,
    ideal_doc="0: leader transfers move no data",
)
