"""Label constraints: one condition on a store's labels (PD's
``LabelConstraint``), matching a store against a list of them, and telling
when a list can never match (contradictory constraints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from opforge.placement.cluster import Store

CONSTRAINT_OPS = ("in", "notIn", "exists", "notExists")


def _is_exclusive_label(key: str) -> bool:
    """Stores labelled ``$something`` only take peers of rules that name that
    label in a constraint (PD's exclusive labels: a way to fence stores off)."""
    return key.startswith("$")


def _labels_of(store: Store | Mapping[str, str]) -> Mapping[str, str]:
    return store if isinstance(store, Mapping) else store.labels


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
