"""The rule manager (PD's ``RuleManager``): keeps the rules and groups,
validates every change as a whole, tells which rules apply to a key range and
fits regions to them."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Mapping

from opforge.placement.cluster import Region, StoreState
from opforge.placement.config import ScheduleConfig
from opforge.placement.rules.fit import RegionFit, _store_view, fit_region
from opforge.placement.rules.rule import DEFAULT_GROUP_ID, DEFAULT_RULE_ID, Rule, RuleGroup


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
