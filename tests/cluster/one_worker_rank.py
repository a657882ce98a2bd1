"""The rank of a one-worker cluster (what one H200 runs; ``test_one_worker.py``): the distributed
executor over a process group of one, on tables partitioned like the cluster's (a layout for each),
for queries that would shuffle, gather, broadcast and filter across workers. It puts each query's
rows, the single-process engine's rows and the collectives the query took on the queue."""

import numpy as np
import pyarrow as pa
import torch

QUERIES = (
    "SELECT c_region, count(*) AS n, sum(o_total) AS t FROM orders JOIN customer ON o_cust = c_id "
    "GROUP BY c_region ORDER BY c_region",
    "SELECT o_id FROM orders WHERE o_cust IN (SELECT c_id FROM customer WHERE c_region = 'north') ORDER BY o_id",
    "SELECT c_id, count(o_id) AS n FROM customer LEFT JOIN orders ON o_cust = c_id GROUP BY c_id ORDER BY c_id",
    "SELECT sum(o_total) AS t, count(DISTINCT o_cust) AS c FROM orders WHERE o_total > 50",
    "SELECT o_cust, o_total FROM orders ORDER BY o_total DESC, o_id LIMIT 5",
)


def tables() -> dict:
    rng = np.random.default_rng(29)
    n = 400
    return {"orders": pa.table({"o_id": np.arange(n, dtype=np.int64), "o_cust": rng.integers(0, 60, n),
                                "o_total": rng.integers(1, 100, n).astype(np.float64)}),
            "customer": pa.table({"c_id": np.arange(50, dtype=np.int64),
                                  "c_region": [("north", "south", "east")[i % 3] for i in range(50)]})}


def run(rank, world, port, out_q):
    import exchange_ranks

    exchange_ranks.in_gloo_group(rank, world, port, out_q, _queries, OPFORGE_INTERPRET="0")


def _queries() -> tuple[list]:
    import exchange_ranks
    import opforge.distributed as D
    from opforge import sql
    from opforge.cluster.dist_executor import DistributedExecutor
    from opforge.sql.physical.context import ExecContext

    calls: list = []
    exchange_ranks.count_collectives(calls)
    con = sql.connect(device="cpu")
    for name, t in tables().items():
        con.register(name, t)
    layouts = {"orders": ("o_id", "regions/2/0:0,1:0"), "customer": ("c_id", "regions/2/0:0,1:0")}
    out = []
    for text in QUERIES:
        want = con.sql(text).to_arrow().to_pylist()
        node = con.sql(text)._node
        calls.clear()
        ex = DistributedExecutor(con._tables, torch.device("cpu"), ExecContext(**con._cluster_options()),
                                 D.world_size(), layouts=layouts)
        batch, spread = ex.run_distributed(node)
        got = pa.Table.from_arrays([batch.cols[o.cid].to_arrow() for o in node.outputs],
                                   names=[o.name for o in node.outputs]).to_pylist()
        out.append((text, want, got, spread, len(calls)))
    return (out,)
