"""The placement driver under the simulator: every case meets PD's criterion,
and a long chaos run keeps the cluster safe.

Cases run with the real driver on a simulated clock (see
``opforge.placement.simulator``). A case that fails because of a known defect
in a driver module (not in the simulator) is marked xfail with the defect
named; the criterion itself is never relaxed.
"""

from __future__ import annotations

import random

import pytest

from opforge.placement.cluster import Peer, PeerRole
from opforge.placement.simulator import runner
from opforge.placement.simulator.cases import (
    Call, Case, Check, RegionSpec, StoreSpec, random_placement, rule_violations,
)
from opforge.placement.simulator.node import Task
from opforge.placement.simulator.simulated_cluster import quorum_ok
from opforge.placement.operator.step import RemovePeer

# Cases that fail because of a known defect in a driver module, with the defect
# named (none today: keep the mechanism for the next one).
KNOWN_DRIVER_DEFECTS: dict[str, str] = {}


def _param(name: str):
    if name in KNOWN_DRIVER_DEFECTS:
        return pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_DRIVER_DEFECTS[name], strict=True))
    return name


@pytest.fixture(scope="module")
def results() -> dict[str, runner.CaseResult]:
    return {}


def _run(results, name: str) -> runner.CaseResult:
    if name not in results:
        results[name] = runner.run_case(name, seed=0)
    return results[name]


@pytest.mark.parametrize("name", [_param(n) for n in runner.list_cases()])
def test_case_passes(results, name):
    r = _run(results, name)
    detail = f"{name}: {r.message}; operators {r.operators}; final {r.final_violations[:3]}"
    assert r.ticks is not None, f"criterion never met: {detail}"
    assert r.held and r.passed, f"met at tick {r.ticks} but no longer holds at the end: {detail}"
    assert r.quorum_violations == 0, detail
    assert r.coverage_errors == 0, detail
    if r.kind == "balance":
        assert r.reversed_moves == 0, f"{name}: {r.reversed_examples}"
    if r.kind == "repair":
        assert r.final_violations == [], detail
    if r.ideal_mib:
        assert r.moved_mib >= r.ideal_mib - 1e-6, "moved less than the lower bound: the bound is wrong"


def test_case_list_and_metrics(results, tmp_path):
    names = runner.list_cases()
    for expected in ("balance-leader", "balance-region", "add-nodes", "delete-nodes", "store-down",
                     "region-split", "region-merge", "hot-read", "hot-write", "import-data",
                     "label-isolation", "leader-in-zone"):
        assert expected in names
    r = _run(results, "balance-leader")
    assert r.operators["balance-leader"]["success"] >= 300  # 600 leaders from one store to three
    assert r.moved_mib == 0 and r.ideal_mib == 0
    series = r.series
    assert len(series["tick"]) == r.ticks_run
    assert set(series["leaders"]) == {1, 2, 3}
    assert series["leaders"][1][0] > 550 and abs(series["leaders"][2][-1] - 200) <= 10
    png = runner.plot_case(r, str(tmp_path / "bl.png"))
    assert (tmp_path / "bl.png").stat().st_size > 1000 and png.endswith(".png")
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(runner.table([r]))
    assert "balance-leader" in console.export_text()
    d = r.to_json()
    assert d["passed"] and d["moved_bytes"] == 0 and "series" in d


def test_unknown_case_is_refused():
    with pytest.raises(ValueError, match="unknown case"):
        runner.run_case("no-such-case")


def test_same_seed_same_run():
    a = runner.run_case("region-split", seed=3, max_ticks=40)
    b = runner.run_case("region-split", seed=3, max_ticks=40)
    assert (a.total_operators, a.moved_mib, a.steps, a.series["regions"]) == (
        b.total_operators, b.moved_mib, b.steps, b.series["regions"])


def test_dropped_steps_are_resent():
    """Leaders that ignore a third of the steps: the driver resends, the case still passes."""
    r = runner.run_case("balance-leader", sim_config={"step_drop_prob": 0.33})
    assert r.passed and r.steps["dropped"] > 50 and r.reversed_moves == 0


# --------------------------------------------------------------------------
# the simulator's own mechanics
# --------------------------------------------------------------------------
def _tiny_run(regions: int = 8) -> runner.CaseRun:
    case = Case(name="tiny", description="", criterion="", check=lambda run: Check(True),
                stores=[StoreSpec(i, {"zone": f"z{i}", "host": f"h{i}"}) for i in range(1, 5)],
                regions=RegionSpec(count=regions, replicas=3, size_mib=8), schedulers=())
    return runner.CaseRun(case, seed=1)


def test_split_and_merge_keep_the_key_space_and_bump_versions():
    run = _tiny_run()
    sim = run.sim
    r = sim.sorted_regions()[3]
    v = r.version
    task = Task(r.id, None, None, r.conf_ver, r.version, 0)
    new = sim.split_region(r, (), task)
    assert len(new) == 1 and sim.coverage_error() is None
    child = sim.regions[new[0]]
    assert r.version == child.version == v + 1 and child.end == r.start
    assert {p.store_id for p in child.peers} == {p.store_id for p in r.peers}
    assert not ({p.id for p in child.peers} & {p.id for p in r.peers})
    assert sim.merge_blocker(child, r) == ""
    sim.merge_regions(child, r, task)
    assert child.id not in sim.regions and sim.coverage_error() is None
    assert r.version == v + 2
    assert sum(sim.peer_count(s) for s in sim.nodes) == 3 * len(sim.regions)


def test_quorum_check_catches_a_bad_removal():
    run = _tiny_run()
    sim = run.sim
    r = sim.sorted_regions()[0]
    stores = [p.store_id for p in r.peers]
    sim.store_down(stores[1])
    assert quorum_ok(r.peers, sim.is_alive)
    victim = r.peers[2]
    task = Task(r.id, RemovePeer(victim.store_id, victim.id), 7, r.conf_ver, r.version, 0)
    sim.change_membership(r, tuple(p for p in r.peers if p.id != victim.id), task)
    assert len(sim.quorum_violations) == 1 and sim.quorum_violations[0].operator_id == 7


def test_joint_quorum_needs_both_halves():
    alive = {1, 2, 3}.__contains__
    peers = (Peer(1, 1), Peer(2, 2), Peer(3, 4, PeerRole.DEMOTING_VOTER), Peer(4, 5, PeerRole.INCOMING_VOTER))
    # incoming {1,2,5}: 2 of 3 alive; outgoing {1,2,4}: 2 of 3 alive
    assert quorum_ok(peers, alive)
    assert not quorum_ok(peers, {1, 3}.__contains__)


def test_regions_tile_the_key_space():
    run = _tiny_run(regions=16)
    assert run.sim.coverage_error() is None
    rs = run.sim.sorted_regions()
    rs[5].end = rs[6].start + b"\x01"
    assert "overlap" in run.sim.coverage_error() or "gap" in run.sim.coverage_error()


# --------------------------------------------------------------------------
# chaos
# --------------------------------------------------------------------------
CHAOS_TICKS = 2000  # failures happen before this tick
QUIET_TICKS = 800  # then everything is up, and the driver gets this long to repair


def _chaos_case(seed: int) -> Case:
    rng = random.Random(seed)
    zones = {1: "z1", 2: "z1", 3: "z2", 4: "z2", 5: "z3", 6: "z3"}
    events = []
    t = 20
    while t < CHAOS_TICKS - 50:
        kind = rng.random()
        sid = rng.randint(1, 6)
        if kind < 0.55:  # a store fails, for a short blip or long enough to be repaired
            dur = rng.choice([rng.randint(5, 25), rng.randint(40, 220)])
            dur = min(dur, CHAOS_TICKS - t - 1)
            events.append(Call(t, lambda run, s=sid: _fail(run, s), f"store {sid} down"))
            events.append(Call(t + dur, lambda run, s=sid: run.sim.store_up(s), f"store {sid} up"))
            t += dur + rng.randint(5, 60)
        else:  # a store gets slow
            dur = rng.randint(50, 250)
            factor = rng.choice([2.0, 4.0, 8.0])
            events.append(Call(t, lambda run, s=sid, f=factor: run.sim.set_slow(s, f), f"store {sid} slow"))
            events.append(Call(t + dur, lambda run, s=sid: run.sim.set_slow(s, 1.0), f"store {sid} normal"))
            t += rng.randint(20, 80)
    return Case(
        name="chaos", description="failures, slow stores, lost and repeated messages",
        criterion="safety every tick; rules satisfied at the end",
        stores=[StoreSpec(i, {"zone": zones[i], "host": f"h{i}"}, snap_bandwidth=32) for i in range(1, 7)],
        regions=RegionSpec(count=180, replicas=3, size_mib=24, placement=random_placement),
        config={"location_labels": ["zone", "host"], "store_limit_add_peer": 120,
                "store_limit_remove_peer": 120, "patrol_regions_per_tick": 64},
        sim={"step_drop_prob": 0.1, "step_dup_prob": 0.05, "hb_drop_prob": 0.05, "hb_dup_prob": 0.05,
             "check_coverage": True},
        events=events, check=lambda run: Check(True), max_ticks=CHAOS_TICKS + QUIET_TICKS,
    )


def _fail(run: runner.CaseRun, sid: int) -> None:
    # at most one store down at a time: with 3 replicas a quorum always survives the failures
    # themselves, so any region losing its majority would be the driver's doing
    if any(not n.alive for n in run.sim.nodes.values()):
        return
    run.sim.store_down(sid)


def test_chaos_keeps_regions_safe_and_converges():
    run = runner.CaseRun(_chaos_case(seed=11), seed=11)
    sim = run.sim
    downs = 0
    for tick in range(CHAOS_TICKS + QUIET_TICKS):
        run.step()
        downs += sum(1 for n in sim.nodes.values() if not n.alive)
        # every tick: no membership change broke a majority, no key range lost or doubled
        assert not sim.quorum_violations, sim.quorum_violations[:3]
        assert not sim.coverage_errors, sim.coverage_errors[:3]
        if tick >= CHAOS_TICKS + 100 and tick % 25 == 0 and not rule_violations(run, limit=1):
            break
    assert all(n.alive for n in sim.nodes.values())
    bad = rule_violations(run)
    assert bad == [], bad
    assert downs > 200 and sim.elections > 0 and sim.steps_dropped > 0
    assert sim.heartbeats_refused > 0  # stale duplicates were refused, not applied
