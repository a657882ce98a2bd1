"""opforge.distributed: many GPUs (or CPU processes) over torch.distributed.

Launched by ``torchrun``; NCCL on GPUs, Gloo on CPUs. What the engines use:

- setup: :func:`init`, :func:`destroy`, :func:`info`, :func:`mesh`, :func:`mesh_group`
- collectives: :func:`broadcast`, :func:`all_gather` (uneven partitions),
  :func:`reduce_scatter`
- shuffles of variable-size partitions: :func:`shuffle`, :func:`shuffle_batch`,
  :func:`shuffle_by`, :func:`hash_partition`, :func:`partition`
- overlapped tensor-parallel GEMMs: :func:`all_gather_matmul`,
  :func:`matmul_reduce_scatter`
"""

from opforge.distributed.collectives import all_gather, broadcast, reduce_scatter
from opforge.distributed.errors import CollectiveError, DistError, SetupError
from opforge.distributed.group import RankInfo, destroy, device, info, init, mesh, mesh_group, rank, world_size
from opforge.distributed.overlap import all_gather_matmul, matmul_reduce_scatter
from opforge.distributed.shuffle import hash_partition, partition, shuffle, shuffle_batch, shuffle_by

__all__ = [
    "init", "destroy", "info", "rank", "world_size", "device", "mesh", "mesh_group", "RankInfo",
    "broadcast", "all_gather", "reduce_scatter",
    "shuffle", "shuffle_batch", "shuffle_by", "hash_partition", "partition",
    "all_gather_matmul", "matmul_reduce_scatter",
    "DistError", "SetupError", "CollectiveError",
]
