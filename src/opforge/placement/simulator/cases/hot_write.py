"""hot-write: 20 regions led from store 1 take heavy writes (16 MiB/s each).
Every replica applies every write, the leader does more work; both the hot
leaders and the hot peers must spread.

Pass (PD's hot-write case: hot-region leader and peer counts differ by at
most 2): the write flow each store leads, and the write flow each store
applies as any replica, differ between the busiest and the idlest store by at
most two hot regions' worth.
"""

from opforge.placement.simulator.cases import Case, Check, RegionSpec, SetFlow, StoreSpec, random_placement
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
    lead = {s: 0.0 for s in sim.up_store_ids()}
    peer = dict(lead)
    for r in sim.regions.values():
        if not r.write_rate:
            continue
        if r.leader is not None and r.leader.store_id in lead:
            lead[r.leader.store_id] += r.write_rate
        for p in r.peers:
            if p.store_id in peer:
                peer[p.store_id] += r.write_rate
    s_lead = max(lead.values()) - min(lead.values())
    s_peer = max(peer.values()) - min(peer.values())
    ok = s_lead <= 2 * FLOW + 1 and s_peer <= 2 * FLOW + 1
    return Check(ok, f"write MiB/s led {[round(v / MIB) for v in lead.values()]} (spread {s_lead / MIB:.0f}), "
                     f"as peer {[round(v / MIB) for v in peer.values()]} (spread {s_peer / MIB:.0f}); "
                     f"limit {2 * FLOW / MIB:.0f}")


CASE = Case(
    name="hot-write",
    description=f"5 stores, 400 regions; {HOT} regions led from store 1 write {FLOW // MIB} MiB/s each",
    criterion="write flow per store, as leader and as peer: busiest minus idlest <= 2 hot regions",
    stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 6)],
    regions=RegionSpec(count=400, replicas=3, size_mib=32, placement=random_placement),
    events=[SetFlow(1, "hot", _pick, Flow(write_bytes=FLOW, write_keys=FLOW / 1024))],
    check=_check,
    hold_ticks=20,  # flows fluctuate as regions split and move: it must stay even
    max_ticks=500,
    kind="hot",
)
