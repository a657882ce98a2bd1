"""The user-facing API in DuckDB's habits: connect(), register(), sql() -> Relation.

``connect()`` and ``register()`` import no engine: the parser, planner, executor and op library load
at the first statement, which also reads the sources register() kept (``table_source``).
A registered table's columns reach the device when a query first reads them (``table.LazyColumns``)
and each column's statistics (``planner/statistics.py``) are gathered once, when the join planner or
EXPLAIN's estimates first look the column up. The process's first query run collects and freezes
the objects alive then (``gc_freeze.py``): the collector's full passes stop rescanning the imports
inside later queries.

``EXPLAIN <query>`` gives the plan with estimated rows, ``EXPLAIN ANALYZE <query>`` runs it with
per-operator measurement (``sql/profile.py``); both as a relation with one row per operator, and
as text through ``Relation.explain()``."""
from __future__ import annotations

import itertools
import os
import re
import time
from typing import TYPE_CHECKING

import torch

from opforge.sql import gc_freeze, schemas, table_source
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.outofcore.sizes import env_limit, parse_size

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from sqlglot import exp

    from opforge.sql import plan as P
    from opforge.sql.ddl import MemoryCatalog
    from opforge.sql.executor import Executor
    from opforge.sql.physical.context import ExecContext
    from opforge.sql.planner.cardinality import Estimator
    from opforge.sql.planner.join_order import JoinOrderOptimizer
    from opforge.sql.planner.statistics import TableStats
    from opforge.sql.profile import Profiler
    from opforge.sql.settings import Settings
    from opforge.sql.table import Table

# Everything else loads at the first statement (issue 23: connect() + register() in milliseconds):
# the parser (sqlglot), binder, planner, executor and the op library, pandas and pyarrow's readers.
# ``register`` keeps a file's or a frame's source unread (``table_source``) until then.

DEFAULT_SKEW_THRESHOLD = 0.1  # physical/context.py's (a test keeps them equal); importing it loads the joins
_DEFAULT_OPTIONS = (None, "auto", True, DEFAULT_SKEW_THRESHOLD, 1, "auto")


def _are_defaults(options: tuple) -> bool:
    """Options equal to connect()'s defaults, type included (``workers=True`` is no default): they
    pass ``check_options``, which imports every join algorithm to list the names."""
    return all(type(v) is type(d) and v == d for v, d in zip(options, _DEFAULT_OPTIONS))


_EXPLAIN = re.compile(r"^\s*explain\s+(analyze\s+|analyse\s+)?(.*)$", re.IGNORECASE | re.DOTALL)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Relation:
    """A planned query; executed on each call to to_arrow / to_pandas / fetchall.
    ``mode`` "explain" / "analyze": the relation is the EXPLAIN [ANALYZE] of the query instead."""

    def __init__(self, con: "Connection", node: P.Node | None, message: str = "", mode: str = "query",
                 result: pa.Table | None = None):
        """``result``: the answer of a statement already run (INSERT's row count)."""
        self._con, self._node, self._message, self._mode = con, node, message, mode
        self._result = result
        self._estimator: Estimator | None = None

    @property
    def plan(self) -> P.Node | None:
        return self._node

    @property
    def columns(self) -> list[str]:
        if self._mode == "explain":
            return ["operator", "est_rows"]
        if self._mode == "analyze":
            from opforge.sql.profile import SCHEMA
            return SCHEMA.names
        if self._result is not None:
            return self._result.column_names
        return [] if self._node is None else [o.name for o in self._node.outputs]

    def _executor(self, profiler: Profiler | None = None) -> Executor:
        from opforge.sql.executor import Executor

        return Executor(self._con._tables, self._con.device, self._con._context(), profiler)

    def to_arrow(self, *, dictionary: bool = False) -> pa.Table:
        """The result; ``dictionary``: string columns may come as Arrow dictionary arrays (what the
        writers take: no per-row gather of words here, ``parquet_write`` decodes them in parallel)."""
        if self._result is not None:
            return self._result
        if self._node is None:
            import pyarrow as pa

            return pa.table({})
        if self._mode == "explain":
            return self._estimates()
        if self._mode == "analyze":
            return self.analyze().to_arrow()
        if self._con.cluster is not None:  # every worker runs it over the regions it leads
            return self._con.cluster.execute(self._node, self._con._cluster_options())
        result = self._executor().to_arrow(self._node, dictionary=dictionary)
        gc_freeze.after_first_query()  # the engine is imported now: full GC passes skip it from here on
        return result

    def to_pandas(self) -> pd.DataFrame:
        return self.to_arrow().to_pandas()

    def fetchall(self) -> list[tuple]:
        t = self.to_arrow()
        cols = [c.to_pylist() for c in t.columns]
        return list(zip(*cols)) if cols else []

    def _estimate(self, node: P.Node) -> int:
        """Estimated rows from the tables' statistics (``planner/cardinality.py``)."""
        if self._estimator is None:
            from opforge.sql.planner.cardinality import Estimator

            self._estimator = Estimator(self._node, self._con._stats)
        return int(round(self._estimator.rows(node)))

    def _estimates(self) -> pa.Table:
        import pyarrow as pa

        ops, est = [], []

        def walk(node, depth):
            ops.append("  " * depth + node.describe())
            est.append(self._estimate(node))
            for c in node.inputs():
                walk(c, depth + 1)

        walk(self._node, 0)
        return pa.table({"operator": pa.array(ops, pa.string()), "est_rows": pa.array(est, pa.int64())})

    def analyze(self) -> Profiler:
        """Run the query once with per-operator measurement; the ``Profiler`` holds the figures
        (``.stats``, ``.to_arrow()``, ``.render(total_ms)``)."""
        if self._node is None:
            raise SqlError("EXPLAIN ANALYZE: this statement has no query plan")
        from opforge.sql.profile import Profiler

        prof = Profiler(self._con.device, self._estimate)
        prof.plan_order(self._node)
        t0 = time.perf_counter()
        self._executor(prof).to_arrow(self._node)
        prof.total_ms = (time.perf_counter() - t0) * 1e3
        return prof

    def explain(self, analyze: bool = False) -> str:
        """The plan with estimated rows; ``analyze=True`` runs it and adds actual rows, time, bytes,
        GB/s (and % of the copy bandwidth on cuda) and the registry ops / kernels per operator."""
        if self._node is None:
            return self._message
        from opforge.sql import plan as P

        if (analyze or self._mode == "analyze") and self._con.cluster is not None:
            t0 = time.perf_counter()
            self._con.cluster.execute(self._node, self._con._cluster_options())
            ms = (time.perf_counter() - t0) * 1e3
            return (P.explain(self._node, estimate=self._estimate) + f"\n\ndistributed over "
                    f"{self._con.cluster.size} workers in {ms:.1f} ms\n" + self._con.cluster.report())
        if analyze or self._mode == "analyze":
            prof = self.analyze()
            return prof.render(prof.total_ms)
        return P.explain(self._node, estimate=self._estimate)

    def __repr__(self) -> str:
        from opforge.sql import plan as P

        if self._mode == "analyze":
            return "EXPLAIN ANALYZE " + P.explain(self._node, estimate=self._estimate)
        return self.explain()


class Connection:
    def __init__(self, device: str | torch.device | None = None, memory_budget: int | None = None,
                 join_algorithm: str = "auto", join_reordering: str = "auto", runtime_filters: bool = True,
                 skew_threshold: float | None = DEFAULT_SKEW_THRESHOLD, workers: int = 1,
                 join_distribution: str = "auto", cluster=None, database: str | os.PathLike | None = None,
                 memory_limit: int | str | None = None, spill_host_limit: int | str | None = None):
        if not _are_defaults((memory_budget, join_algorithm, runtime_filters, skew_threshold, workers,
                              join_distribution)):
            from opforge.sql.physical.context import check_options

            check_options(memory_budget, join_algorithm, runtime_filters, skew_threshold, workers, join_distribution)
        if join_reordering != "auto":
            from opforge.sql.planner.join_order import check_mode

            check_mode(join_reordering)
        self.device = torch.device(device or _default_device())
        self.memory_budget = memory_budget
        # out of core (sql/outofcore): the device limit (else SET memory_limit, else the env) and the host tier
        self.memory_limit = parse_size(memory_limit)
        self.spill_host_limit = parse_size(spill_host_limit, "spill_host_limit")
        self.join_algorithm = join_algorithm
        self.join_reordering = join_reordering
        self.runtime_filters = runtime_filters
        self.skew_threshold = skew_threshold
        self.workers = workers
        self.join_distribution = join_distribution
        self.cluster = cluster  # opforge.cluster.Cluster: registered tables live on its workers
        # register() order; a TableSource is read at the first statement (``_tables``)
        self._registered: dict[str, Table | table_source.TableSource] = {}
        self._unread = False  # some value of _registered is a TableSource
        self._table_stats: dict[str, TableStats] = {}
        self.views: dict[str, exp.Expression] = {}
        self.schemas: set[str] = {schemas.MAIN}  # CREATE SCHEMA (sql/schemas.py)
        self.prepared: dict[str, str] = {}  # PREPARE name AS ... (sql/prepared.py)
        self._cids = itertools.count()
        self._memory_catalog: MemoryCatalog | None = None
        self._settings_now: Settings | None = None
        self._nested = False  # inside a statement: its inner queries (ddl.py) run through sql()
        self._file_tables: dict[tuple, str] = {}  # read_parquet / read_csv files -> hidden table (table_functions)
        self.database = None
        if database is not None and database != ":memory:":
            from opforge.sql.database import Database

            self.database = Database(database)
            self._memory.attach(self.database)
            # the schemas of the tables read back (a schema itself is not stored: it holds tables)
            self.schemas |= {schemas.schema_of(name.lower()) for name in self._registered}

    @property
    def _tables(self) -> dict[str, Table]:
        """The registered tables; the sources register() kept are read first (their footer or
        conversion: a damaged file fails here with register's message and is not registered)."""
        if self._unread:
            for name in [n for n, t in self._registered.items() if isinstance(t, table_source.TableSource)]:
                try:
                    self._registered[name] = self._registered[name].load(self.device)
                except Exception:
                    del self._registered[name]
                    raise
            self._unread = False
        return self._registered

    @property
    def _stats(self) -> dict[str, TableStats]:
        """Each table's statistics (``planner/statistics.py``: every column's computed on its first lookup)."""
        from opforge.sql.planner.statistics import table_stats

        for name, table in self._tables.items():
            if name not in self._table_stats:
                self._table_stats[name] = table_stats(table, self._memory_limit)
        return self._table_stats

    @property
    def _memory(self) -> MemoryCatalog:
        """The tables made by CREATE TABLE (``sql/ddl.py``), made at the first use (it needs sqlglot)."""
        if self._memory_catalog is None:
            from opforge.sql.ddl import MemoryCatalog

            self._memory_catalog = MemoryCatalog(self)
        return self._memory_catalog

    @property
    def _settings(self) -> Settings:
        """SET default_null_order, ... (``sql/settings.py``), made at the first statement."""
        if self._settings_now is None:
            from opforge.sql.settings import Settings

            self._settings_now = Settings()
        return self._settings_now

    def _context(self) -> ExecContext:
        from opforge.sql.physical.context import ExecContext, check_options

        check_options(self.memory_budget, self.join_algorithm, self.runtime_filters, self.skew_threshold,
                      self.workers, self.join_distribution)
        limit = self._memory_limit()
        spill_dir = None if self.database is None else os.path.join(self.database.folder, ".spill")
        return ExecContext(self.memory_budget, self.join_algorithm, self.runtime_filters, self.skew_threshold,
                           self.workers, self.join_distribution, limit, self.spill_host_limit, spill_dir)

    def _memory_limit(self) -> int | None:
        """The device memory limit now: SET memory_limit, else connect's, else the environment's."""
        return self._settings.memory_limit or self.memory_limit or env_limit()

    def _cluster_options(self) -> dict:
        """The ExecContext options a cluster's workers run with (``cluster/dist_executor.py``)."""
        return {"memory_budget": self.memory_budget, "join_algorithm": self.join_algorithm,
                "runtime_filters": self.runtime_filters, "skew_threshold": self.skew_threshold,
                "join_distribution": self.join_distribution}

    def register(self, name: str, obj, partition_key: str | None = None, *,
                 partition_by: str | None = None) -> "Connection":
        """Loads a pyarrow.Table, pandas.DataFrame, a list of pyarrow Tables / RecordBatches (one
        partition each: scans skip partitions by their min / max), a .parquet (its row groups are
        partitions) / .csv path, a folder of .parquet files or a list of their paths (one table,
        the files' rows one after the other) under `name`; each column moves to the device when a query first
        reads it. A path or a frame is read (footer, CSV, pandas' conversion) at the first statement,
        so register costs no I/O and loads no engine; what can be checked cheaply fails here (a
        missing file, a name that is neither .parquet nor .csv, a file without Parquet's magic bytes),
        the rest fails, with the same error, at the first statement (``table_source``). ``partition_key``: the column whose hash places the rows on workers when
        ``workers > 1`` (joins on it need no shuffle). With ``connect(cluster=c)`` the table is also
        cut into regions placed on the cluster's workers, by a hash of ``partition_by`` (alias of
        ``partition_key``) or by row ranges; this connection keeps it for planning (statistics)."""
        if partition_by is not None:
            if partition_key is not None and partition_key != partition_by:
                raise ValueError("register: give partition_by or partition_key, not both")
            partition_key = partition_by
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"register: name must be an identifier, got {name!r}")
        source = table_source.deferred(obj)
        if source is not None and partition_key is None and self.cluster is None:
            self._registered[name] = source
            self._table_stats.pop(name, None)
            self._unread = True
            return self
        from opforge.sql.table import Table

        table = Table.load(obj, self.device)
        if partition_key is not None:
            if partition_key not in table.names:
                raise SqlError(f"register: partition_key {partition_key!r} is not a column of {name!r}")
            table.partition_key = partition_key
        self._registered[name] = table
        self._table_stats.pop(name, None)
        if self.cluster is not None:
            from opforge.sql import host_scan

            data = host_scan.table(table)  # a file's or a frame's rows, not a trip through this device
            self.cluster.place_table(name, table.to_arrow() if data is None else data, partition_key)
        return self

    def _put_table(self, name: str, data: pa.Table) -> None:
        """(Re)places a table made by CREATE TABLE / INSERT (``sql/ddl.py``); any name DuckDB accepts."""
        from opforge.sql.table import Table

        self._registered[name] = Table.from_arrow(data, self.device)
        self._table_stats.pop(name, None)
        if self.cluster is not None:
            self.cluster.place_table(name, data)

    def _put_stored(self, name: str, files: list) -> None:
        """(Re)places a database's table (``sql/ddl.py``): read from its Parquet files, column by
        column when used, chunk by chunk under a memory limit; never loaded whole on the host."""
        from opforge.sql.table import LazyColumns, Table

        columns = LazyColumns.of_parquet_files(files, self.device)
        self._registered[name] = Table(list(columns.names), columns)
        self._table_stats.pop(name, None)

    def unregister(self, name: str) -> None:
        if self._memory_catalog is not None:
            self._memory_catalog.tables.pop(name.lower(), None)
        self._registered.pop(name, None)
        self._table_stats.pop(name, None)
        if self.cluster is not None and name in self.cluster.tables:
            self.cluster.drop_table(name)
        self.views.pop(name.lower(), None)

    def tables(self) -> list[str]:
        return sorted([*self._registered, *self.views])

    def sql(self, text: str, params=None) -> Relation:
        """Runs ``text`` (several statements: each runs, the last one's answer is returned).
        ``params``: values for its ``?`` / ``$n`` placeholders (``sql/parameters.py``)."""
        if self.database is not None and not self._nested:
            self._memory.sync()  # a statement's inner queries see the tables it started with
        if params is None and text.lstrip()[:1].upper() in ("P", "E", "D"):
            from opforge.sql import prepared
            done = prepared.run(self, text)  # PREPARE / EXECUTE / DEALLOCATE
            if done is not None:
                return done
        m = _EXPLAIN.match(text)
        if m:
            inner = self.sql(m.group(2), params)
            if inner.plan is None:
                raise SqlError("EXPLAIN: expected a query (SELECT ...)")
            return Relation(self, inner.plan, mode="analyze" if m.group(1) else "explain")
        message = self._settings.reset(text)
        if message is not None:
            return Relation(self, None, message)
        from opforge.sql import parameters
        from opforge.sql.frontend.parser import parse_all

        text, count = parameters.number_placeholders(text)
        trees = parameters.bind(parse_all(text), count, params)
        if not trees:
            raise SqlError("expected a SQL statement, got none")
        for tree in trees[:-1]:  # several statements: each runs, the last one's answer is returned
            self._run(tree, text).fetchall()
        return self._run(trees[-1], text)

    def _run(self, tree: exp.Expression, text: str) -> Relation:
        nested, self._nested = self._nested, True
        try:
            return self._statement(tree, text)
        finally:
            self._nested = nested

    def execute(self, text: str, params=None) -> Relation:
        """``sql`` under DB-API's name: runs the statement(s) now (a query's rows are fetched
        from the returned relation)."""
        rel = self.sql(text, params)
        if rel.plan is None:
            rel.fetchall()
        return rel

    def close(self) -> None:
        """Drops the connection's tables from memory; a database folder keeps every committed table."""
        for name in list(self._registered):
            self.unregister(name)
        self._file_tables.clear()
        self.database = None
        if self._memory_catalog is not None:
            self._memory_catalog.database = None

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _statement(self, tree: exp.Expression, text: str) -> Relation:
        import pyarrow as pa
        from sqlglot import exp

        from opforge.sql import copy_statement, table_functions

        tree = table_functions.materialize(self, self._settings.apply(tree, text))
        if isinstance(tree, exp.Set):
            return Relation(self, None, self._settings.set(tree))
        if isinstance(tree, (exp.Insert, exp.Delete, exp.Update)):
            n = self._memory.change(tree)
            return Relation(self, None, f"{n} rows", result=pa.table({"Count": pa.array([n], pa.int64())}))
        if isinstance(tree, exp.Create):
            return self._create(tree)
        if isinstance(tree, exp.Copy):
            n = copy_statement.run(self, tree)
            return Relation(self, None, f"{n} rows", result=pa.table({"Count": pa.array([n], pa.int64())}))
        if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "TABLE":
            return Relation(self, None, self._memory.drop(tree))
        if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "SCHEMA":
            return Relation(self, None, schemas.drop(self, tree))
        if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "VIEW":
            target = tree.this if tree.this is not None else (tree.args.get("tables") or [None])[0]
            name = target.name.lower()
            if name not in self.views and not tree.args.get("exists"):
                raise SqlError(f"DROP VIEW: no view named {name!r}")
            self.views.pop(name, None)
            return Relation(self, None, f"dropped view {name}")
        if not isinstance(tree, (exp.Select, exp.Union, exp.Subquery, exp.Intersect, exp.Except, exp.Values)):
            raise NotSupportedError(f"statement {type(tree).__name__} (only SELECT queries, CREATE TABLE / VIEW, "
                                    "INSERT, UPDATE, DELETE, DROP and SET)")
        return Relation(self, self.plan(tree))

    def plan(self, tree: exp.Expression) -> P.Node:
        from opforge.sql.frontend.binder import Binder
        from opforge.sql.optimizer import optimize

        binder = Binder(_Catalog(self), self._run_scalar, self._cids, self._settings.order_by_non_integer_literal)
        binder.single_row_check = self._settings.scalar_subquery_error_on_multiple_rows
        node, _ = binder.bind_query(tree)
        return optimize(node, self.device, self._join_order())

    def _join_order(self) -> JoinOrderOptimizer:
        from opforge.sql.physical.joins.base import Hardware
        from opforge.sql.planner.join_order import SKEW_THRESHOLD, JoinOrderOptimizer

        return JoinOrderOptimizer(self._stats, self._tables, self.join_reordering,
                                  Hardware.with_budget(self.memory_budget),
                                  skew_threshold=self.skew_threshold or SKEW_THRESHOLD,
                                  workers=self.workers, join_distribution=self.join_distribution)

    def _run_table(self, node: P.Node) -> pa.Table:
        from opforge.sql.executor import Executor
        from opforge.sql.optimizer import optimize

        node = optimize(node, self.device, self._join_order())
        return Executor(self._tables, self.device, self._context()).to_arrow(node)

    def _run_scalar(self, node: P.Node):
        t = self._run_table(node)
        if t.num_rows > 1 and self._settings.scalar_subquery_error_on_multiple_rows:
            raise SqlError(f"scalar subquery returned {t.num_rows} rows, expected at most 1")
        if t.num_rows == 0:
            return None
        return t.column(0)[0].as_py()

    def _create(self, tree: exp.Create) -> Relation:
        from sqlglot import exp

        kind = (tree.args.get("kind") or "").upper()
        if kind == "SCHEMA":
            return Relation(self, None, schemas.create(self.schemas, tree))
        if kind == "TABLE":
            return Relation(self, None, self._memory.create(tree))
        if kind != "VIEW":
            raise NotSupportedError(f"CREATE {kind} (only CREATE TABLE and CREATE VIEW)")
        name = schemas.qualified_name(tree.this if isinstance(tree.this, exp.Table) else tree.this.this)
        if (name in self.views or name in {t.lower() for t in self._tables}) and not tree.args.get("replace"):
            raise SqlError(f"CREATE VIEW: {name!r} already exists")
        query = tree.expression
        if isinstance(tree.this, exp.Schema) and tree.this.expressions:  # CREATE VIEW v(a, b): the names
            alias = exp.TableAlias(this=exp.to_identifier(name),
                                   columns=[exp.to_identifier(c.name) for c in tree.this.expressions])
            query = exp.select("*").from_(exp.Subquery(this=query, alias=alias))
        self.plan(query)  # validate now: errors surface at CREATE time
        self.views[name] = query
        return Relation(self, None, f"created view {name}")


class _Catalog:
    def __init__(self, con: Connection):
        self.tables = con._tables
        self.views = con.views
        # WITH RECURSIVE runs its steps while binding, over hidden tables (frontend/recursive_cte.py)
        self.run_table, self.put_table = con._run_table, con._put_table
        self.drop_table = lambda name: (con._tables.pop(name, None), con._stats.pop(name, None))


def connect(target: str | os.PathLike | torch.device | None = None, memory_budget: int | None = None,
            join_algorithm: str = "auto", join_reordering: str = "auto", runtime_filters: bool = True,
            skew_threshold: float | None = DEFAULT_SKEW_THRESHOLD, workers: int = 1,
            join_distribution: str = "auto", cluster=None, *, device: str | torch.device | None = None,
            database: str | os.PathLike | None = None, memory_limit: int | str | None = None,
            spill_host_limit: int | str | None = None) -> Connection:
    """A new connection; device defaults to cuda when available, else cpu. ``memory_budget``
    (bytes): a join build side or group table larger than this is radix-partitioned and processed
    part by part. ``join_algorithm``: "auto" (the planner's physical choice for the inner joins
    it plans, ``sql/planner/physical_choice.py``; the run-time rule in ``sql/physical/join.py``
    for the others) or the name of one algorithm of ``sql/physical/joins`` (a module each: "hash",
    "merge", "nested_loop", "direct" (perfect hash), "radix" (radix-partitioned hash)) for every
    equi-join: a user override.
    ``join_reordering``: "auto" (exact DPccp while affordable, else greedy), "greedy" or "none"
    (the FROM order); see ``sql/planner/join_order.py``.
    ``runtime_filters``: push min / max, IN-list and Bloom filters from each join's build side
    into the probe side's scans, and skip partitions they exclude (``sql/physical/runtime_filter.py``).
    ``skew_threshold``: a join key value above this share of the probe rows is split off in
    partitioned joins (``sql/physical/skew.py``); None turns skew handling off.
    ``workers`` / ``join_distribution`` ("auto", "broadcast", "partitioned"): the simulated
    multi-worker mode, every equi-join broadcast or partitioned (``sql/physical/simulated_workers.py``).
    ``cluster``: an ``opforge.cluster.Cluster``; queries run on its workers (``cluster/dist_executor.py``).
    ``database``: a folder whose tables persist (``sql/database.py``); None or ":memory:" keeps
    them in memory. ``target``: a device ("cpu", "cuda", "cuda:1", a torch.device) or, as in
    DuckDB's ``connect("path/to/db")``, the database.
    ``memory_limit`` ("24GiB", bytes; also ``SET memory_limit`` and ``$OPFORGE_SQL_MEMORY_LIMIT``):
    the device memory the query's data may take; above it scans read in chunks and joins /
    aggregations partition and spill to host memory (up to ``spill_host_limit``), then to disk
    (``sql/outofcore``)."""
    if target is not None:
        is_device = isinstance(target, torch.device) or _is_device(target)
        if (device if is_device else database) is not None:
            raise TypeError(f"connect: {target!r} given both positionally and by keyword")
        if is_device:
            device = target
        else:
            database = target
    return Connection(device, memory_budget, join_algorithm, join_reordering, runtime_filters, skew_threshold,
                      workers, join_distribution, cluster, database, memory_limit, spill_host_limit)


def _is_device(name) -> bool:
    if not isinstance(name, str):
        return False
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return False
    return True
