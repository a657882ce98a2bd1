"""label-isolation: 6 stores in 3 zones (two hosts each), location labels
[zone, host], isolation level zone. Regions were placed ignoring zones, so
most have two replicas in one zone. Replicas must end in distinct zones.

Pass (PD's diagnose-label-isolation case): every region has 3 voters on up
stores in 3 distinct zones and fits its rules.
"""

from opforge.placement.simulator.cases import (
    Case, RegionSpec, StoreSpec, ideal_isolation_mib, random_placement, repaired,
)

ZONES = {1: "z1", 2: "z1", 3: "z2", 4: "z2", 5: "z3", 6: "z3"}

CASE = Case(
    name="label-isolation",
    description="6 stores in 3 zones; 450 regions placed at random without regard to zones",
    criterion="every region: 3 voters on up stores in 3 distinct zones, fitting its rules",
    stores=[StoreSpec(i, {"zone": ZONES[i], "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=450, replicas=3, size_mib=32, placement=random_placement),
    config={"location_labels": ["zone", "host"], "isolation_level": "zone",
            "store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=repaired,
    max_ticks=600,
    ideal=ideal_isolation_mib,
    ideal_doc="the larger of: data the stores gained, and the replicas sharing a zone at the start",
    kind="repair",
)
