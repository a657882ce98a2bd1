"""leader-in-zone: a placement rule wants every leader in zone z1 (a leader
rule with ``zone in [z1]``) and two more voters elsewhere, each zone apart
(PD's diagnose-rule case). Leaders start spread over all zones.

Pass: every region's leader is on a store of zone z1, every region fits its
rules (a leader in z1, two followers, isolated by zone), fully replicated.
"""

from opforge.placement.rules import LabelConstraint, Rule
from opforge.placement.simulator.cases import Case, Check, RegionSpec, StoreSpec, all_of, repaired, zero

ZONES = {1: "z1", 2: "z1", 3: "z2", 4: "z2", 5: "z3", 6: "z3"}


def _placement(i, rng, stores, replicas):
    # one replica per zone, the leader in a random zone
    picks = [rng.choice([s for s in stores if ZONES[s] == z]) for z in ("z1", "z2", "z3")]
    rng.shuffle(picks)
    return picks


def _setup(run) -> None:
    rules = run.driver.rules
    rules.set_rules([
        Rule("pd", "default", index=1, role="follower", count=2, location_labels=("zone", "host"),
             isolation_level="zone"),
        Rule("pd", "leader-z1", index=0, role="leader", count=1,
             label_constraints=(LabelConstraint("zone", "in", ("z1",)),), location_labels=("zone", "host")),
    ])


def _check(run) -> Check:
    sim = run.sim
    off = sum(1 for r in sim.regions.values()
              if r.leader is None or sim.nodes[r.leader.store_id].labels.get("zone") != "z1")
    lead = Check(off == 0, f"{off} leaders outside z1")
    return all_of(lead, repaired(run)) if lead.ok else lead


CASE = Case(
    name="leader-in-zone",
    description="6 stores in 3 zones; 450 regions one replica per zone; rule: leaders in z1",
    criterion="every leader in zone z1; every region fits its rules and is fully replicated",
    stores=[StoreSpec(i, {"zone": ZONES[i], "host": f"h{i}"}) for i in range(1, 7)],
    regions=RegionSpec(count=450, replicas=3, size_mib=32, placement=_placement),
    config={"location_labels": ["zone", "host"]},
    setup=_setup,
    check=_check,
    max_ticks=600,
    ideal=zero,
    ideal_doc="0: the replicas already sit one per zone; only leaders move",
    kind="placement",
)
