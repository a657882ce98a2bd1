"""Placement rules: label constraints, validation, which rules apply to a
region, how its peers fit them, persistence."""

import json

import pytest

from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, Store
from opforge.placement.config import ScheduleConfig
from opforge.placement.rules import (
    LabelConstraint, Rule, RuleGroup, RuleManager, match_label_constraints,
)

NOW = 1000.0


def store(sid, **labels):
    return Store(sid, labels=dict(labels), capacity=100, available=50, last_heartbeat=NOW)


def region(rid, *peers, start=b"", end=b"", leader=None, learners=(), down=(), pending=()):
    """peers: (peer id, store id) pairs; the first voter leads unless told."""
    ps = tuple(Peer(pid, sid, PeerRole.LEARNER if pid in learners else PeerRole.VOTER) for pid, sid in peers)
    lead = next(p for p in ps if p.id == leader) if leader is not None else next(p for p in ps if p.is_voter)
    return Region(rid, start_key=start, end_key=end, peers=ps, leader=lead, down_peers=tuple(down),
                  pending_peers=tuple(pending))


# ---------------------------------------------------------------------------
# label constraints
# ---------------------------------------------------------------------------
class TestLabelConstraint:
    a = store(1, zone="z1", disk="ssd")
    b = store(2, zone="z2")
    c = store(3)  # no labels

    def test_in(self):
        lc = LabelConstraint("zone", "in", ["z1", "z3"])
        assert [lc.matches(s) for s in (self.a, self.b, self.c)] == [True, False, False]

    def test_not_in_is_true_when_label_missing(self):
        lc = LabelConstraint("zone", "notIn", ["z1"])
        assert [lc.matches(s) for s in (self.a, self.b, self.c)] == [False, True, True]

    def test_exists_and_not_exists(self):
        ex, nex = LabelConstraint("disk", "exists"), LabelConstraint("disk", "notExists")
        assert [ex.matches(s) for s in (self.a, self.b, self.c)] == [True, False, False]
        assert [nex.matches(s) for s in (self.a, self.b, self.c)] == [False, True, True]

    def test_empty_value_counts_as_missing(self):
        s = store(4, zone="")
        assert not LabelConstraint("zone", "exists").matches(s)
        assert LabelConstraint("zone", "notExists").matches(s)
        assert not LabelConstraint("zone", "in", ["z1"]).matches(s)

    def test_all_constraints_must_hold(self):
        cons = [LabelConstraint("zone", "in", ["z1", "z2"]), LabelConstraint("disk", "exists")]
        assert match_label_constraints(self.a, cons)
        assert not match_label_constraints(self.b, cons)
        assert match_label_constraints(self.c, []) and not match_label_constraints(None, [])

    def test_exclusive_label_fences_store_off(self):
        fenced = store(5, zone="z1", **{"$tier": "gpu-hbm"})
        assert not match_label_constraints(fenced, [LabelConstraint("zone", "in", ["z1"])])
        assert not match_label_constraints(fenced, [])
        assert match_label_constraints(fenced, [LabelConstraint("$tier", "in", ["gpu-hbm"])])

    @pytest.mark.parametrize("key,op,values,msg", [
        ("zone", "equals", ["z1"], "unknown op"),
        ("", "in", ["z1"], "key"),
        ("zone", "in", [], "at least one value"),
        ("zone", "exists", ["z1"], "takes no values"),
        ("zone", "in", "z1", "list"),
    ])
    def test_malformed(self, key, op, values, msg):
        with pytest.raises(ValueError, match=msg):
            LabelConstraint(key, op, values)


# ---------------------------------------------------------------------------
# rule validation
# ---------------------------------------------------------------------------
class TestRuleValidation:
    @pytest.mark.parametrize("kwargs,msg", [
        (dict(count=0), "count must be a positive"),
        (dict(count=-2), "count must be a positive"),
        (dict(role="witness"), "unknown role"),
        (dict(role="leader", count=2), "one leader"),
        (dict(start_key=b"b", end_key=b"b"), "must sort before"),
        (dict(start_key=b"c", end_key=b"b"), "must sort before"),
        (dict(label_constraints=[{"key": "zone", "op": "near", "values": ["z"]}]), "unknown op"),
        (dict(location_labels=["zone"], isolation_level="rack"), "isolation_level 'rack' must be one of"),
        (dict(location_labels=["zone", "zone"]), "duplicates"),
    ])
    def test_malformed_rule(self, kwargs, msg):
        with pytest.raises(ValueError, match=msg):
            Rule("g", "r", **kwargs)

    @pytest.mark.parametrize("cons", [
        [LabelConstraint("zone", "in", ["z1"]), LabelConstraint("zone", "notIn", ["z1"])],
        [LabelConstraint("zone", "exists"), LabelConstraint("zone", "notExists")],
        [LabelConstraint("zone", "in", ["z1"]), LabelConstraint("zone", "in", ["z2"])],
        [LabelConstraint("zone", "in", ["z1"]), LabelConstraint("zone", "notExists")],
    ])
    def test_contradictory_constraints(self, cons):
        with pytest.raises(ValueError, match="contradict"):
            Rule("g", "r", label_constraints=cons)

    def test_compatible_constraints_on_one_key_are_fine(self):
        r = Rule("g", "r", label_constraints=[LabelConstraint("zone", "in", ["z1", "z2"]),
                                              LabelConstraint("zone", "notIn", ["z1"])])
        assert match_label_constraints(store(1, zone="z2"), r.label_constraints)
        assert not match_label_constraints(store(2, zone="z1"), r.label_constraints)

    def test_duplicate_id_in_group(self):
        m = RuleManager()
        m.add_rule(Rule("g", "r", count=1))
        with pytest.raises(ValueError, match="already exists"):
            m.add_rule(Rule("g", "r", count=2))
        with pytest.raises(ValueError, match="two rules with id 'x'"):
            m.set_rules([Rule("g", "x"), Rule("g", "x", count=2)])
        assert m.get_rule("g", "x") is None  # nothing of the failed batch stayed
        m.add_rule(Rule("h", "r"))  # same id, other group: fine

    def test_set_rule_replaces_same_key(self):
        m = RuleManager()
        m.set_rule(Rule("pd", "default", count=5))
        assert m.get_rule("pd", "default").count == 5
        assert len(m.list_rules()) == 1

    def test_default_rule_follows_replication_config(self):
        m = RuleManager(ScheduleConfig(max_replicas=3))
        m.apply_replication_config(ScheduleConfig(max_replicas=5, location_labels=["zone"], isolation_level="zone"))
        r = m.get_rule("pd", "default")
        assert (r.count, r.location_labels, r.isolation_level) == (5, ("zone",), "zone")
        with pytest.raises(ValueError, match="count must be a positive"):
            m.apply_replication_config(ScheduleConfig(max_replicas=0))
        assert m.get_rule("pd", "default").count == 5

    def test_cannot_delete_last_rule(self):
        m = RuleManager()
        with pytest.raises(ValueError, match="no rule left"):
            m.delete_rule("pd", "default")
        assert m.get_rule("pd", "default") is not None

    def test_range_needs_a_voter_rule(self):
        m = RuleManager()
        with pytest.raises(ValueError, match="at least one voter"):
            m.set_rule(Rule("pd", "only-learners", override=True, index=1, role="learner", count=1))
        assert [r.id for r in m.list_rules()] == ["default"]

    def test_two_leader_rules_on_one_range(self):
        m = RuleManager()
        m.set_rule(Rule("pd", "lead-a", role="leader", start_key=b"a", end_key=b"m"))
        with pytest.raises(ValueError, match="more than one leader rule"):
            m.set_rule(Rule("pd", "lead-b", role="leader", start_key=b"k", end_key=b"z"))
        m.set_rule(Rule("pd", "lead-b", role="leader", start_key=b"m", end_key=b"z"))  # disjoint: fine

    def test_bad_config_isolation_level(self):
        with pytest.raises(ValueError, match="isolation_level 'zone' must be one of"):
            RuleManager(ScheduleConfig(isolation_level="zone"))

    def test_unsatisfiable_by_current_stores_is_allowed_but_explained(self):
        m = RuleManager(ScheduleConfig(max_replicas=3, location_labels=["zone"], isolation_level="zone"))
        m.set_rule(Rule("pd", "gpu", role="learner", count=1,
                        label_constraints=[LabelConstraint("gpu", "in", ["h200"])]))
        stores = [store(1, zone="z1"), store(2, zone="z1"), store(3, zone="z2")]
        notes = m.explain(stores)
        assert any("pd/gpu" in n and "no store matches" in n for n in notes)
        assert any("pd/default" in n and "isolation_level 'zone' needs 3" in n for n in notes)
        good = [store(1, zone="z1", gpu="h200"), store(2, zone="z2"), store(3, zone="z3")]
        assert m.explain(good) == []


# ---------------------------------------------------------------------------
# which rules apply
# ---------------------------------------------------------------------------
def ids(rules):
    return [f"{r.group_id}/{r.id}" for r in rules]


class TestRulesFor:
    def test_key_range_matching(self):
        m = RuleManager()
        m.set_rule(Rule("pd", "tbl", start_key=b"b", end_key=b"d", role="learner", count=1))
        assert ids(m.rules_for(region(1, (1, 1), start=b"", end=b"b"))) == ["pd/default"]
        assert ids(m.rules_for(region(2, (1, 1), start=b"b", end=b"c"))) == ["pd/default", "pd/tbl"]
        assert ids(m.rules_for(region(3, (1, 1), start=b"c", end=b"d"))) == ["pd/default", "pd/tbl"]
        assert ids(m.rules_for(region(4, (1, 1), start=b"d", end=b""))) == ["pd/default"]
        # spans the boundary at b"b" or b"d": no rules until it is split
        assert m.rules_for(region(5, (1, 1), start=b"a", end=b"c")) == []
        assert m.rules_for(region(6, (1, 1), start=b"c", end=b"")) == []
        assert m.split_keys(b"a", b"") == [b"b", b"d"]
        assert m.split_keys(b"b", b"d") == []

    def test_rule_override_within_group(self):
        m = RuleManager()
        m.set_rule(Rule("pd", "three-zones", index=1, override=True, count=3, start_key=b"t", end_key=b"u"))
        assert ids(m.rules_for(region(1, (1, 1), start=b"t", end=b"t5"))) == ["pd/three-zones"]
        assert ids(m.rules_for(region(2, (1, 1), start=b"a", end=b"b"))) == ["pd/default"]

    def test_rule_override_only_hides_earlier_rules(self):
        m = RuleManager()
        m.set_rules([Rule("pd", "a-first", index=-1, role="learner"),
                     Rule("pd", "mid", index=1, override=True),
                     Rule("pd", "z-after", index=2, role="learner")])
        assert ids(m.rules_for(region(1, (1, 1)))) == ["pd/mid", "pd/z-after"]

    def test_group_override_and_index_order(self):
        m = RuleManager()
        m.set_rule(Rule("tiflash", "columnar", role="learner"))
        m.set_rule(Rule("app", "pinned", count=2))
        # default order: group index 0 for all, then group id
        assert ids(m.rules_for(region(1, (1, 1)))) == ["app/pinned", "pd/default", "tiflash/columnar"]
        m.set_group(RuleGroup("app", index=5, override=True))
        # app now sorts last and hides every group before it
        assert ids(m.rules_for(region(1, (1, 1)))) == ["app/pinned"]
        m.set_group(RuleGroup("app", index=5, override=False))
        assert ids(m.rules_for(region(1, (1, 1)))) == ["pd/default", "tiflash/columnar", "app/pinned"]
        m.delete_group("app")
        assert m.get_group("app") == RuleGroup("app")

    def test_pd_documented_example(self):
        # ruleA g4 override, ruleB g4 override, ruleC g3, ruleD g2; group 3 overrides.
        m = RuleManager()
        m.set_group_bundle(RuleGroup("3", override=True), [Rule("3", "C")])
        m.set_rules([Rule("4", "A", override=True), Rule("4", "B", override=True), Rule("2", "D")])
        m.set_group(RuleGroup("4"))
        m.set_group(RuleGroup("2"))
        # group "pd" sorts after "4" and does not override: its default rule stays
        assert ids(m.rules_for(region(1, (1, 1)))) == ["3/C", "4/B", "pd/default"]
        m.delete_rule("pd", "default")
        assert ids(m.rules_for(region(1, (1, 1)))) == ["3/C", "4/B"]


# ---------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------
def zones_cluster(*zone_host):
    c = Cluster(clock=lambda: NOW)
    for i, (z, h) in enumerate(zone_host, start=1):
        c.put_store(store(i, zone=z, host=h))
    return c


class TestFit:
    cfg = ScheduleConfig(max_replicas=3, location_labels=["zone", "host"])

    def test_satisfied_with_isolation_score(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"))
        fit = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2), (13, 3)), c)
        assert fit.is_satisfied() and fit.missing == 0 and fit.orphan_peers == []
        assert fit.rule_fits[0].isolation_score == 300  # three pairs apart at "zone": 100 each

    def test_missing_replica(self):
        c = zones_cluster(("z1", "h1"), ("z1", "h2"), ("z2", "h3"))
        fit = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2)), c)
        assert not fit.is_satisfied()
        assert fit.missing == 1 and fit.rule_fits[0].missing == 1
        assert fit.rule_fits[0].isolation_score == 1  # same zone, different host

    def test_orphan_is_the_worse_isolated_extra(self):
        c = zones_cluster(("z1", "h1"), ("z1", "h2"), ("z2", "h3"), ("z3", "h4"))
        r = region(1, (11, 1), (12, 2), (13, 3), (14, 4))
        fit = RuleManager(self.cfg).fit_region(r, c)
        assert len(fit.orphan_peers) == 1 and fit.orphan_peers[0].store_id in (1, 2)
        assert fit.rule_fits[0].isolation_score == 300
        assert not fit.is_satisfied()

    def test_healthy_peers_preferred(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"), ("z3", "h4"))
        r = region(1, (11, 1), (12, 2), (13, 3), (14, 4), down=(13,))
        fit = RuleManager(self.cfg).fit_region(r, c)
        assert [p.id for p in fit.orphan_peers] == [13]
        assert fit.rule_fits[0].unhealthy_peers == []

    def test_down_store_makes_peer_unhealthy(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"))
        c.stores[3].last_heartbeat = 0.0
        fit = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2), (13, 3)), c)
        assert [p.id for p in fit.rule_fits[0].unhealthy_peers] == [13]
        # a plain list of stores has no notion of down; down_stores tells it
        fit2 = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2), (13, 3)), list(c.stores.values()),
                                                down_stores={3})
        assert [p.id for p in fit2.rule_fits[0].unhealthy_peers] == [13]

    def test_learner_in_voter_rule_has_different_role(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"))
        fit = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2), (13, 3), learners=(13,)), c)
        assert [p.id for p in fit.rule_fits[0].peers_with_different_role] == [13]
        assert not fit.is_satisfied()

    def test_leader_rule_and_constraints(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"))
        m = RuleManager(self.cfg)
        m.set_group_bundle(RuleGroup("pd"), [
            Rule("pd", "leader", role="leader", count=1, label_constraints=[LabelConstraint("zone", "in", ["z1"])]),
            Rule("pd", "voters", role="voter", count=2, index=1, location_labels=["zone"]),
        ])
        good = m.fit_region(region(1, (11, 1), (12, 2), (13, 3), leader=11), c)
        assert good.is_satisfied()
        assert [p.id for p in good.rule_fit_of_store(1).peers] == [11]
        bad = m.fit_region(region(1, (11, 1), (12, 2), (13, 3), leader=12), c)
        lf = bad.rule_fits[0]
        assert lf.rule.id == "leader" and [p.id for p in lf.peers_with_different_role] == [11]
        assert not bad.is_satisfied()

    def test_peer_on_unknown_store_is_orphan(self):
        c = zones_cluster(("z1", "h1"), ("z2", "h2"), ("z3", "h3"))
        fit = RuleManager(self.cfg).fit_region(region(1, (11, 1), (12, 2), (19, 9)), c)
        assert [p.id for p in fit.orphan_peers] == [19] and fit.missing == 1

    def test_no_rules_never_satisfied(self):
        m = RuleManager()
        m.set_rule(Rule("pd", "x", start_key=b"m"))
        fit = m.fit_region(region(1, (11, 1), start=b"a", end=b"z"), [store(1)])
        assert fit.rule_fits == [] and not fit.is_satisfied()


# ---------------------------------------------------------------------------
# persistence
# ---------------------------------------------------------------------------
class TestJson:
    def test_round_trip(self):
        m = RuleManager(ScheduleConfig(max_replicas=5, location_labels=["zone", "host"], isolation_level="zone"))
        m.set_group(RuleGroup("tiflash", index=3, override=False))
        m.set_rule(Rule("tiflash", "col", start_key=b"\x00t", end_key=b"\x00u", role="learner", count=2,
                        label_constraints=[LabelConstraint("engine", "in", ["columnar"]),
                                           LabelConstraint("zone", "notIn", ["z9"])],
                        location_labels=["zone"]))
        text = json.dumps(m.to_json())
        m2 = RuleManager.from_json(json.loads(text))
        assert m2.list_rules() == m.list_rules()
        assert m2.get_group("tiflash") == RuleGroup("tiflash", 3, False)
        assert m2.to_json() == m.to_json()
        assert json.loads(text)["rules"][0]["start_key"] == ""  # keys are hex
        r = region(1, (1, 1), start=b"\x00t1", end=b"\x00t2")
        assert ids(m2.rules_for(r)) == ids(m.rules_for(r)) == ["pd/default", "tiflash/col"]

    def test_empty_state_gives_default_rule(self):
        m = RuleManager.from_json({}, ScheduleConfig(max_replicas=1))
        assert [(r.id, r.count) for r in m.list_rules()] == [("default", 1)]

    @pytest.mark.parametrize("state,msg", [
        ({"rules": [{"group_id": "g", "id": "r", "role": "voter", "count": 1, "start_key": "zz"}]}, "hex"),
        ({"rules": [{"group_id": "g", "id": "r", "role": "voter"}]}, "missing field 'count'"),
        ({"rules": [{"group_id": "g", "id": "r", "role": "voter", "count": 1, "colour": 1}]}, "unknown fields"),
        ({"rules": [{"group_id": "g", "id": "r", "role": "voter", "count": 1}] * 2}, "two rules"),
        ({"groups": [{"id": "g", "index": "high"}]}, "index must be an integer"),
        ([], "JSON object"),
    ])
    def test_bad_state(self, state, msg):
        with pytest.raises(ValueError, match=msg):
            RuleManager.from_json(state)
