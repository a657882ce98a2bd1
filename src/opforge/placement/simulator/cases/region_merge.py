"""region-merge: many small, cold regions (4 MiB, after a mass delete). The
merge checker must fold them into their neighbours.

Runs of 5 neighbouring regions share their stores (as they do after the
regions split from one parent); the merge checker here proposes a merge only
when source and target peers already sit on the same stores (it does not
first move peers together as PD's does), so neighbours across runs merge
only when they happen to line up.

Pass (PD's region-merge case, mergeRatio = the run length): at most 5 % more
regions than initial / 5, and every region fully replicated.
"""

from opforge.placement.simulator.cases import (
    Case, Check, RegionSpec, StoreSpec, all_of, blocks, repaired, round_robin,
)

INITIAL = 800
RUN = 5


def _check(run) -> Check:
    n = len(run.sim.regions)
    want = INITIAL / RUN
    merged = Check(n <= 1.05 * want, f"{n} regions (want <= {1.05 * want:.0f})")
    return all_of(merged, repaired(run)) if merged.ok else merged


CASE = Case(
    name="region-merge",
    description=f"5 stores, {INITIAL} regions of 4 MiB in runs of {RUN} on the same stores",
    criterion=f"at most 5% more regions than {INITIAL}/{RUN}; every region fully replicated",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 6)],
    regions=RegionSpec(count=INITIAL, replicas=3, size_mib=4, keys_per_mib=1000, placement=blocks(RUN, round_robin)),
    config={"split_merge_interval": 0, "merge_schedule_limit": 16},
    check=_check,
    max_ticks=600,
    kind="merge",
)
