"""region-split: some regions are far bigger than region_max_size (a bulk
load landed in them). The driver's split checker must cut them down, and the
pieces must spread like any other region.

Pass: no region above region_max_size (or region_max_keys), every region
fully replicated, and every store's region size within 5 % of the mean.
"""

from opforge.placement.simulator.cases import (
    Case, Check, RegionSpec, StoreSpec, all_of, balanced, random_placement, repaired,
)


def _size(i, rng):
    return 600.0 if i % 10 == 0 else 32.0  # one region in ten is 600 MiB


def _check(run) -> Check:
    cfg = run.driver.config
    big = [r for r in run.sim.regions.values() if r.size > cfg.region_max_size or r.keys > cfg.region_max_keys]
    small = Check(not big, f"{len(big)} regions over {cfg.region_max_size} MiB, {len(run.sim.regions)} regions")
    if not small.ok:
        return small
    return all_of(small, balanced(run, leaders=False, regions=False, sizes=True), repaired(run))


CASE = Case(
    name="region-split",
    description="5 stores, 200 regions placed at random; one in ten is 600 MiB (region_max_size 144)",
    criterion="no region above region_max_size; every region fully replicated; region size of every "
              "store within 5% of the mean",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 6)],
    regions=RegionSpec(count=200, replicas=3, size_mib=_size, keys_per_mib=1000, placement=random_placement),
    config={"store_limit_add_peer": 240, "store_limit_remove_peer": 240},
    check=_check,
    max_ticks=600,
    kind="split",
)
