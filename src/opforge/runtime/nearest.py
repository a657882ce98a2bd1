"""Nearest shape bucket: how far one tuned bucket is from another.

A shape bucket is an op's own string ("16h:512x512:d128:g1:causal",
"1x1024:cc", "131072/8192:3"). Its *skeleton* is the text with every number
replaced by ``#`` ("#h:#x#:d#:g#:causal"). Two buckets are comparable only
when their skeletons are equal (same layout, same flags such as ``causal``
or ``cc``), and their distance is the sum of ``|log2 a - log2 b|`` over their
numbers in order: doubling one size costs 1, whichever size it is. Zero
counts as 0.5 (log2 = -1) so that it is comparable too.

Entries are grouped by :func:`group` (op, variant, kernel version, dtype,
GPU model): a config tuned for another op, kernel version, dtype or GPU is
never a neighbour. Triton, torch and SM count may differ (a shipped table
used after an upgrade), but an entry that matches them wins a tie.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the cache imports this module to index its entries
    from opforge.runtime.cache import TuneEntry, TuneKey

_NUMBER = re.compile(r"\d+")


def group(key: "TuneKey") -> tuple[str, str, str, str, str]:
    """The entries that may stand in for one another: same op, variant, kernel version, dtype, GPU."""
    return (key.op, key.variant, key.kernel_version, key.dtype, key.gpu)


def parse(bucket: str) -> tuple[str, tuple[float, ...]]:
    """``(skeleton, log2 of each number)`` of a bucket string."""
    logs = tuple(math.log2(int(n)) if int(n) > 0 else -1.0 for n in _NUMBER.findall(bucket))
    return _NUMBER.sub("#", bucket), logs


@dataclass(frozen=True)
class Indexed:
    """One entry of a group, its bucket parsed once."""

    skeleton: str
    logs: tuple[float, ...]
    entry: "TuneEntry"


def index(entries: Iterable["TuneEntry"]) -> dict[tuple, list[Indexed]]:
    """Entries by :func:`group`, each bucket parsed: built once, so a lookup
    scans one op-variant-dtype's few dozen entries, never the whole table."""
    out: dict[tuple, list[Indexed]] = {}
    for e in entries:
        skeleton, logs = parse(e.key.shape_bucket)
        out.setdefault(group(e.key), []).append(Indexed(skeleton, logs, e))
    return out


@dataclass(frozen=True)
class Near:
    """A neighbour's entry for a key: how far, from which table, how many environment facts differ."""

    distance: float
    mismatches: int  # of triton, torch, SM count
    source: str  # "tuned" (the user's cache) | "shipped"
    entry: "TuneEntry"

    @property
    def bucket(self) -> str:
        return self.entry.key.shape_bucket

    def order(self, rank: int) -> tuple:
        """Nearest first; then the same environment, the user's cache, and the bucket text (deterministic)."""
        return (round(self.distance, 9), self.mismatches, rank, self.bucket, self.entry.key.text())


def neighbours(key: "TuneKey", tables: Iterable[tuple[str, dict[tuple, list[Indexed]]]]) -> list[Near]:
    """Entries comparable with ``key``'s bucket from each ``(source, index)``, nearest first."""
    skeleton, logs = parse(key.shape_bucket)
    found: list[tuple[tuple, Near]] = []
    for rank, (source, groups) in enumerate(tables):
        for item in groups.get(group(key), ()):
            if item.skeleton != skeleton or len(item.logs) != len(logs):
                continue
            distance = sum(abs(a - b) for a, b in zip(item.logs, logs))
            k = item.entry.key
            mismatches = (k.triton != key.triton) + (k.torch != key.torch) + (k.sm_count != key.sm_count)
            near = Near(distance, mismatches, source, item.entry)
            found.append((near.order(rank), near))
    found.sort(key=lambda pair: pair[0])
    return [near for _, near in found]
