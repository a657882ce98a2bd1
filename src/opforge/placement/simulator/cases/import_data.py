"""import-data: a bulk import writes 24 MiB a tick at one spot of the key
space for 100 ticks. The region there grows past region_max_size again and
again; the split checker cuts it, and the new regions (all born on the same
three stores) must spread.

Pass (PD's import-data case, on size): the import range is cut into regions
no bigger than region_max_size, and every store's region size is within 5 %
of the mean.
"""

from opforge.placement.simulator.cases import (
    Case, Check, Import, RegionSpec, StoreSpec, all_of, balanced, random_placement,
)


def _check(run) -> Check:
    cfg = run.driver.config
    big = [r for r in run.sim.regions.values() if r.size > cfg.region_max_size]
    small = Check(not big, f"{len(big)} regions over {cfg.region_max_size} MiB; {len(run.sim.regions)} regions")
    if not small.ok:
        return small
    return all_of(small, balanced(run, leaders=False, regions=False, sizes=True))


CASE = Case(
    name="import-data",
    description="6 stores, 300 regions of 16 MiB; 24 MiB/tick imported at one key for 100 ticks (2.4 GiB)",
    criterion="no region above region_max_size; region size of every store within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=300, replicas=3, size_mib=16, keys_per_mib=1000, placement=random_placement),
    events=[Import(1, where=0.37, mib_per_tick=24, until=101, keys_per_mib=1000)],
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=_check,
    check_from=101,
    max_ticks=700,
    kind="import",
)
