"""Schedulers: each looks at the cluster and proposes operators toward one goal.

``SCHEDULERS`` maps PD's scheduler names to their classes; ``create(name,
**args)`` builds one (``args`` are the class's keyword arguments, e.g.
``create("evict-leader", store_ids=[3])``).
"""

from __future__ import annotations

from opforge.placement.schedulers.balance_leader import BalanceLeaderScheduler
from opforge.placement.schedulers.balance_region import BalanceRegionScheduler
from opforge.placement.schedulers.evict_leader import EvictLeaderScheduler
from opforge.placement.schedulers.hot_region import HotRegionScheduler
from opforge.placement.schedulers.scatter_range import ScatterRangeScheduler
from opforge.placement.schedulers.shuffle_leader import ShuffleLeaderScheduler
from opforge.placement.schedulers.shuffle_region import ShuffleRegionScheduler

SCHEDULERS: dict[str, type] = {
    cls.name: cls
    for cls in (BalanceLeaderScheduler, BalanceRegionScheduler, EvictLeaderScheduler, ShuffleLeaderScheduler,
                ShuffleRegionScheduler, ScatterRangeScheduler, HotRegionScheduler)
}


def create(name: str, **args):
    """A new scheduler by its PD name, with its keyword arguments."""
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise ValueError(f"unknown scheduler {name!r}; known: {sorted(SCHEDULERS)}")
    try:
        return cls(**args)
    except TypeError as e:
        raise ValueError(f"scheduler {name!r}: bad arguments {sorted(args)}: {e}") from None


__all__ = ["SCHEDULERS", "create", "BalanceLeaderScheduler", "BalanceRegionScheduler", "EvictLeaderScheduler",
           "HotRegionScheduler", "ScatterRangeScheduler", "ShuffleLeaderScheduler", "ShuffleRegionScheduler"]
