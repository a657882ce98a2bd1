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

The package holds one concept per module, as PD's ``placement/``:
``label_constraint`` (conditions on store labels), ``rule`` (rules and
groups), ``fit`` (a region's peers against its rules) and ``rule_manager``.
Everything is re-exported here: ``from opforge.placement.rules import Rule``.
"""

from __future__ import annotations

from opforge.placement.location import REPLICA_BASE_SCORE, compare_location, distinct_score, isolation_score
from opforge.placement.rules.fit import (
    RegionFit, RuleFit, _matches_role, _store_view, fit_region, location_distance_index,
)
from opforge.placement.rules.label_constraint import (
    CONSTRAINT_OPS, LabelConstraint, _contradiction, _is_exclusive_label, _labels_of, match_label_constraints,
)
from opforge.placement.rules.rule import DEFAULT_GROUP_ID, DEFAULT_RULE_ID, ROLES, VOTER_ROLES, Rule, RuleGroup
from opforge.placement.rules.rule_manager import RuleManager, _prepare_rules_for_apply, _Segment, rules_for_context

__all__ = [
    "CONSTRAINT_OPS", "ROLES", "VOTER_ROLES", "DEFAULT_GROUP_ID", "DEFAULT_RULE_ID", "LabelConstraint",
    "match_label_constraints", "Rule", "RuleGroup", "RuleFit", "RegionFit", "fit_region", "location_distance_index",
    "RuleManager", "rules_for_context", "REPLICA_BASE_SCORE", "compare_location", "distinct_score",
    "isolation_score",
]
