"""hot-read: 20 regions led from store 1 serve heavy reads (16 MiB/s each,
above the 8 MiB/s hot threshold). Reads are served by leaders, so the hot
leaders must spread.

Pass (PD's hot-read case: hot-region leader counts differ by at most 2): the
read flow each store serves as leader differs between the busiest and the
idlest store by at most two hot regions' worth (2 x 16 MiB/s).
"""

from opforge.placement.simulator.cases import Case, Check, RegionSpec, SetFlow, StoreSpec, random_placement, zero
from opforge.placement.simulator.simulated_cluster import Flow

MIB = 1 << 20
FLOW = 16 * MIB
HOT = 20


def _pick(run):
    led = [r.id for r in sorted(run.sim.regions.values(), key=lambda r: r.start)
           if r.leader is not None and r.leader.store_id == 1]
    return led[:HOT]


def _check(run) -> Check:
    sim = run.sim
    load = {s: 0.0 for s in sim.up_store_ids()}
    for r in sim.regions.values():
        if r.read_rate and r.leader is not None and r.leader.store_id in load:
            load[r.leader.store_id] += r.read_rate
    spread = max(load.values()) - min(load.values())
    return Check(spread <= 2 * FLOW + 1, f"read MiB/s led per store {[round(v / MIB) for v in load.values()]}, "
                                         f"spread {spread / MIB:.0f} (<= {2 * FLOW / MIB:.0f})")


CASE = Case(
    name="hot-read",
    description=f"5 stores, 400 regions; {HOT} regions led from store 1 read at {FLOW // MIB} MiB/s each",
    criterion="read flow led per store: busiest minus idlest <= 2 hot regions",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 6)],
    regions=RegionSpec(count=400, replicas=3, size_mib=32, placement=random_placement),
    events=[SetFlow(1, "hot", _pick, Flow(read_bytes=FLOW, read_keys=FLOW / 1024, query=200))],
    check=_check,
    hold_ticks=20,  # flows fluctuate as regions split and move: it must stay even
    max_ticks=400,
    ideal=zero,
    ideal_doc="0: moving read leaders needs no data",
    kind="hot",
)
