"""Out of core: queries over data larger than the device memory limit (``connect(memory_limit=...)``,
``SET memory_limit``, ``$OPFORGE_SQL_MEMORY_LIMIT``).

* ``sizes``: "24GiB" -> bytes, the limit's sources.
* ``spill``: where partitions wait (pinned host memory up to a host limit, then files on disk).
* ``chunked_scan``: a table whose scanned columns exceed the limit is read in chunks from the host
  (Parquet files, Arrow / pandas data, a database's tables: their Parquet files); the planner's statistics of such a
  column are gathered over the same chunks (``planner/statistics.chunked_column_stats``).
* ``partition``: rows to hash partitions by key *values* (consistent across chunks and tables).
* ``grace``: the partitioned (grace) hash join, hash aggregation, DISTINCT and PARTITION BY
  windows over spilled partitions.
* ``partial_aggregate``: an aggregation in two steps, each chunk first, then the partials.
* ``external_sort``: ORDER BY over the limit as sorted runs spilled and merged.
* ``ordered_window``: a window without PARTITION BY, streamed in its ORDER BY's order (after an
  external sort) segment by segment, with the state its frames need carried across segments.
* ``streaming``: the executor's side of it: which subtrees stream chunk by chunk, which operators
  consume streams (aggregate, join, union, distinct, window, sort, top-k) and how; EXPLAIN ANALYZE
  rows for streamed operators.
"""
