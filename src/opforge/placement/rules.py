"""Placement rules: where a region's replicas must live (PD's placement rules).

A :class:`Rule` says "``count`` peers of role ``role`` for the key range
``[start_key, end_key)``, on stores whose labels satisfy
``label_constraints``, spread as far apart as ``location_labels`` allow (and
never two in the same ``isolation_level`` domain)". Rules live in groups
(:class:`RuleGroup`); the :class:`RuleManager` keeps them, validates every
change, tells which rules apply to a region (:meth:`RuleManager.rules_for`)
and how a region's peers fit them (:meth:`RuleManager.fit_region`).

Which rules apply to a key range (as PD):

* rules are ordered by ``(group index, group id, rule index, rule id)``;
* a rule with ``override=True`` discards the rules ordered before it *in its
  own group*; a group with ``override=True`` discards the rules of every group
  ordered before it;
* the key space is cut at every rule's start and end key; a region that spans
  one of these cuts gets no rules at all (it has to be split first: see
  :meth:`RuleManager.split_keys` and the split checker).

Validation raises :class:`ValueError` naming the rule and the problem:
malformed fields (empty ids, unknown role or constraint op, ``count <= 0``,
``start_key >= end_key``, a leader rule with ``count > 1``), contradictory
label constraints (``zone in [a]`` with ``zone notIn [a]``, ``exists`` with
``notExists``...), an ``isolation_level`` that is not one of the rule's
``location_labels``, two rules with one ``(group_id, id)`` in one batch, and a
rule set that leaves a key range with rules but no voter, or with two leader
rules. A rule that no *current* store can satisfy is allowed (stores come and
go) but :meth:`RuleManager.explain` reports it.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from opforge.placement.cluster import Cluster, Peer, PeerRole, Region, Store, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.location import REPLICA_BASE_SCORE, compare_location, distinct_score, isolation_score  # noqa: F401

CONSTRAINT_OPS = ("in", "notIn", "exists", "notExists")
ROLES = ("voter", "leader", "follower", "learner")
VOTER_ROLES = ("voter", "leader", "follower")
DEFAULT_GROUP_ID = "pd"
DEFAULT_RULE_ID = "default"


def _is_exclusive_label(key: str) -> bool:
    """Stores labelled ``$something`` only take peers of rules that name that
    label in a constraint (PD's exclusive labels: a way to fence stores off)."""
    return key.startswith("$")


def _labels_of(store: Store | Mapping[str, str]) -> Mapping[str, str]:
    return store if isinstance(store, Mapping) else store.labels


# --------------------------------------------------------------------------
# label constraints
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelConstraint:
    """One condition on a store's labels.

    ``in``: the label is set and its value is one of ``values``;
    ``notIn``: the label is unset, or its value is none of ``values``;
    ``exists``: the label is set (to a non-empty value); ``notExists``: it is not.
    """

    key: str
    op: str
    values: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.values, str):
            raise ValueError(f"label constraint {self.key!r}: values must be a list of strings, "
                             f"got the string {self.values!r}")
        object.__setattr__(self, "values", tuple(self.values))
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"label constraint: key must be a non-empty string, got {self.key!r}")
        if self.op not in CONSTRAINT_OPS:
            raise ValueError(f"label constraint on {self.key!r}: unknown op {self.op!r}; "
                             f"use one of {list(CONSTRAINT_OPS)}")
        if not all(isinstance(v, str) and v for v in self.values):
            raise ValueError(f"label constraint on {self.key!r}: values must be non-empty strings, "
                             f"got {list(self.values)!r}")
        if self.op in ("in", "notIn") and not self.values:
            raise ValueError(f"label constraint {self.key!r} {self.op}: needs at least one value")
        if self.op in ("exists", "notExists") and self.values:
            raise ValueError(f"label constraint {self.key!r} {self.op}: takes no values, "
                             f"got {list(self.values)!r}")

    def matches(self, store: Store | Mapping[str, str]) -> bool:
        value = _labels_of(store).get(self.key, "")
        if self.op == "in":
            return value != "" and value in self.values
        if self.op == "notIn":
            return value == "" or value not in self.values
        if self.op == "exists":
            return value != ""
        return value == ""  # notExists

    def to_json(self) -> dict:
        d = {"key": self.key, "op": self.op}
        if self.values:
            d["values"] = list(self.values)
        return d

    @classmethod
    def from_json(cls, d) -> "LabelConstraint":
        if not isinstance(d, Mapping):
            raise ValueError(f"label constraint must be an object, got {type(d).__name__}")
        unknown = set(d) - {"key", "op", "values"}
        if unknown:
            raise ValueError(f"label constraint: unknown fields {sorted(unknown)}")
        return cls(d.get("key", ""), d.get("op", ""), tuple(d.get("values") or ()))


def match_label_constraints(store: Store | None, constraints: Iterable[LabelConstraint]) -> bool:
    """Whether ``store`` satisfies every constraint (an unknown store never does;
    a store with an exclusive ``$label`` only matches constraints naming it)."""
    if store is None:
        return False
    constraints = tuple(constraints)
    named = {c.key for c in constraints}
    if any(_is_exclusive_label(k) and k not in named for k in store.labels):
        return False
    return all(c.matches(store) for c in constraints)


def _contradiction(constraints: tuple[LabelConstraint, ...]) -> str | None:
    """Why no label set at all could satisfy ``constraints`` (None if some could)."""
    by_key: dict[str, list[LabelConstraint]] = {}
    for c in constraints:
        by_key.setdefault(c.key, []).append(c)
    for key, cs in by_key.items():
        unset_ok = True  # may the label be unset?
        only: set[str] | None = None  # None: any value (minus `banned`)
        banned: set[str] = set()
        for c in cs:
            if c.op == "in":
                unset_ok = False
                only = set(c.values) if only is None else only & set(c.values)
            elif c.op == "notIn":
                banned |= set(c.values)
            elif c.op == "exists":
                unset_ok = False
            else:
                only = set()
        some_value_ok = only is None or bool(only - banned)
        if not unset_ok and not some_value_ok:
            return f"label constraints on {key!r} contradict each other: " + ", ".join(
                f"{c.op} {list(c.values)}" if c.values else c.op for c in cs)
    return None


# --------------------------------------------------------------------------
# rules and groups
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    group_id: str
    id: str
    index: int = 0
    override: bool = False
    start_key: bytes = b""
    end_key: bytes = b""  # b"" = +infinity
    role: str = "voter"
    count: int = 1
    label_constraints: tuple[LabelConstraint, ...] = ()
    location_labels: tuple[str, ...] = ()
    isolation_level: str = ""

    def __post_init__(self):
        where = f"rule {self.group_id!r}/{self.id!r}"
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ValueError(f"{where}: group_id must be a non-empty string")
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"{where}: id must be a non-empty string")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ValueError(f"{where}: index must be an integer, got {self.index!r}")
        if not isinstance(self.override, bool):
            raise ValueError(f"{where}: override must be a boolean, got {self.override!r}")
        if not isinstance(self.start_key, bytes) or not isinstance(self.end_key, bytes):
            raise ValueError(f"{where}: start_key and end_key must be bytes")
        if self.end_key and self.start_key >= self.end_key:
            raise ValueError(f"{where}: start_key {self.start_key.hex()!r} must sort before "
                             f"end_key {self.end_key.hex()!r}")
        if self.role not in ROLES:
            raise ValueError(f"{where}: unknown role {self.role!r}; use one of {list(ROLES)}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0:
            raise ValueError(f"{where}: count must be a positive integer, got {self.count!r}")
        if self.role == "leader" and self.count > 1:
            raise ValueError(f"{where}: a leader rule defines one leader, got count {self.count}")
        if isinstance(self.location_labels, str) or isinstance(self.label_constraints, (str, Mapping)):
            raise ValueError(f"{where}: location_labels and label_constraints must be lists")
        cons = tuple(c if isinstance(c, LabelConstraint) else LabelConstraint.from_json(c)
                     for c in self.label_constraints)
        object.__setattr__(self, "label_constraints", cons)
        labels = tuple(self.location_labels)
        if not all(isinstance(label, str) and label for label in labels):
            raise ValueError(f"{where}: location_labels must be non-empty strings, got {list(labels)!r}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"{where}: location_labels has duplicates: {list(labels)!r}")
        object.__setattr__(self, "location_labels", labels)
        if not isinstance(self.isolation_level, str):
            raise ValueError(f"{where}: isolation_level must be a string")
        if self.isolation_level and self.isolation_level not in labels:
            raise ValueError(f"{where}: isolation_level {self.isolation_level!r} must be one of "
                             f"location_labels {list(labels)!r}")
        why = _contradiction(cons)
        if why:
            raise ValueError(f"{where}: {why}; no store could ever match")

    @property
    def key(self) -> tuple[str, str]:
        return (self.group_id, self.id)

    @property
    def is_voter_role(self) -> bool:
        return self.role in VOTER_ROLES

    def covers(self, start: bytes, end: bytes) -> bool:
        """Whether the rule's range holds all of ``[start, end)``."""
        if start < self.start_key:
            return False
        if self.end_key == b"":
            return True
        return end != b"" and end <= self.end_key

    def matches_store(self, store: Store | None) -> bool:
        return match_label_constraints(store, self.label_constraints)

    def to_json(self) -> dict:
        d = {"group_id": self.group_id, "id": self.id, "index": self.index, "override": self.override,
             "start_key": self.start_key.hex(), "end_key": self.end_key.hex(), "role": self.role,
             "count": self.count}
        if self.label_constraints:
            d["label_constraints"] = [c.to_json() for c in self.label_constraints]
        if self.location_labels:
            d["location_labels"] = list(self.location_labels)
        if self.isolation_level:
            d["isolation_level"] = self.isolation_level
        return d

    @classmethod
    def from_json(cls, d) -> "Rule":
        if not isinstance(d, Mapping):
            raise ValueError(f"a rule must be a JSON object, got {type(d).__name__}")
        known = {"group_id", "id", "index", "override", "start_key", "end_key", "role", "count",
                 "label_constraints", "location_labels", "isolation_level"}
        unknown = set(d) - known
        where = f"rule {d.get('group_id')!r}/{d.get('id')!r}"
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
        for name in ("group_id", "id", "role", "count"):
            if name not in d:
                raise ValueError(f"{where}: missing field {name!r}")
        keys = {}
        for name in ("start_key", "end_key"):
            text = d.get(name, "")
            try:
                keys[name] = bytes.fromhex(text)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: {name} must be a hex string, got {text!r}") from None
        cons = d.get("label_constraints") or []
        if not isinstance(cons, list):
            raise ValueError(f"{where}: label_constraints must be a list")
        labels = d.get("location_labels") or []
        if not isinstance(labels, list):
            raise ValueError(f"{where}: location_labels must be a list")
        return cls(d["group_id"], d["id"], d.get("index", 0), d.get("override", False), keys["start_key"],
                   keys["end_key"], d["role"], d["count"], tuple(LabelConstraint.from_json(c) for c in cons),
                   tuple(labels), d.get("isolation_level", ""))


@dataclass(frozen=True)
class RuleGroup:
    id: str
    index: int = 0
    override: bool = False

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"rule group: id must be a non-empty string, got {self.id!r}")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ValueError(f"rule group {self.id!r}: index must be an integer, got {self.index!r}")
        if not isinstance(self.override, bool):
            raise ValueError(f"rule group {self.id!r}: override must be a boolean, got {self.override!r}")

    def to_json(self) -> dict:
        return {"id": self.id, "index": self.index, "override": self.override}

    @classmethod
    def from_json(cls, d) -> "RuleGroup":
        if not isinstance(d, Mapping):
            raise ValueError(f"a rule group must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"id", "index", "override"}
        if unknown:
            raise ValueError(f"rule group {d.get('id')!r}: unknown fields {sorted(unknown)}")
        return cls(d.get("id", ""), d.get("index", 0), d.get("override", False))


# --------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------
# The location arithmetic is shared with the schedulers' filters.
location_distance_index = compare_location


@dataclass
class RuleFit:
    """The peers one rule got, and how well they fit it."""

    rule: Rule
    peers: list[Peer] = field(default_factory=list)
    peers_with_different_role: list[Peer] = field(default_factory=list)  # right store, wrong role
    unhealthy_peers: list[Peer] = field(default_factory=list)  # down, pending, or on a down store
    isolation_score: float = 0.0
    stores: list[Store] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return max(self.rule.count - len(self.peers), 0)

    def is_satisfied(self) -> bool:
        return len(self.peers) == self.rule.count and not self.peers_with_different_role

    def contains_store(self, store_id: int) -> bool:
        return any(p.store_id == store_id for p in self.peers)

    def _key(self) -> tuple:
        return (len(self.peers), -len(self.unhealthy_peers), -len(self.peers_with_different_role),
                self.isolation_score)

    def to_json(self) -> dict:
        return {"rule": list(self.rule.key), "peers": [p.id for p in self.peers],
                "peers_with_different_role": [p.id for p in self.peers_with_different_role],
                "unhealthy_peers": [p.id for p in self.unhealthy_peers], "missing": self.missing,
                "isolation_score": self.isolation_score}


@dataclass
class RegionFit:
    """How a region's peers are divided among the rules that apply to it."""

    rule_fits: list[RuleFit] = field(default_factory=list)
    orphan_peers: list[Peer] = field(default_factory=list)  # peers no rule wants

    def is_satisfied(self) -> bool:
        """Every rule has its count of peers in the right role and no peer is
        left over (False when no rule applies)."""
        return bool(self.rule_fits) and all(rf.is_satisfied() for rf in self.rule_fits) and not self.orphan_peers

    @property
    def missing(self) -> int:
        return sum(rf.missing for rf in self.rule_fits)

    def rule_fit_of(self, peer_id: int) -> RuleFit | None:
        for rf in self.rule_fits:
            if any(p.id == peer_id for p in rf.peers):
                return rf
        return None

    def rule_fit_of_store(self, store_id: int) -> RuleFit | None:
        for rf in self.rule_fits:
            if rf.contains_store(store_id):
                return rf
        return None

    def to_json(self) -> dict:
        return {"rule_fits": [rf.to_json() for rf in self.rule_fits],
                "orphan_peers": [p.id for p in self.orphan_peers], "satisfied": self.is_satisfied()}


def _store_view(stores) -> tuple[dict[int, Store], Callable[[int], bool]]:
    """(stores by id, is-store-down) from a Cluster, a mapping or an iterable."""
    if isinstance(stores, Cluster):
        return stores.stores, stores.is_store_down
    if isinstance(stores, Mapping):
        by_id = dict(stores)
    else:
        by_id = {s.id: s for s in stores}
    return by_id, (lambda sid: False)


def _matches_role(peer: Peer, is_leader: bool, role: str) -> bool:
    if role == "voter":
        return peer.is_voter
    if role == "leader":
        return is_leader
    if role == "follower":
        return peer.is_voter and not is_leader
    return peer.role == PeerRole.LEARNER


def fit_region(region: Region, rules: list[Rule], stores, down_stores: Iterable[int] = ()) -> RegionFit:
    """Divide ``region``'s peers among ``rules`` (in order) the way PD does.

    Each rule takes up to ``count`` unused peers whose stores match its label
    constraints. Assignments are compared rule by rule, earlier rules first;
    for one rule, more peers beat fewer, then fewer unhealthy peers, then fewer
    peers in the wrong role, then a higher isolation score. Peers no rule takes
    are orphans. Healthy peers are tried first, so ties go to them."""
    by_id, is_down = _store_view(stores)
    down_stores = set(down_stores)
    leader_id = region.leader.id if region.leader is not None else None

    def unhealthy(p: Peer) -> int:
        if p.id in region.down_peers or p.store_id in down_stores or is_down(p.store_id):
            return 0
        return 1 if p.id in region.pending_peers else 2

    peers = sorted(region.peers, key=lambda p: (-unhealthy(p), p.id))
    health = {p.id: unhealthy(p) for p in peers}

    def make_fit(rule: Rule, chosen: tuple[Peer, ...]) -> RuleFit:
        rf = RuleFit(rule, list(chosen))
        rf.stores = [by_id[p.store_id] for p in chosen]
        rf.isolation_score = isolation_score(rf.stores, rule.location_labels)
        for p in chosen:
            if not _matches_role(p, p.id == leader_id, rule.role):
                rf.peers_with_different_role.append(p)
            if health[p.id] < 2:
                rf.unhealthy_peers.append(p)
        return rf

    best: list = [None, None]  # [keys, fits]

    def search(i: int, used: frozenset, fits: list[RuleFit], keys: list[tuple]) -> None:
        if best[0] is not None and keys < best[0][:len(keys)]:
            return  # already worse than the best on an earlier rule
        if i == len(rules):
            if best[0] is None or keys > best[0]:
                best[0], best[1] = list(keys), list(fits)
            return
        rule = rules[i]
        cands = [p for p in peers if p.id not in used and p.store_id in by_id
                 and match_label_constraints(by_id[p.store_id], rule.label_constraints)]
        for combo in itertools.combinations(cands, min(rule.count, len(cands))):
            rf = make_fit(rule, combo)
            search(i + 1, used | {p.id for p in combo}, fits + [rf], keys + [rf._key()])

    search(0, frozenset(), [], [])
    fits = best[1] or []
    taken = {p.id for rf in fits for p in rf.peers}
    return RegionFit(fits, [p for p in peers if p.id not in taken])


# --------------------------------------------------------------------------
# the manager
# --------------------------------------------------------------------------
def _prepare_rules_for_apply(rules: list[Rule], groups: Mapping[str, RuleGroup]) -> tuple[Rule, ...]:
    """``rules`` sorted in apply order; drop what overrides hide."""
    out: list[Rule] = []
    current: list[Rule] = []  # the kept rules of the group being read
    group_id = None
    for r in rules:
        if r.group_id != group_id:
            g = groups.get(r.group_id)
            if g is not None and g.override:
                out = []  # this group overrides every group before it
            else:
                out.extend(current)
            current, group_id = [], r.group_id
        if r.override:
            current = []  # this rule overrides the earlier rules of its group
        current.append(r)
    out.extend(current)
    return tuple(out)


@dataclass(frozen=True)
class _Segment:
    start: bytes
    end: bytes  # b"" = +infinity
    rules: tuple[Rule, ...]


class RuleManager:
    """Keeps the placement rules and rule groups; every change is validated as
    a whole and either applies completely or raises ValueError and changes
    nothing."""

    def __init__(self, config: ScheduleConfig | None = None, *, default_rule: bool = True):
        config = config or ScheduleConfig()
        self._rules: dict[tuple[str, str], Rule] = {}
        self._groups: dict[str, RuleGroup] = {}
        self._segments: list[_Segment] = []
        self._starts: list[bytes] = []
        self.version = 0  # bumped by every change (for caches)
        if default_rule:
            self.set_rule(self.default_rule(config))

    @staticmethod
    def default_rule(config: ScheduleConfig) -> Rule:
        """The rule PD creates from the replication config: ``max_replicas`` voters."""
        if config.isolation_level and config.isolation_level not in config.location_labels:
            raise ValueError(f"isolation_level {config.isolation_level!r} must be one of "
                             f"location_labels {list(config.location_labels)!r} or empty")
        return Rule(DEFAULT_GROUP_ID, DEFAULT_RULE_ID, role="voter", count=config.max_replicas,
                    location_labels=tuple(config.location_labels), isolation_level=config.isolation_level)

    def apply_replication_config(self, config: ScheduleConfig) -> None:
        """Follow a change of ``max_replicas`` / ``location_labels`` /
        ``isolation_level``: the default rule (pd/default), if still there, is
        rewritten from them (as PD does); other rules are the user's."""
        old = self.get_rule(DEFAULT_GROUP_ID, DEFAULT_RULE_ID)
        if old is None:
            return
        new = self.default_rule(config)
        self.set_rule(Rule(old.group_id, old.id, old.index, old.override, old.start_key, old.end_key, old.role,
                           new.count, old.label_constraints, new.location_labels, new.isolation_level))

    # -- queries ---------------------------------------------------------
    def _order_key(self, r: Rule, groups: Mapping[str, RuleGroup] | None = None) -> tuple:
        g = (groups if groups is not None else self._groups).get(r.group_id)
        return (g.index if g else 0, r.group_id, r.index, r.id)

    def get_rule(self, group_id: str, rule_id: str) -> Rule | None:
        return self._rules.get((group_id, rule_id))

    def list_rules(self) -> list[Rule]:
        return sorted(self._rules.values(), key=self._order_key)

    def rules_by_group(self, group_id: str) -> list[Rule]:
        return [r for r in self.list_rules() if r.group_id == group_id]

    def get_group(self, group_id: str) -> RuleGroup:
        """The group's settings (a default group if none were set)."""
        return self._groups.get(group_id) or RuleGroup(group_id)

    def list_groups(self) -> list[RuleGroup]:
        ids = set(self._groups) | {r.group_id for r in self._rules.values()}
        return sorted((self.get_group(i) for i in ids), key=lambda g: (g.index, g.id))

    def rules_for_range(self, start: bytes, end: bytes) -> list[Rule]:
        """The rules to apply to ``[start, end)``, in apply order; empty when
        the range spans a rule boundary (split it first) or no rule covers it."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            return []
        seg = self._segments[i]
        if seg.end != b"" and (end == b"" or end > seg.end):
            return []
        return list(seg.rules)

    def rules_for(self, region: Region) -> list[Rule]:
        return self.rules_for_range(region.start_key, region.end_key)

    def split_keys(self, start: bytes, end: bytes) -> list[bytes]:
        """Keys strictly inside ``(start, end)`` where the applied rules change."""
        i = bisect.bisect_right(self._starts, start)
        out = []
        while i < len(self._starts):
            k = self._starts[i]
            if end != b"" and k >= end:
                break
            if k > start:
                out.append(k)
            i += 1
        return out

    def fit_region(self, region: Region, stores, *, down_stores: Iterable[int] = ()) -> RegionFit:
        """Fit ``region`` to the rules that apply to it. ``stores`` is a Cluster
        (its down stores count as unhealthy), a mapping id -> Store, or Stores."""
        return fit_region(region, self.rules_for(region), stores, down_stores)

    def explain(self, stores) -> list[str]:
        """Human-readable warnings about rules the given stores cannot satisfy."""
        by_id, is_down = _store_view(stores)
        live = [s for s in by_id.values() if s.state != StoreState.TOMBSTONE]
        notes = []
        for r in self.list_rules():
            name = f"rule {r.group_id}/{r.id}"
            match = [s for s in live if r.matches_store(s)]
            if not match:
                cons = ", ".join(f"{c.key} {c.op} {list(c.values)}" if c.values else f"{c.key} {c.op}"
                                 for c in r.label_constraints) or "none"
                notes.append(f"{name}: no store matches its label constraints ({cons}); its {r.count} "
                             f"{r.role} peer(s) cannot be placed")
                continue
            if len(match) < r.count:
                notes.append(f"{name}: wants {r.count} {r.role} peer(s) but only {len(match)} store(s) "
                             f"match its label constraints ({sorted(s.id for s in match)})")
            if r.isolation_level:
                domains = {s.labels.get(r.isolation_level) for s in match if s.labels.get(r.isolation_level)}
                if len(domains) < r.count:
                    notes.append(f"{name}: isolation_level {r.isolation_level!r} needs {r.count} distinct "
                                 f"values but the matching stores have {len(domains)} ({sorted(domains)})")
            for label in r.location_labels:
                if not any(label in s.labels for s in match):
                    notes.append(f"{name}: no matching store has location label {label!r}")
            up = [s for s in match if s.state == StoreState.UP and not is_down(s.id)]
            if len(up) < r.count <= len(match):
                notes.append(f"{name}: only {len(up)} matching store(s) are up, fewer than count {r.count}")
        return notes

    # -- changes -----------------------------------------------------------
    def set_rule(self, rule: Rule) -> None:
        """Insert ``rule``, or replace the rule with the same (group_id, id)."""
        self._commit({**self._rules, rule.key: self._check_rule(rule)}, self._groups)

    def add_rule(self, rule: Rule) -> None:
        """Insert ``rule``; ValueError if its (group_id, id) is taken."""
        if rule.key in self._rules:
            raise ValueError(f"rule {rule.group_id}/{rule.id} already exists in group {rule.group_id!r}")
        self.set_rule(rule)

    def set_rules(self, rules: Iterable[Rule]) -> None:
        """Insert or replace several rules at once (all or none)."""
        rules = [self._check_rule(r) for r in rules]
        new = dict(self._rules)
        seen = set()
        for r in rules:
            if r.key in seen:
                raise ValueError(f"two rules with id {r.id!r} in group {r.group_id!r}")
            seen.add(r.key)
            new[r.key] = r
        self._commit(new, self._groups)

    def set_group_bundle(self, group: RuleGroup, rules: Iterable[Rule]) -> None:
        """Replace a group and all its rules at once."""
        rules = [self._check_rule(r) for r in rules]
        new = {k: r for k, r in self._rules.items() if r.group_id != group.id}
        seen = set()
        for r in rules:
            if r.group_id != group.id:
                raise ValueError(f"rule {r.group_id}/{r.id} does not belong to group {group.id!r}")
            if r.key in seen:
                raise ValueError(f"two rules with id {r.id!r} in group {r.group_id!r}")
            seen.add(r.key)
            new[r.key] = r
        self._commit(new, {**self._groups, group.id: group})

    def delete_rule(self, group_id: str, rule_id: str) -> None:
        if (group_id, rule_id) not in self._rules:
            raise KeyError(f"no rule {group_id}/{rule_id}")
        new = dict(self._rules)
        del new[(group_id, rule_id)]
        self._commit(new, self._groups)

    def set_group(self, group: RuleGroup) -> None:
        if not isinstance(group, RuleGroup):
            raise ValueError(f"set_group takes a RuleGroup, got {type(group).__name__}")
        self._commit(self._rules, {**self._groups, group.id: group})

    def delete_group(self, group_id: str) -> None:
        """Forget a group's settings (its rules stay, in a default group)."""
        new = dict(self._groups)
        new.pop(group_id, None)
        self._commit(self._rules, new)

    @staticmethod
    def _check_rule(rule) -> Rule:
        if not isinstance(rule, Rule):
            raise ValueError(f"expected a Rule, got {type(rule).__name__}")
        return rule

    def _commit(self, rules: dict[tuple[str, str], Rule], groups: dict[str, RuleGroup]) -> None:
        segments = self._build(rules, groups)
        self._rules, self._groups = dict(rules), dict(groups)
        self._segments = segments
        self._starts = [s.start for s in segments]
        self.version += 1

    def _build(self, rules: Mapping[tuple[str, str], Rule], groups: Mapping[str, RuleGroup]) -> list[_Segment]:
        if not rules:
            raise ValueError("no rule left: at least one placement rule is needed")
        ordered = sorted(rules.values(), key=lambda r: self._order_key(r, groups))
        points = sorted({b""} | {r.start_key for r in ordered} | {r.end_key for r in ordered if r.end_key})
        segments: list[_Segment] = []
        for i, start in enumerate(points):
            end = points[i + 1] if i + 1 < len(points) else b""
            applied = _prepare_rules_for_apply([r for r in ordered if r.covers(start, end)], groups)
            where = f"key range [{start.hex() or '-inf'}, {end.hex() or '+inf'})"
            if applied:
                if not any(r.is_voter_role for r in applied):
                    raise ValueError(f"{where}: needs at least one voter or leader rule, got "
                                     f"{[f'{r.group_id}/{r.id} ({r.role})' for r in applied]}")
                leaders = [f"{r.group_id}/{r.id}" for r in applied if r.role == "leader"]
                if len(leaders) > 1:
                    raise ValueError(f"{where}: more than one leader rule applies: {leaders}")
            if segments and segments[-1].rules == applied:
                segments[-1] = _Segment(segments[-1].start, end, applied)
            else:
                segments.append(_Segment(start, end, applied))
        return segments

    # -- persistence -------------------------------------------------------
    def to_json(self) -> dict:
        return {"rules": [r.to_json() for r in self.list_rules()],
                "groups": [g.to_json() for g in sorted(self._groups.values(), key=lambda g: g.id)]}

    @classmethod
    def from_json(cls, d, config: ScheduleConfig | None = None) -> "RuleManager":
        """Load what :meth:`to_json` wrote; with no rules, the default rule."""
        if not isinstance(d, Mapping):
            raise ValueError(f"rule manager state must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"rules", "groups"}
        if unknown:
            raise ValueError(f"rule manager state: unknown fields {sorted(unknown)}")
        rules_in, groups_in = d.get("rules") or [], d.get("groups") or []
        if not isinstance(rules_in, list) or not isinstance(groups_in, list):
            raise ValueError("rule manager state: rules and groups must be lists")
        rules = [Rule.from_json(r) for r in rules_in]
        groups = [RuleGroup.from_json(g) for g in groups_in]
        m = cls(config, default_rule=not rules)
        by_key: dict[tuple[str, str], Rule] = dict(m._rules)
        for r in rules:
            if r.key in by_key:
                raise ValueError(f"two rules with id {r.id!r} in group {r.group_id!r}")
            by_key[r.key] = r
        gmap: dict[str, RuleGroup] = {}
        for g in groups:
            if g.id in gmap:
                raise ValueError(f"rule group {g.id!r} appears twice")
            gmap[g.id] = g
        m._commit(by_key, gmap)
        return m


_DEFAULT_MANAGERS: dict[tuple, RuleManager] = {}


def rules_for_context(ctx) -> RuleManager:
    """``ctx.rules`` if placement rules are on, else a (cached) manager holding
    just the default rule built from ``ctx.config``."""
    if getattr(ctx, "rules", None) is not None:
        return ctx.rules
    cfg = ctx.config
    key = (cfg.max_replicas, tuple(cfg.location_labels), cfg.isolation_level)
    m = _DEFAULT_MANAGERS.get(key)
    if m is None:
        if len(_DEFAULT_MANAGERS) > 64:
            _DEFAULT_MANAGERS.clear()
        m = _DEFAULT_MANAGERS[key] = RuleManager(cfg)
    return m
