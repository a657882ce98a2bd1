"""Broadcast, all-gather and reduce-scatter: thin over torch.distributed, with validation.

Each wrapper checks its arguments on this rank (type, device for the
backend, shapes), runs the backend collective inside
:func:`~opforge.distributed.errors.collective` so a dead or late peer is a clear
:class:`~opforge.distributed.errors.CollectiveError`, and extends the backend where
the engines need more than it offers: ``all_gather`` takes partitions of
different lengths (dim 0), ``reduce_scatter`` takes uneven ``sizes``.

Cross-rank consistency. Ranks that disagree about shapes or dtypes make a
backend hang or read garbage. Where a wrapper exchanges sizes anyway
(``all_gather``) it also exchanges a fingerprint of dtype and trailing shape
and raises the same ``ValueError`` on every rank when they differ; the other
wrappers do so when ``OPFORGE_DIST_CHECK=1`` (one more small collective and a
host sync per call, the habit of ``TORCH_DISTRIBUTED_DEBUG=DETAIL``).
"""

from __future__ import annotations

import os
import zlib

import torch
import torch.distributed as dist

from opforge.distributed import group as G
from opforge.distributed.errors import collective

# torch 2.13 renamed the single-tensor collectives; older releases only have the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
              "product": dist.ReduceOp.PRODUCT}


def checks_enabled() -> bool:
    """``OPFORGE_DIST_CHECK=1``: exchange shape fingerprints before collectives that would not otherwise."""
    return os.environ.get("OPFORGE_DIST_CHECK", "0") not in ("", "0", "false", "off")


def guard(where: str, what: str, group=None):
    """The error context for one collective on ``group``."""
    return collective(where, what, dist.get_rank(group), dist.get_world_size(group), G.timeout_s())


def check_tensor(where: str, name: str, t, group=None, *, min_dim: int = 0) -> None:
    """A tensor on the device the group's backend takes, with at least ``min_dim`` dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    dev = G.device(group)
    if t.device.type != dev.type:
        raise ValueError(f"{where}: {name} is on {t.device} but the {G.backend(group)} group takes {dev.type} "
                         f"tensors (move it with .to({str(dev)!r}))")
    if t.dim() < min_dim:
        raise ValueError(f"{where}: {name} must have at least {min_dim} dim(s) (rows on dim 0), got shape "
                         f"{tuple(t.shape)}")


def check_sizes(where: str, name: str, sizes, world: int) -> list[int]:
    """``sizes``: one non-negative int per rank."""
    try:
        out = [int(s) for s in sizes]
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be a sequence of {world} ints, got {sizes!r}") from None
    if len(out) != world or any(s < 0 for s in out) or any(isinstance(s, bool) for s in sizes):
        raise ValueError(f"{where}: {name} must hold {world} non-negative ints (one per rank), got {list(sizes)!r}")
    return out


def signature(*tensors: torch.Tensor) -> str:
    """What every rank must agree on: dtypes and shapes past dim 0."""
    return ";".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape[1:])}" for t in tensors)


def exchange(where: str, what: str, values: list[int], sig: str, group=None) -> torch.Tensor:
    """All-gather ``values`` (the same count on every rank) plus a fingerprint of ``sig``;
    a ``[world, len(values)]`` int64 CPU tensor. Raises the same ``ValueError`` on every
    rank when the fingerprints differ."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    dev = G.device(group)
    mine = torch.tensor(list(values) + [zlib.crc32(sig.encode())], dtype=torch.int64, device=dev)
    table = torch.empty(world * mine.numel(), dtype=torch.int64, device=dev)
    with guard(where, f"the exchange of {what}", group):
        all_gather_single(table, mine, group=group)
    table = table.cpu().view(world, -1)
    prints = table[:, -1]
    if bool((prints != prints[0]).any()):
        odd = [r for r in range(world) if prints[r] != prints[0]]
        raise ValueError(f"{where}: ranks disagree on {what}: rank(s) {odd} differ from rank 0; this rank ({me}) "
                         f"has {sig}")
    return table[:, :-1]


def broadcast(tensor: torch.Tensor, src: int = 0, *, group=None) -> torch.Tensor:
    """Copy ``src``'s ``tensor`` into every rank's ``tensor`` (in place; returned).
    Every rank passes a contiguous tensor of the same shape and dtype."""
    where = "opforge.distributed.broadcast"
    world = G.world_size(group, where=where)
    check_tensor(where, "tensor", tensor, group)
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < world:
        raise ValueError(f"{where}: src must be a rank of the group (0..{world - 1}), got {src!r}")
    if not tensor.is_contiguous():
        raise ValueError(f"{where}: tensor must be contiguous (it is written in place); call .contiguous() first")
    if checks_enabled():
        exchange(where, "the tensor's shape and dtype", [tensor.shape[0] if tensor.dim() else 1],
                 signature(tensor.reshape(-1, *tensor.shape[1:]) if tensor.dim() else tensor.reshape(1)), group)
    root = src if group is None else dist.get_global_rank(group, src)
    with guard(where, "broadcast", group):
        dist.broadcast(tensor, root, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, *, group=None, sizes=None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0 in rank order.

    Ranks may hold different row counts (zero included); the trailing shape
    and dtype must match. ``sizes`` (rows per rank, if the caller knows them)
    skips the size exchange and its host sync.
    """
    where = "opforge.distributed.all_gather"
    world, me = G.world_size(group, where=where), G.rank(group, where=where)
    check_tensor(where, "tensor", tensor, group, min_dim=1)
    x = tensor.contiguous()
    if sizes is None:
        sizes = exchange(where, "dtype and trailing shape", [x.shape[0]], signature(x), group)[:, 0].tolist()
    else:
        sizes = check_sizes(where, "sizes", sizes, world)
        if sizes[me] != x.shape[0]:
            raise ValueError(f"{where}: sizes[{me}]={sizes[me]} but this rank's tensor has {x.shape[0]} rows")
    tail = tuple(x.shape[1:])
    out = torch.empty((sum(sizes),) + tail, dtype=x.dtype, device=x.device)
    most = max(sizes)
    if most == 0:
        return out
    if min(sizes) == most:
        with guard(where, "all-gather", group):
            all_gather_single(out, x, group=group)
        return out
    # Uneven: gather rows padded to the longest partition, then drop the padding.
    padded = x.new_zeros((most,) + tail)
    padded[: x.shape[0]] = x
    buf = torch.empty((world * most,) + tail, dtype=x.dtype, device=x.device)
    with guard(where, "all-gather", group):
        all_gather_single(buf, padded, group=group)
    buf = buf.view((world, most) + tail)
    return torch.cat([buf[r, : sizes[r]] for r in range(world)], out=out)


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, group=None, sizes=None) -> torch.Tensor:
    """Reduce ``tensor`` elementwise over ranks and keep this rank's block of rows.

    Without ``sizes`` the rows split evenly (dim 0 divisible by the group
    size): rank r gets rows ``[r*M/p, (r+1)*M/p)``. With ``sizes`` (rows per
    rank, the same list on every rank) block r has ``sizes[r]`` rows; it runs
    as an all-to-all plus a local reduction in rank order.
    """
    where = "opforge.distributed.reduce_scatter"
    world, me = G.world_size(group, where=where), G.rank(group, where=where)
    check_tensor(where, "tensor", tensor, group, min_dim=1)
    if op not in REDUCE_OPS:
        raise ValueError(f"{where}: op must be one of {', '.join(map(repr, REDUCE_OPS))}, got {op!r}")
    if tensor.dtype == torch.bool:
        raise TypeError(f"{where}: tensor is bool; reduce an integer or float tensor")
    x = tensor.contiguous()
    rows, tail = x.shape[0], tuple(x.shape[1:])
    if sizes is None:
        if rows % world:
            raise ValueError(f"{where}: tensor has {rows} rows, not divisible by the group size {world}; "
                             f"pass sizes=[rows of each rank] for an uneven split")
        if checks_enabled():
            exchange(where, "the tensor's shape and dtype", [rows], signature(x), group)
        out = torch.empty((rows // world,) + tail, dtype=x.dtype, device=x.device)
        if rows:
            with guard(where, "reduce-scatter", group):
                reduce_scatter_single(out, x, op=REDUCE_OPS[op], group=group)
        return out
    sizes = check_sizes(where, "sizes", sizes, world)
    if sum(sizes) != rows:
        raise ValueError(f"{where}: sizes sum to {sum(sizes)} but tensor has {rows} rows")
    if checks_enabled():
        exchange(where, "sizes, dtype and trailing shape", [], f"{sizes};{signature(x)}", group)
    recv = torch.empty((world * sizes[me],) + tail, dtype=x.dtype, device=x.device)
    if rows:
        with guard(where, "reduce-scatter (all-to-all)", group):
            dist.all_to_all_single(recv, x, [sizes[me]] * world, sizes, group=group)
    parts = recv.view((world, sizes[me]) + tail)
    if op == "sum":
        return parts.sum(0, dtype=x.dtype)
    if op == "max":
        return parts.amax(0)
    if op == "min":
        return parts.amin(0)
    return parts.prod(0, dtype=x.dtype)
