"""The physical join algorithms, one module each, and their registry (read by the planner and the
executor alike, as DuckDB keeps one ``physical_*_join`` class per algorithm).

Every module of this package other than ``base`` holds one ``ALGORITHM``: an instance of a
``base.JoinAlgorithm`` subclass (eligibility, cost and EXPLAIN reason for the planner; run-time
rule, label and pairs for the executor). They are found by listing the package, so adding an
algorithm is adding its module (and its tests): ``connect(join_algorithm=...)`` accepts its name,
the planner prices it for every inner equi-join, and the executor runs it when chosen.

* ``hash``: ``opforge.hash_join`` (any equi-join; every fallback's target);
* ``radix``: the radix-partitioned hash join (the planner's "hash partitioned");
* ``direct``: perfect hashing over unique dense integer build keys;
* ``merge``: sort-merge (no sort when both inputs are already in key order);
* ``nested_loop``: every pair compared (tiny inputs; joins without equi keys).
"""
from __future__ import annotations

import importlib
import pkgutil

from opforge.sql.physical.joins.base import JoinAlgorithm

_NOT_ALGORITHMS = frozenset({"base"})


def discover(path=__path__, package: str = __name__) -> tuple[JoinAlgorithm, ...]:
    """The ``ALGORITHM`` of every module of ``package`` (at ``path``) but ``base``, in the planner's
    order (``rank``, then name)."""
    found = []
    for m in pkgutil.iter_modules(path):
        if m.name in _NOT_ALGORITHMS or m.name.startswith("_"):
            continue
        algo = getattr(importlib.import_module(f"{package}.{m.name}"), "ALGORITHM", None)
        if not isinstance(algo, JoinAlgorithm) or algo.name != m.name:
            raise TypeError(f"{package}.{m.name}: ALGORITHM must be a JoinAlgorithm named {m.name!r}, got {algo!r}")
        found.append(algo)
    return tuple(sorted(found, key=lambda a: (a.rank, a.name)))


ALGORITHMS: tuple[JoinAlgorithm, ...] = discover()  # in the planner's order (rank)


def names() -> tuple[str, ...]:
    """The ``join_algorithm=`` names, sorted."""
    return tuple(sorted(a.name for a in ALGORITHMS))


def get(name: str) -> JoinAlgorithm:
    for a in ALGORITHMS:
        if a.name == name:
            return a
    raise ValueError(f"unknown join algorithm {name!r}; one of {names()}")


def for_choice(plan_name: str, partitioned: bool) -> JoinAlgorithm:
    """The algorithm behind a planner's ``JoinChoice`` (its ``algorithm`` and ``partitioned``)."""
    for a in ALGORITHMS:
        if a.plan_name == plan_name and a.partitioned == partitioned:
            return a
    raise ValueError(f"no join algorithm planned as {plan_name!r} (partitioned={partitioned})")


def without_keys() -> JoinAlgorithm:
    """The algorithm of joins without equi keys."""
    [algo] = [a for a in ALGORITHMS if a.without_keys]
    return algo


def unplanned(left_rows: int, right_rows: int, presorted: bool) -> JoinAlgorithm:
    """The executor's rule for joins the planner did not plan: the eligible algorithm of the least
    ``unplanned_priority`` (nested loop for tiny inputs, merge for sorted ones, else hash)."""
    ruled = sorted((a for a in ALGORITHMS if a.unplanned_priority is not None), key=lambda a: a.unplanned_priority)
    return next(a for a in ruled if a.unplanned(left_rows, right_rows, presorted))
