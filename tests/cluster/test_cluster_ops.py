"""Cluster operations on a local Ray instance (CPU workers, Gloo), one cluster for the module:
scale-out from 2 workers within the step count the placement simulator predicts for the same
layout, drain-before-remove, and a chaos run of kills and restarts under a query load. Every
query is checked against DuckDB's answer (TPC-H SF0.01)."""
import os
import re

import pytest

from opforge import sql
from opforge.sql.tpch import compare, data, queries, reference

SF = 0.01
KEYS = {"orders": "o_orderkey", "lineitem": "l_orderkey", "customer": "c_custkey"}


@pytest.fixture(scope="module")
def tpch():
    root = os.path.join(os.environ["OPFORGE_CACHE_DIR"], "tpch")  # shared with tests/sql/tpch
    return data.generate(SF, root), root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import opforge.cluster as C

    c = C.start(workers=2, env={"OPFORGE_INTERPRET": "0"}, temp_dir=str(tmp_path_factory.mktemp("ray")),
                num_cpus=5, regions_per_table=6, max_restarts=50)  # room for the workers added later
    yield c
    c.stop()


@pytest.fixture(scope="module")
def con(cluster, tpch):
    paths, _ = tpch
    con = sql.connect(device="cpu", cluster=cluster)
    for name, key in KEYS.items():
        con.register(name, str(paths[name]), partition_by=key)
    return con


def _differs(con, root, n):
    text = queries.query(n)
    keys = compare.order_keys(text)
    return compare.compare(con.sql(text).to_arrow(), reference.answer(n, SF, root), ordered=keys is not None,
                           order_by=keys)


def _check(con, root, n):
    diffs = _differs(con, root, n)
    assert not diffs, f"{queries.name(n)} on the cluster differs from DuckDB:\n" + "\n".join(diffs)


def _fully_replicated(cluster) -> None:
    """Every region: ``replicas`` voters on distinct live stores, each holding the region's rows."""
    for m in cluster.regions.values():
        stores = [p["store_id"] for p in m.peers]
        assert len(stores) == cluster.replicas == len(set(stores)), m
        assert all(p["role"] == "voter" for p in m.peers), m
        assert not set(stores) & (cluster.dead_stores | cluster.draining), m
        for w in cluster._holders(m):
            assert cluster.held_by(w).get(m.id) == m.rows, (m, w)


def _region_counts(cluster) -> dict[int, int]:
    return {s["store_id"]: s["region_count"] for s in cluster.status()["stores"] if s["state"] == "up"}


def _events(orders, rows=4000, heavy_share=0.7):
    """A skewed fact table: ``heavy_share`` of its rows on one order key, the rest spread."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(29)
    keys = orders.column("o_orderkey").to_numpy()
    pick = rng.choice(keys, rows)
    early = orders.column("o_orderdate").to_numpy() < np.datetime64("1995-01-01")
    pick[rng.random(rows) < heavy_share] = keys[early][7]  # an order the query's date filter keeps
    return pa.table({"e_id": np.arange(rows, dtype=np.int64), "e_orderkey": pick.astype(np.int64),
                     "e_amount": rng.integers(1, 100, rows).astype(np.int64)})


def test_runtime_filters_and_skew_across_workers(con, tpch, cluster):
    """A partitioned join whose probe side is skewed (70 % of its rows on one key) and whose build
    side is filtered: the heavy key's rows are dealt over the workers, the build side's filter
    (made from every worker's rows) drops probe rows before they move; the answer is DuckDB's."""
    import duckdb
    import pyarrow.parquet as pq

    paths, _ = tpch
    orders = pq.read_table(paths["orders"], columns=["o_orderkey", "o_orderdate", "o_totalprice"])
    events = _events(orders)
    con.register("events", events, partition_by="e_id")  # not laid out by the join key: it must move
    text = ("SELECT e_id, o_orderdate, e_amount FROM events JOIN orders ON e_orderkey = o_orderkey "
            "WHERE o_orderdate < DATE '1995-01-01'")
    want = duckdb.query(text + " ORDER BY e_id").to_arrow_table()
    con.join_distribution = "partitioned"
    try:
        got = con.sql(text + " ORDER BY e_id").to_arrow()
        report = con.sql(text).explain(analyze=True)
    finally:
        con.join_distribution = "auto"
    assert not compare.compare(got, want, ordered=True, order_by=["e_id"])
    exchanges = [e for w in cluster.last_query["workers"] for e in w["exchanges"]]
    dealt = [e for e in exchanges if "heavy keys" in e["exchange"] and "dealt" in e["exchange"]]
    assert len(dealt) == cluster.size, exchanges  # every worker took part in the skew handling
    filtered = [e for e in exchanges if e["exchange"] == "runtime-filtered"]
    assert filtered and sum(e["rows_out"] for e in filtered) < sum(e["rows_in"] for e in filtered)
    shared = [int(re.search(r"heavy keys' (\d+) rows to all", e["exchange"]).group(1)) for e in exchanges
              if "rows to all" in e["exchange"]]
    assert len(shared) == cluster.size and sum(shared) == 1  # the heavy key's one order, sent to every worker
    assert "runtime-filtered" in report and "heavy keys" in report
    con.sql("DROP TABLE events")


def test_scale_out_within_the_simulators_prediction(con, tpch, cluster):
    from opforge.cluster.scaling import predict_scale_out

    _, root = tpch
    cluster.settle()
    predicted = predict_scale_out(cluster)
    assert predicted.passed and predicted.steps > 0
    i = cluster.add_worker()
    _check(con, root, 12)  # the new worker leads no region yet: it scans nothing (it knows no table's schema)
    steps = cluster.settle()
    print(f"scale-out: {steps} steps, predicted {predicted.steps}, counts {_region_counts(cluster)} "
          f"vs {predicted.region_counts}")
    counts = _region_counts(cluster)
    assert cluster.store_of[i] in counts and counts[cluster.store_of[i]] > 0
    assert 0 < steps <= predicted.steps, f"scale-out took {steps} steps, the simulator predicts {predicted.steps}"
    spread = max(predicted.region_counts.values()) - min(predicted.region_counts.values())
    assert max(counts.values()) - min(counts.values()) <= spread, (counts, predicted.region_counts)
    _fully_replicated(cluster)
    _check(con, root, 12)


def test_remove_worker_drains_it_first(con, tpch, cluster, capsys):
    from opforge import cli
    from opforge.cluster import endpoint

    _, root = tpch
    size = cluster.size  # the module's tests may run in any order or split over pytest-xdist workers
    cluster.add_worker()
    cluster.settle()
    assert cluster.size == size + 1
    _check(con, root, 3)
    victim = cluster.store_of[1]
    before = {rid: m.rows for rid, m in cluster.regions.items()}
    held = sum(1 for m in cluster.regions.values() if m.peer_on(victim))
    assert held
    assert cli.main(["pd", "ctl", "--url", cluster.pd.url, "--token-file", str(endpoint.directory() / "token"),
                     "store", "delete", str(victim)]) == 0  # an operator takes the store offline: pd-ctl's way
    capsys.readouterr()
    cluster.sync()  # the coordinator sees it: the drain is under way, the worker still serves
    assert victim in cluster.draining and victim in cluster.store_of
    cluster.sync()
    assert cluster.operators_in_flight()  # the rule checker is moving its replicas off it
    _check(con, root, 12)
    assert cluster.remove_worker(cluster.store_of.index(victim)) == victim
    assert cluster.size == size and victim not in cluster.store_of
    state = {s["store_id"]: s["state"] for s in cluster.status()["stores"]}
    assert state[victim] == "tombstone"
    assert {rid: m.rows for rid, m in cluster.regions.items()} == before  # no region lost
    _fully_replicated(cluster)
    _check(con, root, 3)
    _check(con, root, 12)
    with pytest.raises(ValueError, match="no worker 7"):
        cluster.drain(7)


def _clicks(buckets: int, rows: int = 6000, hot_share: float = 0.85):
    """A table whose rows are mostly (``hot_share``) on 8 keys, all in hash bucket 0 and split 4 / 4
    by the next hash bit: region 0 is hot and one split parts its keys."""
    import numpy as np
    import pyarrow as pa
    import torch

    from opforge.distributed import hash_partition

    cand = torch.arange(1, 20000, dtype=torch.int64)
    h = hash_partition(cand, 1 << 31)
    mine = cand[h % buckets == 0]
    bit = ((h[h % buckets == 0] // buckets) & 1).bool()
    hot = torch.cat([mine[~bit][:4], mine[bit][:4]]).numpy()
    rng = np.random.default_rng(29)
    keys = rng.integers(20000, 10 ** 6, rows)
    is_hot = rng.random(rows) < hot_share
    keys[is_hot] = rng.choice(hot, int(is_hot.sum()))
    return pa.table({"c_key": keys.astype(np.int64), "c_v": rng.integers(0, 1000, rows).astype(np.int64)})


def test_hot_region_is_split_and_spread(con, cluster):
    """Region heartbeats report what queries read of each region; the one holding the hot keys is
    split by the driver (on the workers' real rows, the region map updated) and its halves' leaders
    spread by the hot-region scheduler; every answer equals DuckDB's before, during and after."""
    import duckdb

    clicks = _clicks(cluster.regions_per_table)
    con.register("clicks", clicks, partition_by="c_key")
    text = "SELECT c_key, count(*) AS n, sum(c_v) AS v FROM clicks GROUP BY c_key ORDER BY c_key"
    want = duckdb.query(text).to_arrow_table()
    first = cluster.tables["clicks"]["regions"][0]
    assert cluster.regions[first].rows > 0.8 * clicks.num_rows  # the hot keys' bucket

    def query():
        assert not compare.compare(con.sql(text).to_arrow(), want, ordered=True, order_by=["c_key"])

    with pytest.raises(ValueError, match="hot_bytes must be"):
        cluster.watch_hot(-1)
    cluster.watch_hot(1)
    try:
        for _ in range(12):
            query()
            cluster.sync()
            if cluster.splits and _by(cluster, "hot-region", _halves(cluster, first)):
                break
        halves = _halves(cluster, first)
        assert len(halves) >= 2, "the hot region was not split"
        assert sum(cluster.regions[r].rows for r in cluster.tables["clicks"]["regions"]) == clicks.num_rows
        for r in halves:  # each half on the stores the map says, with the rows the map says
            for w in cluster._holders(cluster.regions[r]):
                assert cluster.held_by(w)[r] == cluster.regions[r].rows
        assert _by(cluster, "split-hot", [first]), "the split was not the split checker's load split"
        assert _by(cluster, "hot-region", halves), "the hot-region scheduler moved no half"
        assert len({cluster.regions[r].leader_store for r in halves}) > 1, "the halves were not spread"
        query()  # routed by the new region map
    finally:
        cluster.watch_hot(None)
    con.sql("DROP TABLE clicks")
    cluster.settle()


def _by(cluster, desc: str, regions) -> bool:
    """Did an operator of ``desc`` (a scheduler or checker) finish on one of ``regions``?"""
    return any(op.desc == desc and op.region_id in regions and op.status.value == "success"
               for op in cluster.pd.driver.controller.history())


def _halves(cluster, rid):
    """The regions split off region ``rid`` (its bucket), itself included."""
    index = cluster.regions[rid].index
    table = cluster.regions[rid].table
    return [r for r in cluster.tables[table]["regions"] if cluster.regions[r].index == index]


CHAOS_S = float(os.environ.get("OPFORGE_CHAOS_S", "10"))  # the 60 s: OPFORGE_CHAOS_S=60


def _steady(cluster) -> None:
    """Heartbeat rounds until the driver has nothing in flight (recovering first from any kill)."""
    import opforge.cluster as C

    for _ in range(10):
        try:
            cluster.settle()
            return
        except C.RetryableError:  # a worker died since the last call: the next call recovers
            continue
    raise AssertionError("the cluster did not settle after 10 tries")


def _driver_reports_fully_replicated(cluster) -> None:
    """The quorum guard of the chaos run, in the driver's own view: every region has ``replicas``
    voters, all on up stores, so one more kill loses at most one copy of any region."""
    dc = cluster.pd.driver.cluster
    for rid in cluster.regions:
        r = dc.regions[rid]
        assert len(r.peers) == cluster.replicas and all(p.is_voter for p in r.peers), r
        assert all(dc.get_store(p.store_id).state.value == "up" for p in r.peers), r
        assert r.leader is not None, r


def test_chaos_kills_and_restarts_under_a_query_load(con, tpch, cluster):
    """For CHAOS_S seconds: queries back to back; before half of them (once the driver reports every
    region fully replicated) a random worker is SIGKILLed at a random moment of the query, before
    one in four a worker is added or drained away. Every query equals DuckDB's answer or raises the retryable error;
    no committed row is lost."""
    import random
    import threading
    import time

    import opforge.cluster as C

    _, root = tpch
    rng = random.Random(29)
    rows = {rid: m.rows for rid, m in cluster.regions.items()}
    answered = retried = kills = scaled = step = 0
    deadline = time.monotonic() + CHAOS_S
    while time.monotonic() < deadline:
        _steady(cluster)
        _driver_reports_fully_replicated(cluster)
        _fully_replicated(cluster)
        assert {rid: m.rows for rid, m in cluster.regions.items()} == rows  # no committed data lost
        action = ("kill", "query", "kill", "scale")[step % 4]  # kills first: a short run still has some
        step += 1
        killer = None
        if action == "kill":
            victim = rng.randrange(cluster.size)
            killer = threading.Timer(rng.uniform(0.0, 0.4), cluster.kill_worker, args=(victim,))
            killer.start()
            kills += 1
        elif action == "scale":
            if cluster.size < 4:
                cluster.add_worker()
            else:
                cluster.remove_worker(rng.randrange(cluster.size))
            scaled += 1
        try:
            diffs = _differs(con, root, rng.choice((3, 12)))
        except C.RetryableError:
            retried += 1
        else:
            assert not diffs, "\n".join(diffs)
            answered += 1
        if killer is not None:
            killer.join()
    _steady(cluster)
    _driver_reports_fully_replicated(cluster)
    assert {rid: m.rows for rid, m in cluster.regions.items()} == rows
    print(f"chaos {CHAOS_S:g} s: {answered} answered, {retried} retryable, {kills} kills, {scaled} scale steps")
    assert answered > 0 and kills > 0
    _check(con, root, 3)
