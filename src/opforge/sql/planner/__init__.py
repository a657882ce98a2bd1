"""The join planner (issue 9), one concern per module:

* ``statistics``: per-column row / NULL counts, min / max, distinct counts (exact or HyperLogLog)
  and most-common values, gathered when a table is registered;
* ``cardinality``: filter and join selectivity (equivalence classes, distinct counts), estimated
  rows for every operator;
* ``join_graph``: the query graph of a tree of inner joins;
* ``join_tree``, ``dp``, ``greedy``: join trees, DPccp, Greedy Operator Ordering;
* ``cost``, ``physical_choice``: bytes-moved cost of each physical join on the GPU (hash table vs
  L2 / HBM), and the cheapest algorithm and build side; C_out as the alternative model. The
  algorithms themselves (eligibility, cost, reason) are the registry ``sql/physical/joins``, which
  the executor runs from too;
* ``join_order``: the optimizer pass that ties them together (``connect(join_reordering=...)``);
* ``runtime_filters``: min / max, IN-list and (blocked) Bloom filters from a build side, partition
  pruning (applied by ``sql/physical/runtime_filter.py`` and ``sql/physical/scan.py``);
* ``distribution``: broadcast vs partitioned joins over several GPUs (run, simulated, by
  ``sql/physical/simulated_workers.py``).
* ``shared_subtrees``: the subtrees a plan holds several times under other column ids (a CTE
  read twice, the block under a ROLLUP), which the executor runs once (``sql/executor.py``).

The executor follows the plan: the physical join and build side (``sql/physical/join.py``), skew
handling from the statistics' heavy hitters (``sql/physical/skew.py``).
"""
