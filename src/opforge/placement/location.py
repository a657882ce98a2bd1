"""Where stores sit (zone, host, NVLink domain, ...) and how spread a set of
replicas is: PD's CompareLocation, DistinctScore and isolation score, shared
by the filters, the schedulers and the rule fit."""

from __future__ import annotations

from typing import Iterable

from opforge.placement.cluster import Store

# A pair of stores first differing at label i of n scores 100 ** (n - i - 1):
# differing on a higher level (zone) outweighs any number of lower ones (host).
REPLICA_BASE_SCORE = 100.0


def _label(store: Store, key: str) -> str:
    return store.labels.get(key, "").lower()


def compare_location(a: Store, b: Store, labels: Iterable[str]) -> int:
    """The first of ``labels`` on which two stores differ, or -1 if they share a
    location. A label missing on either store does not tell them apart (as in PD)."""
    for i, key in enumerate(labels):
        va, vb = _label(a, key), _label(b, key)
        if va and vb and va != vb:
            return i
    return -1


def distinct_score(labels: Iterable[str], others: Iterable[Store], store: Store) -> float:
    """How far ``store`` is from each of ``others`` (higher: better spread);
    ``store`` itself, if among them, is skipped."""
    labels = tuple(labels)
    n = len(labels)
    score = 0.0
    for o in others:
        if o.id == store.id:
            continue
        i = compare_location(store, o, labels)
        if i != -1:
            score += REPLICA_BASE_SCORE ** (n - i - 1)
    return score


def isolation_score(stores: list[Store], labels: Iterable[str]) -> float:
    """Sum of the pair scores over all pairs of ``stores`` (PD's fit isolation score)."""
    labels = tuple(labels)
    if not labels or len(stores) <= 1:
        return 0.0
    return sum(distinct_score(labels, stores[i + 1:], a) for i, a in enumerate(stores))
