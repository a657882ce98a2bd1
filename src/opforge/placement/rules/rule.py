"""A placement rule and a rule group (PD's ``Rule`` and ``RuleGroup``):
their fields, validation and JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from opforge.placement.cluster import Store
from opforge.placement.rules.label_constraint import LabelConstraint, _contradiction, match_label_constraints

ROLES = ("voter", "leader", "follower", "learner")
VOTER_ROLES = ("voter", "leader", "follower")
DEFAULT_GROUP_ID = "pd"
DEFAULT_RULE_ID = "default"


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
