"""One ``gc.freeze()`` per process, after its first query has run: the cyclic collector's full
passes then skip every object alive at that point (the imports of the parser, planner, executor
and the kernels it ran among them).

Why: a full pass scans every tracked object, and the imports alone (torch, Triton, sqlglot, the
engine) leave 175-300 K of them: one pass took 150-200 ms, and the collector starts one every few
dozen queries, inside whatever is allocating at that moment, most often a query's planning
(TPC-DS SF10 on the H200: q60 planned in 268 ms where the run before took 34, q81 in 219
instead of 10; 155 ms a pass on a 2-core CPU at SF0.01). After the freeze a full pass scans only
the objects made since: 4 ms there after three more queries.

A frozen object is still freed when its last reference goes; only a reference cycle of objects
alive at the freeze that later becomes garbage is never collected. So the freeze comes right
after a full collection, once. ``OPFORGE_GC_FREEZE=0`` leaves the collector alone.
"""
from __future__ import annotations

import gc
import os

ENV = "OPFORGE_GC_FREEZE"
_done = False


def after_first_query() -> bool:
    """Collect and freeze once per process (the first call that finds the freeze enabled);
    True when this call froze."""
    global _done
    if _done or os.environ.get(ENV, "1").strip() in ("0", "false", "off", "no"):
        return False
    _done = True
    gc.collect()
    gc.freeze()
    return True
