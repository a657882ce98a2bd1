"""opforge.cluster on a local Ray instance: 3 CPU workers (Gloo), one cluster for the module.

The workers are the placement driver's stores; TPC-H SF0.01 tables are regions on them (2
replicas each); queries run over the leader regions with exchanges over the process group and
equal DuckDB's answers; operator steps move real data; a SIGKILLed worker makes the query in
flight fail with a retryable error, and the next one succeeds once the lost replicas are back; a
worker added later gets regions moved to it by the balance scheduler.
"""
import os
import time

import pytest

from opforge import sql
from opforge.sql.tpch import compare, data, queries, reference

SF = 0.01
QUERIES = (1, 3, 6, 12, 14)
KEYS = {"orders": "o_orderkey", "lineitem": "l_orderkey", "customer": "c_custkey", "part": "p_partkey"}
TABLES = ("lineitem", "orders", "customer", "part")  # what QUERIES read


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    root = os.path.join(os.environ["OPFORGE_CACHE_DIR"], "tpch")  # shared with tests/sql/tpch
    return data.generate(SF, root), root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import opforge.cluster as C

    # the workers run the SQL hash ops by their torch reference (as tests/sql/conftest.py does here)
    c = C.start(workers=3, env={"OPFORGE_INTERPRET": "0"}, temp_dir=str(tmp_path_factory.mktemp("ray")),
                num_cpus=4)  # room for the worker scale-out adds
    yield c
    c.stop()


@pytest.fixture(scope="module")
def con(cluster, tpch):
    paths, _ = tpch
    con = sql.connect(device="cpu", cluster=cluster)
    for name in TABLES:
        con.register(name, str(paths[name]), partition_by=KEYS[name])
    return con


def _check(con, root, n):
    text = queries.query(n)
    keys = compare.order_keys(text)
    diffs = compare.compare(con.sql(text).to_arrow(), reference.answer(n, SF, root), ordered=keys is not None,
                            order_by=keys)
    assert not diffs, f"{queries.name(n)} on the cluster differs from DuckDB:\n" + "\n".join(diffs)


def _regions_replicated(cluster, replicas=2):
    for m in cluster.regions.values():
        stores = [p["store_id"] for p in m.peers]
        assert len(stores) == replicas == len(set(stores)), m
        assert not set(stores) & cluster.dead_stores
        for w in cluster._holders(m):
            assert m.id in cluster.held_by(w)


def test_tpch_on_three_workers_equals_duckdb(con, tpch, cluster):
    _, root = tpch
    for n in QUERIES:
        _check(con, root, n)
    per_worker = cluster.last_query["workers"]
    assert len(per_worker) == 3 and any(x["exchanges"] for x in per_worker)
    _check(con, root, 12)  # orders JOIN lineitem on the key both are partitioned by: nothing moves
    joins = [e for e in cluster.last_query["workers"][0]["exchanges"] if e["node"].startswith("Join")]
    assert joins and all(e["exchange"] == "none (co-located)" for e in joins)
    text = con.sql(queries.query(3)).explain(analyze=True)  # per worker: rows, time, each exchange
    assert "distributed over 3 workers" in text and "worker 2:" in text
    # customer's few rows are gathered (a small build side), orders and lineitem join where they are
    assert "gather (small build side)" in text and "none (co-located)" in text


def test_top_k_and_limit_gather_only_each_workers_first_rows(con, cluster, tpch):
    """ORDER BY ... LIMIT over partitioned rows: each worker sends its first limit + offset rows,
    and the answer is DuckDB's (a total order: ties broken by the key)."""
    import duckdb

    paths, _ = tpch
    text = ("SELECT o_orderpriority, o_orderkey, o_totalprice FROM orders "
            "ORDER BY o_orderpriority DESC, o_totalprice, o_orderkey LIMIT 25 OFFSET 40")
    got = con.sql(text).fetchall()
    want = duckdb.sql(text.replace("FROM orders", f"FROM '{paths['orders']}'")).fetchall()
    assert got == want
    gathers = [e for w in cluster.last_query["workers"] for e in w["exchanges"] if e["exchange"] == "gather"]
    assert gathers and all(e["rows_in"] <= 65 for e in gathers), gathers
    assert len(con.sql("SELECT o_orderkey FROM orders LIMIT 7 OFFSET 3").fetchall()) == 7


def test_a_file_registered_on_the_cluster_goes_to_the_workers_from_the_host(cluster, tpch):
    """The rows placed on the workers are read from the file; the driver's device holds none."""
    paths, root = tpch
    c = sql.connect(device="cpu", cluster=cluster)
    c.register("nation_h", str(paths["nation"]), partition_by="n_nationkey")
    try:
        assert c._registered["nation_h"].columns.loaded() == []
        got = c.sql("SELECT n_regionkey, count(*) AS n, min(n_name) AS m FROM nation_h GROUP BY 1 ORDER BY 1").fetchall()
        import duckdb

        assert got == duckdb.sql(f"SELECT n_regionkey, count(*) AS n, min(n_name) AS m FROM '{paths['nation']}' "
                                 "GROUP BY 1 ORDER BY 1").fetchall()
    finally:
        cluster.drop_table("nation_h")


def test_workers_are_the_drivers_stores(con, cluster):
    st = cluster.status()
    stores = [s for s in st["stores"] if s["state"] == "up"]
    assert len(stores) == 3 and {s["labels"]["worker"] for s in stores} == {"0", "1", "2"}
    placed = sum(len(cluster.tables[t]["regions"]) for t in TABLES)
    assert sum(s["leader_count"] for s in stores) == placed  # every region's leader reported
    assert sum(s["region_count"] for s in stores) == 2 * placed
    _regions_replicated(cluster)
    con.sql(queries.query(6)).to_arrow()
    cluster.sync()
    assert sum(s["keys_read"] for s in cluster.status()["stores"]) > 0  # scans reach the driver


def test_cluster_status_command(con, cluster, capsys):
    from opforge import cli

    assert cli.main(["cluster", "status"]) == 0
    out = capsys.readouterr().out
    assert "stores (3)" in out and "lineitem" in out and "operators in flight: 0" in out


def test_a_query_error_on_the_workers_is_the_querys_own(con, cluster):
    from opforge.sql.errors import SqlError

    with pytest.raises(SqlError, match="Overflow"):  # raised on every worker, not a lost worker
        con.sql("SELECT o_orderkey * 9223372036854775807 AS x FROM orders").to_arrow()
    assert con.sql("SELECT count(*) FROM orders").fetchall() == [(15000,)]  # the group re-formed


def test_one_worker_failing_alone_fails_the_query_fast_and_names_it(con, tpch, cluster):
    """Its peers wait for it in a collective: the error must come back in seconds (not at the
    group's 60 s timeout), name the worker and the cause, and the next query must be right."""
    import opforge.cluster as C
    from opforge.sql.errors import SqlError

    _, root = tpch
    cluster.inject_failure(1, "disk on fire")  # raised as its next call starts
    t0 = time.monotonic()
    with pytest.raises(C.RetryableError, match=r"worker 1 failed .*InjectedFailure: worker 1: disk on fire"):
        con.sql(queries.query(3)).to_arrow()
    assert time.monotonic() - t0 < 10
    _check(con, root, 3)
    # a query that fails on one region only: o_orderkey 7's (one worker leads it)
    t0 = time.monotonic()
    with pytest.raises(SqlError, match=r"division by zero .*\(on worker \d\)"):
        con.sql("SELECT o_orderpriority, count(*) FROM orders WHERE o_orderkey // (o_orderkey - 7) >= 0 "
                "GROUP BY 1").to_arrow()
    assert time.monotonic() - t0 < 10
    _check(con, root, 12)


def test_tables_made_and_dropped_by_sql_follow_on_the_cluster(con, cluster):
    con.sql("CREATE TABLE prio AS SELECT o_orderpriority, count(*) AS n FROM orders GROUP BY o_orderpriority")
    assert "prio" in cluster.tables
    assert con.sql("SELECT sum(n) FROM prio").fetchall() == [(15000,)]  # SF0.01's orders
    regions = set(cluster.tables["prio"]["regions"])
    con.sql("DROP TABLE prio")
    assert "prio" not in cluster.tables and not regions & set(cluster.pd.driver.cluster.regions)


def test_joins_keep_the_layout_of_the_rows_that_stay(con, tpch, cluster):
    """A join that gathers one side leaves the other side's rows where they were, laid out as
    before: q21's semi and anti joins of lineitem with itself on l_orderkey, above joins that
    gather supplier and nation, and q05's orders-lineitem join, above joins that gather customer,
    run co-located (nothing moves); both answers are DuckDB's."""
    paths, root = tpch
    extra = {"supplier": "s_suppkey", "nation": None, "region": None}
    for name, key in extra.items():
        con.register(name, str(paths[name]), partition_by=key)
    try:
        for n, joins in ((21, ("Join semi [l_orderkey", "Join anti [l_orderkey")), (5, ("Join inner [o_orderkey",))):
            _check(con, root, n)
            for w in cluster.last_query["workers"]:
                moved = {e["node"].split("#")[0]: e["exchange"] for e in w["exchanges"]}
                assert all(moved.get(j) == "none (co-located)" for j in joins), (n, w["exchanges"])
    finally:
        for name in extra:
            con.sql(f"DROP TABLE {name}")


def test_operator_steps_move_region_data(con, tpch, cluster):
    _, root = tpch
    rid = cluster.tables["orders"]["regions"][0]
    meta = cluster.regions[rid]
    src = meta.leader_store
    dst = next(s for s in cluster.store_of if meta.peer_on(s) is None)
    cluster.pd.service.add_operator({"kind": "move-peer", "region_id": rid, "from_store": src, "to_store": dst})
    cluster.settle()
    assert meta.peer_on(dst) is not None and meta.peer_on(src) is None
    assert rid in cluster.held_by(cluster.worker_of(dst)) and rid not in cluster.held_by(cluster.worker_of(src))
    _check(con, root, 12)  # orders now read from the copy on its new store


def test_scale_out_moves_regions_to_the_new_worker(con, tpch, cluster):
    _, root = tpch
    before = {s["store_id"]: s["region_count"] for s in cluster.status()["stores"]}
    i = cluster.add_worker()
    assert cluster.settle() > 0
    after = {s["store_id"]: s["region_count"] for s in cluster.status()["stores"] if s["state"] == "up"}
    new = cluster.store_of[i]
    assert new not in before and after[new] > 0 and max(after.values()) < max(before.values())
    _regions_replicated(cluster)
    _check(con, root, 3)  # over 4 workers


def test_killed_worker_fails_the_query_then_replicas_take_over(con, tpch, cluster):
    import opforge.cluster as C

    _, root = tpch
    old_store = cluster.store_of[1]
    cluster.kill_worker(1)
    with pytest.raises(C.RetryableError, match="run it again"):
        con.sql(queries.query(12)).to_arrow()
    _check(con, root, 12)  # recovers first: new leaders, group re-formed
    assert cluster.store_of[1] != old_store and old_store in cluster.dead_stores
    cluster.settle()
    _regions_replicated(cluster)
    state = {s["store_id"]: s["state"] for s in cluster.status()["stores"]}
    assert state[old_store] == "tombstone"
    _check(con, root, 3)
