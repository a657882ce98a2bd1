"""opforge.cluster: one system across processes and hosts.

Workers are long-lived Ray actors (one per GPU, or per CPU process), the placement driver's stores;
data moves between them over a torch.distributed group (NCCL / Gloo), control goes through Ray.

    c = opforge.cluster.start(workers=3)
    con = opforge.sql.connect(cluster=c)
    con.register("lineitem", table, partition_by="l_orderkey")
    con.sql("SELECT ...").to_arrow()
    c.stop()
"""
from opforge.cluster.errors import ClusterError, RetryableError

__all__ = ["start", "Cluster", "ClusterError", "RetryableError"]


def __getattr__(name: str):
    # torch and Ray load with the coordinator, not with the package: `opforge cluster status` stays light
    if name in ("start", "Cluster"):
        from opforge.cluster import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'opforge.cluster' has no attribute {name!r}")
